#!/bin/sh
':' //; export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_-1048576}"; exec node "$0" "$@"
// The line above is for sh, and a string and a comment for JavaScript: run as a program, this file starts
// node on itself with glibc's malloc told to hand blocks of 1 MiB and more straight back to the system when
// freed (unless MALLOC_MMAP_THRESHOLD_ is set already). By default malloc raises that threshold each time it
// frees such a block, and the blocks the data stages read and write through then stay with the process: at
// 1M sessions a run through pairs peaked a quarter higher. `node bin/prefab.js` skips the line (set the variable
// yourself); other C libraries ignore it.
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
    if (dir) return Promise.all([import(pathToFileURL(join(dir, 'cli.js')).href), import(pathToFileURL(join(dir, 'stages.js')).href)]);
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
