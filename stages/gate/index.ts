// gate: keeps the pairs the judges confirm with enough confidence (abstain > guess), drops the rest with
// the reason, and reports per source and negative type. Changing the threshold reruns this stage alone:
// no judge is asked again.
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import { PAIR_SOURCES, type PairSource } from '../../core/records.ts';

const config = z.strictObject({
  min_confidence: z.number().min(0).max(1).default(0.5).describe('The least confidence a kept pair has.'),
  min_margin: z
    .number()
    .min(0)
    .nullable()
    .default(null)
    .describe('Drop pairs whose margin is known and below this; null: no margin filter.'),
  sources: z
    .array(z.enum(PAIR_SOURCES as [PairSource, ...PairSource[]]))
    .default([...PAIR_SOURCES])
    .describe('Sources whose pairs may be kept.'),
  calibration: z
    .strictObject({
      enabled: z
        .boolean()
        .default(true)
        .describe(
          "Decide the pairs the verifier did not by each judge's measured accuracy (a Wilson lower bound above chance earns a vote) instead of the confidence the judges report; false: as the judges said.",
        ),
      min_votes: z
        .number()
        .int()
        .min(1)
        .default(20)
        .describe(
          "Votes of known truth a group (source and negative type) needs before its own accuracy is used; below it the source's, and with fewer there too the judge decides nothing there.",
        ),
      z: z.number().positive().default(1.96).describe("The Wilson interval's z: 1.96 is 95%."),
      min_reward_gap: z
        .number()
        .min(0)
        .max(1)
        .default(0.1)
        .describe('A reward gap at least this wide says which side is truly better.'),
    })
    .prefault({})
    .describe(
      'How judges earn their weight: measured on the pairs whose truth is known (the verifier decided them, their rewards differ, or they are hard negatives), per source and negative type.',
    ),
});

/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const gate = defineStage({
  name: 'gate',
  description: 'keep pairs the judges confirm with enough confidence; report per source and negative type',
  version: 2,
  inputs: ['judge'],
  outputs: ['train.jsonl', 'test.jsonl', 'dropped.jsonl', 'report.json', 'report.md'],
  config,

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
});
