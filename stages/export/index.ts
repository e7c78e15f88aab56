// export: the sessions table and the SFT, preference-pair (as TRL reads them), trajectory-level pair and KTO
// datasets as Parquet, each with a card.
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import { redactionConfig } from '../../core/redact.ts';
import { DATASETS } from './schema.ts';

const config = z.strictObject({
  sft_min_reward: z
    .number()
    .min(0)
    .max(1)
    .default(0.7)
    .describe('Sessions with at least this reward are SFT examples.'),
  kto_desirable_min: z
    .number()
    .min(0)
    .max(1)
    .default(0.7)
    .describe(
      'KTO: a session with at least this reward is a desirable row; sessions between the two thresholds are left out.',
    ),
  kto_undesirable_max: z
    .number()
    .min(0)
    .max(1)
    .default(0.3)
    .describe(
      'KTO: a session with at most this reward is an undesirable row; sessions between the two thresholds are left out.',
    ),
  row_group_size: z
    .number()
    .int()
    .min(1)
    .default(1000)
    .describe('Parquet rows per row group: the unit a reader loads at once.'),
  redaction: redactionConfig
    .extend({ enabled: z.boolean().default(false).describe('Off by default: the datasets keep the values as logged.') })
    .prefault({})
    .describe(
      "Mask personal data in every exported text (messages, feedback, metadata), as before a judge's request; off by default.",
    ),
  compression: z
    .enum(['snappy', 'gzip', 'uncompressed'])
    .default('snappy')
    .describe('Parquet compression: snappy is fast, gzip smaller.'),
});
/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const exportStage = defineStage({
  name: 'export',
  description:
    'write sessions, SFT, pairs (as TRL reads them), trajectory-level pairs and KTO datasets as Parquet with cards',
  version: 4,
  inputs: ['ingest', 'split', 'gate'],
  outputs: [...DATASETS],
  config,

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
});
