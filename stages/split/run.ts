// The split stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
// split: gives sessions without task_id a task by request similarity, then puts every task wholly on the
// train or the test side by a stable hash, in buckets by task so that pairing reads one bucket at a time.
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { unitHash } from '../../pipeline/hash.ts';
import { JsonlWriter, readLines } from '../../pipeline/jsonl.ts';
import { every, safePoint } from '../../pipeline/interrupt.ts';
import type { Session, Split, SplitSession } from '../../core/records.ts';
import { joinFolders, ownsBucket, sameInEvery, sumCounts } from '../../pipeline/shards.ts';
import { SPLITS, bucketFile, bucketOf, leadingTaskId, readIngestIndex, sessionSegments, type SplitInfo } from '../layout.ts';
import { TaskMatcher, requestText } from './similarity.ts';

import type { ShardPart, StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

/** Up to 4M sessions a bucket holds split.bucket_size of them; beyond, buckets grow (and two files a bucket stay open while split writes). */
const MAX_BUCKETS = 1024;

/** What split's bucket writers may hold on their way to disk, together. */
const WRITE_BUFFERS = 64 << 20;

/**
 * On a shard, every session is still read and every untasked one matched (a task is decided over all the
 * data), but only the buckets the shard owns are written and counted.
 */
export async function run({ config: cfg, out, input, log, signal, shard }: StageContext<Config>): Promise<StageReport> {
  const segments = await sessionSegments(input('ingest'));

  const index = (await readIngestIndex(input('ingest')))!;
  const total = index.files.reduce((n, f) => n + f.sessions, 0);
  const untasked = index.files.reduce((n, f) => n + f.untasked, 0);
  // Only when some sessions lack a task: one request text per known task, to match them against.
  const matcher = new TaskMatcher(cfg.untasked_similarity);
  if (untasked > 0) {
    const known = new Set<string>();
    for (const segment of segments) {
      for await (const { text } of readLines(segment)) {
        const task = leadingTaskId(text);
        if (task === null || (task !== undefined && known.has(task))) continue;
        const s = JSON.parse(text) as Session;
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
  const buffer = Math.min(1 << 20, Math.max(64 << 10, Math.floor(WRITE_BUFFERS / (2 * buckets))));
  for (const side of SPLITS) for (let b = 0; b < buckets; b++) if (ownsBucket(shard, b)) writers.set(`${side}/${b}`, new JsonlWriter(bucketFile(out, side, b), 'w', buffer));
  const counts = { train_sessions: 0, test_sessions: 0, matched_to_task: 0, new_groups: 0 };
  const progress = log.progress('split', total);
  const due = every(1000);
  const stopped = () => 'split: stopped before it had put every session in its bucket; the next run does it again';
  for (const segment of segments) {
    for await (const { text } of readLines(segment)) {
      if (text.length === 0) continue;
      if (due()) await safePoint(signal, stopped);
      progress.tick();
      // A session with a task is written as it was read, with its side appended; only one without is parsed.
      let s: Session | null = null;
      let taskMatch: SplitSession['task_match'] = null;
      let taskId = leadingTaskId(text);
      if (taskId === undefined) taskId = (s = JSON.parse(text) as Session).task_id;
      if (taskId === null) {
        s ??= JSON.parse(text) as Session;
        const m = matcher.assign(requestText(s.messages));
        taskId = m.task_id;
        taskMatch = { score: m.score, kind: m.kind };
      }
      const bucket = bucketOf(taskId, buckets);
      if (!ownsBucket(shard, bucket)) continue;
      if (taskMatch) counts[taskMatch.kind === 'matched_task' ? 'matched_to_task' : 'new_groups']++;
      const side: Split = unitHash(taskId, `split:${cfg.salt}`) < cfg.test_ratio ? 'test' : 'train';
      counts[`${side}_sessions`]++;
      const writer = writers.get(`${side}/${bucket}`)!;
      // JSON.stringify of { ...s, split, task_match: null } when s is the line's session, as the line ends in '}'.
      if (s === null) await writer.writeLine(`${text.slice(0, -1)},"split":"${side}","task_match":null}`);
      else await writer.write({ ...s, task_id: taskId, split: side, task_match: taskMatch } satisfies SplitSession);
    }
  }
  progress.done();
  for (const w of writers.values()) await w.close();
  await writeFile(join(out, 'info.json'), JSON.stringify({ buckets } satisfies SplitInfo) + '\n');
  return report({ ...counts, untasked, buckets });
}

function report(counts: Record<string, number>): StageReport {
  const c = counts as Record<'train_sessions' | 'test_sessions' | 'buckets' | 'untasked' | 'matched_to_task' | 'new_groups', number>;
  return {
    counts,
    summary:
      `${c.train_sessions} train / ${c.test_sessions} test sessions in ${c.buckets} bucket(s); ` +
      `${c.untasked} without task_id (${c.matched_to_task} matched to a task, ${c.new_groups} started new groups)`,
  };
}

/** The shards' bucket files side by side; the untasked and the bucket count are of all the data on every shard. */
export async function merge(parts: ShardPart[], out: string): Promise<StageReport> {
  await joinFolders(parts, 'sessions', out);
  await sameInEvery(parts, 'info.json', out);
  return report(sumCounts(parts.map((p) => p.counts), ['untasked', 'buckets']));
}
