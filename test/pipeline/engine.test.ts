import { spawn } from 'node:child_process';
import {
  existsSync,
  mkdtempSync,
  readdirSync,
  renameSync,
  statSync,
  utimesSync,
  writeFileSync,
  readFileSync,
  rmSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { Workspace, acquireLock } from '../../pipeline/workspace.ts';
import { quietLogger, runs, toyEngine } from '../fixtures/toy-stages.ts';

let dir: string;
let workdir: string;
const config = (extra: Record<string, unknown> = {}) => ({ source: { files: ['a.txt', 'b.txt'] }, ...extra });

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'prefab-engine-'));
  workdir = join(dir, 'workspace');
  writeFileSync(join(dir, 'a.txt'), 'banana ');
  writeFileSync(join(dir, 'b.txt'), 'apple\n');
  runs.length = 0;
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const actions = (outcomes: { stage: string; action: string }[]) =>
  Object.fromEntries(outcomes.map((o) => [o.stage, o.action]));

describe('engine', () => {
  it('runs every stage once, then does no work when nothing changed', async () => {
    const first = await toyEngine(workdir, dir, config()).run();
    expect(actions(first)).toEqual({ source: 'ran', upper: 'ran', count: 'ran' });
    expect(JSON.parse(readFileSync(join(workdir, 'count', 'count.json'), 'utf8'))).toEqual({ n: 4 });
    const mtime = statSync(join(workdir, 'count', 'count.json')).mtimeMs;

    runs.length = 0;
    const second = await toyEngine(workdir, dir, config()).run();
    expect(actions(second)).toEqual({ source: 'fresh', upper: 'fresh', count: 'fresh' });
    expect(runs).toEqual([]);
    expect(statSync(join(workdir, 'count', 'count.json')).mtimeMs).toBe(mtime);
  });

  it('records input hashes, config hash, code version, counts and timings in the manifest', async () => {
    await toyEngine(workdir, dir, config()).run();
    const source = JSON.parse(readFileSync(join(workdir, 'source', 'manifest.json'), 'utf8'));
    const upper = JSON.parse(readFileSync(join(workdir, 'upper', 'manifest.json'), 'utf8'));
    expect(source.external.map((f: { name: string }) => f.name.endsWith('a.txt') || f.name.endsWith('b.txt'))).toEqual([
      true,
      true,
    ]);
    expect(source.external[0].xxh64).toMatch(/^[0-9a-f]{16}$/);
    expect(upper.inputs.source).toBe(source.fingerprint);
    expect(upper.code_version).toBe('test/upper@1');
    expect(upper.config_hash).toMatch(/^[0-9a-f]{64}$/);
    expect(upper.counts).toEqual({ chars: 13 });
    expect(upper.seconds).toBeGreaterThanOrEqual(0);
    expect(upper.outputs[0]).toMatchObject({ path: 'upper.txt', bytes: 13 });
  });

  it('reruns a stage whose input file content changed, and downstream only if its output changed', async () => {
    await toyEngine(workdir, dir, config()).run();
    writeFileSync(join(dir, 'b.txt'), 'avocado\n');
    const status = await toyEngine(workdir, dir, config()).status();
    expect(status[0]).toMatchObject({ state: 'stale', reasons: ['input files: 1 changed'] });
    expect(status[1]!.state).toBe('stale');
    runs.length = 0;
    await toyEngine(workdir, dir, config()).run();
    expect(runs).toEqual(['source', 'upper', 'count']);

    // Same bytes under a changed file time: the content hash decides, nothing reruns.
    writeFileSync(join(dir, 'b.txt'), 'avocado\n');
    runs.length = 0;
    await toyEngine(workdir, dir, config()).run();
    expect(runs).toEqual([]);
  });

  it('reruns only the stage whose config section changed when its output feeds nothing new', async () => {
    await toyEngine(workdir, dir, config()).run();
    runs.length = 0;
    const outcomes = await toyEngine(workdir, dir, config({ count: { letter: 'N' } })).run();
    expect(actions(outcomes)).toEqual({ source: 'fresh', upper: 'fresh', count: 'ran' });
    expect(JSON.parse(readFileSync(join(workdir, 'count', 'count.json'), 'utf8'))).toEqual({ n: 2 });
  });

  it('forcing a stage reruns it alone and marks everything downstream stale', async () => {
    await toyEngine(workdir, dir, config()).run();
    runs.length = 0;
    const forced = await toyEngine(workdir, dir, config()).run({ force: 'source' });
    expect(actions(forced)).toEqual({ source: 'ran' });
    const status = await toyEngine(workdir, dir, config()).status();
    expect(status.map((s) => s.state)).toEqual(['fresh', 'stale', 'stale']);
    expect(status[1]!.reasons[0]).toMatch(/upstream source was rerun by `prefab stage`/);
    runs.length = 0;
    await toyEngine(workdir, dir, config()).run();
    expect(runs).toEqual(['upper', 'count']);
  });

  it('sees a deleted or altered output as stale', async () => {
    await toyEngine(workdir, dir, config()).run();
    writeFileSync(join(workdir, 'upper', 'upper.txt'), 'X');
    const status = await toyEngine(workdir, dir, config()).status();
    expect(status[1]).toMatchObject({ state: 'stale', reasons: ['output upper.txt is altered (its size changed)'] });
    expect(status[2]!.reasons).toContain('upstream upper is not fresh');
  });

  it('sees a same-size byte flip in an output by its content, rebuilds it, and verifies every output when asked', async () => {
    await toyEngine(workdir, dir, config()).run();
    const path = join(workdir, 'upper', 'upper.txt');
    const text = readFileSync(path, 'utf8');
    writeFileSync(
      path,
      text.replace(/[A-Z]/, (c) => (c === 'Z' ? 'Y' : String.fromCharCode(c.charCodeAt(0) + 1))),
    );
    const status = await toyEngine(workdir, dir, config()).status();
    expect(status[1]).toMatchObject({
      state: 'stale',
      reasons: ['output upper.txt is altered (its content is not what the stage wrote)'],
    });
    runs.length = 0;
    await toyEngine(workdir, dir, config()).run();
    expect(runs).toContain('upper');
    expect(readFileSync(path, 'utf8')).toBe(text);
    // A flip that kept the mtime is found by --verify, which hashes every output.
    writeFileSync(path, text.toLowerCase());
    const manifest = JSON.parse(readFileSync(join(workdir, 'upper', 'manifest.json'), 'utf8'));
    utimesSync(path, new Date(), (Math.floor(manifest.outputs[0].mtime_ms) + 0.5) / 1000);
    expect((await toyEngine(workdir, dir, config()).status())[1]!.state).toBe('fresh');
    expect((await toyEngine(workdir, dir, config()).status(true))[1]).toMatchObject({
      state: 'stale',
      reasons: ['output upper.txt is altered (its content is not what the stage wrote)'],
    });
  });

  it('keeps the last good output when a stage fails, reports the failure and stops', async () => {
    await toyEngine(workdir, dir, config()).run();
    const before = readFileSync(join(workdir, 'source', 'all.txt'), 'utf8');
    writeFileSync(join(dir, 'a.txt'), 'cherry ');
    const outcomes = await toyEngine(workdir, dir, config({ source: { files: ['a.txt', 'b.txt'], fail: true } })).run();
    expect(actions(outcomes)).toEqual({ source: 'failed', upper: 'not reached', count: 'not reached' });
    expect(readFileSync(join(workdir, 'source', 'all.txt'), 'utf8')).toBe(before);
    const status = await toyEngine(workdir, dir, config()).status();
    expect(status[0]!.lastFailure?.error).toBe('source failed on purpose');
    // What the failed attempt wrote is gone at once (a full disk has room again to record the failure).
    expect(readdirSync(join(workdir, '.tmp'))).toHaveLength(0);
    await toyEngine(workdir, dir, config()).run();
    expect(readdirSync(join(workdir, '.tmp'))).toHaveLength(0);
  });

  it('puts back a stage folder parked by a run that died between its two renames', async () => {
    await toyEngine(workdir, dir, config()).run();
    renameSync(join(workdir, 'upper'), join(workdir, '.tmp', 'upper.old-deadbeef'));
    runs.length = 0;
    await toyEngine(workdir, dir, config()).run();
    expect(runs).toEqual([]);
    expect(existsSync(join(workdir, 'upper', 'upper.txt'))).toBe(true);
  });

  it('never trusts the output of a stage killed with SIGKILL, and takes over its lock', async () => {
    await toyEngine(workdir, dir, config()).run();
    writeFileSync(join(dir, 'a.txt'), 'cherry ');
    const marker = join(dir, 'in-stage');
    const child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        join(__dirname, '..', 'fixtures', 'toy-run.ts'),
        workdir,
        dir,
        JSON.stringify(config({ source: { files: ['a.txt', 'b.txt'], hangAfterWrite: marker } })),
      ],
      { stdio: 'ignore' },
    );
    for (let i = 0; i < 300 && !existsSync(marker); i++) await new Promise((r) => setTimeout(r, 50));
    expect(existsSync(marker)).toBe(true);
    const exited = new Promise((r) => child.once('exit', (_code, signal) => r(signal)));
    child.kill('SIGKILL');
    expect(await exited).toBe('SIGKILL');

    // The half-made output sits in .tmp; the committed folder is the old one and is stale against the new input.
    expect(readFileSync(join(workdir, 'source', 'all.txt'), 'utf8')).toBe('banana apple\n');
    const status = await toyEngine(workdir, dir, config()).status();
    expect(status[0]!.state).toBe('stale');

    const lines: string[] = [];
    const release = await acquireLock(new Workspace(workdir), 'test', quietLogger(lines));
    expect(lines.join('')).toMatch(/stale lock removed.*no longer running/);
    release();
    await toyEngine(workdir, dir, config()).run();
    expect(readFileSync(join(workdir, 'upper', 'upper.txt'), 'utf8')).toBe('CHERRY APPLE\n');
  });

  it('refuses a second run while the lock holder is alive, naming it', async () => {
    const ws = new Workspace(workdir);
    const release = await acquireLock(ws, 'prefab run', quietLogger());
    await expect(acquireLock(ws, 'prefab run', quietLogger())).rejects.toThrow(
      /in use by another run: pid \d+ .*prefab run/,
    );
    release();
    const again = await acquireLock(ws, 'prefab run', quietLogger());
    again();
  });
});

describe('engine status', () => {
  it('shows a stage whose input files cannot be read as stale, saying why, instead of failing', async () => {
    const dir2 = mkdtempSync(join(tmpdir(), 'prefab-engine-'));
    writeFileSync(join(dir2, 'a.txt'), 'x');
    await toyEngine(join(dir2, 'ws'), dir2, { source: { files: ['a.txt'] } }).run();
    rmSync(join(dir2, 'a.txt'));
    const status = await toyEngine(join(dir2, 'ws'), dir2, { source: { files: ['a.txt'] } }).status();
    expect(status[0]!.state).toBe('stale');
    expect(status[0]!.reasons[0]).toMatch(/^input files: .*a\.txt/);
  });
});
