// What a command loads: every stage and command is declared up front (its config schema, its options), but
// its work, and the heavy libraries behind it, load only when it runs. A module-load hook in the child process
// lists every module it loads.
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO } from '../fixtures/cli.ts';
import { jsonl, session, tempDir } from '../fixtures/pipeline.ts';

const HOOK = `data:text/javascript,${encodeURIComponent(`
import { register } from 'node:module';
register('data:text/javascript,' + encodeURIComponent("export async function load(url, context, next) { process.stderr.write('loaded ' + url + '\\\\n'); return next(url, context); }"));
`)}`;

/** Runs prefab with the hook: its exit code and the modules it loaded (their URLs). */
function loads(args: string[]): { code: number; modules: string[]; stderr: string } {
  const r = spawnSync(process.execPath, ['--import', HOOK, join(REPO, 'bin', 'prefab.js'), ...args], { encoding: 'utf8', env: { ...process.env, NO_COLOR: '1' } });
  const modules = r.stderr.split('\n').flatMap((line) => (line.startsWith('loaded ') ? [line.slice(7)] : []));
  return { code: r.status ?? -1, modules, stderr: r.stderr };
}

const heavy = (modules: string[]) => modules.filter((m) => /node_modules\/(@tensorflow|openai|hyparquet)/.test(m) || /\/train\/(model|decode|run)\.ts$/.test(m));

describe('startup', () => {
  it('loads no TensorFlow.js, trainer, openai or Parquet library for status, stages, --help or the first data stages', () => {
    const dir = tempDir();
    const inbox = join(dir, 'inbox');
    mkdirSync(inbox);
    writeFileSync(join(inbox, 'a.jsonl'), jsonl([session('s1', 't1', 1), session('s2', 't1', 0), session('s3', 't2', 1)]));
    const config = join(dir, 'prefab.yaml');
    writeFileSync(config, `ingest:\n  inputs: [${inbox}]\n`);
    const common = ['--workdir', join(dir, 'workspace'), '--config', config];
    for (const args of [[...common, 'status'], [...common, 'stages'], ['--help'], [...common, 'run', '--until', 'split']]) {
      const r = loads(args);
      expect(r.code, `prefab ${args.join(' ')}: ${r.stderr.split('\n').filter((l) => !l.startsWith('loaded ')).join('\n')}`).toBe(0);
      expect(r.modules.length).toBeGreaterThan(20); // the hook saw the modules
      expect(heavy(r.modules), `prefab ${args.join(' ')}`).toEqual([]);
    }
  });

  it('loads TensorFlow.js and the model when a command needs the model', () => {
    const r = loads(['model', 'inspect', join(REPO, 'test', 'fixtures', 'hf-tiny', 'llama-tiny')]);
    expect(r.code).toBe(0);
    expect(heavy(r.modules).some((m) => m.includes('@tensorflow/tfjs-core'))).toBe(true);
    expect(heavy(r.modules).some((m) => m.endsWith('/train/model.ts'))).toBe(true);
  });
});
