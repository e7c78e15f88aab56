// The online refresh loop with real processes on a tiny workspace: a candidate trained on reversed pairs is
// never promoted, and the history says why with the numbers; a kill -9 mid-night leaves production as it was
// and the next refresh resumes the night; two refreshes never share a workspace; a production whose live
// success fell is rolled back to the previous weights byte for byte; `--days` prints the daily table; compounding
// nights build each candidate on the last one rejected. The decision itself is checked on scripted agents, whose
// skills are known: the better one is promoted. bench/nights.ts replays the nights on fresh draws.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Pair, Session } from '../../core/records.ts';
import { AGENTS, ScriptedAgent } from '../../env/agents.ts';
import { validationEpisodes, type EpisodeRecord } from '../../env/evaluate.ts';
import { simulate } from '../../env/simulate.ts';
import { DEFAULT_WORLD, generateTask, generateWorld } from '../../env/world.ts';
import { signTestP } from '../../core/paired-success.ts';
import { compare, gateConfig } from '../../loop/paired.ts';
import { Registry } from '../../loop/registry.ts';
import { replayBuffer } from '../../loop/refresh.ts';
import { REPO, prefab, prefabAsync } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { readSafetensors, writeSafetensors } from '../../model/safetensors.ts';

let dir: string;
let workdir: string;
let config: string;
let inbox: string;
const registry = () => new Registry(join(workdir, 'registry'));
const refresh = (...args: string[]) =>
  prefab(['--workdir', workdir, '--config', config, '--log-format', 'json', 'refresh', ...args]);

/** Simulated sessions of new tasks, each changed by `edit`, written into the inbox as `name`. */
async function toInbox(
  name: string,
  o: { offset: number; tasks: number; agent?: (typeof AGENTS)[number] | 'mix' },
  edit: (s: Session) => Session = (s) => s,
): Promise<Session[]> {
  const sessions: Session[] = [];
  for await (const s of simulate({
    tasks: o.tasks,
    trials: 4,
    agent: o.agent ?? 'mix',
    noise: 0.3,
    split: 'train',
    seed: DEFAULT_WORLD.seed,
    companies: DEFAULT_WORLD.companies,
    offset: o.offset,
  }))
    sessions.push(edit(s));
  writeFileSync(join(inbox, name), sessions.map((s) => JSON.stringify(s)).join('\n') + '\n');
  return sessions;
}

/** Rewards and outcomes turned over: what succeeded reads as failed and the other way round, so every outcome pair is reversed. */
const reversed = (s: Session): Session => {
  const meta = JSON.parse(s.metadata) as { success: boolean };
  return {
    ...s,
    session_id: `reversed:${s.session_id}`,
    reward: Math.round((1 - s.reward) * 1e6) / 1e6,
    metadata: JSON.stringify({ ...meta, success: !meta.success }),
  };
};

describe('prefab refresh', () => {
  beforeAll(() => {
    dir = tempDir();
    workdir = join(dir, 'workspace');
    inbox = join(dir, 'inbox');
    mkdirSync(inbox);
    config = join(dir, 'loop.yaml');
    writeFileSync(
      config,
      `ingest:
  inputs: [${join(REPO, 'data', 'sample')}, ${inbox}]
tokenizer: { vocab_size: 512 }
sft:
  model: { layers: 1, hidden_size: 32, heads: 2, context: 640 }
  max_sessions: 80
  resample_copies: 0
  max_steps: 4
  warmup: 1
dpo: { max_steps: 4, max_examples: 48, batch_size: 4 }
eval:
  max_pairs: 12
  max_sessions: 6
  simulator: { tasks: 2, k: 1, max_tokens: 16 }
refresh:
  inbox: ${inbox}
  buffer: { size: 24 }
  dpo: { max_steps: 6, checkpoint_every: 1 }
  dapo: { enabled: true, mode: feedback, steps: 1, tasks_per_step: 1, group_size: 2, max_generation_batches: 1, simulator: { max_tokens: 16, max_turns: 3 } }
  eval: { tasks: 6, k: 1, max_tokens: 16, max_turns: 3 }
  rollback: { min_sessions: 4 }
  days: { tasks: 2, trials: 2, concurrency: 4 }
`,
    );
    const r = prefab(['--workdir', workdir, '--config', config, '--log-format', 'json', 'run']);
    expect(r.code, r.stderr).toBe(0);
    expect(registry().aliases()).toEqual({ production: 'v0001', candidate: null });
  });

  it('never promotes a candidate trained on reversed pairs, and says why with the numbers', async () => {
    await toInbox('reversed.jsonl', { offset: 20_000, tasks: 6 }, reversed);
    const r = refresh();
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/candidate v0002: success .* p = /);
    expect(r.stdout).toMatch(/decision: rejected: not better with confidence/);
    expect(registry().aliases()).toEqual({ production: 'v0001', candidate: null });
    const rejected = registry().history().at(-1)!;
    expect(rejected).toMatchObject({ event: 'rejected', version: 'v0002' });
    expect((rejected as { reason: string }).reason).toMatch(
      /^night 1: not better with confidence .*success \d\.\d{3} vs \d\.\d{3} on 6 paired episodes .*sign test p = /,
    );
    expect(registry().version('v0002')).toMatchObject({
      parent: 'v0001',
      source: {
        stage: 'refresh',
        night: 1,
        chain: 'dpo, dapo',
        new_pairs: expect.any(Number),
        fingerprints: {
          export: JSON.parse(readFileSync(join(workdir, 'export', 'manifest.json'), 'utf8')).fingerprint,
        },
      },
    });
    const report = JSON.parse(readFileSync(join(workdir, 'refresh', 'nights', '0001', 'report.json'), 'utf8'));
    expect(report).toMatchObject({
      night: 1,
      decision: 'rejected',
      production_before: 'v0001',
      production_after: 'v0001',
      candidate: 'v0002',
    });
    expect(report.data.new_sessions).toBe(24);
    expect(report.data.buffer.new).toBeGreaterThan(0);
    expect(report.comparison.guards.map((g: { metric: string }) => g.metric)).toEqual([
      'reward',
      'well_formed',
      'turns',
      'sensitive_asked',
    ]);
    // The chain: DPO from production, then a feedback-guided DAPO step (its rollouts played); the version is the DAPO model.
    expect(report.training).toMatchObject({ loss: expect.any(Number), 'dapo/episodes': 2 });
    const versionWeights = readFileSync(join(registry().folder('v0002'), 'model', 'model.safetensors'));
    expect(
      versionWeights.equals(
        readFileSync(join(workdir, 'refresh', 'nights', '0001', 'candidate-dapo', 'model', 'model.safetensors')),
      ),
    ).toBe(true);
    // Nothing new since: the next night has nothing to train on, and says so.
    const idle = refresh();
    expect(idle.stdout).toMatch(/nothing to train on/);
  });

  it('leaves production as it was when killed mid-night, and the next refresh resumes the night', async () => {
    await toInbox('more.jsonl', { offset: 21_000, tasks: 6 });
    const before = registry().history().length;
    const child = prefabAsync(['--workdir', workdir, '--config', config, '--log-format', 'json', 'refresh']);
    // Killed once the candidate has a whole checkpoint (step-N, not the step-N.tmp being written): mid-training,
    // after the night's data and buffer are down.
    const cache = join(workdir, 'refresh', 'nights', '0003', '.cache');
    const checkpointed = () =>
      existsSync(cache) &&
      readdirSync(cache).some(
        (f) => f.startsWith('run-') && readdirSync(join(cache, f)).some((c) => /^step-\d+$/.test(c)),
      );
    const exited = new Promise((resolve) => child.on('exit', resolve));
    while (!checkpointed() && child.exitCode === null) await new Promise((resolve) => setTimeout(resolve, 20));
    child.kill('SIGKILL');
    await exited;
    expect(registry().history()).toHaveLength(before);
    expect(registry().aliases().production).toBe('v0001');
    expect(existsSync(join(workdir, 'refresh', 'nights', '0003', 'report.json'))).toBe(false);
    const again = refresh();
    expect(again.code, again.stderr).toBe(0);
    expect(again.stderr).toMatch(/resuming night 3/);
    expect(again.stderr).toMatch(/resuming from checkpoint/);
    expect(again.stdout).toMatch(/^night 3: production v0001/m);
    expect(JSON.parse(readFileSync(join(workdir, 'refresh', 'nights', '0003', 'report.json'), 'utf8')).candidate).toBe(
      'v0003',
    );
  });

  it('promotes a candidate whose paired episodes are better, and production then holds its weights (the episodes planted: a tiny model succeeds at nothing)', async () => {
    await toInbox('better.jsonl', { offset: 23_000, tasks: 6 });
    const night = join(workdir, 'refresh', 'nights', '0004');
    const trained = join(night, 'candidate-dapo', 'model', 'model.safetensors');
    // The night is stopped once its candidate is trained, before it is evaluated...
    const child = prefabAsync(['--workdir', workdir, '--config', config, 'refresh']);
    const exited = new Promise((resolve) => child.on('exit', resolve));
    while (!existsSync(trained) && child.exitCode === null) await new Promise((resolve) => setTimeout(resolve, 10));
    child.kill('SIGKILL');
    await exited;
    expect(existsSync(join(night, 'report.json'))).toBe(false);
    // ...and its paired episodes are written as the candidate succeeding where production failed, as a much better model would.
    const world = generateWorld({ ...DEFAULT_WORLD });
    const episode = (t: number, success: number) => ({
      task: generateTask(world, 'val', t).task_id,
      trial: 0,
      success,
      reward: success,
      turns: 4,
      calls: 3,
      calls_ok: 3,
      company_found: 1,
      sensitive_asked: 0,
    });
    writeFileSync(
      join(night, 'eval.json'),
      JSON.stringify({
        production: [0, 1, 2, 3, 4, 5].map((t) => episode(t, 0)),
        candidate: [0, 1, 2, 3, 4, 5].map((t) => episode(t, 1)),
      }),
    );
    const r = refresh();
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(
      /decision: promoted: better with confidence: success 1\.000 vs 0\.000 on 6 paired episodes \(6 better, 0 worse, sign test p = 0\.0156/,
    );
    expect(registry().aliases().production).toBe('v0004');
    expect(registry().history().at(-1)).toMatchObject({ event: 'promoted', version: 'v0004', from: 'v0001' });
    expect(
      readFileSync(join(registry().folder('v0004'), 'model', 'model.safetensors')).equals(readFileSync(trained)),
    ).toBe(true);
  });

  it('rolls production back to the previous weights, byte for byte, when its live success falls below 0.95 × its baseline', async () => {
    const weights = readFileSync(join(registry().folder('v0001'), 'model', 'model.safetensors'));
    // Traffic: v0001 served sessions that succeeded, then v0004, promoted over it, served ones that failed.
    await toInbox('traffic-v0001.jsonl', { offset: 22_000, tasks: 2, agent: 'oracle' }, (s) => ({
      ...s,
      session_id: `live:${s.session_id}`,
      model: 'v0001',
    }));
    await toInbox('traffic-v0004.jsonl', { offset: 22_100, tasks: 2, agent: 'random' }, (s) => ({
      ...s,
      session_id: `live:${s.session_id}`,
      model: 'v0004',
    }));
    const r = refresh();
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/production v0004, rolled back to v0001/);
    expect(r.stdout).toMatch(/live traffic: v0001 1\.000 on 8 sessions, v0004 \d\.\d{3} on 8 sessions/);
    const rollback = registry()
      .history()
      .find((e) => e.event === 'rolled_back')!;
    expect(rollback).toMatchObject({ version: 'v0001', from: 'v0004' });
    expect((rollback as { reason: string }).reason).toMatch(
      /^night 5: live success \d\.\d{3} over 8 sessions fell below 0\.95 × v0001's \d\.\d{3}/,
    );
    expect(registry().aliases().production).toBe('v0001');
    expect(
      readFileSync(join(registry().folder(registry().aliases().production!), 'model', 'model.safetensors')).equals(
        weights,
      ),
    ).toBe(true);
  });

  it('rejects a candidate whose weights are not numbers, ends the night with that reason, and the next night starts', async () => {
    await toInbox('diverged.jsonl', { offset: 24_000, tasks: 6 });
    const nights = join(workdir, 'refresh', 'nights');
    const night = join(nights, String(readdirSync(nights).length + 1).padStart(4, '0'));
    const trained = join(night, 'candidate-dapo', 'model', 'model.safetensors');
    // The night is stopped once its candidate is trained, and the candidate's weights made NaN, as a DPO that
    // diverged without a NaN loss would leave them.
    const child = prefabAsync(['--workdir', workdir, '--config', config, 'refresh']);
    const exited = new Promise((resolve) => child.on('exit', resolve));
    while (!existsSync(trained) && child.exitCode === null) await new Promise((resolve) => setTimeout(resolve, 10));
    child.kill('SIGKILL');
    await exited;
    const { tensors, metadata } = readSafetensors(trained);
    for (const t of tensors.values()) t.data.fill(Number.NaN);
    writeSafetensors(trained, tensors, metadata);
    const production = registry().aliases().production;
    const versions = registry().versions().length;
    const r = refresh();
    expect(r.code, r.stderr).toBe(0);
    const report = JSON.parse(readFileSync(join(night, 'report.json'), 'utf8'));
    expect(report).toMatchObject({ decision: 'rejected', candidate: null, production_after: production });
    expect(report.reason).toMatch(
      /^the candidate is no model \(its weight .* holds a value that is not a finite number\)/,
    );
    expect(registry().versions()).toHaveLength(versions);
    // The loop goes on: the next refresh is a new night, not this one again.
    await toInbox('after.jsonl', { offset: 25_000, tasks: 2 });
    const next = refresh();
    expect(next.code, next.stderr).toBe(0);
    expect(next.stderr).not.toMatch(/resuming night/);
  });

  it('runs simulated days end to end and prints the daily table; a second refresh meanwhile is refused', async () => {
    const first = prefabAsync(['--workdir', workdir, '--config', config, 'refresh', '--days', '1']);
    let out = '';
    let err = '';
    first.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => first.on('exit', resolve));
    await new Promise<void>((resolve) =>
      first.stderr!.on('data', (d: Buffer) => ((err += d.toString()), /day 1|refresh: night/.test(err) && resolve())),
    );
    const second = refresh();
    expect(second.code).not.toBe(0);
    expect(second.stderr).toMatch(/in use by another run: pid \d+/);
    expect(await exited, err).toBe(0);
    expect(out).toMatch(/^\| day \| date \| production \| live success \| candidate \|/m);
    expect(out).toMatch(/^\| 1 \| 2026-06-01 \| v0001 \| \d\.\d{3} \(4\) \|/m);
    const day = readFileSync(join(inbox, 'day-0001.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Session);
    expect(day).toHaveLength(4);
    expect(new Set(day.map((s) => s.model))).toEqual(new Set(['v0001']));
  });

  it('with refresh.compound, trains a night’s candidate from the last night’s rejected one, and the registry says so', async () => {
    const compound = join(dir, 'loop-compound.yaml');
    writeFileSync(compound, readFileSync(config, 'utf8').replace('refresh:\n', 'refresh:\n  compound: true\n'));
    const night = (...extra: string[]) =>
      prefab(['--workdir', workdir, '--config', compound, '--log-format', 'json', ...extra, 'refresh']);
    const reportOf = (n: number) =>
      JSON.parse(
        readFileSync(join(workdir, 'refresh', 'nights', String(n).padStart(4, '0'), 'report.json'), 'utf8'),
      ) as { night: number; decision: string; candidate: string | null; production_before: string };
    const trainedFrom = (n: number) =>
      JSON.parse(
        readFileSync(
          join(workdir, 'refresh', 'nights', String(n).padStart(4, '0'), 'candidate', 'model', 'trainer_state.json'),
          'utf8',
        ),
      ).info.from as string;
    await toInbox('compound-1.jsonl', { offset: 26_000, tasks: 6 }, reversed);
    const first = night('--switch-config');
    expect(first.code, first.stderr).toBe(0);
    const nights = readdirSync(join(workdir, 'refresh', 'nights')).length;
    const a = reportOf(nights);
    expect(a).toMatchObject({ decision: 'rejected', candidate: expect.stringMatching(/^v\d{4}$/) });
    await toInbox('compound-2.jsonl', { offset: 27_000, tasks: 6 }, reversed);
    const second = night();
    expect(second.code, second.stderr).toBe(0);
    const b = reportOf(nights + 1);
    expect(b.production_before).toBe(a.production_before);
    // Night b starts where night a's candidate ended, not from production; what it is compared with is production.
    expect(trainedFrom(nights + 1)).toBe(a.candidate);
    expect(trainedFrom(nights)).not.toBe(a.candidate);
    expect(registry().version(b.candidate!)).toMatchObject({
      parent: b.production_before,
      source: { built_on: a.candidate },
    });
  });
});

describe('the nights replayed on fresh draws (bench/nights.ts)', () => {
  it('plays each night’s candidate and its production on validation tasks the night never played', () => {
    const out = join(dir, 'replay');
    const r = spawnSync(
      process.execPath,
      ['--import', 'tsx', join(REPO, 'bench', 'nights.ts'), '--config', config, '--workdir', workdir, '--out', out],
      { cwd: REPO, encoding: 'utf8' },
    );
    expect(r.status, r.stderr).toBe(0);
    const nights = readFileSync(join(workdir, 'refresh', 'nights.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { night: number; candidate: string | null; comparison: unknown; decision: string });
    const judged = nights.filter((n) => n.candidate && n.comparison);
    expect(judged.length).toBeGreaterThan(1);
    const lines = readFileSync(join(out, 'nights.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { night: number; decision: string; replay: { p: number; difference: number } });
    expect(lines.map((l) => [l.night, l.decision])).toEqual(judged.map((n) => [n.night, n.decision]));
    for (const n of judged) expect(r.stdout).toMatch(new RegExp(`^\\| ${n.night} \\| ${n.decision} \\| `, 'm'));
    // The replay's tasks are the six after the six every night played.
    const played = JSON.parse(readFileSync(join(workdir, 'refresh', 'nights', '0001', 'eval.json'), 'utf8')) as {
      production: EpisodeRecord[];
    };
    const replayed = JSON.parse(readFileSync(join(out, 'episodes', 'v0001-replay.json'), 'utf8')) as EpisodeRecord[];
    expect(replayed).toHaveLength(6);
    const seen = new Set(played.production.map((e) => e.task));
    expect(replayed.filter((e) => seen.has(e.task))).toEqual([]);
  });
});

describe('the paired decision', () => {
  const options = { worldSeed: DEFAULT_WORLD.seed, companies: DEFAULT_WORLD.companies, tasks: 12, k: 2, maxTurns: 12 };
  const world = generateWorld({ ...DEFAULT_WORLD });
  /** A scripted agent's episodes on the validation tasks, a fresh agent per episode, played side by side. */
  async function episodes(agent: (typeof AGENTS)[number]): Promise<EpisodeRecord[]> {
    return validationEpisodes(
      (taskId, trial) => {
        const index = Number(taskId.split('-').at(-1));
        return new ScriptedAgent(agent, world, generateTask(world, 'val', index), `paired:${trial}`, 0.3);
      },
      { ...options, together: true },
    );
  }

  it('promotes the better agent on twin episodes and keeps the worse one out', async () => {
    const oracle = await episodes('oracle');
    const random = await episodes('random');
    const gate = gateConfig.parse({});
    const better = compare(random, oracle, gate, 's');
    expect(better.promote, better.reason).toBe(true);
    expect(better.success.p).toBeLessThan(0.05);
    expect(better.reason).toMatch(/^better with confidence: success 1\.000 vs 0\.\d{3} on 24 paired episodes/);
    const worse = compare(oracle, random, gate, 's');
    expect(worse.promote).toBe(false);
    expect(worse.reason).toMatch(/^not better with confidence/);
    expect(compare(oracle, random, gateConfig.parse({ test: 'bootstrap' }), 's').promote).toBe(false);
    expect(compare(random, oracle, gateConfig.parse({ test: 'bootstrap' }), 's').promote).toBe(true);
  });

  it('keeps a candidate with better success out when a guard regresses', async () => {
    const noisy = await episodes('noisy');
    const random = await episodes('random');
    const asksTooMuch = noisy.map((r) => ({ ...r, sensitive_asked: r.sensitive_asked + 1 }));
    const d = compare(random, asksTooMuch, gateConfig.parse({}), 's');
    expect(d.success.candidate).toBeGreaterThan(d.success.production);
    expect(d.promote).toBe(false);
    expect(d.reason).toMatch(/sensitive_asked/);
    expect(d.guards.find((g) => g.metric === 'sensitive_asked')!.ok).toBe(false);
  });

  it('fills the replay buffer with every new pair first, then older pairs favouring the recent ones, never past its size', () => {
    const pairs = Array.from({ length: 400 }, (_, i) => ({ pair_id: `p${i}` }) as Pair);
    // p0…p99 appeared on night 1, p100…p199 on night 5, p200…p379 on night 9, p380…p399 are new tonight (night 10).
    const seen = Object.fromEntries(pairs.slice(0, 380).map((p, i) => [p.pair_id, i < 100 ? 1 : i < 200 ? 5 : 9]));
    const b = replayBuffer(pairs, seen, 10, { size: 100, half_life_nights: 2 }, 'seed');
    expect(b.chosen).toHaveLength(100);
    expect([b.fresh, b.old]).toEqual([20, 80]);
    const ids = b.chosen.map((p) => Number(p.pair_id.slice(1)));
    expect(ids.slice(0, 20).every((i) => i >= 380)).toBe(true);
    const night = (lo: number, hi: number) => ids.filter((i) => i >= lo && i < hi).length;
    expect(night(200, 380)).toBeGreaterThan(night(100, 200));
    expect(night(100, 200)).toBeGreaterThanOrEqual(night(0, 100));
    expect(replayBuffer(pairs, seen, 10, { size: 100, half_life_nights: 2 }, 'seed').chosen).toEqual(b.chosen);
    expect(replayBuffer(pairs, {}, 1, { size: 50, half_life_nights: 2 }, 'seed')).toMatchObject({ fresh: 50, old: 0 });
  });

  it('computes the exact one-sided sign test', () => {
    expect(signTestP(5, 5)).toBeCloseTo(1 / 32, 12);
    expect(signTestP(0, 0)).toBe(1);
    expect(signTestP(9, 10)).toBeCloseTo(11 / 1024, 12);
    expect(signTestP(0, 7)).toBeCloseTo(1, 12);
  });
});
