// split: gives sessions without task_id a task by request similarity, then puts every task wholly on the
// train or the test side by a stable hash, in buckets by task so that pairing reads one bucket at a time.
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';

const config = z.strictObject({
  test_ratio: z.number().min(0).max(1).default(0.1).describe('Share of tasks (not sessions) that go to the test side.'),
  salt: z.string().default('prefab').describe('Changing the salt reshuffles which tasks are held out.'),
  untasked_similarity: z
    .number()
    .min(0)
    .max(1)
    .default(0.5)
    .describe('Jaccard similarity of request shingles at which an untasked session joins a task (see similarity.ts).'),
  bucket_size: z
    .number()
    .int()
    .min(16)
    .default(4096)
    .describe('Sessions per bucket: bounds the memory of the stages that group by task.'),
});

/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const split = defineStage({
  name: 'split',
  description: 'assign untasked sessions to tasks by similarity; hold out tasks by stable hash',
  version: 4,
  inputs: ['ingest'],
  outputs: ['sessions', 'info.json'],
  config,

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
  shard: (parts, out) => import('./run.ts').then((m) => m.merge(parts, out)),
});
