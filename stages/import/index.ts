// import: ready-made preference pairs (HH-RLHF, TRL's formats, UltraFeedback: stages/import/formats.ts) read
// as pairs with `source: imported`, beside the pairs built from sessions. Each goes to train or test by a
// seeded draw on its prompt (pairs of one prompt together). The judge stage keeps them as given or has the
// judges check them (judge.imported); they are exported with the other pairs, not to the SFT or KTO sets.
// A record that cannot be read goes to quarantine.jsonl with its file, place and reason, as in ingest.
import { z } from 'zod';
import { resolveInputs } from '../../pipeline/inputs.ts';
import { defineStage } from '../../pipeline/stage.ts';

const config = z.strictObject({
  inputs: z
    .array(z.string())
    .default([])
    .describe(
      'Files, folders (read recursively) or globs of preference data, relative to the config file (JSONL, JSON array, Parquet; .gz for JSONL and JSON). Empty: nothing is imported.',
    ),
  file_format: z
    .enum(['auto', 'jsonl', 'json', 'parquet'])
    .default('auto')
    .describe('auto: each file by its extension; otherwise every file is read as this format.'),
  max_record_bytes: z
    .number()
    .int()
    .min(1024)
    .default(16_000_000)
    .describe(
      'A record longer than this (its text, in bytes) is quarantined with its size instead of read; a JSONL line is cut off as soon as it passes the limit and reading goes on at its newline, as in ingest.',
    ),
  format: z
    .enum(['auto', 'hh', 'trl', 'ultrafeedback'])
    .default('auto')
    .describe(
      'The shape of a record: hh (chosen/rejected HH-RLHF transcripts, the prompt implicit), trl (prompt + chosen/rejected, as text or conversations; or whole chosen/rejected conversations), ultrafeedback (prompt + rated completions: the best against each rated lower); auto: by the fields each record has.',
    ),
  mapping: z
    .strictObject({
      prompt: z.string().default('prompt').describe('Dotted path of the prompt (text or messages).'),
      chosen: z
        .string()
        .default('chosen')
        .describe('Dotted path of the chosen side (text, messages, or an HH transcript).'),
      rejected: z.string().default('rejected').describe('Dotted path of the rejected side.'),
      completions: z.string().default('completions').describe('UltraFeedback: dotted path of the rated completions.'),
      response: z.string().default('response').describe("UltraFeedback: a completion's text, within it."),
      rating: z.string().default('overall_score').describe("UltraFeedback: a completion's rating, within it."),
    })
    .prefault({})
    .describe('Where each part of a pair is found in a record.'),
  test_ratio: z
    .number()
    .min(0)
    .max(1)
    .default(0.05)
    .describe(
      'Share of the prompts whose pairs go to test (a seeded draw on the prompt, so pairs of one prompt stay together).',
    ),
  seed: z.string().default('prefab').describe('The train/test draw.'),
});

/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const importStage = defineStage({
  name: 'import',
  description: 'read ready-made preference pairs (HH-RLHF, TRL, UltraFeedback) as pairs with source imported',
  version: 1,
  inputs: [],
  outputs: ['train.jsonl', 'test.jsonl', 'quarantine.jsonl'],
  config,
  external: (cfg, configDir, log) =>
    cfg.inputs.length ? resolveInputs(cfg.inputs, configDir, { key: 'import.inputs', log }) : Promise.resolve([]),

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
  // Imported pairs have no tasks to shard by: every shard imports them all (the judge stage keeps them on shard 0 only).
  shard: 'whole',
});
