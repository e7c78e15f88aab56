// What a command loads: every stage and command is declared up front (its config schema, its options), but
// its work, and the heavy libraries behind it, load only when it runs. A module-load hook in the child process
// lists every module it loads.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO, prefab } from '../fixtures/cli.ts';
import { jsonl, session, tempDir } from '../fixtures/pipeline.ts';

// The hook runs on the loader's own thread: it appends each URL to a file at once, before the module loads
// (what that thread writes to stderr may be lost when the process exits right after its last import).
const HOOK = `data:text/javascript,${encodeURIComponent(`
import { register } from 'node:module';
register('data:text/javascript,' + encodeURIComponent("import { appendFileSync } from 'node:fs'; export async function load(url, context, next) { appendFileSync(process.env.PREFAB_TEST_LOADS, url + '\\\\n'); return next(url, context); }"));
`)}`;

/**
 * Runs prefab with the hook: its exit code and the modules it loaded (their URLs). From the bundle (as users
 * run it) only packages are modules of their own; through tsx (`tsx`) every source file is.
 */
function loads(args: string[], tsx = false): { code: number; modules: string[]; stderr: string } {
  const list = join(tempDir(), 'loaded.txt');
  const r = spawnSync(process.execPath, ['--import', HOOK, join(REPO, 'bin', 'prefab.js'), ...args], {
    encoding: 'utf8',
    env: { ...process.env, NO_COLOR: '1', PREFAB_TEST_LOADS: list, ...(tsx ? { PREFAB_TSX: '1' } : {}) },
  });
  const modules = existsSync(list) ? readFileSync(list, 'utf8').split('\n').filter(Boolean) : [];
  return { code: r.status ?? -1, modules, stderr: r.stderr };
}

const heavy = (modules: string[]) =>
  modules.filter(
    (m) =>
      /node_modules\/(@tensorflow|openai|hyparquet)/.test(m) ||
      /\/(model\/llama|runtime\/decode|trainers\/run)\.ts$/.test(m),
  );

describe('startup', () => {
  it('loads no TensorFlow.js, trainer, openai or Parquet library for status, stages, --help or the first data stages', () => {
    const dir = tempDir();
    const inbox = join(dir, 'inbox');
    mkdirSync(inbox);
    writeFileSync(
      join(inbox, 'a.jsonl'),
      jsonl([session('s1', 't1', 1), session('s2', 't1', 0), session('s3', 't2', 1)]),
    );
    const config = join(dir, 'prefab.yaml');
    writeFileSync(config, `ingest:\n  inputs: [${inbox}]\n`);
    const common = ['--workdir', join(dir, 'workspace'), '--config', config];
    for (const args of [
      [...common, 'status'],
      [...common, 'stages'],
      ['--help'],
      [...common, 'run', '--until', 'split'],
    ])
      for (const tsx of [false, true]) {
        const r = loads(args, tsx);
        expect(r.code, `prefab ${args.join(' ')}: ${r.stderr}`).toBe(0);
        expect(r.modules.length).toBeGreaterThan(20); // the hook saw the modules
        expect(heavy(r.modules), `prefab ${args.join(' ')}`).toEqual([]);
      }
  });

  it('loads tinyglobby only where a folder or a pattern is among the inputs, and cli-progress only for a bar on a terminal', () => {
    const dir = tempDir();
    const inbox = join(dir, 'inbox');
    mkdirSync(inbox);
    writeFileSync(join(inbox, 'a.jsonl'), jsonl([session('s1', 't1', 1), session('s2', 't1', 0)]));
    const packages = (modules: string[]) =>
      ['tinyglobby', 'cli-progress'].filter((p) => modules.some((m) => m.includes(`/node_modules/${p}/`)));
    const configs = { file: join(inbox, 'a.jsonl'), folder: inbox, pattern: join(inbox, '*.jsonl') };
    for (const [kind, input] of Object.entries(configs)) {
      const config = join(dir, `${kind}.yaml`);
      writeFileSync(config, `ingest:\n  inputs: [${input}]\n`);
      const r = loads(['--workdir', join(dir, `workspace-${kind}`), '--config', config, 'run', '--until', 'split']);
      expect(r.code, r.stderr).toBe(0);
      expect(packages(r.modules), kind).toEqual(kind === 'file' ? [] : ['tinyglobby']);
    }
    expect(packages(loads(['--help']).modules)).toEqual([]);
  });

  it('loads TensorFlow.js and the model when a command needs the model, and not to read a folder’s config', () => {
    const folder = join(REPO, 'test', 'fixtures', 'hf-tiny', 'llama-tiny');
    const inspected = loads(['model', 'inspect', folder]);
    expect(inspected.code, inspected.stderr).toBe(0);
    expect(heavy(inspected.modules)).toEqual([]);
    for (const tsx of [false, true]) {
      const r = loads(['--backend', 'wasm', 'model', 'score', folder, '--ids', '[[1,5,9]]'], tsx);
      // What it said besides the modules it loaded: why, if it loaded too few.
      const said = `tsx: ${tsx}, ${r.modules.length} modules; ${r.stderr}`;
      expect(r.code, said).toBe(0);
      expect(
        heavy(r.modules).some((m) => m.includes('@tensorflow/tfjs-core')),
        said,
      ).toBe(true);
      if (tsx) expect(heavy(r.modules).some((m) => m.endsWith('/model/llama.ts'))).toBe(true);
    }
  });
});

describe('the bundle', () => {
  const current = () =>
    JSON.parse(readFileSync(join(REPO, 'node_modules', '.cache', 'prefab', 'current.json'), 'utf8')) as {
      dir: string;
      inputs: Record<string, unknown>;
    };

  it('is made again when a source it was made from changes, and prefab runs through tsx when asked', () => {
    expect(prefab(['--help']).code).toBe(0);
    const before = current();
    expect(Object.keys(before.inputs)).toContain('stages/gate/index.ts');
    expect(prefab(['--help']).code).toBe(0);
    expect(current().dir).toBe(before.dir); // nothing changed: the same bundle
    const source = join(REPO, 'stages', 'gate', 'index.ts');
    const now = new Date();
    utimesSync(source, now, now);
    const r = prefab(['stages']);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('gate');
    expect(current().dir).not.toBe(before.dir);
    const viaTsx = spawnSync(process.execPath, [join(REPO, 'bin', 'prefab.js'), 'stages'], {
      encoding: 'utf8',
      env: { ...process.env, PREFAB_TSX: '1' },
    });
    expect(viaTsx.status).toBe(0);
    expect(viaTsx.stdout).toBe(r.stdout);
  });
  it('is removed once no command runs from it: not while a command made from it still does, however old', () => {
    const cache = join(REPO, 'node_modules', '.cache', 'prefab');
    const exited = spawnSync(process.execPath, ['-e', '']).pid!;
    const builds = { running: join(cache, 'build-1-running'), done: join(cache, 'build-1-done') };
    const users = { running: process.pid, done: exited };
    const hoursAgo = new Date(Date.now() - 2 * 3_600_000);
    for (const [name, dir] of Object.entries(builds)) {
      mkdirSync(join(dir, 'users'), { recursive: true });
      writeFileSync(join(dir, 'users', String(users[name as keyof typeof users])), '');
      utimesSync(dir, hoursAgo, hoursAgo);
    }
    try {
      const now = new Date();
      utimesSync(join(REPO, 'stages', 'gate', 'index.ts'), now, now);
      const r = spawnSync(process.execPath, [join(REPO, 'bin', 'prefab.js'), 'stages']);
      expect(r.status).toBe(0);
      expect(existsSync(builds.running)).toBe(true);
      expect(existsSync(builds.done)).toBe(false);
      // The command noted itself as the new build's user and took its note away as it exited (commands of
      // other tests running at the same time may have notes there of their own).
      expect(existsSync(join(cache, current().dir, 'users'))).toBe(true);
      expect(readdirSync(join(cache, current().dir, 'users'))).not.toContain(String(r.pid));
    } finally {
      rmSync(builds.running, { recursive: true, force: true });
      rmSync(builds.done, { recursive: true, force: true });
    }
  });
});

describe("the data stages' worker threads", () => {
  it('load no package they do not use (each thread pays for every module it loads)', () => {
    expect(prefab(['--help']).code).toBe(0);
    const dir = join(
      REPO,
      'node_modules',
      '.cache',
      'prefab',
      (
        JSON.parse(readFileSync(join(REPO, 'node_modules', '.cache', 'prefab', 'current.json'), 'utf8')) as {
          dir: string;
        }
      ).dir,
    );
    // The packages a bundle entry loads: the bare imports of it and of every chunk it imports, transitively,
    // and the packages bundled into those chunks (esbuild heads each module's code with its path).
    const packagesOf = (entry: string) => {
      const packages = new Set<string>();
      const seen = new Set<string>();
      const visit = (file: string) => {
        if (seen.has(file)) return;
        seen.add(file);
        const code = readFileSync(join(dir, file), 'utf8');
        for (const [, spec] of code.matchAll(/(?:from|import)\s*"([^"]+)"/g)) {
          if (spec!.startsWith('./')) visit(spec!.slice(2));
          else if (!spec!.startsWith('node:')) packages.add(spec!);
        }
        for (const [, name] of code.matchAll(/^\/\/ node_modules\/((?:@[^/]+\/)?[^/]+)\//gm)) packages.add(name!);
      };
      visit(entry);
      return [...packages].sort();
    };
    // A thread checksums what it writes (xxhash-wasm); the rewriter's endpoint, config schemas and progress bars stay on the main thread.
    expect(packagesOf('pairs-worker.mjs')).toEqual(['xxhash-wasm']);
    expect(packagesOf('ingest-worker.mjs')).toEqual(['xxhash-wasm']);
    expect(packagesOf('cli.mjs')).toEqual(expect.arrayContaining(['zod', 'yaml', 'commander']));
  });
});

describe('the executable', () => {
  it('as a program (npx prefab), starts node with malloc told to hand large blocks back, unless the variable is set', () => {
    // A module loaded first says what the node process that runs prefab was given.
    const said = `data:text/javascript,${encodeURIComponent("process.stderr.write('threshold ' + process.env.MALLOC_MMAP_THRESHOLD_ + '\\n')")}`;
    const { MALLOC_MMAP_THRESHOLD_: _, ...unset } = process.env;
    const threshold = (given: Record<string, string>) => {
      const r = spawnSync(join(REPO, 'bin', 'prefab.js'), ['--version'], {
        encoding: 'utf8',
        env: { ...unset, ...given, NODE_OPTIONS: `--import ${said}` },
      });
      expect(r.status, r.stderr).toBe(0);
      expect(r.stdout.trim()).toMatch(/^\d+\.\d+\.\d+$/); // the arguments reached prefab
      return r.stderr.match(/threshold (\S+)/)?.[1];
    };
    expect(threshold({})).toBe('1048576');
    expect(threshold({ MALLOC_MMAP_THRESHOLD_: '65536' })).toBe('65536');
  });
});
