// Two policies compared on twin episodes (the same validation task, try and sampler seed): the exact sign
// test and a bootstrap interval over tasks. Eval's line against SFT and the refresh gate both use these; kept
// apart from env/evaluate.ts so that the report can print a comparison without loading the simulator.
import { seeded } from './random.ts';

/** An episode as the comparison sees it: which task and try, and whether it succeeded (1 or 0). */
export interface Twin {
  task: string;
  trial: number;
  success: number;
  /**
   * What the bootstrap resamples whole, where tasks are alike within it (a company's tasks: the same fields
   * asked for); absent: the task.
   */
  cluster?: string;
}

/** Mean of the values; 0 for none. */
const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

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

/**
 * The mean success difference (candidate − baseline) under resampling of clusters (tasks, or what `cluster`
 * names) with their episodes: its (alpha, 1 − alpha) quantiles.
 */
function bootstrapInterval(
  baseline: Twin[],
  candidate: Twin[],
  samples: number,
  alpha: number,
  seed: string,
): [number, number] {
  const clusterOf = (r: Twin) => r.cluster ?? r.task;
  const tasks = [...new Set(baseline.map(clusterOf))];
  const diffOf = new Map(tasks.map((t) => [t, [] as number[]]));
  baseline.forEach((p, i) => diffOf.get(clusterOf(p))!.push(candidate[i]!.success - p.success));
  const rand = seeded(seed, 'bootstrap');
  const means: number[] = [];
  for (let s = 0; s < samples; s++) {
    const drawn: number[] = [];
    for (let i = 0; i < tasks.length; i++) drawn.push(...diffOf.get(tasks[Math.floor(rand() * tasks.length)]!)!);
    means.push(mean(drawn));
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
  baseline: Twin[],
  candidate: Twin[],
  o: { samples: number; alpha: number; seed: string },
): PairedSuccess {
  if (
    baseline.length !== candidate.length ||
    baseline.some((p, i) => p.task !== candidate[i]!.task || p.trial !== candidate[i]!.trial)
  )
    throw new Error('paired comparison: the two sides did not play the same episodes');
  const better = baseline.filter((p, i) => candidate[i]!.success > p.success).length;
  const worse = baseline.filter((p, i) => candidate[i]!.success < p.success).length;
  const a = mean(baseline.map((r) => r.success));
  const b = mean(candidate.map((r) => r.success));
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

/**
 * Holm's step-down correction of p-values from several planned comparisons: each p, multiplied by how many
 * of the comparisons are not yet rejected when it is reached (the smallest by all m), held at least the one
 * before it, at most 1; in the order given.
 */
export function holm(ps: number[]): number[] {
  const order = ps.map((p, i) => ({ p, i })).sort((a, b) => a.p - b.p);
  const adjusted = new Array<number>(ps.length);
  let running = 0;
  order.forEach(({ p, i }, rank) => {
    running = Math.max(running, Math.min(1, (ps.length - rank) * p));
    adjusted[i] = running;
  });
  return adjusted;
}

/** The comparison in a line: `name` against `against` on twin episodes. */
export function pairedLine(name: string, against: string, p: PairedSuccess): string {
  const f = (x: number) => (x >= 0 ? '+' : '') + x.toFixed(3);
  return (
    `${name} against ${against}, twin episodes: ${f(p.difference)} (${p.better} better, ${p.worse} worse; ` +
    `one-sided sign test p = ${p.p.toPrecision(2)}; ${Math.round((1 - 2 * p.alpha) * 100)}% bootstrap interval [${f(p.interval[0])}, ${f(p.interval[1])}])`
  );
}
