#!/bin/sh
':' //; export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_-1048576}"; n=$(nproc 2>/dev/null) || n=0; v8=; [ "$n" -ge 1 ] && [ "$n" -le 4 ] && v8='--no-concurrent-recompilation --max-inlined-bytecode-size-cumulative=300'; exec node $v8 "$0" "$@"
// The line above is for sh, and a string and a comment for JavaScript: run as a program, this file starts
// node on itself with glibc's malloc told to hand blocks of 1 MiB and more straight back to the system when
// freed (unless MALLOC_MMAP_THRESHOLD_ is set already). By default malloc raises that threshold each time it
// frees such a block, and the blocks the data stages read and write through then stay with the process: at
// 1M sessions a run through pairs peaked a quarter higher. On up to 4 cores, where the data stages' worker
// threads take every core, V8 also compiles optimized code on the thread that runs it rather than on a
// helper thread, which only took turns with those threads: the pairs stage took 1.46-1.55 s instead of
// 1.65-1.70 on the synthetic 100k sessions, 1.81-1.83 instead of 1.90-1.94 on the simulator's (training's
// speed did not move beyond its noise). Compiling on the thread that runs the code, V8 also inlines less
// into a function it optimizes (300 bytes of bytecode at most in all, not 920): the data stages' five
// threads (the main one, two for ingest, two for pairs) each compile their hot code anew, and compiling took
// 1.13 s of CPU of a run through pairs on the simulator's 100k sessions (0.84 s with this); the run took
// 3.59-3.73 s instead of 3.82-4.14, the synthetic 100k 2.61-2.69 instead of 2.78-3.11, and a million
// simulated sessions 30.6-31.9 s either way (training's tokens/s did not move). The collector's helpers
// stay: without them (--single-threaded-gc) the simulator's pairs went faster still, but the synthetic ones
// 0.3 s slower and 40 MiB larger.
// `node bin/prefab.js` skips the line (set the variable and flags yourself); other C libraries ignore the
// variable.
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
    if (dir) return Promise.all([import(pathToFileURL(join(dir, 'cli.mjs')).href), import(pathToFileURL(join(dir, 'stages.mjs')).href)]);
  }
  const { register } = await import('tsx/esm/api');
  register();
  return Promise.all([import('../pipeline/cli.ts'), import('../stages/index.ts')]);
}

const [{ main }, { STAGES, COMMANDS }] = await load();
const code = await main(process.argv, STAGES, COMMANDS);
// Exit now rather than when the event loop drains: a stage that failed may leave retries of other requests
// waiting on timers. Standard output is flushed first.
process.stdout.write('', () => process.exit(code));
