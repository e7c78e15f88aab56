// Builds the CPU path's C kernels at install (package.json's postinstall): node-gyp, as npm ships it, on
// prefab_cpu.c. Where there is no C compiler or it fails, says so in a line: the install goes on, and training
// on the CPU then runs the reference model on WebAssembly, several times slower. PREFAB_CPU_KERNELS=off skips it.
import { spawnSync } from 'node:child_process';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
if (process.env.PREFAB_CPU_KERNELS === 'off') process.exit(0);
// npm runs this with its own node-gyp named in npm_config_node_gyp, and its settings (nodedir) in the environment.
const gyp = process.env.npm_config_node_gyp;
const [command, args] = gyp ? [process.execPath, [gyp]] : ['node-gyp', []];
const r = spawnSync(command, [...args, 'rebuild', '--directory', here], { encoding: 'utf8' });
if (r.status === 0) console.log('prefab: built the CPU path’s C kernels (runtime/cpu)');
else {
  const why =
    r.error?.message ??
    `${
      (r.stderr || r.stdout)
        .trim()
        .split('\n')
        .filter((l) => /error/i.test(l))[0] ?? `exit ${r.status}`
    }`;
  console.warn(
    `prefab: the CPU path’s C kernels were not built (${why}); training on the CPU runs the reference model on WebAssembly, several times slower`,
  );
}
