import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { writeSyntheticSessions } from '../../bench/synthetic-sessions.ts';
import { prefab, prefabAsync, REPO } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { quietLogger } from '../fixtures/toy-stages.ts';
import { Workspace, acquireLock } from '../../pipeline/workspace.ts';

const DEFAULT = join(REPO, 'configs', 'default.yaml');

describe('prefab command line', () => {
  it('runs the sample, then does nothing the second time and says so, leaving the exports untouched', async () => {
    const workdir = join(tempDir(), 'workspace');
    const first = prefab([
      '--workdir',
      workdir,
      '--config',
      DEFAULT,
      '--log-format',
      'text',
      'run',
      '--until',
      'export',
    ]);
    expect(first.code, first.stderr).toBe(0);
    expect(first.stdout).toMatch(/^ingest\s+ran\s.*2000 new sessions/m);
    expect(first.stdout).toMatch(/^export\s+ran\s/m);
    const parquet = join(workdir, 'export', 'pairs', 'train.parquet');
    const before = statSync(parquet).mtimeMs;

    const second = prefab([
      '--workdir',
      workdir,
      '--config',
      DEFAULT,
      '--log-format',
      'text',
      'run',
      '--until',
      'export',
    ]);
    expect(second.code).toBe(0);
    expect(second.stdout).toBe('Everything is up to date: nothing to do.\n');
    expect(statSync(parquet).mtimeMs).toBe(before);

    const forced = prefab(['--workdir', workdir, '--config', DEFAULT, 'stage', 'pairs']);
    expect(forced.code).toBe(0);
    const status = JSON.parse(prefab(['--workdir', workdir, '--config', DEFAULT, 'status', '--json']).stdout)
      .stages as { stage: string; state: string; reasons: string[] }[];
    expect(status.map((s) => [s.stage, s.state])).toEqual([
      ['ingest', 'fresh'],
      ['import', 'fresh'],
      ['split', 'fresh'],
      ['sample', 'fresh'],
      ['pairs', 'fresh'],
      ['judge', 'stale'],
      ['gate', 'stale'],
      ['export', 'stale'],
      ['tokenizer', 'never run'],
      ['sft', 'never run'],
      ['dpo', 'never run'],
      ['dapo', 'never run'],
      ['eval', 'never run'],
    ]);
    // While a run holds the workspace, status says so: its pid and since when.
    const release = await acquireLock(new Workspace(workdir), 'prefab run', quietLogger());
    const live = prefab(['--workdir', workdir, '--config', DEFAULT, 'status', '--json']);
    expect(JSON.parse(live.stdout).live_run).toMatchObject({
      pid: process.pid,
      command: 'prefab run',
      started_at: expect.any(String),
    });
    expect(prefab(['--workdir', workdir, '--config', DEFAULT, 'status']).stdout).toMatch(
      new RegExp(`^a run is live: pid ${process.pid} on .* since `),
    );
    release();
    expect(
      JSON.parse(prefab(['--workdir', workdir, '--config', DEFAULT, 'status', '--json']).stdout).live_run,
    ).toBeNull();
    expect(status[5]!.reasons[0]).toMatch(/upstream pairs was rerun/);
    const text = prefab(['--workdir', workdir, '--config', DEFAULT, 'status']).stdout;
    expect(text).toMatch(/^judge\s+stale\s+\(upstream pairs was rerun/m);
    expect(text).toMatch(/^export\s+stale\s+\(upstream pairs was rerun/m);

    const third = prefab([
      '--workdir',
      workdir,
      '--config',
      DEFAULT,
      '--log-format',
      'json',
      'run',
      '--until',
      'export',
    ]);
    expect(JSON.parse(third.stdout).stages.map((s: { action: string }) => s.action)).toEqual([
      'fresh',
      'fresh',
      'fresh',
      'fresh',
      'fresh',
      'ran',
      'ran',
      'ran',
    ]);
  });

  it('exits 2 with a clear message on bad usage', () => {
    const workdir = join(tempDir(), 'workspace');
    const unknownStage = prefab(['--workdir', workdir, '--config', DEFAULT, 'stage', 'nope']);
    expect(unknownStage.code).toBe(2);
    expect(unknownStage.stderr).toMatch(
      /unknown stage 'nope'; the stages are: ingest, import, split, sample, pairs, judge, gate, export, tokenizer, sft, dpo, dapo, eval/,
    );
    const dir = tempDir();
    writeFileSync(join(dir, 'bad.yaml'), 'pairs:\n  outcome:\n    max_pairs: 3\n');
    const badConfig = prefab(['--workdir', workdir, '--config', join(dir, 'bad.yaml'), 'run']);
    expect(badConfig.code).toBe(2);
    expect(badConfig.stderr).toMatch(/bad\.yaml:3: unknown key pairs\.outcome\.max_pairs/);
    expect(prefab(['run', '--frobnicate']).code).toBe(2);
    // --backend reaches the stages and commands typed: anything but its choices is refused before any work.
    for (const command of [['run'], ['refresh'], ['serve'], ['model', 'inspect', workdir]]) {
      const badBackend = prefab(['--workdir', workdir, '--config', DEFAULT, '--backend', 'cuda', ...command]);
      expect(badBackend.code, command.join(' ')).toBe(2);
      expect(badBackend.stderr).toMatch(
        /option '--backend <name>' argument 'cuda' is invalid\. Allowed choices are auto, cpu, webgpu, wasm/,
      );
    }
    expect(prefab(['--help']).code).toBe(0);
  });

  it('goes on quietly when its reader stops early (`prefab preview inputs | head -3`)', async () => {
    const child = prefabAsync(['--config', DEFAULT, 'preview', 'inputs', '--records', '2000']);
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    // Read the first chunk, then close the pipe as `head` does.
    child.stdout.once('data', () => child.stdout.destroy());
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    expect(stderr).not.toMatch(/EPIPE|Unhandled/);
    expect(code, stderr).toBe(0);
  });

  it('says what went wrong where it is, as JSON when asked, and speaks up when a run exports no pair', () => {
    const dir = tempDir();
    const workdir = join(dir, 'workspace');
    // A misspelt section is named at its own line.
    writeFileSync(join(dir, 'typo.yaml'), 'ingest:\n  inputs: []\npairz:\n  outcome: {}\n');
    const typo = prefab(['--workdir', workdir, '--config', join(dir, 'typo.yaml'), '--log-format', 'json', 'run']);
    expect(typo.code).toBe(2);
    // A scheduler reading stdout gets an object, and stderr is JSON lines too.
    expect(JSON.parse(typo.stdout)).toMatchObject({
      ok: false,
      exit: 2,
      error: expect.stringMatching(/typo\.yaml:3: unknown key pairz/),
    });
    expect(JSON.parse(typo.stderr.trim())).toMatchObject({ level: 'error', event: 'usage' });
    // Imported pairs alone: no sessions at all is a run, and the pairs are said to be kept as given, not judged.
    writeFileSync(
      join(dir, 'only.yaml'),
      `ingest:\n  inputs: []\nimport:\n  inputs: [${join(REPO, 'data', 'sample-pairs', 'hh-rlhf.jsonl')}]\n`,
    );
    const only = prefab([
      '--workdir',
      workdir,
      '--config',
      join(dir, 'only.yaml'),
      '--log-format',
      'text',
      'run',
      '--until',
      'export',
    ]);
    expect(only.code, only.stderr).toBe(0);
    expect(only.stdout).toMatch(/^judge .*: 0 confirmed.*; \d+ imported pairs kept as given, not judged/m);
    expect(only.stdout).toMatch(/^export .*pairs [1-9]\d*\//m);
    // No sessions and nothing imported: the run ends, and says that no pair came out and where to look.
    writeFileSync(join(dir, 'none.yaml'), 'ingest:\n  inputs: []\n');
    const none = prefab([
      '--workdir',
      join(dir, 'none'),
      '--config',
      join(dir, 'none.yaml'),
      '--log-format',
      'text',
      'run',
      '--until',
      'export',
    ]);
    expect(none.code, none.stderr).toBe(0);
    expect(none.stderr).toMatch(/no preference pair was exported for training/);
  });

  it('reads the config the workspace was made with when --config is left out, refuses another until told to switch', () => {
    const dir = tempDir();
    const workdir = join(dir, 'workspace');
    writeFileSync(
      join(dir, 'mine.jsonl'),
      JSON.stringify({ task_id: 't', reward: 1, messages: [{ role: 'user', content: 'hi' }] }) + '\n',
    );
    const mine = join(dir, 'mine.yaml');
    writeFileSync(mine, 'ingest:\n  inputs: [mine.jsonl]\n');
    expect(prefab(['--workdir', workdir, '--config', mine, 'run', '--until', 'ingest']).code).toBe(0);
    const sessions = () => JSON.parse(readFileSync(join(workdir, 'ingest', 'manifest.json'), 'utf8')).counts.sessions;
    // Forgetting --config goes on with the workspace's own: the bundled sample is not read into it.
    const forgot = prefab(['--workdir', workdir, '--log-format', 'text', 'run', '--until', 'ingest']);
    expect(forgot.code, forgot.stderr).toBe(0);
    expect(forgot.stdout).toMatch(/Everything is up to date/);
    expect(sessions()).toBe(1);
    // Another config by name is refused before any stage runs.
    const other = prefab(['--workdir', workdir, '--config', DEFAULT, 'run', '--until', 'ingest']);
    expect(other.code).toBe(2);
    expect(other.stderr).toContain(`was made with --config ${mine}`);
    expect(other.stderr).toMatch(/Leave --config out to go on with the workspace's; or, .* add --switch-config/);
    expect(sessions()).toBe(1);
    // status reads on, and says so.
    expect(prefab(['--workdir', workdir, '--config', DEFAULT, 'status']).stderr).toContain(
      `was made with --config ${mine}`,
    );
    const switched = prefab(['--workdir', workdir, '--config', DEFAULT, '--switch-config', 'run', '--until', 'ingest']);
    expect(switched.code, switched.stderr).toBe(0);
    expect(sessions()).toBe(2001);
    // From now on, a command without --config reads the switched one.
    const after = prefab(['--workdir', workdir, '--log-format', 'text', 'run', '--until', 'ingest']);
    expect(after.code, after.stderr).toBe(0);
    expect(after.stdout).toMatch(/Everything is up to date/);
  });

  it('recovers from kill -9 in the middle of a run: nothing half-written is taken as fresh', async () => {
    const dir = tempDir();
    await writeSyntheticSessions(join(dir, 'big.jsonl'), 20_000, 7);
    writeFileSync(join(dir, 'config.yaml'), 'ingest:\n  inputs: [big.jsonl]\n');
    const args = ['--workdir', join(dir, 'workspace'), '--config', join(dir, 'config.yaml'), '--log-format', 'json'];
    const child = prefabAsync([...args, 'run', '--until', 'export']);
    let log = '';
    await new Promise<void>((resolve, reject) => {
      child.stderr.on('data', (chunk: Buffer) => {
        log += chunk.toString();
        if (/"event":"running","stage":"pairs"/.test(log)) {
          child.kill('SIGKILL');
          resolve();
        }
      });
      child.once('exit', () => reject(new Error(`finished before it could be killed:\n${log}`)));
    });
    await new Promise((r) => child.once('exit', r));

    const status = JSON.parse(prefab([...args, 'status', '--json']).stdout).stages as {
      stage: string;
      state: string;
    }[];
    expect(status.map((s) => s.state)).toEqual(['fresh', 'fresh', 'fresh', 'fresh', ...Array(9).fill('never run')]);

    const rerun = prefab([...args, 'run', '--until', 'export']);
    expect(rerun.code, rerun.stderr).toBe(0);
    expect(rerun.stderr).toMatch(/stale lock removed/);
    expect(JSON.parse(rerun.stdout).stages.map((s: { action: string }) => s.action)).toEqual([
      'fresh',
      'fresh',
      'fresh',
      'fresh',
      'ran',
      'ran',
      'ran',
      'ran',
    ]);
    const manifest = JSON.parse(readFileSync(join(dir, 'workspace', 'export', 'manifest.json'), 'utf8'));
    expect(manifest.counts.sessions_train + manifest.counts.sessions_test).toBe(20_000);
  });
});

/** Whether this process may mount a tmpfs (root, as CI's is: .ci/run installs packages). */
const mayMount = process.getuid?.() === 0;

describe('prefab on a full disk', () => {
  // A real tmpfs, smaller than the default run's ingest needs. Mounting one needs root: elsewhere the test runs
  // only in CI (where it must), as the WebGPU and C-kernel tests do without their adapter.
  it.skipIf(!mayMount && !process.env.CI)(
    'says which file could not be written, frees what the stage wrote, records the failure, and refuses the lock by name',
    () => {
      const mnt = tempDir();
      const mounted = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=6m', 'tmpfs', mnt], { encoding: 'utf8' });
      expect(mounted.status, `a tmpfs is needed for this test: ${mounted.stderr}`).toBe(0);
      try {
        const ws = join(mnt, 'ws');
        const run = prefab(['--workdir', ws, '--config', DEFAULT, 'run', '--until', 'export']);
        expect(run.code).toBe(1);
        expect(run.stderr).toMatch(/sessions\/\S+\.jsonl could not be written \(ENOSPC/);
        expect(run.stderr).not.toMatch(/^\s+at /m);
        // The stage's half-made folder is gone, so the failure is on record for status.
        expect(readdirSync(join(ws, '.tmp'))).toEqual([]);
        const status = JSON.parse(prefab(['--workdir', ws, 'status', '--json']).stdout) as {
          stages: { stage: string; state: string; last_failure: { error: string } | null }[];
        };
        expect(status.stages[0]).toMatchObject({ stage: 'ingest', state: 'never run' });
        expect(status.stages[0]!.last_failure!.error).toMatch(/ENOSPC/);
        // Full to the last byte: even the lock cannot be taken, and that is said plainly.
        spawnSync('sh', ['-c', `head -c 8M /dev/zero > ${join(mnt, 'fill')}`]);
        const locked = prefab(['--workdir', ws, 'run']);
        expect(locked.code).toBe(1);
        expect(locked.stderr).toMatch(
          /cannot take the workspace's lock: .*could not be written \(ENOSPC\): the disk is full/,
        );
        expect(locked.stderr).not.toMatch(/^\s+at /m);
      } finally {
        spawnSync('umount', [mnt]);
      }
    },
  );
});
