// The CLI's TypeScript as JavaScript, bundled by esbuild (the compiler tsx itself uses) into
// node_modules/.cache/prefab/: made on first use and again whenever a file it was made from changed (a
// source, a bundled package's file, this file). Running the sources through tsx's module hooks would cost
// every module a round trip to the hooks' thread before any work (docs/experiments.md, "Figures behind the code").
// Packages stay outside the bundle, loaded from node_modules as usual, but for the
// few every command loads (BUNDLED); each stage's work and each heavy command is a chunk of its own, loaded
// when it runs, as in the sources.
import { mkdirSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';

const REPO = join(import.meta.dirname, '..');
const CACHE = join(REPO, 'node_modules', '.cache', 'prefab');
/** The bundle's entry points: the CLI, and the stages and commands it is given (their chunks shared). */
const ENTRIES = { cli: 'pipeline/cli.ts', stages: 'stages/index.ts', commands: 'bin/commands.ts' };
/** What worker threads run, each a file of its own with all it imports: no chunks to load one by one as a thread starts. */
const WORKERS = {
  'ingest-worker': 'stages/ingest/worker.ts',
  'pairs-worker': 'stages/pairs/worker.ts',
  'judge-worker': 'stages/judge/worker.ts',
  'export-worker': 'stages/export/worker.ts',
  'parquet-worker': 'pipeline/parquet-worker.ts',
};

/** The folder of the bundle made from the sources as they are now, or null. */
function current() {
  let manifest;
  try {
    manifest = JSON.parse(readFileSync(join(CACHE, 'current.json'), 'utf8'));
  } catch {
    return null;
  }
  for (const [file, seen] of Object.entries(manifest.inputs)) {
    let now;
    try {
      now = statSync(join(REPO, file));
    } catch {
      return null;
    }
    if (now.mtimeMs !== seen.mtimeMs || now.size !== seen.size) return null;
  }
  return join(CACHE, manifest.dir);
}

/**
 * Each module's import.meta as it would be unbundled: its own file's URL, folder and path (a bundle's chunk
 * would otherwise give the chunk's), so files found next to a module are found.
 */
const importMeta = {
  name: 'import-meta',
  setup(build) {
    build.onLoad({ filter: /\.ts$/ }, (args) => {
      const source = readFileSync(args.path, 'utf8')
        .replaceAll('import.meta.url', JSON.stringify(pathToFileURL(args.path).href))
        .replaceAll('import.meta.dirname', JSON.stringify(dirname(args.path)))
        .replaceAll('import.meta.filename', JSON.stringify(args.path));
      return { contents: source, loader: 'ts' };
    });
  },
};

/**
 * Packages bundled in rather than loaded from node_modules: the ones every command loads (the config's YAML
 * and schemas, the command line). Each is then read and compiled with its chunk, where Node would resolve
 * and read it file by file (yaml is some seventy CommonJS files, zod thirty modules). The rest stay outside,
 * loaded by the commands that need them.
 */
const BUNDLED = new Set(['commander', 'yaml', 'zod']);

const packageName = (path) =>
  path
    .split('/')
    .slice(0, path.startsWith('@') ? 2 : 1)
    .join('/');

/** Every import of a package is left to node_modules but the BUNDLED packages' (and Node's own, which esbuild knows). */
const bundledPackages = {
  name: 'bundled-packages',
  setup(build) {
    build.onResolve({ filter: /^[^./]/ }, (args) =>
      BUNDLED.has(packageName(args.path)) || args.path.startsWith('node:')
        ? undefined
        : { path: args.path, external: true },
    );
  },
};

/** A bundled CommonJS package's require of a Node module goes to a require made for its chunk (an ES module has none). */
const REQUIRE =
  "import { createRequire as __prefabCreateRequire } from 'node:module'; const require = __prefabCreateRequire(import.meta.url);";

/**
 * The bundle's folder (its entry points cli.mjs, stages.mjs and commands.mjs), made first if the sources changed since. The
 * command is noted in it as a user until it exits: a build a command still runs from is never removed.
 */
export async function bundle() {
  const fresh = current();
  if (fresh) return using(fresh);
  const { build } = await import('esbuild');
  mkdirSync(CACHE, { recursive: true });
  const started = Date.now();
  const dir = `build-${started}-${process.pid}`;
  // Files named .mjs: Node takes them for ES modules without looking for a package.json's `type` above each.
  const options = {
    absWorkingDir: REPO,
    outdir: join(CACHE, dir),
    outExtension: { '.js': '.mjs' },
    bundle: true,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    metafile: true,
    logLevel: 'error',
    plugins: [importMeta, bundledPackages],
    banner: { js: REQUIRE },
  };
  const results = await Promise.all([
    build({ ...options, entryPoints: ENTRIES, splitting: true }),
    build({ ...options, entryPoints: WORKERS, splitting: false }),
  ]);
  const inputs = {};
  for (const file of new Set([...results.flatMap((r) => Object.keys(r.metafile.inputs)), 'bin/bundle.js'])) {
    const s = statSync(join(REPO, file));
    inputs[file] = { mtimeMs: s.mtimeMs, size: s.size };
  }
  // A source saved while the bundle was being made: this build serves this command only, the next builds again.
  if (Object.values(inputs).some((s) => s.mtimeMs >= started)) return using(join(CACHE, dir));
  // Commands started at once may each build: the last to finish names its build, atomically.
  const pointer = join(CACHE, `current.json.${process.pid}`);
  writeFileSync(pointer, JSON.stringify({ dir, inputs }));
  renameSync(pointer, join(CACHE, 'current.json'));
  // Older builds go once no command runs from them (a training run may load a stage's chunk hours after it
  // started), and an hour after they were made (a command may be between finding a build and noting itself).
  for (const old of readdirSync(CACHE)) {
    const path = join(CACHE, old);
    if (old.startsWith('build-') && old !== dir && statSync(path).mtimeMs < Date.now() - 3_600_000 && !inUse(path))
      rmSync(path, { recursive: true, force: true });
  }
  return using(join(CACHE, dir));
}

/** Notes this process as a user of the build until it exits; returns the build's folder. */
function using(dir) {
  const users = join(dir, 'users');
  const mine = join(users, String(process.pid));
  try {
    mkdirSync(users, { recursive: true });
    writeFileSync(mine, '');
    process.once('exit', () => rmSync(mine, { force: true }));
  } catch {
    // A read-only cache: the build still serves; only its removal is less careful.
  }
  return dir;
}

/** Whether a live process noted itself as a user of the build; the notes of those gone (killed) are removed. */
function inUse(dir) {
  let pids;
  try {
    pids = readdirSync(join(dir, 'users'));
  } catch {
    return false;
  }
  return (
    pids.filter((pid) => {
      try {
        process.kill(Number(pid), 0);
        return true;
      } catch (error) {
        if (error.code === 'EPERM') return true;
        rmSync(join(dir, 'users', pid), { force: true });
        return false;
      }
    }).length > 0
  );
}
