// dpo: preference optimisation of the SFT model on the exported pairs (DPO and its sigmoid, robust, hinge
// and IPO losses; SimPO; ORPO: trainers/dpo.ts) or on the KTO rows (trainers/kto.ts). The SFT model is the starting
// point and, for the losses that need one, the frozen reference, whose log-probabilities are cached here; the
// run is trainers/preference.ts's, which a refresh night runs too. With iterative.enabled, the pairs are the
// policy's own instead: rounds of rollouts in the simulator and DPO on their step pairs (rl/iterative.ts).
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import { PAIR_KINDS } from '../../core/records.ts';
import { LOSS_NAMES, anchorOnlyPairs, loraSettings, preferenceKnobs } from '../../trainers/settings.ts';
import { iterativeKnobs } from '../../rl/settings.ts';

const config = z
  .strictObject({
    ...preferenceKnobs({ lr: 1e-4, losses: LOSS_NAMES }),
    desirable_weight: z.number().positive().default(1).describe("KTO's weight on the loss of desirable rows."),
    undesirable_weight: z.number().positive().default(1).describe("KTO's weight on the loss of undesirable rows."),
    max_examples: z
      .number()
      .int()
      .min(1)
      .nullable()
      .default(null)
      .describe('Train on at most this many pairs or rows (null: all), drawn by a seeded shuffle.'),
    pair_kinds: z
      .array(z.enum(PAIR_KINDS))
      .min(1)
      .nullable()
      .default(null)
      .describe(
        "Train only on pairs of these kinds: a source (outcome, best_of_n, hard_negative, imported) or a source and negative type as eval's breakdown names them (hard_negative/format); null: every pair. Not for KTO.",
      ),
    lora: loraSettings,
    iterative: z
      .strictObject({
        enabled: z
          .boolean()
          .default(false)
          .describe(
            "Iterative on-policy DPO instead of DPO on the exported pairs: rounds of the policy's own rollouts in the simulator, step pairs where they part, DPO (these knobs, rpo_alpha among them) on each round's pairs (rl/iterative.ts).",
          ),
        ...iterativeKnobs,
      })
      .prefault({})
      .describe('Iterative on-policy DPO (off by default): the rounds, rollouts and reference of rl/iterative.ts.'),
  })
  .superRefine(anchorOnlyPairs)
  .superRefine((c, ctx) => {
    if (!c.iterative.enabled) return;
    // Iterative DPO trains on its own step pairs: the exported rows' settings would be silently ignored.
    if (c.loss === 'kto')
      ctx.addIssue({
        code: 'custom',
        path: ['loss'],
        message: 'dpo.iterative trains on step pairs: set dpo.loss to a pairwise loss, not kto',
      });
    if (c.pair_kinds)
      ctx.addIssue({
        code: 'custom',
        path: ['pair_kinds'],
        message: 'dpo.iterative trains on its own step pairs, not the exported kinds: set pair_kinds to null',
      });
  });

/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const dpo = defineStage({
  name: 'dpo',
  description: 'preference optimisation (DPO, IPO, SimPO, ORPO, KTO) of the SFT model on the exported pairs',
  version: 4,
  inputs: ['sft', 'export'],
  outputs: ['model', 'metrics.jsonl'],
  config,

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
});
