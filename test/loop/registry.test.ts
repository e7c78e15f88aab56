// The model registry: versions with their parents, aliases, an append-only history, promotion and rollback
// that a kill -9 cannot leave half-made, and `prefab models` over it.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { appendFileSync, existsSync, mkdirSync, readFileSync, readdirSync, truncateSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { Registry } from '../../loop/registry.ts';
import { REPO, prefab } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';

/** A stand-in model folder: the registry copies folders, whatever is in them. */
function modelFolder(tag: string): string {
  const dir = join(tempDir(), 'model');
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ architectures: ['LlamaForCausalLM'], tag }));
  writeFileSync(join(dir, 'model.safetensors'), `weights of ${tag}`);
  return dir;
}

const evalTable = (success: number) => ({ models: { dpo: { 'success/mean@2': success, 'reward/mean': 0.1 } } });

describe('model registry', () => {
  it('makes the first model production, the next the candidate with production as its parent, and keeps each one’s folder and info', () => {
    const registry = new Registry(join(tempDir(), 'registry'));
    expect(registry.aliases()).toEqual({ production: null, candidate: null });
    const first = registry.register(modelFolder('a'), {
      source: { stage: 'dpo', sessions: 2000 },
      config: { dpo: { lr: 1e-4 } },
      eval: evalTable(0.05),
    });
    expect(first).toBe('v0001');
    expect(registry.aliases()).toEqual({ production: 'v0001', candidate: null });
    const second = registry.register(modelFolder('b'), {
      source: { stage: 'dpo', sessions: 2400 },
      config: {},
      eval: evalTable(0.1),
    });
    expect(registry.aliases()).toEqual({ production: 'v0001', candidate: 'v0002' });
    expect(registry.version(second)).toMatchObject({ id: 'v0002', parent: 'v0001', source: { sessions: 2400 } });
    expect(readFileSync(join(registry.folder(second), 'model', 'model.safetensors'), 'utf8')).toBe('weights of b');
    expect(registry.versions().map((v) => v.id)).toEqual(['v0001', 'v0002']);
    expect(() => registry.version('v0009')).toThrow(/no version v0009/);
  });

  it('promotes, rejects and rolls back by appending one readable line each; a second rollback goes back one more promotion, never to the version just rolled back', () => {
    const registry = new Registry(join(tempDir(), 'registry'));
    registry.register(modelFolder('a'), { source: {}, config: {}, eval: null });
    registry.register(modelFolder('b'), { source: {}, config: {}, eval: null });
    registry.promote('v0002', 'better on the paired eval');
    expect(registry.aliases()).toEqual({ production: 'v0002', candidate: null });
    expect(() => registry.promote('v0002', 'again')).toThrow(/already production/);
    registry.register(modelFolder('c'), { source: {}, config: {}, eval: null });
    expect(registry.aliases()).toEqual({ production: 'v0002', candidate: 'v0003' });
    registry.reject('v0003', 'not better with confidence');
    expect(registry.aliases()).toEqual({ production: 'v0002', candidate: null });
    registry.promote('v0003', 'by hand');
    registry.rollback('live success fell below 0.95 × baseline');
    expect(registry.aliases().production).toBe('v0002');
    registry.rollback('worse again');
    expect(registry.aliases().production).toBe('v0001');
    expect(() => registry.rollback('no more')).toThrow(/production v0001 has no predecessor/);
    const lines = readFileSync(join(registry.dir, 'history.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.event, l.version, l.from ?? null])).toEqual([
      ['registered', 'v0001', null],
      ['promoted', 'v0001', null],
      ['registered', 'v0002', null],
      ['candidate', 'v0002', null],
      ['promoted', 'v0002', 'v0001'],
      ['registered', 'v0003', null],
      ['candidate', 'v0003', null],
      ['rejected', 'v0003', null],
      ['promoted', 'v0003', 'v0002'],
      ['rolled_back', 'v0002', 'v0003'],
      ['rolled_back', 'v0001', 'v0002'],
    ]);
    expect(lines[9].reason).toBe('live success fell below 0.95 × baseline');
    const lone = new Registry(join(tempDir(), 'registry'));
    lone.register(modelFolder('a'), { source: {}, config: {}, eval: null });
    expect(() => lone.rollback('no')).toThrow(/nothing to roll back to/);
  });

  it('leaves the previous state after a kill -9 mid-promotion: a torn line is no decision, and the next one cuts it off', async () => {
    const registry = new Registry(join(tempDir(), 'registry'));
    registry.register(modelFolder('a'), { source: {}, config: {}, eval: null });
    registry.register(modelFolder('b'), { source: {}, config: {}, eval: null });
    // A torn line, as a kill in the middle of a write leaves it.
    appendFileSync(
      join(registry.dir, 'history.jsonl'),
      '{"at":"2026-11-23T00:00:00.000Z","event":"promoted","version":"v0002","fr',
    );
    expect(registry.aliases().production).toBe('v0001');
    registry.promote('v0002', 'after the torn line');
    expect(registry.aliases().production).toBe('v0002');
    for (const line of readFileSync(join(registry.dir, 'history.jsonl'), 'utf8').trim().split('\n'))
      expect(() => JSON.parse(line)).not.toThrow();

    // A real kill -9 of a process promoting in a loop: every decision it made is whole, the aliases are the last one's.
    const child = spawn(process.execPath, [
      '--import',
      'tsx',
      join(__dirname, '..', 'fixtures', 'promote-loop.ts'),
      registry.dir,
    ]);
    const path = join(registry.dir, 'history.jsonl');
    const before = readFileSync(path, 'utf8').length;
    await new Promise<void>((resolve) => {
      const timer = setInterval(() => {
        if (readFileSync(path, 'utf8').length > before + 20_000) {
          clearInterval(timer);
          child.kill('SIGKILL');
          resolve();
        }
      }, 5);
    });
    await new Promise((r) => child.once('exit', r));
    const events = registry.history();
    expect(events.length).toBeGreaterThan(100);
    const last = events.findLast((e) => e.event === 'promoted')!;
    expect(registry.aliases().production).toBe(last.version);
    registry.promote(last.version === 'v0001' ? 'v0002' : 'v0001', 'after the kill');
    // The killed process's lock, if it held it, was taken over, and its pid's file swept: no lock file is left.
    expect(readdirSync(registry.dir).filter((f) => f.startsWith('.lock'))).toEqual([]);
    const text = readFileSync(path, 'utf8');
    expect(text.endsWith('\n')).toBe(true);
    for (const line of text.trim().split('\n')) expect(() => JSON.parse(line)).not.toThrow();
  });

  it('takes over a lock whose holder is gone, or holds this very pid (reused since, as pid 1 in a container)', () => {
    const registry = new Registry(join(tempDir(), 'registry'));
    registry.register(modelFolder('a'), { source: {}, config: {}, eval: null });
    registry.register(modelFolder('b'), { source: {}, config: {}, eval: null });
    const lock = join(registry.dir, '.lock');
    for (const holder of [process.pid, 2 ** 22 + 1]) {
      writeFileSync(lock, `${holder}\n`); // pids on Linux stay below 2^22
      writeFileSync(`${lock}.${2 ** 22 + 1}.tmp`, `${2 ** 22 + 1}\n`); // a process killed while taking it
      // Else it waits for the holder as for a live one, and gives up saying so.
      registry.promote(registry.aliases().production === 'v0001' ? 'v0002' : 'v0001', `over ${holder}`);
      expect(readdirSync(registry.dir).filter((f) => f.startsWith('.lock'))).toEqual([]);
    }
  });

  it('never promotes or rolls back to a version whose files were damaged since it was registered', () => {
    const registry = new Registry(join(tempDir(), 'registry'));
    const info = { source: {}, config: {}, eval: null };
    registry.register(modelFolder('a'), info);
    registry.register(modelFolder('b'), info);
    const weights = (id: string) => join(registry.folder(id), 'model', 'model.safetensors');
    expect(registry.version('v0002').files!['model.safetensors']).toMatchObject({ bytes: 12 });
    expect(registry.damage('v0002')).toBeNull();
    truncateSync(weights('v0002'), 5);
    expect(() => registry.promote('v0002', 'looked better')).toThrow(
      /v0002 is damaged \(model\/model\.safetensors is 5 bytes, registered 12\): not promoted/,
    );
    expect(registry.aliases().production).toBe('v0001');
    registry.register(modelFolder('c'), info);
    registry.promote('v0003', 'better');
    writeFileSync(weights('v0001'), 'weights of z'); // the same size, other bytes
    expect(() => registry.rollback('worse live')).toThrow(
      /v0001 is damaged \(model\/model\.safetensors has another SHA-256 than the file registered\): not rolled back to/,
    );
    expect(registry.aliases().production).toBe('v0003');
    const cli = prefab(['--workdir', join(registry.dir, '..'), 'models', 'promote', 'v0002', '--reason', 'x']);
    expect(cli.code).toBe(1);
    expect(cli.stderr).toMatch(/v0002 is damaged/);
    // Nor is it served: the server refuses to start on it, naming the file.
    const served = prefab(['--workdir', join(registry.dir, '..'), 'serve', '--model', 'v0002', '--port', '0']);
    expect(served.code).toBe(1);
    expect(served.stderr).toMatch(
      /v0002 \(v0002\) is damaged: model\/model\.safetensors is 5 bytes, registered 12; it is not served/,
    );
    expect(served.stderr).not.toMatch(/^\s+at /m);
  });

  it('does not count a version folder a kill left half-copied or unrecorded', () => {
    const registry = new Registry(join(tempDir(), 'registry'));
    registry.register(modelFolder('a'), { source: {}, config: {}, eval: null });
    mkdirSync(join(registry.dir, 'versions', '.tmp-v0002', 'model'), { recursive: true }); // killed mid-copy
    mkdirSync(join(registry.dir, 'versions', 'v0002', 'model'), { recursive: true }); // killed after the rename, before the history line
    expect(registry.versions().map((v) => v.id)).toEqual(['v0001']);
    expect(registry.register(modelFolder('b'), { source: {}, config: {}, eval: null })).toBe('v0003');
    expect(existsSync(join(registry.dir, 'versions', '.tmp-v0002'))).toBe(false);
    expect(readdirSync(join(registry.dir, 'versions')).sort()).toEqual(['v0001', 'v0002', 'v0003']);
    expect(registry.versions().map((v) => v.id)).toEqual(['v0001', 'v0003']);
  });

  it('is listed, shown, promoted and rolled back by `prefab models`', () => {
    const workdir = join(tempDir(), 'workspace');
    const registry = new Registry(join(workdir, 'registry'));
    const empty = prefab(['--workdir', workdir, 'models', 'list']);
    expect(empty.code, empty.stderr).toBe(0);
    expect(empty.stdout).toMatch(/no versions/);
    registry.register(modelFolder('a'), { source: { stage: 'dpo' }, config: {}, eval: evalTable(0.05) });
    registry.register(modelFolder('b'), { source: { stage: 'dpo' }, config: {}, eval: evalTable(0.1) });
    const list = prefab(['--workdir', workdir, 'models', 'list']);
    expect(list.code, list.stderr).toBe(0);
    expect(list.stdout).toMatch(/^v0001 .* production .* dpo +success\/mean@2 0\.050$/m);
    expect(list.stdout).toMatch(/^v0002 .* v0001 +candidate .* success\/mean@2 0\.100$/m);
    const promoted = prefab(['--workdir', workdir, 'models', 'promote', 'v0002', '--reason', 'by hand in a test']);
    expect(promoted.code, promoted.stderr).toBe(0);
    expect(promoted.stdout).toBe('v0002 is production (was v0001)\n');
    const shown = JSON.parse(prefab(['--workdir', workdir, 'models', 'show', 'production']).stdout);
    expect(shown).toMatchObject({ id: 'v0002', parent: 'v0001', folder: join(registry.folder('v0002'), 'model') });
    expect(prefab(['--workdir', workdir, 'models', 'rollback']).stdout).toBe('v0001 is production again (was v0002)\n');
    const json = JSON.parse(prefab(['--workdir', workdir, 'models', 'list', '--json']).stdout);
    expect(json.aliases).toEqual({ production: 'v0001', candidate: null });
    expect(json.history.at(-1)).toMatchObject({ event: 'rolled_back', reason: 'rolled back by hand' });
    const unknown = prefab(['--workdir', workdir, 'models', 'promote', 'v0042']);
    expect(unknown.code).not.toBe(0);
    expect(unknown.stderr).toMatch(/no version v0042/);
  });
});

describe('the model a run registers', () => {
  it('is the last model the run reached: after `--until sft`, SFT’s, which then serves as production', () => {
    const dir = tempDir();
    const config = join(dir, 'tiny.yaml');
    writeFileSync(
      config,
      `ingest:
  inputs: [${join(REPO, 'data', 'sample')}]
tokenizer: { vocab_size: 512 }
sft:
  model: { layers: 1, hidden_size: 32, heads: 2, context: 640 }
  max_sessions: 40
  max_steps: 2
`,
    );
    const workdir = join(dir, 'workspace');
    const run = prefab(['--workdir', workdir, '--config', config, 'run', '--until', 'sft']);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toMatch(/registered the model as v0001: production/);
    const registry = new Registry(join(workdir, 'registry'));
    expect(registry.aliases()).toEqual({ production: 'v0001', candidate: null });
    expect(registry.version('v0001')).toMatchObject({ source: { stage: 'sft', folder: 'sft', run: 'prefab run' } });
    expect(
      readFileSync(join(registry.folder('v0001'), 'model', 'model.safetensors')).equals(
        readFileSync(join(workdir, 'sft', 'model', 'model.safetensors')),
      ),
    ).toBe(true);
    // Nothing new: the same weights are not registered twice.
    expect(prefab(['--workdir', workdir, '--config', config, 'run', '--until', 'sft']).code).toBe(0);
    expect(registry.versions()).toHaveLength(1);
    // A run that reaches no model registers none.
    const data = prefab(['--workdir', join(dir, 'data-only'), '--config', config, 'run', '--until', 'export']);
    expect(data.code, data.stderr).toBe(0);
    expect(existsSync(join(dir, 'data-only', 'registry'))).toBe(false);
  });
});

describe('model registry under races and damage', () => {
  it('makes decisions one at a time: of four promotions at once, one is recorded and the others are refused', async () => {
    const { prefabAsync } = await import('../fixtures/cli.ts');
    for (let trial = 0; trial < 4; trial++) {
      const workdir = join(tempDir(), 'workspace');
      const registry = new Registry(join(workdir, 'registry'));
      registry.register(modelFolder('a'), { source: {}, config: {}, eval: null });
      registry.register(modelFolder('b'), { source: {}, config: {}, eval: null });
      const codes = await Promise.all(
        Array.from({ length: 4 }, async () => {
          const child = prefabAsync(['--workdir', workdir, 'models', 'promote', 'v0002']);
          child.stdout.resume();
          child.stderr.resume();
          const [code] = (await once(child, 'exit')) as [number];
          return code;
        }),
      );
      expect(
        codes.filter((c) => c === 0),
        `trial ${trial}`,
      ).toHaveLength(1);
      expect(registry.history().filter((e) => e.event === 'promoted' && e.version === 'v0002')).toHaveLength(1);
      // So a rollback goes back to the version before.
      expect(registry.rollback('test').version).toBe('v0001');
      expect(registry.aliases().production).toBe('v0001');
    }
  });

  it('skips a history line that is not a decision, saying which, and still answers', () => {
    const workdir = join(tempDir(), 'workspace');
    const registry = new Registry(join(workdir, 'registry'));
    registry.register(modelFolder('a'), { source: {}, config: {}, eval: null });
    registry.register(modelFolder('b'), { source: {}, config: {}, eval: null });
    const path = join(registry.dir, 'history.jsonl');
    appendFileSync(path, 'null\n{"note":"hand edit"}\nnot json\n');
    registry.promote('v0002', 'after the garbage');
    const warned: string[] = [];
    expect(new Registry(registry.dir, (m) => warned.push(m)).aliases().production).toBe('v0002');
    expect(warned.map((w) => w.replace(path, 'H'))).toEqual([
      'H line 5: null is not a decision (an object with an event and a version); skipped',
      'H line 6: {"note":"hand edit"} is not a decision (an object with an event and a version); skipped',
      'H line 7: not JSON, so not a decision; skipped',
    ]);
    for (const command of [
      ['models', 'list'],
      ['models', 'rollback', '--reason', 'x'],
    ]) {
      const r = prefab(['--workdir', workdir, ...command]);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stderr).toMatch(/line 5: null is not a decision/);
    }
  });
});
