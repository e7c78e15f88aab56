// The split stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
// split: gives sessions without task_id a task by request similarity, then puts every task wholly on the
// train or the test side by a stable hash, in buckets by task so that pairing reads one bucket at a time.
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { unitHash } from '../../pipeline/hash.ts';
import { JsonlWriter, readJsonl } from '../../pipeline/jsonl.ts';
import { every, safePoint } from '../../pipeline/interrupt.ts';
import type { Session, Split, SplitSession } from '../../core/records.ts';
import { SPLITS, bucketFile, readIngestIndex, sessionSegments, type SplitInfo } from '../layout.ts';
import { TaskMatcher, requestText } from './similarity.ts';

import type { StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

const MAX_BUCKETS = 128;

export async function run({ config: cfg, out, input, log, signal }: StageContext<Config>): Promise<StageReport> {
  const segments = await sessionSegments(input('ingest'));

  const index = (await readIngestIndex(input('ingest')))!;
  const total = index.files.reduce((n, f) => n + f.sessions, 0);
  const untasked = index.files.reduce((n, f) => n + f.untasked, 0);
  // Only when some sessions lack a task: one request text per known task, to match them against.
  const matcher = new TaskMatcher(cfg.untasked_similarity);
  if (untasked > 0) {
    const known = new Set<string>();
    for (const segment of segments) {
      for await (const s of readJsonl<Session>(segment)) {
        if (s.task_id === null || known.has(s.task_id)) continue;
        known.add(s.task_id);
        matcher.add(s.task_id, requestText(s.messages));
      }
    }
  }

  // Pass 2: assign, split and bucket.
  const buckets = Math.min(MAX_BUCKETS, Math.max(1, Math.ceil(total / cfg.bucket_size)));
  await mkdir(join(out, 'sessions'), { recursive: true });
  const writers = new Map<string, JsonlWriter>();
  for (const side of SPLITS) for (let b = 0; b < buckets; b++) writers.set(`${side}/${b}`, new JsonlWriter(bucketFile(out, side, b)));
  const counts = { train_sessions: 0, test_sessions: 0, matched_to_task: 0, new_groups: 0 };
  const progress = log.progress('split', total);
  const due = every(1000);
  const stopped = () => 'split: stopped before it had put every session in its bucket; the next run does it again';
  for (const segment of segments) {
    for await (const s of readJsonl<Session>(segment)) {
      if (due()) await safePoint(signal, stopped);
      progress.tick();
      let taskMatch: SplitSession['task_match'] = null;
      let taskId = s.task_id;
      if (taskId === null) {
        const m = matcher.assign(requestText(s.messages));
        taskId = m.task_id;
        taskMatch = { score: m.score, kind: m.kind };
        if (m.kind === 'matched_task') counts.matched_to_task++;
        else counts.new_groups++;
      }
      const side: Split = unitHash(taskId, `split:${cfg.salt}`) < cfg.test_ratio ? 'test' : 'train';
      const bucket = Math.floor(unitHash(taskId, 'bucket') * buckets);
      counts[`${side}_sessions`]++;
      await writers.get(`${side}/${bucket}`)!.write({ ...s, task_id: taskId, split: side, task_match: taskMatch } satisfies SplitSession);
    }
  }
  progress.done();
  for (const w of writers.values()) await w.close();
  await writeFile(join(out, 'info.json'), JSON.stringify({ buckets } satisfies SplitInfo) + '\n');
  return {
    counts: { ...counts, untasked, buckets },
    summary:
      `${counts.train_sessions} train / ${counts.test_sessions} test sessions in ${buckets} bucket(s); ` +
      `${untasked} without task_id (${counts.matched_to_task} matched to a task, ${counts.new_groups} started new groups)`,
  };
}
