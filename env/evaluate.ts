// A policy acting on the validation tasks (their companies never appear in training), k tries each: success
// mean@k and pass@k, reward and turns, and two signs of what a policy that does not succeed yet has learnt:
// calls the environment accepts, and episodes that looked up the right company.
import type { Policy } from '../core/records.ts';
import { seeded } from '../core/random.ts';
import { settled } from '../core/settled.ts';
import { runEpisode } from './rollout.ts';
import { DEFAULT_WORLD, SENSITIVE, generateWorld, taskPool, type Field } from './world.ts';

export interface ValidationOptions {
  /** The world the sessions came from (its seed and size). */
  worldSeed: number;
  companies: number;
  /** Validation tasks, each tried k times. */
  tasks: number;
  k: number;
  /** Most assistant messages in one episode. */
  maxTurns: number;
  /** Only tasks with at most this many calls (the first `tasks` of them); absent or null: every task. */
  maxCalls?: number | null;
}

export type Figures = Record<string, number | null>;

/** Mean of the values; null for none. */
const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);

/** What one episode on a validation task shows: the figures' per-episode values. */
export interface EpisodeRecord {
  task: string;
  trial: number;
  success: number;
  reward: number;
  turns: number;
  /** Tool results, and those that were not errors (calls the environment accepted). */
  calls: number;
  calls_ok: number;
  /** Whether a result named the task's company (it was looked up). */
  company_found: number;
  /** Sensitive fields asked for on the form that no department needed (the environment penalises each). */
  sensitive_asked: number;
}

/**
 * The episodes over `tasks` × `k` validation tasks, each played by `player(task, trial)`: a sampling policy
 * seeded by the task and try alone, so every episode is reproducible on its own and two policies seeded
 * alike meet the same draws (a paired comparison). `together`: all started at once, so a shared decoder
 * steps them together; otherwise one after another. `afterEpisode` is called as each ends (progress).
 * The records are in task and try order either way.
 */
export async function validationEpisodes(
  player: (taskId: string, trial: number) => Policy,
  o: ValidationOptions & { together?: boolean },
  afterEpisode: () => void = () => {},
): Promise<EpisodeRecord[]> {
  const world = generateWorld({ ...DEFAULT_WORLD, seed: o.worldSeed, companies: o.companies });
  const tasks = taskPool(world, 'val', o.tasks, o.maxCalls ?? null);
  const episodes = Array.from({ length: o.tasks * o.k }, (_, i) => ({
    task: tasks[Math.floor(i / o.k)]!,
    trial: i % o.k,
  }));
  const play = async ({ task, trial }: (typeof episodes)[number]): Promise<EpisodeRecord> => {
    const episode = await runEpisode(world, task, player(task.task_id, trial), o.maxTurns);
    const results = episode.messages.filter((x) => x.role === 'tool').map((x) => x.content ?? '');
    const form = episode.state.form ?? {};
    afterEpisode();
    return {
      task: task.task_id,
      trial,
      success: episode.success ? 1 : 0,
      reward: episode.reward,
      turns: episode.turns,
      calls: results.length,
      calls_ok: results.filter((r) => !r.startsWith('Error:')).length,
      company_found: results.some((r) => r.startsWith(JSON.stringify({ company: task.company }).slice(0, -1))) ? 1 : 0,
      sensitive_asked: Object.keys(form).filter(
        (f) => SENSITIVE.has(f as Field) && !episode.state.needed.includes(f as Field),
      ).length,
    };
  };
  if (!o.together) {
    const records: EpisodeRecord[] = [];
    for (const e of episodes) records.push(await play(e));
    return records;
  }
  return settled(episodes.map(play));
}

/** Episodes of k tries a task, summed up: success mean@k and pass@k, reward, turns, calls accepted, company found. */
export function figuresOf(records: EpisodeRecord[], k: number): Figures {
  const byTask = new Map<string, number>();
  for (const r of records) byTask.set(r.task, Math.max(byTask.get(r.task) ?? 0, r.success));
  const calls = records.reduce((n, r) => n + r.calls, 0);
  return {
    [`success/mean@${k}`]: mean(records.map((r) => r.success)),
    [`success/pass@${k}`]: mean([...byTask.values()]),
    'reward/mean': mean(records.map((r) => r.reward)),
    'turns/mean': mean(records.map((r) => r.turns)),
    'calls/well_formed': calls ? records.reduce((n, r) => n + r.calls_ok, 0) / calls : null,
    company_found: mean(records.map((r) => r.company_found)),
  };
}

/** P(X ≥ k) for X ~ Binomial(n, ½): the one-sided sign test's p-value for k of n discordant twins favouring the candidate. */
export function signTestP(k: number, n: number): number {
  if (n === 0) return 1;
  let p = 0;
  let term = 0.5 ** n; // C(n, 0) / 2ⁿ
  for (let i = 0; i <= n; i++) {
    if (i >= k) p += term;
    term = (term * (n - i)) / (i + 1);
  }
  return Math.min(1, p);
}

/** Quantile q of sorted values (nearest rank). */
const quantile = (sorted: number[], q: number) =>
  sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;

/** The mean success difference (candidate − baseline) under resampling of tasks with their trials: its (alpha, 1 − alpha) quantiles. */
function bootstrapInterval(
  baseline: EpisodeRecord[],
  candidate: EpisodeRecord[],
  samples: number,
  alpha: number,
  seed: string,
): [number, number] {
  const tasks = [...new Set(baseline.map((r) => r.task))];
  const diffOf = new Map(tasks.map((t) => [t, [] as number[]]));
  baseline.forEach((p, i) => diffOf.get(p.task)!.push(candidate[i]!.success - p.success));
  const rand = seeded(seed, 'bootstrap');
  const means: number[] = [];
  for (let s = 0; s < samples; s++) {
    const drawn: number[] = [];
    for (let i = 0; i < tasks.length; i++) drawn.push(...diffOf.get(tasks[Math.floor(rand() * tasks.length)]!)!);
    means.push(mean(drawn) ?? 0);
  }
  means.sort((a, b) => a - b);
  return [quantile(means, alpha), quantile(means, 1 - alpha)];
}

/** Success of two policies on twin episodes (the same task, try and sampler seed at each index). */
export interface PairedSuccess {
  baseline: number;
  candidate: number;
  difference: number;
  /** The bootstrap's (alpha, 1 − alpha) quantiles of the difference, resampling tasks. */
  interval: [number, number];
  alpha: number;
  /** Twins the candidate won and lost. */
  better: number;
  worse: number;
  /** The one-sided exact sign test on those twins. */
  p: number;
}

/** The candidate's success against the baseline's, twin by twin. */
export function pairedSuccess(
  baseline: EpisodeRecord[],
  candidate: EpisodeRecord[],
  o: { samples: number; alpha: number; seed: string },
): PairedSuccess {
  if (
    baseline.length !== candidate.length ||
    baseline.some((p, i) => p.task !== candidate[i]!.task || p.trial !== candidate[i]!.trial)
  )
    throw new Error('paired comparison: the two sides did not play the same episodes');
  const better = baseline.filter((p, i) => candidate[i]!.success > p.success).length;
  const worse = baseline.filter((p, i) => candidate[i]!.success < p.success).length;
  const a = mean(baseline.map((r) => r.success)) ?? 0;
  const b = mean(candidate.map((r) => r.success)) ?? 0;
  return {
    baseline: a,
    candidate: b,
    difference: b - a,
    interval: bootstrapInterval(baseline, candidate, o.samples, o.alpha, o.seed),
    alpha: o.alpha,
    better,
    worse,
    p: signTestP(better, better + worse),
  };
}

/** The comparison in a line: `name` against `against` on twin episodes. */
export function pairedLine(name: string, against: string, p: PairedSuccess): string {
  const f = (x: number) => (x >= 0 ? '+' : '') + x.toFixed(3);
  return (
    `${name} against ${against}, twin episodes: ${f(p.difference)} (${p.better} better, ${p.worse} worse; ` +
    `one-sided sign test p = ${p.p.toPrecision(2)}; ${Math.round((1 - 2 * p.alpha) * 100)}% bootstrap interval [${f(p.interval[0])}, ${f(p.interval[1])}])`
  );
}
