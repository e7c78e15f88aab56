// What passes between stages on disk: the files one stage writes into its folder and a later one reads, by
// name and shape. The sessions those files hold or point at are read through the store (store/).
import { join } from 'node:path';
import { unitHash } from '../pipeline/hash.ts';
import { PipelineError } from '../pipeline/errors.ts';
import { readLines } from '../pipeline/jsonl.ts';
import { forEachLine, readLineBlocks } from '../pipeline/records.ts';
import { readJsonFile } from '../pipeline/workspace.ts';
import type { Message, Pair, Split } from '../core/records.ts';
import type { PairSide } from '../store/messages.ts';
import { SessionsById } from '../store/sessions-by-id.ts';
import { stringAt } from '../store/session-line.ts';

/** What index.json records of each ingested file. */
export interface IngestedFile {
  name: string;
  /** The file's content hash (pipeline/hash.ts `checksum`); `sha256:<hex>` for a file gone before it could be known so. */
  xxh64: string;
  /** Its SHA-256, in an index written before ingest knew files by XXH64 (ingest's run.ts upgrades such an index). */
  sha256?: string;
  segment: string;
  /** The segment's size as ingest wrote it, which its tasks file (TaskRun) adds up to; absent in an index from before tasks files. */
  segment_bytes?: number;
  sessions: number;
  /** Sessions without a task_id: split groups them by similarity. */
  untasked: number;
  quarantined: number;
  duplicates: number;
  /** Records with bytes that are not UTF-8 (kept, the bytes read as U+FFFD). */
  invalid_utf8?: number;
  /** Why reading the file stopped before its end (what came before is kept), or null. */
  damaged?: string | null;
  ingested_at: string;
}

export interface IngestIndex {
  /** Hash of everything in the config that changes how a record is read (not the input list). */
  reading_hash: string;
  files: IngestedFile[];
}

export function readIngestIndex(dir: string): Promise<IngestIndex | null> {
  return readJsonFile<IngestIndex>(join(dir, 'index.json'));
}

/**
 * A run of a segment's consecutive sessions of one task, as the segment's tasks file has it, a JSON array a
 * line: the task (null for sessions without one), how many sessions, and their lines' bytes (newlines
 * included). The runs follow the segment's lines in order and add up to its size, so split places a run at
 * once instead of reading each session's line for its task (a tasks file is a few hundredths of its segment).
 */
export type TaskRun = [task: string | null, sessions: number, bytes: number];

/** The tasks file of the segment `segment` (its name) in an ingest folder. */
export const taskRunsFile = (ingestDir: string, segment: string) => join(ingestDir, 'tasks', segment);

/**
 * The runs of a segment's tasks file, a block of 64 KiB (about 2,000 runs) at a time; an error names the
 * file and line. An ingest from before tasks files wrote none (split then reads the segment itself, as it
 * does a segment whose size is not the `segment_bytes` the index has).
 */
export async function* readTaskRuns(path: string): AsyncGenerator<TaskRun[]> {
  for await (const read of readLineBlocks(path, 64 << 10)) {
    if ('damaged' in read) throw new PipelineError(`${path}: ${read.damaged}`); // (a .gz file's damage: never a tasks file's)
    const block = Buffer.from(read.bytes.buffer, read.bytes.byteOffset, read.bytes.byteLength);
    const runs: TaskRun[] = [];
    let line = read.firstLine;
    forEachLine(block, (start, end) => {
      const run = parseTaskRun(block.toString('utf8', start, end));
      if (!run)
        throw new PipelineError(
          `${path} line ${line}: not a task run ([task, sessions, bytes]); ingest wrote it as one, so the file was changed since: run \`prefab stage ingest\``,
        );
      runs.push(run);
      line++;
    });
    yield runs;
  }
}

function parseTaskRun(text: string): TaskRun | null {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return null;
  }
  if (!Array.isArray(value) || value.length !== 3) return null;
  const [task, sessions, bytes] = value as unknown[];
  const count = (n: unknown) => Number.isSafeInteger(n) && (n as number) > 0;
  return (task === null || typeof task === 'string') && count(sessions) && count(bytes) ? (value as TaskRun) : null;
}

/** The bucket file of `split` number `bucket`: a task's sessions are all in one bucket. */
export function bucketFile(dir: string, split: Split, bucket: number): string {
  return join(dir, 'sessions', `${split}-${String(bucket).padStart(3, '0')}.jsonl`);
}

/** Buckets a stage works before worker threads pay for starting (for workerCount; `--workers` overrides). */
export const MANY_BUCKETS = 4;

/** The bucket of a task, of `buckets`: by a stable hash, so a task's sessions always share one. */
export const bucketOf = (taskId: string, buckets: number) => Math.floor(unitHash(taskId, 'bucket') * buckets);

/** bucketOf for records that come a task's after another's (a task's pairs, as stages write them): worked out once a task. */
export function taskBuckets(buckets: number): (taskId: string) => number {
  let task: string | null = null;
  let bucket = -1;
  return (taskId) => (taskId === task ? bucket : (bucket = bucketOf((task = taskId), buckets)));
}

export interface SplitInfo {
  buckets: number;
}

export async function readSplitInfo(splitDir: string): Promise<SplitInfo> {
  return (await readJsonFile<SplitInfo>(join(splitDir, 'info.json')))!;
}

/** Where split's sessions are read from: its folder, and ingest's, whose segments its bucket files point into. */
export interface SplitFolders {
  split: string;
  ingest: string;
}

/** What the judge stage needs to know of how pairs were made. */
export interface PairsInfo {
  must_decline: string[];
  /** The model that wrote hard negatives, or null when the rewriter is off. */
  rewriter_model: string | null;
}

export const readPairsInfo = (dir: string) => readJsonFile<PairsInfo>(join(dir, 'info.json'));

/** A pair record (of the pairs, judge or gate stage) with its sides made whole. */
export type WholePair<P extends Pair<PairSide>> = Omit<P, 'prompt' | 'chosen' | 'rejected'> & Pair;

/** A pair record as its file holds it, and made whole. */
export interface ReadPair<P extends Pair<PairSide>> {
  stored: P;
  whole: WholePair<P>;
  /** The tools the agent had in the first session a side points into (StoredSession.toolsJson), or null. */
  tools: string | null;
}

const PAIR_TASK = Buffer.from(',"task_id":');

/**
 * The task_id of a pair's line at `start` to `end` of `bytes`, as the pairs stage writes it: read where
 * `,"task_id":` first is (no string holds a bare quote, and no message a task_id), the line parsed whole
 * otherwise.
 */
export function pairTaskId(bytes: Buffer, start: number, end: number): string | null {
  const at = bytes.indexOf(PAIR_TASK, start);
  const task = at >= 0 && at < end ? stringAt(bytes, at + PAIR_TASK.length, end) : undefined;
  return task ?? (JSON.parse(bytes.toString('utf8', start, end)) as Pick<Pair, 'task_id'>).task_id;
}

/**
 * The pair records of a file of the pairs, judge or gate stage (`lines`: the file's, or those of it a thread
 * is given), each as stored and with its sides made whole: a side that points at a session's messages is
 * read from split's bucket file of the pair's task and side (in `folders`, `buckets` of them), through
 * `shared` where a thread reads pieces of a file one after another (the bucket it last indexed is kept). The
 * pairs stage writes its pairs bucket by bucket, and the judge and gate keep that order, so one bucket file
 * at a time is indexed (SessionsById). A session's messages are shared by the pairs that take them while it
 * is kept: read them, do not change them.
 */
export async function* readPairs<P extends Pair<PairSide>>(
  file: string,
  folders: SplitFolders,
  buckets: number,
  lines: AsyncIterable<{ line: number; text: string }> | Iterable<{ line: number; text: string }> = readLines(file),
  shared?: SessionsById,
): AsyncGenerator<ReadPair<P>> {
  const sessions = shared ?? new SessionsById(folders.ingest);
  const bucketOfTask = taskBuckets(buckets);
  try {
    for await (const { line, text } of lines) {
      if (text.length === 0) continue;
      const pair = JSON.parse(text) as P;
      let tools: string | null = null;
      const whole = (side: PairSide): Message[] => {
        if (Array.isArray(side)) return side;
        const [from, to] = side.messages;
        const bucket = bucketFile(folders.split, pair.split, bucketOfTask(pair.task_id!));
        const session = sessions.get(bucket, side.session_id);
        if (
          !session ||
          !(Number.isInteger(from) && Number.isInteger(to) && 0 <= from && from < to && to <= session.messages.length)
        ) {
          const what = session
            ? `has ${session.messages.length} messages, not messages ${from} to ${to}`
            : 'is not there';
          throw new PipelineError(
            `${file} line ${line}: pair ${pair.pair_id} points at session ${side.session_id} in ${bucket}, which ${what}; these pairs were made from another split: run \`prefab stage pairs\` to make them again`,
          );
        }
        tools ??= session.toolsJson;
        return session.messages.slice(from, to).all();
      };
      // Spread, so the record keeps its fields' order.
      const made = { ...pair, prompt: whole(pair.prompt), chosen: whole(pair.chosen), rejected: whole(pair.rejected) };
      yield { stored: pair, whole: made, tools };
    }
  } finally {
    if (!shared) sessions.close();
  }
}
