// Ctrl+C, SIGTERM and SIGHUP, sent to the real `prefab` process while a long stage runs: the process exits
// within the bound with 130, 143 or 129, releases the lock, says what it stopped, and the next run ends where an uninterrupted
// run ends.
import { existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { writeSyntheticSessions } from '../../bench/synthetic-sessions.ts';
import { prefab, prefabAsync } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { tinyConfig } from '../fixtures/tiny.ts';

/**
 * The exit must follow the signal within this many milliseconds. The CLI waits 1.5 s for a safe point before
 * it exits anyway; the rest is room for a machine running other tests at the same time.
 */
const BOUND_MS = 3000;

interface Interrupted {
  code: number | null;
  /** From the signal to the process's exit. */
  ms: number;
  log: string;
}

/** Starts `prefab args`, sends `signal` once `when` holds (of its stderr so far, or of the workspace), and waits for the exit. */
async function interrupt(
  args: string[],
  when: RegExp | ((log: string) => boolean),
  signal: NodeJS.Signals,
): Promise<Interrupted> {
  const ready = typeof when === 'function' ? when : (log: string) => when.test(log);
  const child = prefabAsync(args);
  let log = '';
  let sentAt = 0;
  const check = () => {
    if (sentAt || !ready(log)) return;
    sentAt = performance.now();
    child.kill(signal);
  };
  const poll = setInterval(check, 25);
  return new Promise((resolve, reject) => {
    child.stderr.on('data', (chunk: Buffer) => {
      log += chunk.toString();
      check();
    });
    child.once('exit', (code) => {
      clearInterval(poll);
      if (!sentAt) reject(new Error(`finished before the signal was sent:\n${log}`));
      else resolve({ code, ms: performance.now() - sentAt, log });
    });
  });
}

const status = (args: string[]) =>
  JSON.parse(prefab([...args, 'status', '--json']).stdout).stages as {
    stage: string;
    state: string;
    last_failure: { status: string; error: string } | null;
  }[];
const stageStatus = (args: string[], stage: string) => status(args).find((s) => s.stage === stage)!;

describe('a data stage on a large input', () => {
  it('stops within the bound on SIGINT, exits 130, releases the lock, and the next run makes the same exports', async () => {
    const dir = tempDir();
    await writeSyntheticSessions(join(dir, 'big.jsonl'), 20_000, 7);
    writeFileSync(join(dir, 'config.yaml'), 'ingest:\n  inputs: [big.jsonl]\n');
    const args = (ws: string) => [
      '--workdir',
      join(dir, ws),
      '--config',
      join(dir, 'config.yaml'),
      '--log-format',
      'json',
    ];

    const stopped = await interrupt(
      [...args('workspace'), 'run', '--until', 'export'],
      /"event":"running","stage":"pairs"/,
      'SIGINT',
    );
    expect(stopped.code, stopped.log).toBe(130);
    expect(stopped.ms).toBeLessThan(BOUND_MS);
    expect(existsSync(join(dir, 'workspace', '.lock'))).toBe(false);
    expect(stopped.log).toMatch(
      /"event":"interrupted: stopping at the next safe point; a second signal stops at once","signal":"SIGINT","stage":"pairs"/,
    );
    const pairs = stageStatus(args('workspace'), 'pairs');
    expect(pairs.state).toBe('never run');
    expect(pairs.last_failure).toMatchObject({
      status: 'interrupted',
      error: expect.stringMatching(
        /^pairs: stopped at (train|test) bucket \d+ of \d+; the next run makes pairs again$/,
      ),
    });
    expect(prefab([...args('workspace'), 'status']).stdout).toMatch(
      /pairs\s+never run\s*\n\s+last attempt interrupted at /,
    );

    const rerun = prefab([...args('workspace'), 'run', '--until', 'export']);
    expect(rerun.code, rerun.stderr).toBe(0);
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
    const whole = prefab([...args('uninterrupted'), 'run', '--until', 'export']);
    expect(whole.code, whole.stderr).toBe(0);
    for (const dataset of ['sessions', 'sft', 'pairs', 'kto']) {
      for (const side of ['train', 'test']) {
        const file = join('export', dataset, `${side}.parquet`);
        expect(
          readFileSync(join(dir, 'workspace', file)).equals(readFileSync(join(dir, 'uninterrupted', file))),
          file,
        ).toBe(true);
      }
    }
  });
});

describe('the training stages and eval', () => {
  let dir: string;
  let config: string;
  const args = (ws: string) => ['--workdir', join(dir, ws), '--config', config, '--log-format', 'json'];
  beforeAll(() => {
    dir = tempDir();
    // Runs long enough to interrupt each stage.
    config = tinyConfig(dir, {
      vocab: 400,
      context: 512,
      sessions: 120,
      sftSteps: 40,
      dpo: 'max_steps: 40',
      examples: 200,
      checkpointEvery: 10,
      pairs: 16,
      nllSessions: 8,
      tasks: 6,
      maxTokens: 24,
    });
    const whole = prefab([...args('uninterrupted'), 'run']);
    expect(whole.code, whole.stderr).toBe(0);
  });

  it('stops SFT at a step boundary with a checkpoint, DPO on SIGTERM, eval in the simulator on SIGHUP; each rerun resumes, and the result is the uninterrupted run’s', async () => {
    const run = [...args('workspace'), 'run'];
    const cache = (stage: string) => join(dir, 'workspace', '.cache', stage);
    const checkpoints = (stage: string) =>
      existsSync(cache(stage))
        ? readdirSync(cache(stage)).flatMap((r) =>
            r.startsWith('run-') ? readdirSync(join(cache(stage), r)).filter((f) => /^step-\d+$/.test(f)) : [],
          )
        : [];

    // SFT, once it wrote its step-10 checkpoint: stopped at a step boundary, where it saves another; status
    // says so; the rerun resumes there.
    const sft = await interrupt(run, () => checkpoints('sft').length > 0, 'SIGINT');
    expect(sft.code, sft.log).toBe(130);
    expect(sft.ms).toBeLessThan(BOUND_MS);
    expect(existsSync(join(dir, 'workspace', '.lock'))).toBe(false);
    const stoppedAt = /sft steps: stopped at step (\d+) of 40; checkpoint kept, the next run resumes from step \1/.exec(
      sft.log,
    );
    expect(stoppedAt, sft.log).not.toBeNull();
    const step = Number(stoppedAt![1]);
    expect(step).toBeGreaterThanOrEqual(10);
    expect(checkpoints('sft')).toContain(`step-${String(step).padStart(6, '0')}`);
    expect(stageStatus(args('workspace'), 'sft')).toMatchObject({
      state: 'never run',
      last_failure: { status: 'interrupted' },
    });

    // DPO, stopped by a scheduler's SIGTERM after SFT finished on the rerun.
    const dpo = await interrupt(run, () => checkpoints('dpo').length > 0, 'SIGTERM');
    expect(dpo.code, dpo.log).toBe(143);
    expect(dpo.ms).toBeLessThan(BOUND_MS);
    expect(dpo.log).toMatch(new RegExp(`"event":"resuming from checkpoint","stage":"sft".*"step":${step}`));
    expect(dpo.log).toMatch(
      /dpo steps: stopped at step \d+ of \d+; checkpoint kept, the next run resumes from step \d+/,
    );
    expect(stageStatus(args('workspace'), 'sft').state).toBe('fresh');
    expect(stageStatus(args('workspace'), 'dpo')).toMatchObject({
      state: 'never run',
      last_failure: { status: 'interrupted' },
    });

    // Eval, stopped in the simulator after the untrained model's figures by a closed terminal's SIGHUP.
    const evaluation = await interrupt(run, /"event":"evaluated","stage":"eval","model":"untrained"/, 'SIGHUP');
    expect(evaluation.code, evaluation.log).toBe(129);
    expect(evaluation.ms).toBeLessThan(BOUND_MS);
    expect(evaluation.log).toMatch(/"event":"interrupted","stage":"eval"/);
    expect(existsSync(join(dir, 'workspace', 'eval', 'eval.json'))).toBe(false);

    const last = prefab(run);
    expect(last.code, last.stderr).toBe(0);
    expect(existsSync(join(dir, 'workspace', '.lock'))).toBe(false);
    for (const file of [
      'sft/model/model.safetensors',
      'dpo/model/model.safetensors',
      'eval/eval.json',
      'eval/table.txt',
    ]) {
      expect(
        readFileSync(join(dir, 'workspace', file)).equals(readFileSync(join(dir, 'uninterrupted', file))),
        file,
      ).toBe(true);
    }
    const withoutSpeed = (path: string) => readFileSync(path, 'utf8').replace(/"tokens\/s":\d+/g, '');
    for (const file of ['sft/metrics.jsonl', 'dpo/metrics.jsonl'])
      expect(withoutSpeed(join(dir, 'workspace', file)), file).toBe(withoutSpeed(join(dir, 'uninterrupted', file)));
  });
});
