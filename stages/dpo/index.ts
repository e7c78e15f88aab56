// dpo: preference optimisation of the SFT model on the exported pairs (DPO and its sigmoid, robust, hinge
// and IPO losses; SimPO; ORPO: trainers/dpo.ts) or on the KTO rows (trainers/kto.ts). The SFT model is the starting
// point and, for the losses that need one, the frozen reference, whose log-probabilities are cached here.
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import { PAIR_KINDS } from '../../core/records.ts';
import { LOSS_NAMES, loraSettings, trainingConfig } from '../../trainers/settings.ts';

const config = z.strictObject({
  loss: z
    .enum(LOSS_NAMES)
    .default('dpo')
    .describe(
      "dpo is DPO's sigmoid loss; robust and hinge are its variants; simpo and orpo need no reference; kto trains on the KTO rows.",
    ),
  beta: z
    .number()
    .positive()
    .nullable()
    .default(null)
    .describe("β (ORPO: λ); null takes the loss's paper default: 0.1, SimPO 2.0."),
  label_smoothing: z
    .number()
    .min(0)
    .lt(0.5)
    .default(0)
    .describe(
      'cDPO / robust DPO: the chance a label is wrong, below 0.5 (at 0.5 a label says nothing, and robust DPO divides by 1 − 2ε).',
    ),
  gamma_beta_ratio: z.number().min(0).default(0.5).describe("SimPO's margin γ as a share of β."),
  desirable_weight: z.number().positive().default(1).describe("KTO's weight on the loss of desirable rows."),
  undesirable_weight: z.number().positive().default(1).describe("KTO's weight on the loss of undesirable rows."),
  // batch_size counts pairs (KTO: rows).
  ...trainingConfig(1e-4),
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
  max_length: z
    .number()
    .int()
    .min(16)
    .nullable()
    .default(null)
    .describe(
      "Tokens of prompt and completion together (null: the model's context), as TRL's max_length: the prompt keeps its head and as many latest messages as leave room for the longer side; a pair that still does not fit is left out.",
    ),
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
