// The split stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
// A bucket file points at runs of ingest's lines rather than copying the sessions (store/runs.ts).
import { closeSync, existsSync, fstatSync, openSync, readSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { fnv1a, unitHash } from '../../pipeline/hash.ts';
import { JsonlWriter, LineBuffer } from '../../pipeline/jsonl.ts';
import { BufferShelf } from '../../pipeline/buffers.ts';
import { safePoint } from '../../pipeline/interrupt.ts';
import { forEachLine } from '../../pipeline/records.ts';
import { PipelineError } from '../../pipeline/errors.ts';
import { SPLITS, type Session, type Split, type SplitSession } from '../../core/records.ts';
import { joinFolders, ownsBucket, sameInEvery, sumCounts } from '../../pipeline/shards.ts';
import { bucketFile, bucketOf, readIngestIndex, readTaskRuns, taskRunsFile, type SplitInfo } from '../layout.ts';
import { leadingTaskId, sessionTail } from '../../store/session-line.ts';
import { sessionRunLine, sessionSegments, type SessionRun } from '../../store/runs.ts';
import { TaskMatcher, requestText } from './similarity.ts';

import type { ShardPart, StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

/** Up to 4M sessions a bucket holds split.bucket_size of them; beyond, buckets grow (and two files a bucket stay open while split writes). */
const MAX_BUCKETS = 1024;

/** What split's bucket files may hold on their way to disk, together (gathered, then in the writers' streams). */
const WRITE_BUFFERS = 16 << 20;

/** Tasks whose side and bucket split remembers, each in the slot its id's FNV-1a hash gives (a power of two). */
const PLACED_TASKS = 256;

/** A task id's slot among PLACED_TASKS. */
const slotOf = (task: string) => fnv1a(task) & (PLACED_TASKS - 1);

/**
 * The lines of an open segment (of its bytes `from` to `to`, which start and end lines), block by block:
 * each line's start and end in `bytes` (without its newline), two numbers a line in `lines`, and where
 * `bytes` starts in the file. A block is valid until the next is asked
 * for: it is read into again. Not readLineBlocks (pipeline/records.ts): a run needs where its lines lie in
 * the file, and a segment (never gzip, no byte order mark) is read faster with readSync in 4 MiB blocks than
 * through the thread pool in 1 MiB ones, on a stage that does nothing else meanwhile. Every segment is read
 * into the same buffer (`into`, grown where a line is longer): many small segments would otherwise each map
 * new memory.
 */
function* segmentLines(
  file: number,
  into: { buffer: Buffer },
  from = 0,
  to = Infinity,
): Generator<{ bytes: Buffer; base: number; lines: number[] }> {
  let { buffer } = into;
  let base = from;
  let held = 0;
  for (;;) {
    if (held === buffer.length) into.buffer = buffer = Buffer.concat([buffer, Buffer.allocUnsafeSlow(buffer.length)]);
    const bytesRead = readSync(file, buffer, held, Math.min(buffer.length - held, to - base - held), base + held);
    const filled = held + bytesRead;
    // A line is whole once its newline is read (or the range ends): a block ends after the last newline.
    const cut = bytesRead === 0 ? filled : buffer.lastIndexOf(10, filled - 1) + 1;
    if (cut > 0) {
      const bytes = buffer.subarray(0, cut);
      const lines: number[] = [];
      forEachLine(bytes, (start, end) => end > start && lines.push(start, end));
      yield { bytes, base, lines };
    }
    if (bytesRead === 0) return;
    buffer.copy(buffer, 0, cut, filled);
    base += cut;
    held = filled - cut;
  }
}

/** A segment open for reading while `use` runs. */
async function withSegment<T>(path: string, use: (file: number) => Promise<T>): Promise<T> {
  const file = openSync(path, 'r');
  try {
    return await use(file);
  } finally {
    closeSync(file);
  }
}

/**
 * The session of the line at `start` to `end` of a block of `segment` that starts at byte `base` of it; an
 * error names the segment and where the line starts.
 */
function parseSession(bytes: Buffer, start: number, end: number, segment: string, base: number): Session {
  try {
    return JSON.parse(bytes.toString('utf8', start, end)) as Session;
  } catch (error) {
    throw new PipelineError(
      `${segment}: the line at byte ${base + start} is not a session's JSON (${(error as Error).message}); ingest wrote it as one, so the file was changed or cut short since: run \`prefab stage ingest\` to read the input files again`,
    );
  }
}

/** A bucket file of split's, the block of lines being gathered for it, and the run of ingest's lines it is at. */
type BucketOut = { writer: JsonlWriter; lines: LineBuffer; run: SessionRun | null };

/**
 * On a shard, every session is still placed and every untasked one matched (a task is decided over all the
 * data), but only the buckets the shard owns are written and counted. A session with a task goes into its
 * bucket file as where its line lies in ingest's segment, consecutive lines of a segment that go to one
 * bucket file as one run: a run of one task's sessions is placed from the segment's tasks file (layout.ts
 * TaskRun) without reading them; a segment without one is read line by line, each task read from its line's
 * head. Only a session without a task is parsed, and written whole with the task it is given; where there
 * are some, every segment's lines are read first for the known tasks' requests they are matched against.
 */
export async function run({ config: cfg, out, input, log, signal, shard }: StageContext<Config>): Promise<StageReport> {
  const segments = await sessionSegments(input('ingest'));
  const reading = { buffer: Buffer.allocUnsafeSlow(4 << 20) };

  const index = (await readIngestIndex(input('ingest')))!;
  const total = index.files.reduce((n, f) => n + f.sessions, 0);
  const untasked = index.files.reduce((n, f) => n + f.untasked, 0);
  // Only when some sessions lack a task: one request text per known task, to match them against.
  const matcher = new TaskMatcher(cfg.untasked_similarity);
  if (untasked > 0) {
    const known = new Set<string>();
    for (const segment of segments) {
      await withSegment(segment, async (fd) => {
        for (const { bytes, base, lines } of segmentLines(fd, reading)) {
          for (let k = 0; k < lines.length; k += 2) {
            const start = lines[k]!;
            const end = lines[k + 1]!;
            const task = leadingTaskId(bytes, start, end);
            if (task === null || (task !== undefined && known.has(task))) continue;
            const s = parseSession(bytes, start, end, segment, base);
            if (s.task_id === null || known.has(s.task_id)) continue;
            known.add(s.task_id);
            matcher.add(s.task_id, requestText(s.messages));
          }
        }
      });
    }
  }

  // Pass 2: assign, split and bucket. Each bucket file's lines are gathered and written in blocks.
  const buckets = Math.min(MAX_BUCKETS, Math.max(1, Math.ceil(total / cfg.bucket_size)));
  await mkdir(join(out, 'sessions'), { recursive: true });
  // Per file, a block being gathered and up to two in its writer's stream: gathering goes on while the disk
  // writes, and 2,048 files (1,024 buckets) hold no more than the few that most runs have.
  const gather = Math.min(1 << 20, Math.max(8 << 10, Math.floor(WRITE_BUFFERS / (3 * 2 * buckets))));
  if (shard && shard.index >= buckets)
    log.warn(
      `shard ${shard.index}/${shard.count} owns none of the ${buckets} bucket(s): it has nothing to do; fewer shards, or a smaller split.bucket_size (${cfg.bucket_size} sessions a bucket now), share the work`,
    );
  const files = new Map<string, BucketOut>();
  // A block written is gathered into again (a few spare blocks serve every file).
  const shelf = new BufferShelf(16);
  for (const side of SPLITS)
    for (let b = 0; b < buckets; b++)
      if (ownsBucket(shard, b))
        files.set(`${side}/${b}`, {
          writer: new JsonlWriter(bucketFile(out, side, b), 'w', 2 * gather),
          lines: new LineBuffer(gather, shelf),
          run: null,
        });
  const flush = async (file: BucketOut) => {
    const count = file.lines.count;
    const block = file.lines.take();
    await file.writer.writeBlock(block, count, () => shelf.put(block.buffer as ArrayBuffer));
  };
  // A line that would not fit in the block being gathered starts the next one.
  const room = async (file: BucketOut, bytes: number) => {
    if (file.lines.length > 0 && file.lines.length + bytes > gather) await flush(file);
  };
  const endRun = async (file: BucketOut) => {
    if (!file.run) return;
    const line = sessionRunLine(file.run);
    file.run = null;
    await room(file, line.length);
    file.lines.push(line);
  };
  const counts = { train_sessions: 0, test_sessions: 0, matched_to_task: 0, new_groups: 0 };
  const progress = log.progress('split', total);
  // A task's side and bucket, worked out once (two hashes) for the sessions of it that come one after another,
  // and remembered in a slot of PLACED_TASKS for where a few tasks' sessions lie apart.
  type Placed = { task: string | null; side: Split; file: BucketOut | undefined };
  const slots: (Placed | undefined)[] = new Array(PLACED_TASKS).fill(undefined);
  let last: Placed = { task: null, side: 'train', file: undefined };
  const place = (taskId: string) => {
    if (last.task === taskId) return;
    const slot = slotOf(taskId);
    let placed = slots[slot];
    if (placed?.task !== taskId) {
      const side = unitHash(taskId, `split:${cfg.salt}`) < cfg.test_ratio ? 'test' : 'train';
      slots[slot] = placed = { task: taskId, side, file: files.get(`${side}/${bucketOf(taskId, buckets)}`) };
    }
    last = placed;
  };
  // Ingest's lines `from` to `to` of segment `name`, `sessions` of them, all of the task placed last and as
  // ingest wrote them (JSON objects ending in '}', their newlines included): pointed at, on the file's run
  // when they come straight after it in the same segment.
  const pointAt = async (name: string, from: number, to: number, sessions: number) => {
    const file = last.file;
    // Not this shard's bucket: no file was opened for it.
    if (!file) return;
    counts[last.side === 'train' ? 'train_sessions' : 'test_sessions'] += sessions;
    if (file.run && file.run.ingest === name && file.run.bytes[1] === from) {
      file.run.bytes[1] = to;
      file.run.sessions += sessions;
      return;
    }
    await endRun(file);
    file.run = { ingest: name, bytes: [from, to], sessions, split: last.side };
  };
  // A block of a segment's lines, each read for its task (and parsed where the head does not tell it, or
  // the session has none and is matched to one).
  const takeLines = async (
    { bytes, base, lines }: { bytes: Buffer; base: number; lines: number[] },
    segment: string,
    name: string,
  ) => {
    for (let k = 0; k < lines.length; k += 2) {
      const start = lines[k]!;
      const end = lines[k + 1]!;
      let s: Session | null = null;
      let taskMatch: SplitSession['task_match'] = null;
      let taskId = leadingTaskId(bytes, start, end);
      // A line read by its head is parsed all the same when it does not end as a JSON object: it is
      // written whole then, never with its last byte taken for a closing brace.
      if (taskId === undefined || bytes[end - 1] !== 0x7d)
        taskId = (s = parseSession(bytes, start, end, segment, base)).task_id;
      if (taskId === null) {
        s ??= parseSession(bytes, start, end, segment, base);
        const m = matcher.assign(requestText(s.messages));
        taskId = m.task_id;
        taskMatch = { score: m.score, kind: m.kind };
      }
      place(taskId);
      if (s === null && bytes[end] === 10) {
        await pointAt(name, base + start, base + end + 1, 1);
        continue;
      }
      const file = last.file;
      if (!file) continue;
      if (taskMatch) counts[taskMatch.kind === 'matched_task' ? 'matched_to_task' : 'new_groups']++;
      counts[last.side === 'train' ? 'train_sessions' : 'test_sessions']++;
      await endRun(file);
      await room(file, end - start + 64);
      // JSON.stringify of { ...s, split, task_match: null } when s is the line's session (the segment's last
      // line, without its newline), as the line ends in '}'.
      if (s === null) file.lines.pushBytes(bytes.subarray(start, end - 1), sessionTail(last.side));
      else
        file.lines.push(
          JSON.stringify({ ...s, task_id: taskId, split: last.side, task_match: taskMatch } satisfies SplitSession),
        );
    }
  };
  const stopped = () => 'split: stopped before it had put every session in its bucket; the next run does it again';
  const segmentBytes = new Map(index.files.map((f) => [f.segment, f.segment_bytes]));
  try {
    for (const segment of segments) {
      const name = basename(segment);
      const runsFile = taskRunsFile(input('ingest'), name);
      await withSegment(segment, async (fd) => {
        const size = fstatSync(fd).size;
        const written = segmentBytes.get(name);
        if (written !== undefined && written !== size)
          log.warn('a segment is not the size ingest wrote: its lines are read for their tasks, not its tasks file', {
            segment: name,
            bytes: size,
            written,
          });
        // An ingest from before tasks files, or a segment changed since: every line is read for its task.
        if (written !== size || !existsSync(runsFile)) {
          for (const block of segmentLines(fd, reading)) {
            await safePoint(signal, stopped);
            progress.tick(block.lines.length / 2);
            await takeLines(block, segment, name);
          }
          return;
        }
        // A run of one task is placed at once; only the sessions without a task are read (and matched).
        let at = 0;
        for await (const runs of readTaskRuns(runsFile)) {
          await safePoint(signal, stopped);
          for (const [task, sessions, bytes] of runs) {
            progress.tick(sessions);
            if (task === null) {
              // Many sessions without a task may follow one another (all of them, in some logs): a block at a time.
              for (const block of segmentLines(fd, reading, at, at + bytes)) {
                await safePoint(signal, stopped);
                await takeLines(block, segment, name);
              }
            } else {
              place(task);
              await pointAt(name, at, at + bytes, sessions);
            }
            at += bytes;
          }
        }
        if (at !== size)
          throw new PipelineError(
            `${runsFile}: its runs add up to ${at} bytes, and ${segment} has ${size}; ingest wrote them together, so one was changed since: run \`prefab stage ingest\``,
          );
      });
    }
    for (const file of files.values()) await endRun(file);
    progress.done();
    for (const file of files.values()) {
      if (file.lines.length > 0) await flush(file);
      await file.writer.close();
    }
  } catch (error) {
    // The stage failed (its folder is discarded): its bucket files are closed as they are.
    await Promise.allSettled([...files.values()].map((file) => file.writer.abort()));
    throw error;
  }
  await writeFile(join(out, 'info.json'), JSON.stringify({ buckets } satisfies SplitInfo) + '\n');
  return report({ ...counts, untasked, buckets });
}

function report(counts: Record<string, number>): StageReport {
  const c = counts as Record<
    'train_sessions' | 'test_sessions' | 'buckets' | 'untasked' | 'matched_to_task' | 'new_groups',
    number
  >;
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
  return report(
    sumCounts(
      parts.map((p) => p.counts),
      ['untasked', 'buckets'],
    ),
  );
}
