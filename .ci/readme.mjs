#!/usr/bin/env node
// The README's command blocks, run in order as a new user would, on a clone of this checkout (its
// node_modules and built kernels linked in): so that the README cannot drift from the product again (issue
// 66: its own commands were refused). `npm ci` and `npm test` are .ci/run's own steps and are not run again;
// a block right after a line `<!-- readme-check: skip, REASON -->` is not run (the recipe's two hours, said
// in the README beside it); `prefab serve` runs in the background until the end, once it says it listens.
// A line is one command (the README continues none with `\`), and ` #` starts its comment (none is quoted).
// A command that exits with another code than 0 fails the check, naming it and showing its last output.
// SMALLER runs a command at a smaller size than the README's, said in the log: five simulated days are about
// 50 minutes on 2 cores, and one runs the same code (CI's 90 minutes hold the suite, the default run and a day).
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const repo = join(import.meta.dirname, '..');
const readme = readFileSync(join(repo, 'README.md'), 'utf8');
const blocks = [...readme.matchAll(/(<!-- readme-check: skip[^>]*-->\n)?```sh\n([\s\S]*?)```/g)]
  .filter((m) => !m[1])
  .map((m) =>
    m[2]
      .split('\n')
      .map((line) => line.replace(/\s+#.*$/, '').trim())
      .filter(Boolean),
  );
const SMALLER = [[/^npx prefab refresh --days 5$/, 'npx prefab refresh --days 1']];
const commands = blocks.flat().filter((c) => c !== 'npm ci' && c !== 'npm test');
// A smaller size for a command the README no longer has would rot unseen.
for (const [pattern] of SMALLER)
  if (!commands.some((c) => pattern.test(c))) {
    process.stderr.write(`README check: no README command matches ${pattern} (.ci/readme.mjs SMALLER)\n`);
    process.exit(1);
  }

const dir = mkdtempSync(join(tmpdir(), 'prefab-readme-'));
execFileSync('git', ['clone', '--quiet', '--local', repo, dir]);
symlinkSync(join(repo, 'node_modules'), join(dir, 'node_modules'));
if (existsSync(join(repo, 'runtime', 'cpu', 'build')))
  cpSync(join(repo, 'runtime', 'cpu', 'build'), join(dir, 'runtime', 'cpu', 'build'), { recursive: true });

const servers = [];
let failed = null;
try {
  for (const written of commands) {
    const started = Date.now();
    const smaller = SMALLER.find(([pattern]) => pattern.test(written));
    const command = smaller ? smaller[1] : written;
    process.stdout.write(smaller ? `$ ${command}   (the README's \`${written}\`, smaller)\n` : `$ ${command}\n`);
    if (/^npx prefab serve\b/.test(command)) {
      try {
        servers.push(await serve(command));
      } catch (error) {
        failed = error.message;
        break;
      }
      continue;
    }
    const r = spawnSync('sh', ['-c', command], { cwd: dir, encoding: 'utf8', maxBuffer: 64 << 20 });
    process.stdout.write(`  exit ${r.status} in ${((Date.now() - started) / 1000).toFixed(0)} s\n`);
    if (r.status !== 0) {
      failed = `\`${command}\` exited ${r.status}:\n${(r.stderr || r.stdout).slice(-3000)}`;
      break;
    }
  }
} finally {
  for (const s of servers) await stop(s);
  rmSync(dir, { recursive: true, force: true });
}
if (failed) {
  process.stderr.write(`README check: ${failed}\n`);
  process.exit(1);
}
const smaller = commands.filter((c) => SMALLER.some(([pattern]) => pattern.test(c))).length;
process.stdout.write(
  `README check: ${commands.length} commands ran, ${commands.length - smaller} as written, ${smaller} smaller (said above)\n`,
);
process.exit(0); // nothing of the commands' may keep the check waiting

/**
 * Starts a server command in the background, in a process group of its own (npx runs prefab as a child of
 * its own: a signal to npx alone leaves the server running, holding the check's pipes open); resolves once
 * it says where it listens.
 */
function serve(command) {
  const child = spawn('sh', ['-c', `exec ${command}`], { cwd: dir, detached: true });
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
      if (/serving .* at http/.test(out)) resolve(child);
    });
    child.stderr.on('data', (d) => (out += d));
    child.on('exit', (code) =>
      reject(new Error(`\`${command}\` exited ${code} before it listened:\n${out.slice(-3000)}`)),
    );
  });
}

/** Stops a server and every process of its group (npx and prefab), and waits for it to exit. */
async function stop(child) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  try {
    process.kill(-child.pid, 'SIGTERM');
  } catch {
    child.kill('SIGTERM'); // its group is gone: the process alone, if it is still there
  }
  await exited;
  child.stdout.destroy();
  child.stderr.destroy();
}
