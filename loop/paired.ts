// The candidate against production, paired: both play the same validation tasks with the same sampler seeds,
// so each episode of one has a twin in the other, and their difference is the candidate's effect and not the
// luck of the draw. Promotion needs success better with confidence (a one-sided exact sign test on the
// discordant twins, or a paired bootstrap by task) and no guard metric worse beyond its tolerance. Pure
// functions: the refresh (loop/refresh.ts) plays the episodes and records what these decide.
import { z } from 'zod';
import type { EpisodeRecord } from '../env/evaluate.ts';
import { pairedSuccess, type PairedSuccess } from '../core/paired-success.ts';

export const gateConfig = z
  .strictObject({
    test: z
      .enum(['sign', 'bootstrap'])
      .default('sign')
      .describe(
        'sign: the exact one-sided sign test on the twins whose success differs; bootstrap: the one-sided lower bound of the success difference, resampling tasks.',
      ),
    alpha: z
      .number()
      .gt(0)
      .lt(1)
      .default(0.05)
      .describe(
        'The test level: promote only when p < alpha (sign), or the (1 − alpha) lower bound is above 0 (bootstrap).',
      ),
    bootstrap_samples: z
      .number()
      .int()
      .min(100)
      .default(2000)
      .describe('Resamples of the tasks for the interval (reported with either test).'),
    guards: z
      .strictObject({
        reward: z
          .number()
          .min(0)
          .default(0.02)
          .describe('The candidate’s mean reward may be at most this much below production’s.'),
        well_formed: z
          .number()
          .min(0)
          .default(0.05)
          .describe('Its share of calls the environment accepts may be at most this much lower.'),
        turns: z
          .number()
          .min(0)
          .default(0.5)
          .describe('Its mean assistant turns per episode may be at most this many more.'),
        sensitive_asked: z
          .number()
          .min(0)
          .default(0.05)
          .describe('Its sensitive fields asked for and not needed, per episode, may be at most this many more.'),
      })
      .prefault({})
      .describe('Metrics that must not regress beyond a tolerance, whatever success says.'),
  })
  .prefault({});
export type GateConfig = z.infer<typeof gateConfig>;

const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

interface GuardResult {
  metric: string;
  production: number;
  candidate: number;
  /** How far it may move the wrong way. */
  tolerance: number;
  ok: boolean;
}

export interface Comparison {
  episodes: number;
  success: Omit<PairedSuccess, 'baseline'> & { production: number };
  guards: GuardResult[];
  promote: boolean;
  /** Why, with the numbers: a line for the report and the registry's history. */
  reason: string;
}

/** Summed-up figures of one side, for the guards. */
function figures(r: EpisodeRecord[]) {
  const calls = r.reduce((n, e) => n + e.calls, 0);
  return {
    reward: mean(r.map((e) => e.reward)),
    well_formed: calls ? r.reduce((n, e) => n + e.calls_ok, 0) / calls : 0,
    turns: mean(r.map((e) => e.turns)),
    sensitive_asked: mean(r.map((e) => e.sensitive_asked)),
  };
}

/** Compares twin episodes (the same task, trial and seed at each index) and decides. */
export function compare(
  production: EpisodeRecord[],
  candidate: EpisodeRecord[],
  gate: GateConfig,
  seed: string,
): Comparison {
  const { baseline, ...paired } = pairedSuccess(production, candidate, {
    samples: gate.bootstrap_samples,
    alpha: gate.alpha,
    seed,
  });
  const success = { production: baseline, ...paired };
  const { better, worse, p, interval } = success;
  const a = figures(production);
  const b = figures(candidate);
  const g = gate.guards;
  const guards: GuardResult[] = [
    {
      metric: 'reward',
      production: a.reward,
      candidate: b.reward,
      tolerance: g.reward,
      ok: b.reward >= a.reward - g.reward,
    },
    {
      metric: 'well_formed',
      production: a.well_formed,
      candidate: b.well_formed,
      tolerance: g.well_formed,
      ok: b.well_formed >= a.well_formed - g.well_formed,
    },
    { metric: 'turns', production: a.turns, candidate: b.turns, tolerance: g.turns, ok: b.turns <= a.turns + g.turns },
    {
      metric: 'sensitive_asked',
      production: a.sensitive_asked,
      candidate: b.sensitive_asked,
      tolerance: g.sensitive_asked,
      ok: b.sensitive_asked <= a.sensitive_asked + g.sensitive_asked,
    },
  ];
  const confident = gate.test === 'sign' ? p < gate.alpha : interval[0] > 0;
  const failed = guards.filter((x) => !x.ok);
  const f = (x: number) => x.toFixed(3);
  const evidence =
    `success ${f(success.candidate)} vs ${f(success.production)} on ${production.length} paired episodes (${better} better, ${worse} worse, ` +
    `sign test p = ${p.toPrecision(3)}, ${Math.round((1 - gate.alpha) * 100)}% bootstrap bounds [${f(interval[0])}, ${f(interval[1])}])`;
  const guardText = failed
    .map((x) => `${x.metric} ${f(x.candidate)} vs ${f(x.production)} (tolerance ${x.tolerance})`)
    .join('; ');
  const promote = confident && failed.length === 0;
  const reason = promote
    ? `better with confidence: ${evidence}; no guard regressed`
    : !confident
      ? `not better with confidence (${gate.test === 'sign' ? `p ≥ ${gate.alpha}` : 'the lower bound is not above 0'}): ${evidence}${failed.length ? `; guards regressed: ${guardText}` : ''}`
      : `a guard regressed: ${guardText}; ${evidence}`;
  return { episodes: production.length, success, guards, promote, reason };
}
