// pairs: preference pairs from the split sessions, one bucket of tasks in memory at a time.
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { JsonlWriter, readJsonl } from '../../pipeline/jsonl.ts';
import { defineStage } from '../../pipeline/stage.ts';
import type { SplitSession } from '../records.ts';
import { SPLITS, bucketFile, readSplitInfo } from '../split/index.ts';
import { buildOutcomePairs } from './outcome.ts';

const config = z.strictObject({
  outcome: z
    .strictObject({
      enabled: z.boolean().default(true),
      /** A session with at least this reward is a success. */
      success_min: z.number().min(0).max(1).default(0.7),
      /** A session with at most this reward is a failure. */
      failure_max: z.number().min(0).max(1).default(0.3),
      max_pairs_per_task: z.number().int().min(1).default(16),
    })
    .refine((c) => c.failure_max < c.success_min, { message: 'failure_max must be below success_min' })
    .prefault({}),
});

/** Sessions of one bucket file grouped by task, tasks in a stable order. */
export async function readTaskGroups(path: string): Promise<[string, SplitSession[]][]> {
  const groups = new Map<string, SplitSession[]>();
  for await (const s of readJsonl<SplitSession>(path)) {
    const group = groups.get(s.task_id!);
    if (group) group.push(s);
    else groups.set(s.task_id!, [s]);
  }
  return [...groups.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
}

export const pairs = defineStage({
  name: 'pairs',
  description: 'build preference pairs: successes against failures of the same task (outcome)',
  version: 1,
  inputs: ['split'],
  outputs: ['train.jsonl', 'test.jsonl', 'dropped.jsonl'],
  config,

  async run({ config: cfg, out, input, log }) {
    const splitDir = input('split');
    const info = await readSplitInfo(splitDir);
    await mkdir(out, { recursive: true });
    const dropped = new JsonlWriter(join(out, 'dropped.jsonl'));
    const counts: Record<string, number> = { train: 0, test: 0, tasks: 0, tasks_with_pairs: 0, tasks_without_success: 0, tasks_without_failure: 0, dropped: 0 };
    const o = cfg.outcome;
    for (const side of SPLITS) {
      const writer = new JsonlWriter(join(out, `${side}.jsonl`));
      const progress = log.progress(`pairs ${side}`, info.buckets);
      for (let b = 0; b < info.buckets; b++) {
        for (const [, sessions] of await readTaskGroups(bucketFile(splitDir, side, b))) {
          counts.tasks!++;
          if (!o.enabled) continue;
          if (!sessions.some((s) => s.reward >= o.success_min)) counts.tasks_without_success!++;
          if (!sessions.some((s) => s.reward <= o.failure_max)) counts.tasks_without_failure!++;
          const built = buildOutcomePairs(sessions, { successMin: o.success_min, failureMax: o.failure_max, maxPairsPerTask: o.max_pairs_per_task });
          if (built.pairs.length > 0) counts.tasks_with_pairs!++;
          for (const pair of built.pairs) await writer.write(pair);
          for (const d of built.dropped) await dropped.write(d);
          counts[side]! += built.pairs.length;
          counts.dropped! += built.dropped.length;
        }
        progress.tick();
      }
      progress.done();
      await writer.close();
    }
    await dropped.close();
    return {
      counts,
      summary:
        `${counts.train} train / ${counts.test} test outcome pairs from ${counts.tasks_with_pairs} of ${counts.tasks} tasks ` +
        `(${counts.tasks_without_success} without a success, ${counts.tasks_without_failure} without a failure, ${counts.dropped} pairs dropped)`,
    };
  },
});
