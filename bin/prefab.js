#!/bin/sh
':' //; export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_-1048576}"; n=$(nproc 2>/dev/null) || n=0; v8=; [ "$n" -ge 1 ] && [ "$n" -le 4 ] && v8='--no-concurrent-recompilation --max-inlined-bytecode-size-cumulative=300'; exec node $v8 "$0" "$@"
// The line above is for sh, and a string and a comment for JavaScript: run as a program, this file starts
// node on itself with glibc's malloc told to hand blocks of 1 MiB and more straight back to the system when
// freed (unless MALLOC_MMAP_THRESHOLD_ is set already): by default malloc raises that threshold as it frees
// such blocks, and the data stages' buffers then stay with the process. On up to 4 cores, where the data
// stages' threads take every core, V8 compiles optimized code on the thread that runs it (a helper thread
// would only take turns with them) and inlines less, since each of those threads compiles its hot code anew
// (docs/experiments.md, "Figures behind the code"). `node bin/prefab.js` skips the line (set the variable and
// flags yourself); other C libraries ignore the variable.
// The `prefab` executable. The code is TypeScript: it runs from a bundle of it (bin/bundle.js), made on first
// use and whenever a source changed, so a clean clone needs no build step. Where no bundle can be made (a
// read-only install), or with PREFAB_TSX=1 (stack traces then name the sources), it runs through tsx.
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

async function load() {
  if (!process.env.PREFAB_TSX) {
    let dir = null;
    try {
      dir = await (await import('./bundle.js')).bundle();
    } catch (error) {
      process.emitWarning(`prefab: running through tsx, the bundle could not be made (${error.message})`);
    }
    // Worker threads (pipeline/workers.ts) start from the bundle's entries for them.
    if (dir) process.env.PREFAB_BUNDLE_DIR = dir;
    if (dir) return Promise.all(['cli', 'stages', 'commands'].map((entry) => import(pathToFileURL(join(dir, `${entry}.mjs`)).href)));
  }
  const { register } = await import('tsx/esm/api');
  register();
  return Promise.all([import('../pipeline/cli.ts'), import('../stages/index.ts'), import('./commands.ts')]);
}

const [{ main }, { STAGES }, { COMMANDS }] = await load();
const code = await main(process.argv, STAGES, COMMANDS);
// Exit now rather than when the event loop drains: a stage that failed may leave retries of other requests
// waiting on timers. Standard output is flushed first.
process.stdout.write('', () => process.exit(code));
