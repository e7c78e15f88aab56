// What passes between stages on disk: the files one stage writes into its folder and a later one reads.
// A stage reads another's output only through this module, never through the other stage's code.
import { closeSync, fstatSync, openSync, readSync, statSync } from 'node:fs';
import { open, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { fnv1a, unitHash } from '../pipeline/hash.ts';
import { PipelineError } from '../pipeline/errors.ts';
import { LineBuffer, readLines } from '../pipeline/jsonl.ts';
import { NumberList } from '../pipeline/buffers.ts';
import { forEachLine, holdsAt, jsonStringEnd, readLineBlocks } from '../pipeline/records.ts';
import { readJsonFile } from '../pipeline/workspace.ts';
import { sameMessage, type Message, type Pair, type Role, type Split, type SplitSession } from '../core/records.ts';

// ── ingest: sessions/<segment>.jsonl, one segment per input file, and index.json ──

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

/** A JSON string literal (quotes included) of `bytes`, decoded: parsed only when it holds an escape. */
function decodeString(bytes: Buffer, from: number, to: number): string {
  for (let i = from + 1; i < to - 1; i++) if (bytes[i] === 92) return JSON.parse(bytes.toString('utf8', from, to)) as string;
  return bytes.toString('utf8', from + 1, to - 1);
}

const HEAD = Buffer.from('{"session_id":"');
const TASK = Buffer.from(',"task_id":');
const NULL = Buffer.from('null,');

/**
 * The head of a session's line as ingest writes it (JSON.stringify of a Session: session_id first, then
 * task_id), in the line at `start` to `end` of `bytes`: where its session_id's JSON string ends (`idEnd`) and
 * its task_id's value starts (`task`); null for a line that does not start so.
 */
function headOf(bytes: Buffer, start: number, end: number): { idEnd: number; task: number } | null {
  if (!holdsAt(bytes, start, HEAD)) return null;
  const idEnd = jsonStringEnd(bytes, start + HEAD.length - 1, end);
  return idEnd < 0 || !holdsAt(bytes, idEnd, TASK) ? null : { idEnd, task: idEnd + TASK.length };
}

/**
 * The task_id of a session's line as ingest writes it, read from the line's head (headOf) without parsing
 * the rest; undefined for a line that does not start so.
 */
export function leadingTaskId(bytes: Buffer, start = 0, end = bytes.length): string | null | undefined {
  const head = headOf(bytes, start, end);
  if (!head) return undefined;
  return holdsAt(bytes, head.task, NULL) ? null : stringAt(bytes, head.task, end);
}

/** The JSON string that starts at `at` (its opening quote) and ends by `end`, decoded; undefined where there is none. */
function stringAt(bytes: Buffer, at: number, end: number): string | undefined {
  if (bytes[at] !== 34) return undefined;
  const close = jsonStringEnd(bytes, at, end);
  return close < 0 ? undefined : decodeString(bytes, at, close);
}

/** The segment files of an ingest folder, in ingestion order. */
export async function sessionSegments(ingestDir: string): Promise<string[]> {
  return (await readdir(join(ingestDir, 'sessions'))).sort().map((f) => join(ingestDir, 'sessions', f));
}

// ── ingest: tasks/<segment>.jsonl, a segment's sessions' tasks ──

/**
 * A run of a segment's consecutive sessions of one task, as the segment's tasks file has it, a JSON array a
 * line: the task (null for sessions without one), how many sessions, and their lines' bytes (newlines
 * included). The runs follow the segment's lines in order and add up to its size, so split places a run at
 * once instead of reading each session's line for its task: the simulator's 100k sessions are 421 MB of
 * segment and 25,000 runs in 725 KB.
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
      if (!run) throw new PipelineError(`${path} line ${line}: not a task run ([task, sessions, bytes]); ingest wrote it as one, so the file was changed since: run \`prefab stage ingest\``);
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

// ── split (and sample, which writes the same layout): sessions/<side>-<bucket>.jsonl and info.json ──
// A bucket file of split's does not copy its sessions: a line of it points at a run of ingest's lines (a
// SessionRun), and only a session split gave a task (so changed) is written whole. A bucket file of sample's
// holds its sampled sessions whole. StoredBucketReader reads either as one line a whole SplitSession.

export const SPLITS: readonly Split[] = ['train', 'test'];

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

/**
 * A line of split's bucket file that stands for `sessions` lines of ingest's segment `ingest` (in its
 * sessions/ folder), bytes `bytes[0]` to `bytes[1]` of it (their newlines included): each read as the
 * session with `"split":<split>,"task_match":null` added, as a session with a task is (sessionTail).
 */
export interface SessionRun {
  ingest: string;
  bytes: [from: number, to: number];
  sessions: number;
  split: Split;
}

/** The line of a run: JSON.stringify of it, its fields in SessionRun's order (written out: split writes one every few sessions). */
export const sessionRunLine = (run: SessionRun): string =>
  `{"ingest":${JSON.stringify(run.ingest)},"bytes":[${run.bytes[0]},${run.bytes[1]}],"sessions":${run.sessions},"split":${JSON.stringify(run.split)}}`;

/**
 * What ends the line of a split session that had its task, in place of the closing brace of the line ingest
 * wrote: JSON.stringify of { ...session, split, task_match: null }.
 */
export const sessionTail = (split: Split): Buffer => SESSION_TAILS[split];
const SESSION_TAILS: Record<Split, Buffer> = { train: Buffer.from(',"split":"train","task_match":null}'), test: Buffer.from(',"split":"test","task_match":null}') };
const SESSION_TAIL_TEXT: Record<Split, string> = { train: SESSION_TAILS.train.toString(), test: SESSION_TAILS.test.toString() };

/** A session's line (`start` to `end` of `bytes`) as `sessions` gives it: a run's with its side's `tail` in place of its closing brace. */
function pushSessionLine(out: LineBuffer, bytes: Buffer, start: number, end: number, tail: Buffer | null): void {
  if (tail) out.pushBytes(bytes.subarray(start, end - 1), tail);
  else out.pushBytes(bytes.subarray(start, end));
}

const RUN_HEAD = Buffer.from('{"ingest":');
const RUN_BYTES = Buffer.from('","bytes":[');
const RUN_SESSIONS = Buffer.from('],"sessions":');
const RUN_SPLIT = Buffer.from(',"split":"');
const RUN_ENDS = SPLITS.map((side) => Buffer.from(`${side}"}`));

/** The segment the last run read named, its bytes and its name: a bucket's runs name a few segments, mostly one. */
let lastSegment = { bytes: Buffer.alloc(0), name: '' };

/**
 * A run line as split writes it (sessionRunLine), read where its bytes lie; null for any other shape (then
 * parsed). At a million runs (a task's sessions apart, a run a session) 0.6 s went to a string of each line
 * and a regular expression.
 */
function runOfShape(bytes: Buffer, start: number, end: number): Partial<SessionRun> | null {
  let at = start + RUN_HEAD.length;
  if (bytes[at++] !== 34) return null;
  const nameStart = at;
  // A name ends at its quote, and holds no backslash (an escape) or slash.
  while (at < end && bytes[at] !== 34 && bytes[at] !== 92 && bytes[at] !== 47) at++;
  if (at === nameStart || !holdsAt(bytes, at, RUN_BYTES)) return null;
  const nameEnd = at;
  // A count: its digits, or -1 for none.
  const count = () => {
    const first = at;
    let n = 0;
    for (; at < end && bytes[at]! >= 48 && bytes[at]! <= 57; at++) n = 10 * n + bytes[at]! - 48;
    return at > first ? n : -1;
  };
  at += RUN_BYTES.length;
  const from = count();
  if (bytes[at++] !== 44) return null;
  const to = count();
  if (!holdsAt(bytes, at, RUN_SESSIONS)) return null;
  at += RUN_SESSIONS.length;
  const sessions = count();
  if (!holdsAt(bytes, at, RUN_SPLIT)) return null;
  at += RUN_SPLIT.length;
  const side = RUN_ENDS.findIndex((tail) => at + tail.length === end && holdsAt(bytes, at, tail));
  if (from < 0 || to < 0 || sessions < 0 || side < 0) return null;
  if (bytes.compare(lastSegment.bytes, 0, lastSegment.bytes.length, nameStart, nameEnd) !== 0) {
    lastSegment = { bytes: Buffer.from(bytes.subarray(nameStart, nameEnd)), name: bytes.toString('latin1', nameStart, nameEnd) };
  }
  return { ingest: lastSegment.name, bytes: [from, to], sessions, split: SPLITS[side] };
}

/** The SessionRun of a bucket line that starts as one (read by its fixed shape, or parsed); an error names the line. */
function readSessionRun(bytes: Buffer, start: number, end: number, path: string, line: number): SessionRun {
  let run = runOfShape(bytes, start, end);
  if (!run) {
    try {
      run = JSON.parse(bytes.toString('utf8', start, end)) as Partial<SessionRun>;
    } catch {
      run = {}; // reported below
    }
  }
  const [from, to] = Array.isArray(run.bytes) ? run.bytes : [];
  const count = (n: unknown): n is number => Number.isSafeInteger(n) && (n as number) >= 0;
  // A session's line is at least `{}` and its newline.
  const fits = count(from) && count(to) && count(run.sessions) && run.sessions > 0 && 3 * run.sessions <= to - from;
  if (typeof run.ingest === 'string' && run.ingest !== '..' && !/[/\\]/.test(run.ingest) && fits && (run.split === 'train' || run.split === 'test')) {
    return { ingest: run.ingest, bytes: [from!, to!], sessions: run.sessions!, split: run.split };
  }
  throw new PipelineError(`${whereOf(path, line)}: not a run of ingest's sessions ({"ingest":<segment>,"bytes":[from,to],"sessions":n,"split":"train"|"test"}) nor a session; run \`prefab stage split\` to write split's buckets again`);
}

/**
 * Which of a task's sessions readTaskGroups keeps: the first `most` in the bucket's order, or (`byId`) the
 * `most` whose ids come first.
 */
export interface TaskCut {
  most: number;
  byId?: boolean;
}

/**
 * Sessions of one bucket file grouped by task, tasks in a stable order, each task's cut to what `cut` keeps
 * (runs of ingest's sessions read from `ingestDir`, through `reader`: a stage reading bucket after bucket
 * passes the same one). The bucket is read a block at a time, and only the sessions kept are held (a task of
 * 500,000 sessions, parsed whole, took gigabytes).
 */
export function readTaskGroups(path: string, ingestDir: string, reader = new StoredBucketReader(), cut: TaskCut = { most: Infinity }): [string, SplitSession[]][] {
  const groups = new Map<string, { id: string; text: string }[]>();
  const sources: SpanSource[] = [null];
  reader.eachSession(
    path,
    ingestDir,
    (bytes, start, end, source) => {
      const task = taskOfLine(bytes, start, end);
      let group = groups.get(task);
      if (!group) groups.set(task, (group = []));
      if (group.length >= cut.most && !cut.byId) return;
      const id = cut.byId ? leadingSessionId(bytes, start, end) : '';
      if (group.length >= cut.most && !(id < group.at(-1)!.id)) return;
      const s = sources[source];
      const text = s ? bytes.toString('utf8', start, end - 1) + SESSION_TAIL_TEXT[s.split] : bytes.toString('utf8', start, end);
      // Kept in the order of their ids (byId: ids are unique), or of the bucket.
      let at = group.length;
      if (cut.byId) while (at > 0 && id < group[at - 1]!.id) at--;
      group.splice(at, 0, { id, text });
      if (group.length > cut.most) group.pop();
    },
    sources,
  );
  return byTask(groups).map(([task, kept]) => [task, kept.map((k) => JSON.parse(k.text) as SplitSession)]);
}

/**
 * The sessions of one bucket file, parsed one at a time (runs of ingest's sessions read from `ingestDir`,
 * through `reader`, which is not to read anything else until they are all given): read at once where they
 * take at most `heldBytes` (HELD_BUCKET); otherwise where each lies is read first (three numbers a session),
 * then the sessions a MiB at a time.
 */
export async function* readBucketSessions(path: string, ingestDir: string, reader = new StoredBucketReader(), heldBytes = HELD_BUCKET): AsyncGenerator<SplitSession> {
  // Read at once: a few runs a bucket, not a read a MiB of sessions and their places first.
  if (reader.sessionBytes(path, ingestDir) <= heldBytes) return yield* parsedLines(await reader.sessions(path, ingestDir));
  const sources: SpanSource[] = [null];
  const at = new NumberList();
  reader.eachSession(
    path,
    ingestDir,
    (_bytes, _start, _end, source, from, to) => {
      at.push(source);
      at.push(from);
      at.push(to);
    },
    sources,
  );
  const spans = spansOf(sources, at.view(), BUCKET_BLOCK);
  for (let q = 0; q < spans.length / 4; ) {
    let [r, size] = [q + 1, spanBytes(spans, q, sources)];
    while (r < spans.length / 4 && size + spanBytes(spans, r, sources) <= BUCKET_BLOCK) size += spanBytes(spans, r++, sources);
    yield* parsedLines(reader.readSpans(path, ingestDir, { sources }, spans, q, r).bytes);
    q = r;
  }
}

/** The sessions of lines a bucket's reader gave, parsed one at a time (the lines found first: the buffer is the reader's). */
function* parsedLines(bytes: Buffer): Generator<SplitSession> {
  const lines: number[] = [];
  forEachLine(bytes, (start, end) => end > start && lines.push(start, end));
  for (let k = 0; k < lines.length; k += 2) yield JSON.parse(bytes.toString('utf8', lines[k], lines[k + 1])) as SplitSession;
}

/** Groups' entries in a stable order: by task id. */
const byTask = <T>(groups: Map<string, T>): [string, T][] => [...groups.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));

// ── a bucket's sessions with their messages as stored: the JSON ingest wrote, read only as far as needed ──

/**
 * A conversation's messages kept as the JSON they were stored as, and read only as far as asked: a message's
 * role without parsing it, a message parsed once when first asked for, a run of messages written out as the
 * bytes it was read from. Ingest writes each message as JSON.stringify of its Message (split's buckets point
 * at those bytes, merge links them), so equal bytes are equal messages. Messages made anew (a rewritten turn) are kept as objects.
 */
export class StoredMessages {
  private constructor(
    /** The bytes the messages were read from, or null for messages made anew. */
    private readonly line: Buffer | null,
    /** Per message of `line`: where its JSON starts and ends. */
    private readonly starts: readonly number[],
    private readonly ends: readonly number[],
    private readonly roles: readonly Role[],
    /** Per message: the message, once parsed (all of them for messages made anew). */
    private readonly parsed: (Message | undefined)[],
    /** This list is messages first … first + length - 1 of the arrays (a slice shares them). */
    private readonly first: number,
    readonly length: number,
    /** The id of the stored session whose messages these are, or null for messages made anew. */
    readonly session: string | null,
    /** JSON.stringify of `session`, worked out once a session rather than once a pair side. */
    readonly sessionJson: string,
  ) {}

  /** Messages kept as they are: made anew, or (`session`) a stored session's, parsed whole. */
  static of(messages: Message[], session: string | null = null): StoredMessages {
    return new StoredMessages(null, [], [], messages.map((m) => m.role), messages, 0, messages.length, session, JSON.stringify(session));
  }

  /** The messages of stored session `session` whose JSON lies at `starts[i]` to `ends[i]` of `line`. */
  static read(line: Buffer, starts: number[], ends: number[], roles: Role[], session: string, sessionJson: string): StoredMessages {
    return new StoredMessages(line, starts, ends, roles, new Array<Message | undefined>(starts.length), 0, starts.length, session, sessionJson);
  }

  role(i: number): Role {
    return this.roles[this.first + i]!;
  }

  at(i: number): Message {
    const k = this.first + i;
    return (this.parsed[k] ??= JSON.parse(this.line!.toString('utf8', this.starts[k], this.ends[k])) as Message);
  }

  all(): Message[] {
    return Array.from({ length: this.length }, (_, i) => this.at(i));
  }

  /** Messages `from` to `to` - 1, sharing what is read and parsed. */
  slice(from: number, to = this.length): StoredMessages {
    return new StoredMessages(this.line, this.starts, this.ends, this.roles, this.parsed, this.first + from, Math.max(0, to - from), this.session, this.sessionJson);
  }

  /** Whether message `i` calls tools: told by its bytes (ingest writes no empty tool_calls), or by the message. */
  hasToolCalls(i: number): boolean {
    const k = this.first + i;
    if (!this.line) return (this.at(i).tool_calls?.length ?? 0) > 0;
    return this.line.subarray(this.starts[k], this.ends[k]).includes(TOOL_CALLS);
  }

  /**
   * The arguments of message `i`'s tool calls, in order, as their JSON text (none for a message without
   * calls). A stored message's are read from its bytes, only their strings decoded, where its calls are
   * written as ingest writes them (`{"id":…,"type":"function","function":{"name":…,"arguments":…}}`, one
   * after another); any other shape is parsed. The hallucination transform reads every call of a session,
   * and parsing each of their messages whole took it 10 of its 24 µs at the simulator's sessions.
   */
  callArguments(i: number): string[] {
    const k = this.first + i;
    if (!this.line || this.parsed[k]) return this.at(i).tool_calls?.map((c) => c.function.arguments) ?? [];
    const [line, end] = [this.line, this.ends[k]!];
    const opens = line.indexOf(TOOL_CALLS, this.starts[k]);
    if (opens < 0 || opens >= end) return [];
    const found: string[] = [];
    // At each call's `{`: its id, name and arguments, each a string that ends at its closing quote.
    for (let at = opens + TOOL_CALLS.length - 1; ; ) {
      const id = holdsAt(line, at, CALL_ID) ? jsonStringEnd(line, at + CALL_ID.length - 1, end) : -1;
      const name = holdsAt(line, id, CALL_NAME) ? jsonStringEnd(line, id + CALL_NAME.length - 1, end) : -1;
      const args = holdsAt(line, name, CALL_ARGUMENTS) ? name + CALL_ARGUMENTS.length - 1 : -1;
      const close = args < 0 ? -1 : jsonStringEnd(line, args, end);
      if (close < 0 || line[close] !== 125 || line[close + 1] !== 125) break;
      found.push(JSON.parse(line.toString('utf8', args, close)) as string);
      if (line[close + 2] === 93) return found; // `]`: the last call
      if (line[close + 2] !== 44) break;
      at = close + 3;
    }
    return this.at(i).tool_calls?.map((c) => c.function.arguments) ?? [];
  }

  /** Indices of the messages of `role`. */
  indicesOf(role: Role): number[] {
    const found: number[] = [];
    for (let i = 0; i < this.length; i++) if (this.role(i) === role) found.push(i);
    return found;
  }

  /** Whether message `i` is message `j` of `other`: their bytes compared, or the messages where one was made anew. */
  same(i: number, other: StoredMessages, j: number): boolean {
    if (!this.line || !other.line) return sameMessage(this.at(i), other.at(j));
    const [a, b] = [this.first + i, other.first + j];
    return this.line.compare(other.line, other.starts[b], other.ends[b], this.starts[a], this.ends[a]) === 0;
  }

  /** Whether the JSON of these messages holds `ascii` (ASCII text: its bytes are the same in UTF-8 and UTF-16). */
  jsonIncludes(ascii: string): boolean {
    if (!this.line) return JSON.stringify(this.all()).includes(ascii);
    return this.length > 0 && this.line.subarray(this.starts[this.first], this.ends[this.first + this.length - 1]).includes(ascii);
  }

  /**
   * These messages as a side of a pair (a PairSide), as JSON: a stored session's as where they lie in it,
   * `{"session_id":…,"messages":[from,to]}`; messages made anew (or none) as their array.
   */
  sideJson(): string {
    if (this.session === null) return JSON.stringify(this.parsed.slice(this.first, this.first + this.length));
    return this.length === 0 ? '[]' : `{"session_id":${this.sessionJson},"messages":[${this.first},${this.first + this.length}]}`;
  }
}

/**
 * A split session as the pairs stage reads it from its bucket line: what it pairs by (id, task, reward,
 * side), its messages as stored, and its metadata as the JSON string literal the line holds, parsed only
 * when asked for.
 */
export class StoredSession {
  constructor(
    readonly session_id: string,
    readonly task_id: string,
    readonly reward: number,
    readonly split: Split,
    /** The metadata as a JSON string literal (quotes included), as JSON.stringify of the session wrote it. */
    private readonly metadataJson: Buffer,
    /** The messages of a session parsed whole, or where its line holds them, found when first asked for (readStoredSession). */
    messages: StoredMessages | MessageList,
  ) {
    if (messages instanceof StoredMessages) this.read = messages;
    else this.list = messages;
  }

  private read: StoredMessages | null = null;
  private readonly list: MessageList | null = null;

  /**
   * The messages, found in the line when first asked for: a task's sessions are all read to be paired, but
   * of a large task's failures only the few its outcome pairs take are asked for their messages, and what is
   * made of a session's messages is done with as soon as its hard negatives are written.
   */
  get messages(): StoredMessages {
    return (this.read ??= storedMessages(this.list!, this));
  }

  /** Lets go of what was made of the messages (they are found again if asked for): a large task's sessions outlive their pairs. */
  forgetMessages(): void {
    if (this.list) this.read = null;
  }

  /** JSON.stringify of the session's id, worked out when first asked for (every pair of the session writes it). */
  get idJson(): string {
    return (this.idJsonMade ??= JSON.stringify(this.session_id));
  }

  private idJsonMade: string | undefined;

  /** JSON.stringify of the task id, worked out when first asked for (every pair of the session writes it). */
  get taskJson(): string {
    return (this.taskJsonMade ??= JSON.stringify(this.task_id));
  }

  private taskJsonMade: string | undefined;

  /** The split session of a line read whole. */
  static of(s: SplitSession): StoredSession {
    return new StoredSession(s.session_id, s.task_id!, s.reward, s.split, Buffer.from(JSON.stringify(s.metadata)), StoredMessages.of(s.messages, s.session_id));
  }

  /** Every other field of the input record, as a JSON string. */
  get metadata(): string {
    return JSON.parse(this.metadataJson.toString('utf8')) as string;
  }

  /**
   * Whether the metadata may hold `ascii` (ASCII text without a quote or a backslash), told from its JSON
   * without parsing it: false only when it cannot (neither the text nor a \u escape, which could spell it, is
   * in the JSON).
   */
  metadataMayHold(ascii: string): boolean {
    // One pass of a loop: metadata is short, and two native searches took longer to call than to run.
    const json = this.metadataJson;
    const first = ascii.charCodeAt(0);
    next: for (let i = 0; i < json.length; i++) {
      if (json[i] === 92 && json[i + 1] === 117) return true; // \u
      if (json[i] !== first) continue;
      for (let j = 1; j < ascii.length; j++) if (json[i + j] !== ascii.charCodeAt(j)) continue next;
      return true;
    }
    return false;
  }

  /** Appends the metadata, as JSON, to `out`. */
  writeMetadata(out: LineBuffer): void {
    out.writeBytes(this.metadataJson);
  }
}

const TOOL_CALLS = Buffer.from(',"tool_calls":[{');
const CALL_ID = Buffer.from('{"id":"');
const CALL_NAME = Buffer.from(',"type":"function","function":{"name":"');
const CALL_ARGUMENTS = Buffer.from(',"arguments":"');
const MESSAGES = Buffer.from(',"messages":[');
const MESSAGE = Buffer.from('{"role":"');
const MESSAGES_END = Buffer.from('],"reward":');
const FEEDBACK = Buffer.from(',"feedback":');
const METADATA = Buffer.from(',"metadata":');
const SPLIT = Buffer.from(',"split":"');
const ROLE_BY_FIRST_BYTE: Record<number, Role> = { 115: 'system', 117: 'user', 97: 'assistant', 116: 'tool' };

/**
 * A session line of a bucket file read without parsing its messages or most of its fields. The line is
 * JSON.stringify of a SplitSession, its fields in a fixed order (session_id, task_id, messages, reward,
 * feedback, model, source, created_at, metadata, split, task_match), and no string in it holds an unescaped
 * quote: so `{"role":"` opens a message, `],"reward":` closes the list, and each `,"field":` is found where it
 * is, nothing else looking like it. A line not shaped so is parsed whole. Its messages are found when first
 * asked for (storedMessages).
 */
export function readStoredSession(line: Buffer): StoredSession {
  const open = line.indexOf(MESSAGES);
  const [close, feedback] = rewardAt(line, 0, line.length);
  const metadata = line.lastIndexOf(METADATA);
  const split = line.lastIndexOf(SPLIT);
  const side = split < 0 ? '' : line.toString('latin1', split + SPLIT.length, line.indexOf(34, split + SPLIT.length));
  // The list opens with a message and closes after one: its messages lie between.
  if (open < 0 || close < 0 || !holdsAt(line, open + MESSAGES.length, MESSAGE) || line[close - 1] !== 125 || feedback < 0 || metadata < feedback || split < metadata || (side !== 'train' && side !== 'test')) {
    return StoredSession.of(JSON.parse(line.toString('utf8')) as SplitSession);
  }
  // The head read as its two strings (split gave every session a task, its string ending where messages start).
  const at = headOf(line, 0, open);
  const head =
    at && line[at.task] === 34 && jsonStringEnd(line, at.task, open) === open
      ? { session_id: decodeString(line, HEAD.length - 1, at.idEnd), task_id: decodeString(line, at.task, open) }
      : (JSON.parse(`${line.toString('utf8', 0, open)}}`) as { session_id: string; task_id: string });
  const reward = JSON.parse(line.toString('latin1', close + MESSAGES_END.length, feedback)) as number;
  return new StoredSession(head.session_id, head.task_id, reward, side, line.subarray(metadata + METADATA.length, split), { line, open, close });
}

/**
 * Where the session line at `start` to `end` of `bytes` holds its reward: after its last `],"reward":`
 * (`close`; found from the end, past the few fields after it rather than every message, and nothing else can
 * look like it: a string holds no bare quote), up to the `,"feedback":` after it. -1 for either not there.
 */
function rewardAt(bytes: Buffer, start: number, end: number): [close: number, feedback: number] {
  const close = bytes.lastIndexOf(MESSAGES_END, end - MESSAGES_END.length);
  if (close < start) return [-1, -1];
  const feedback = bytes.indexOf(FEEDBACK, close);
  return [close, feedback >= 0 && feedback < end ? feedback : -1];
}

/** Where a session line holds its message list: `open` at `,"messages":[`, `close` at the `],"reward":` after it. */
interface MessageList {
  line: Buffer;
  open: number;
  close: number;
}

/**
 * The messages of a session line that readStoredSession read (its list opens with a message and is closed
 * by the last `],"reward":`), found where they lie; a list whose messages are not each `{"role":"<role>"`
 * after a comma is parsed whole.
 */
function storedMessages({ line, open, close }: MessageList, session: StoredSession): StoredMessages {
  const starts: number[] = [];
  const ends: number[] = [];
  const roles: Role[] = [];
  // Braces are found by their byte (memchr) and checked for `{"role":"`: at the simulator's 100k sessions,
  // 90 ms against 160 searching for the whole literal. A message ends at the comma before the next.
  for (let at = open + MESSAGES.length; at >= 0 && at < close; at = line.indexOf(0x7b, at + 1)) {
    if (!holdsAt(line, at, MESSAGE)) continue;
    const role = ROLE_BY_FIRST_BYTE[line[at + MESSAGE.length]!];
    if (!role || line[at + MESSAGE.length + role.length] !== 34 || (starts.length > 0 && line[at - 1] !== 44)) {
      return StoredMessages.of((JSON.parse(line.toString('utf8')) as SplitSession).messages, session.session_id);
    }
    if (starts.length > 0) ends.push(at - 1);
    starts.push(at);
    roles.push(role);
  }
  ends.push(close);
  return StoredMessages.read(line, starts, ends, roles, session.session_id, session.idJson);
}

/**
 * A bucket's lines grouped by task, tasks in a stable order: each task's lines as the offsets where they
 * start and end in `bytes` (numbers, not an object a line: they live as long as the bucket), made
 * StoredSessions when the task is paired (storedSessions).
 */
export interface StoredTaskGroups {
  bytes: Buffer;
  tasks: [string, number[]][];
}

/** The sessions of one task of a bucket, from the offsets of its lines. */
export function storedSessions(bucket: StoredTaskGroups, offsets: number[]): StoredSession[] {
  const sessions: StoredSession[] = [];
  for (let i = 0; i < offsets.length; i += 2) sessions.push(readStoredSession(bucket.bytes.subarray(offsets[i], offsets[i + 1])));
  return sessions;
}

/**
 * Reads bucket files one after another into one buffer, so that its memory is not mapped afresh for each
 * (writing to new pages costs more than the copy itself): what a read gives is valid until the next read.
 */
export class StoredBucketReader {
  /** The bucket file as it is; its sessions, runs read in; the sessions readTaskRange keeps. */
  private file = Buffer.allocUnsafeSlow(0);
  private buffer = Buffer.allocUnsafeSlow(0);
  private kept = new LineBuffer(1 << 16);

  /** A whole file's bytes, valid until the next read. */
  private async bytes(path: string): Promise<Buffer> {
    const file = await open(path, 'r');
    try {
      const { size } = await file.stat();
      if (size > this.file.length) this.file = Buffer.allocUnsafeSlow(size + (size >> 3));
      for (let at = 0; at < size; ) {
        const { bytesRead } = await file.read(this.file, at, size - at, at);
        if (bytesRead === 0) throw new Error(`${path}: ended at byte ${at} of ${size} while it was read`);
        at += bytesRead;
      }
      return this.file.subarray(0, size);
    } finally {
      await file.close();
    }
  }

  /**
   * A bucket file's lines as what is to be read for them: each run of ingest's sessions with its segment
   * (opened once; a run that reaches past its end is told before any is read), its other lines as they are.
   * `use` gets them with their bytes once read (tails added) and the file's bytes; the segments are closed after.
   */
  private async withParts<T>(path: string, ingestDir: string, use: (parts: BucketParts, size: number, file: Buffer) => T): Promise<T> {
    const file = await this.bytes(path);
    const parts = new BucketParts(path, ingestDir);
    try {
      let size = 0;
      let line = 0;
      forEachLine(file, (start, end) => {
        line++;
        if (end > start) size += parts.add(file, start, end, line);
      });
      return use(parts, size, file);
    } finally {
      parts.close();
    }
  }

  /**
   * A large bucket file's parts a block of its lines at a time (`size` bytes; a longer line grows it), each
   * block's given to `visit` with the block and where in the file it starts: what is held does not grow
   * with the file. From the line at byte `from` to the one at byte `until`; the segments are closed after.
   */
  private partsInBlocks(path: string, ingestDir: string, size: number, visit: (parts: BucketParts, block: Buffer, base: number) => void, from = 0, until = Infinity): void {
    // Line numbers count from `from`, and an error says so.
    const parts = new BucketParts(from > 0 ? `${path} from byte ${from},` : path, ingestDir);
    const fd = openSync(path, 'r');
    try {
      let line = 0;
      for (let base = from; base <= until; ) {
        let block = this.fileRoom(size);
        let got = readAll(fd, block, size, base);
        if (got === 0) break;
        let last = block.lastIndexOf(10, got - 1);
        // A line longer than the block: the block grows to hold it (the file's last line may have no newline).
        for (let room = size; last < 0 && got === room; ) {
          block = this.fileRoom((room *= 2));
          got = readAll(fd, block, room, base);
          last = block.lastIndexOf(10, got - 1);
        }
        // The file's end, or its block's last whole line; or the end of the line at `until`, where that comes first.
        let end = got < size || last < 0 ? got : last + 1;
        if (until - base < end) end = Math.min(end, block.indexOf(10, until - base) + 1 || end);
        parts.clear();
        forEachLine(block.subarray(0, end), (start, stop) => {
          line++;
          if (stop > start) parts.add(block, start, stop, line);
        });
        visit(parts, block, base);
        base += end;
      }
    } finally {
      closeSync(fd);
      parts.close();
    }
  }

  /** Room for `size` bytes in the buffer a bucket file is read into. */
  private fileRoom(size: number): Buffer {
    if (size > this.file.length) this.file = Buffer.allocUnsafeSlow(size);
    return this.file;
  }

  /** Room for `size` bytes in the buffer sessions are read into. */
  private room(size: number): Buffer {
    if (size > this.buffer.length) this.buffer = Buffer.allocUnsafeSlow(size + (size >> 3));
    return this.buffer;
  }

  /** The parts of a bucket file read into the buffer, a session a line. */
  private fill(parts: BucketParts, size: number, file: Buffer): Buffer {
    const out = this.room(size);
    let at = 0;
    for (let i = 0; i < parts.length; i++) {
      if (parts.isRun(i)) at = readRun(out, at, parts.fd(i), parts.run(i), parts.where(i));
      else {
        at += file.copy(out, at, parts.from(i), parts.to(i));
        out[at++] = 10;
      }
    }
    return out.subarray(0, at);
  }

  /**
   * A bucket file's sessions, a line each, as whole SplitSessions' JSON: each run of ingest's sessions it
   * points at read from its segment in `ingestDir` (synchronously: a bucket's runs are many small reads of
   * what the page cache mostly holds), its other lines as they are. Valid until the next read.
   */
  sessions(path: string, ingestDir: string): Promise<Buffer> {
    return this.withParts(path, ingestDir, (parts, size, file) => this.fill(parts, size, file));
  }

  /**
   * A bucket file's lines grouped by task (read from each line's head) where its sessions take at most `limit`
   * bytes; a larger bucket's plan (BucketSpans): its sessions read `limit` bytes at a time, a small task's
   * kept as where they lie, a task past the limit given to what `large` makes for it, so that what is paired
   * of it at once can be bounded (stages/pairs/pairer.ts).
   */
  async readOrPlan<L extends LargeTask>(path: string, ingestDir: string, limit: number, large: (task: string, sources: SpanSource[]) => L, block = BUCKET_BLOCK): Promise<StoredTaskGroups | BucketSpans<L>> {
    // A bucket file within a block is read whole; a larger one (many runs: a task's sessions lie apart, a
    // line a session) a block at a time, its sessions' bytes counted first.
    if (statSync(path).size <= block) return this.withParts(path, ingestDir, (parts, size, file) => (size <= limit ? groupByTask(this.fill(parts, size, file)) : this.spans(limit, large, (visit) => visit(parts, file, 0))));
    if (this.sessionBytes(path, ingestDir, block) <= limit) return this.withParts(path, ingestDir, (parts, bytes, file) => groupByTask(this.fill(parts, bytes, file)));
    return this.plan(path, ingestDir, limit, large, block);
  }

  /** What a bucket file's sessions take once read (tails added), told by its lines alone, read a block at a time. */
  sessionBytes(path: string, ingestDir: string, block = BUCKET_BLOCK): number {
    let size = 0;
    this.partsInBlocks(path, ingestDir, block, (parts) => {
      for (let i = 0; i < parts.length; i++) size += parts.sessionBytes(i);
    });
    return size;
  }

  /**
   * A bucket file's plan (BucketSpans) whatever its size, its large tasks gathered by `large`; with `only`,
   * of that task alone (its other tasks' sessions read but not kept).
   */
  plan<L extends LargeTask>(path: string, ingestDir: string, limit: number, large: (task: string, sources: SpanSource[]) => L, block = BUCKET_BLOCK, only?: string): BucketSpans<L> {
    return this.spans(limit, large, (visit) => this.partsInBlocks(path, ingestDir, block, visit), only);
  }

  /**
   * Where the sessions of a bucket file's parts lie, by task: spans of consecutive lines of one source, each
   * of at most `limit` bytes. `blocks` gives the parts a block at a time, each with its block of the file and
   * where that starts.
   */
  private spans<L extends LargeTask>(limit: number, large: (task: string, sources: SpanSource[]) => L, blocks: PartBlocks, only?: string): BucketSpans<L> {
    const sources: SpanSource[] = [null];
    const tasks = new Map<string, GatheredTask<L>>();
    // The last session's task, whose string the next session's takes where its bytes are the same.
    let last: { json: Buffer; task: GatheredTask<L> | null } | null = null;
    // A session: its task, what it takes once read, where it lies; its id and reward, which choose outcome pairs.
    this.sessionsOf(blocks, sources, limit, (bytes, start, end, source, from, to, line) => {
      const head = readHead(bytes, start, end);
      let t: GatheredTask<L> | null | undefined;
      if (head.taskAt && last && bytes.compare(last.json, 0, last.json.length, head.taskAt[0], head.taskAt[1]) === 0) t = last.task;
      else {
        const task = head.taskAt ? decodeString(bytes, head.taskAt[0], head.taskAt[1]) : head.task!;
        t = only !== undefined && task !== only ? null : tasks.get(task);
        if (t === undefined) tasks.set(task, (t = new GatheredTask<L>(task)));
        last = head.taskAt ? { json: Buffer.from(bytes.subarray(head.taskAt[0], head.taskAt[1])), task: t } : null;
      }
      if (!t) return;
      t.bytes += sessionLineBytes(sources, source, from, to);
      const id = head.idAt ? { bytes, start: head.idAt[0], end: head.idAt[1] } : { bytes: head.idJson!, start: 0, end: head.idJson!.length };
      if (t.large) t.large.add(decodeString(id.bytes, id.start, id.end), head.reward, source, from, to, line);
      else {
        t.ids.push(id.bytes, id.start, id.end);
        t.rewards.push(head.reward);
        t.at.push(source);
        t.at.push(from);
        t.at.push(to);
        t.lines.push(line);
        // Larger than the limit: what it gathered goes to its LargeTask, which takes the rest as it comes.
        if (t.bytes > limit) t.toLarge(large(t.task, sources));
      }
    });
    // A task larger than the limit is paired from what its LargeTask kept (pairer.ts), on this thread; a
    // smaller one whole, its spans made anew (they go to the main thread with the plan's pieces).
    return {
      sources,
      tasks: byTask(tasks).map(([task, t]): TaskSpans<L> => (t.large ? { task, bytes: t.bytes, spans: null, large: t.large } : { task, bytes: t.bytes, spans: spansOf(sources, t.at.view(), limit), large: null })),
    };
  }

  /**
   * Every session line of a bucket file, one after another, a block of the file and `BUCKET_BLOCK` bytes of
   * a run at a time (what is held does not grow with the bucket): `visit` gets its bytes (`start` to `end`
   * of `bytes`; a run's without its tail) and where it lies, as a span of one session (SpanSource: `source`,
   * its place in `sources`, which gains the segments the file's runs point into; `from`, `to`).
   */
  eachSession(path: string, ingestDir: string, visit: SessionVisit, sources: SpanSource[]): void {
    this.sessionsOf((v) => this.partsInBlocks(path, ingestDir, BUCKET_BLOCK, v), sources, BUCKET_BLOCK, visit);
  }

  /**
   * The session lines of the parts `blocks` gives (a block at a time, each with its block of the file and
   * where that starts), each given to `visit` with where it lies (a run's source added to `sources` the
   * first time its segment and side are met) and where its line starts in the bucket file; a run's read
   * `most` bytes at a time.
   */
  private sessionsOf(blocks: PartBlocks, sources: SpanSource[], most: number, visit: SessionVisit): void {
    // A run's source by its segment and side (2 × segment + side).
    const sourceOf = new Map<number, number>();
    blocks((parts, file, base) => {
      for (let i = 0; i < parts.length; i++) {
        const line = base + parts.lineStart(i);
        if (!parts.isRun(i)) {
          visit(file, parts.from(i), parts.to(i), 0, base + parts.from(i), base + parts.to(i), line);
          continue;
        }
        const run = parts.run(i);
        const key = 2 * parts.segment(i) + SPLITS.indexOf(run.split);
        let source = sourceOf.get(key);
        if (source === undefined) sourceOf.set(key, (source = sources.push({ ingest: run.ingest, split: run.split }) - 1));
        const lines = this.eachSessionOf(parts, i, run.bytes[0], run.bytes[1], most, (block, start, end, at) => visit(block, start, end, source, at, at + end - start + 1, line));
        if (lines !== run.sessions) throw segmentChanged(parts.where(i), run, `holds ${lines} line(s) there, not all sessions`);
      }
    });
  }

  /**
   * The session lines of part `i` (a run) from byte `from` to `to` of its segment, read `most` bytes at a
   * time (a longer line grows the block), each given to `visit` with its block, where it starts and ends
   * there (its newline), and where it starts in the segment; returns how many.
   */
  private eachSessionOf(parts: BucketParts, i: number, from: number, to: number, most: number, visit: (block: Buffer, start: number, end: number, at: number) => void): number {
    const [fd, run] = [parts.fd(i), parts.run(i)];
    let lines = 0;
    for (let at = from; at < to; ) {
      let block = this.room(Math.min(most, to - at));
      let got = readAll(fd, block, Math.min(block.length, to - at), at);
      if (got === 0) throw segmentChanged(parts.where(i), run, `ended at byte ${at} while it was read`);
      let newline = block.lastIndexOf(10, got - 1);
      while (newline < 0 && at + got < to) {
        block = this.room(2 * block.length);
        got = readAll(fd, block, Math.min(block.length, to - at), at);
        newline = block.lastIndexOf(10, got - 1);
      }
      if (newline < 0) throw segmentChanged(parts.where(i), run, `holds a line there that does not end`);
      for (let start = 0; start <= newline; ) {
        const nl = block.indexOf(10, start);
        if (block[start] !== 123 || block[nl - 1] !== 125) throw segmentChanged(parts.where(i), run, 'holds lines there that are not sessions');
        visit(block, start, nl, at + start);
        lines++;
        start = nl + 1;
      }
      at += newline + 1;
    }
    return lines;
  }

  /**
   * The sessions of task `task` (null: every one) among a bucket file's from `range`: from its
   * line at byte `range[0]` (a run's from byte `range[1]` of its segment; -1: the whole line) to its line at
   * byte `range[2]` (a run's up to byte `range[3]`; -1: not that line), a line each as `sessions` gives them,
   * with where each starts and ends. The bucket file is read a block at a time from the range's first line,
   * and its other tasks' sessions there are read but not kept. Valid until the next read.
   */
  readTaskRange(path: string, ingestDir: string, task: string | null, range: TaskRange, block = BUCKET_BLOCK): { bytes: Buffer; offsets: number[] } {
    const [first, firstFrom, last, lastTo] = range;
    const out = this.kept;
    out.clear();
    const offsets: number[] = [];
    // A session kept as `sessions` gives it, with where it starts and ends.
    const copy = (bytes: Buffer, start: number, end: number, tail: Buffer | null) => {
      offsets.push(out.length);
      pushSessionLine(out, bytes, start, end, tail);
      offsets.push(out.length - 1);
    };
    const ofTask = (bytes: Buffer, start: number, end: number) => task === null || taskOfLine(bytes, start, end) === task;
    this.partsInBlocks(path, ingestDir, block, (parts, file, base) => {
      for (let i = 0; i < parts.length; i++) {
        const at = base + parts.lineStart(i);
        if (at > last || (at === last && lastTo < 0)) return;
        if (!parts.isRun(i)) {
          if (ofTask(file, parts.from(i), parts.to(i))) copy(file, parts.from(i), parts.to(i), null);
          continue;
        }
        const from = at === first && firstFrom >= 0 ? firstFrom : parts.from(i);
        const to = at === last ? lastTo : parts.to(i);
        const tail = SESSION_TAILS[parts.run(i).split];
        this.eachSessionOf(parts, i, from, to, BUCKET_BLOCK, (bytes, start, end) => ofTask(bytes, start, end) && copy(bytes, start, end, tail));
      }
    }, first, last);
    return { bytes: out.view(), offsets };
  }

  /**
   * The sessions of spans `from` to `to` (quad indices) of a bucket's BucketSpans, a line each as `sessions`
   * gives them, read from `path` (the bucket file) and the segments of `ingestDir`; with where each span's
   * lines start (and, last, where they end). Valid until the next read.
   */
  readSpans(path: string, ingestDir: string, { sources }: Pick<BucketSpans, 'sources'>, spans: ArrayLike<number>, from = 0, to = spans.length / 4): { bytes: Buffer; at: number[] } {
    let size = 0;
    for (let q = from; q < to; q++) size += spanBytes(spans, q, sources);
    const out = this.room(size);
    const at: number[] = [];
    const fds = new Map<number, number>();
    const where = `${path} (a run of its lines)`;
    let end = 0;
    try {
      for (let q = from; q < to; q++) {
        const [source, start, stop, sessions] = [spans[4 * q]!, spans[4 * q + 1]!, spans[4 * q + 2]!, spans[4 * q + 3]!];
        const s = sources[source]!;
        let fd = fds.get(source);
        if (fd === undefined) fds.set(source, (fd = s ? openSegment(ingestDir, s.ingest, path).fd : openSync(path, 'r')));
        at.push(end);
        if (s) end = readRun(out, end, fd, { ingest: s.ingest, bytes: [start, stop], sessions, split: s.split }, where);
        else {
          if (readAll(fd, out.subarray(end), stop - start, start) !== stop - start) throw new PipelineError(`${path}: ended before byte ${stop} while it was read again; it has changed since pairing began: run \`prefab stage pairs\` again`);
          end += stop - start;
          out[end++] = 10;
        }
      }
    } finally {
      for (const fd of fds.values()) closeSync(fd);
    }
    at.push(end);
    return { bytes: out.subarray(0, end), at };
  }
}

/** The numbers a BucketParts row holds. */
const W = 7;

/**
 * A bucket file's lines as what is to be read for them, seven numbers a line rather than an object (a bucket
 * may hold a million runs): a run of ingest's sessions, as its segment's place in `segments` (opened), the
 * bytes `from` to `to` of it, how many sessions and its side's place in SPLITS; or a line of the file itself,
 * segment -1, from `from` to `to` of the bytes it was read from. Then the line's number, which an error
 * names, and where the line starts in those bytes.
 */
class BucketParts {
  readonly segments: { name: string; fd: number; size: number }[] = [];
  private readonly segmentOf = new Map<string, number>();
  private rows = new Float64Array(W * 256);
  length = 0;

  /** `path`: the bucket file as an error names it. */
  constructor(
    private readonly path: string,
    private readonly ingestDir: string,
  ) {}

  /**
   * The line `line` of the bucket file, at `start` to `end` of `bytes`, as a part (a run's segment opened
   * the first time it is named; a run that reaches past its end told before any is read); returns the bytes
   * its sessions take once read.
   */
  add(bytes: Buffer, start: number, end: number, line: number): number {
    if (!holdsAt(bytes, start, RUN_HEAD)) {
      this.push(-1, start, end, 0, 0, line, start);
      return this.sessionBytes(this.length - 1);
    }
    const run = readSessionRun(bytes, start, end, this.path, line);
    let segment = this.segmentOf.get(run.ingest);
    if (segment === undefined) this.segmentOf.set(run.ingest, (segment = this.segments.push({ name: run.ingest, ...openSegment(this.ingestDir, run.ingest, whereOf(this.path, line)) }) - 1));
    const { size } = this.segments[segment]!;
    if (run.bytes[1] > size) throw segmentChanged(whereOf(this.path, line), run, `ends at byte ${size}`);
    this.push(segment, run.bytes[0], run.bytes[1], run.sessions, SPLITS.indexOf(run.split), line, start);
    return this.sessionBytes(this.length - 1);
  }

  private push(segment: number, from: number, to: number, sessions: number, side: number, line: number, lineStart: number): void {
    if (W * (this.length + 1) > this.rows.length) {
      const grown = new Float64Array(2 * this.rows.length);
      grown.set(this.rows);
      this.rows = grown;
    }
    const [r, at] = [this.rows, W * this.length++];
    r[at] = segment;
    r[at + 1] = from;
    r[at + 2] = to;
    r[at + 3] = sessions;
    r[at + 4] = side;
    r[at + 5] = line;
    r[at + 6] = lineStart;
  }

  /** The parts forgotten (the segments stay open), for the next block of the file. */
  clear(): void {
    this.length = 0;
  }

  /** The segments closed. */
  close(): void {
    for (const { fd } of this.segments) closeSync(fd);
  }

  /** The bytes part `i`'s sessions take once read: a run's, each session's tail added; a line's, its newline. */
  sessionBytes(i: number): number {
    const r = this.rows;
    return r[W * i + 2]! - r[W * i + 1]! + (r[W * i]! >= 0 ? r[W * i + 3]! * (SESSION_TAILS[SPLITS[r[W * i + 4]!]!].length - 1) : 1);
  }

  isRun(i: number): boolean {
    return this.rows[W * i]! >= 0;
  }
  segment(i: number): number {
    return this.rows[W * i]!;
  }
  from(i: number): number {
    return this.rows[W * i + 1]!;
  }
  to(i: number): number {
    return this.rows[W * i + 2]!;
  }
  fd(i: number): number {
    return this.segments[this.rows[W * i]!]!.fd;
  }
  /** Part `i`, a run, as the SessionRun its line holds. */
  run(i: number): SessionRun {
    const r = this.rows;
    return { ingest: this.segments[r[W * i]!]!.name, bytes: [r[W * i + 1]!, r[W * i + 2]!], sessions: r[W * i + 3]!, split: SPLITS[r[W * i + 4]!]! };
  }
  /** Where part `i`'s line starts in the bytes it was read from. */
  lineStart(i: number): number {
    return this.rows[W * i + 6]!;
  }
  where(i: number): string {
    return whereOf(this.path, this.rows[W * i + 5]!);
  }
}

/** A bucket file's parts a block at a time, each given with its block of the file and where that starts. */
type PartBlocks = (visit: (parts: BucketParts, file: Buffer, base: number) => void) => void;

/**
 * A session line of a bucket (StoredBucketReader.eachSession): `start` to `end` of `bytes`, a run's without its
 * tail; where it lies, as a span of one session (its source's place in the reader's sources, from, to); and
 * where the bucket file's line that holds or points at it starts.
 */
type SessionVisit = (bytes: Buffer, start: number, end: number, source: number, from: number, to: number, line: number) => void;

/** The bytes of a large bucket file read at once (StoredBucketReader.partsInBlocks). */
const BUCKET_BLOCK = 1 << 20;

/** A line of a file as an error names it (a concatenation V8 makes a string of only when an error reads it). */
const whereOf = (path: string, line: number) => `${path} line ${line}`;

/** What a span points into: a segment of ingest's whose sessions take `split`'s tail, or (null) the bucket file's own lines. */
export type SpanSource = { ingest: string; split: Split } | null;

/**
 * Where a large bucket's sessions lie, task by task (StoredBucketReader.readOrPlan). A span is a run of
 * consecutive lines of one source, four numbers: the source (its place in `sources`; 0, null, is the bucket
 * file itself), the bytes `from` to `to` of it (a run's newlines included, a bucket file's last newline not),
 * and how many sessions.
 */
export interface BucketSpans<L extends LargeTask = LargeTask> {
  sources: SpanSource[];
  tasks: TaskSpans<L>[];
}

/**
 * A task of a large bucket and its sessions' bytes as read (tails added): for a task within the limit, the
 * spans of its sessions in the bucket's order; for a larger one, instead, what its LargeTask kept.
 */
type TaskSpans<L extends LargeTask> = { task: string; bytes: number } & ({ spans: Float64Array; large: null } | { spans: null; large: L });

/**
 * The id, task and reward of a session's line, stored as ingest writes it or as a bucket file holds it
 * whole, read as readStoredSession reads them (id and task from the head, the reward between `],"reward":`
 * and the `,"feedback":` after it): the id's and the task's JSON strings where they lie (`idAt`, `taskAt`),
 * or, where the line is not shaped so, the id as JSON and the task from the line parsed whole.
 */
function readHead(bytes: Buffer, start: number, end: number): { idAt?: [number, number]; taskAt?: [number, number]; idJson?: Buffer; task?: string; reward: number } {
  const head = headOf(bytes, start, end);
  const [close, feedback] = rewardAt(bytes, start, end);
  if (head && bytes[head.task] === 34 && feedback > 0) {
    const taskEnd = jsonStringEnd(bytes, head.task, end);
    let reward: unknown;
    try {
      reward = JSON.parse(bytes.toString('latin1', close + MESSAGES_END.length, feedback));
    } catch {
      // parsed whole below
    }
    if (taskEnd > 0 && typeof reward === 'number') return { idAt: [start + HEAD.length - 1, head.idEnd], taskAt: [head.task, taskEnd], reward };
  }
  const s = JSON.parse(bytes.toString('utf8', start, end)) as SplitSession;
  return { idJson: Buffer.from(JSON.stringify(s.session_id)), task: s.task_id!, reward: s.reward };
}

/**
 * A task's sessions as a large bucket's plan gathers them: ids kept as their JSON's bytes, not strings that
 * would live through collections; once the task is larger than the limit, given to its LargeTask instead.
 */
class GatheredTask<L extends LargeTask> {
  bytes = 0;
  ids = new ByteList();
  rewards = new NumberList();
  /** A span (source, from, to) a session. */
  at = new NumberList();
  /** Where in the bucket file each session's line starts. */
  lines = new NumberList();
  large: L | null = null;

  constructor(readonly task: string) {}

  /** What was gathered given to `large`, which takes the task's sessions from now on. */
  toLarge(large: L): void {
    const [ids, ends, rewards, at, lines] = [this.ids.bytes(), this.ids.ends.view(), this.rewards.view(), this.at.view(), this.lines.view()];
    const bytes = Buffer.from(ids.buffer, ids.byteOffset, ids.byteLength);
    for (let i = 0; i < rewards.length; i++) large.add(decodeString(bytes, i === 0 ? 0 : ends[i - 1]!, ends[i]!), rewards[i]!, at[3 * i]!, at[3 * i + 1]!, at[3 * i + 2]!, lines[i]!);
    this.large = large;
    [this.ids, this.rewards, this.at, this.lines] = [new ByteList(), new NumberList(), new NumberList(), new NumberList()];
  }
}

/**
 * What a large bucket's plan keeps of a task larger than the limit (stages/pairs/pairer.ts makes it): each of
 * its sessions in turn, its id, reward and where it lies (a span of source, from, to), and where its line
 * starts in the bucket file, from the first.
 */
export interface LargeTask {
  add(id: string, reward: number, source: number, from: number, to: number, line: number): void;
}

/**
 * Some of a bucket's lines, as readTaskRange reads them: from its line at byte `first` (a run's from byte
 * `firstFrom` of its segment; -1: the whole line) to its line at byte `last` (a run's up to byte `lastTo`;
 * -1: not that line).
 */
export type TaskRange = [first: number, firstFrom: number, last: number, lastTo: number];

/** Byte strings one after another in one growing buffer, with where each ends. */
class ByteList {
  private buffer = Buffer.allocUnsafe(256);
  private length = 0;
  readonly ends = new NumberList();

  push(from: Buffer, start: number, end: number): void {
    if (this.length + end - start > this.buffer.length) {
      const grown = Buffer.allocUnsafe(Math.max(2 * this.buffer.length, this.length + end - start));
      this.buffer.copy(grown, 0, 0, this.length);
      this.buffer = grown;
    }
    this.length += from.copy(this.buffer, this.length, start, end);
    this.ends.push(this.length);
  }

  /** The strings pushed, a view of the list's buffer (no copy). */
  bytes(): Uint8Array {
    return this.buffer.subarray(0, this.length);
  }
}

/** What a session line of `source` takes once read, beyond its stored bytes: a run's sessions their tail in place of the closing brace. */
const tailExtra = (source: SpanSource) => (source ? SESSION_TAILS[source.split].length - 1 : 0);

/** What the session line at `from` to `to` of source `source` takes once read (its tail added, or its newline). */
export const sessionLineBytes = (sources: SpanSource[], source: number, from: number, to: number) => {
  const s = sources[source]!;
  return to - from + (s ? tailExtra(s) : 1);
};

/**
 * The spans of the sessions at `at` (a span of one session each: source, from, to): a session continues the
 * last span where it follows it in the same source (a whole line after the last one's newline, a run's line
 * where the last one's ended) and the span stays within `limit` bytes once read.
 */
function spansOf(sources: SpanSource[], at: Float64Array, limit: number): Float64Array {
  const spans = new NumberList();
  for (let i = 0; i < at.length / 3; i++) {
    const [source, from, to] = [at[3 * i]!, at[3 * i + 1]!, at[3 * i + 2]!];
    const n = spans.length;
    if (n > 0 && spans.get(n - 4) === source && (source === 0 ? spans.get(n - 2) + 1 : spans.get(n - 2)) === from && spanBytes(spans.view(), n / 4 - 1, sources) + sessionLineBytes(sources, source, from, to) <= limit) {
      spans.set(n - 2, to);
      spans.set(n - 1, spans.get(n - 1) + 1);
    } else for (const v of [source, from, to, 1]) spans.push(v);
  }
  return spans.view().slice();
}

/** The bytes span `q` of `spans` takes once read (its sessions' tails added, a bucket file's lines their last newline). */
function spanBytes(spans: ArrayLike<number>, q: number, sources: SpanSource[]): number {
  const source = sources[spans[4 * q]!]!;
  return spans[4 * q + 2]! - spans[4 * q + 1]! + (source ? spans[4 * q + 3]! * tailExtra(source) : 1);
}

/** Reads `length` bytes at `position` of `fd` into `into`, as many as there are; returns how many. */
function readAll(fd: number, into: Buffer, length: number, position: number): number {
  let got = 0;
  while (got < length) {
    const n = readSync(fd, into, got, length - got, position + got);
    if (n === 0) break;
    got += n;
  }
  return got;
}

/** Ingest's segment `name`, opened; an error names `where` pointed at it. */
function openSegment(ingestDir: string, name: string, where: string): { fd: number; size: number } {
  try {
    const fd = openSync(join(ingestDir, 'sessions', name), 'r');
    return { fd, size: fstatSync(fd).size };
  } catch (error) {
    throw new PipelineError(`${where}: points at ingest's segment ${name}, which ${join(ingestDir, 'sessions')} does not hold (${(error as Error).message}); these buckets were made from another ingest: run \`prefab stage split\``);
  }
}

/** The task_id of a session's line (the head ingest writes, or the line parsed whole). */
const taskOfLine = (bytes: Buffer, start: number, end: number): string => leadingTaskId(bytes, start, end) ?? (JSON.parse(bytes.toString('utf8', start, end)) as SplitSession).task_id!;

/** A bucket's session lines grouped by task (read from each line's head), tasks in a stable order. */
function groupByTask(bytes: Buffer): StoredTaskGroups {
  const tasks = new Map<string, number[]>();
  forEachLine(bytes, (start, end) => {
    if (end === start) return;
    const task = taskOfLine(bytes, start, end);
    const offsets = tasks.get(task);
    if (offsets) offsets.push(start, end);
    else tasks.set(task, [start, end]);
  });
  return { bytes, tasks: byTask(tasks) };
}

/** A run that does not find in its segment the sessions split saw there. */
const segmentChanged = (where: string, run: SessionRun, what: string) =>
  new PipelineError(`${where}: split found ${run.sessions} session(s) at bytes ${run.bytes[0]} to ${run.bytes[1]} of ingest's segment ${run.ingest}, which ${what}; it has changed since: run \`prefab stage split\``);

/**
 * Reads `run` from its segment (`fd`) into `out` at `at`, each of its lines given its session's tail in
 * place of its closing brace; returns where the next line goes. The lines are read where they will end and
 * moved up from the last, so no copy of the run is made: line i moves by i times what a tail adds.
 */
function readRun(out: Buffer, at: number, fd: number, run: SessionRun, where: string): number {
  const [from, to] = run.bytes;
  const length = to - from;
  for (let got = 0; got < length; ) {
    const n = readSync(fd, out, at + got, length - got, from + got);
    if (n === 0) throw segmentChanged(where, run, `ended at byte ${from + got} while it was read`);
    got += n;
  }
  const ends: number[] = [];
  const region = out.subarray(at, at + length);
  for (let nl = region.indexOf(10); nl >= 0; nl = region.indexOf(10, nl + 1)) ends.push(at + nl);
  const shaped = ends.length === run.sessions && ends.at(-1) === at + length - 1 && ends.every((nl, i) => out[nl - 1] === 125 && out[i === 0 ? at : ends[i - 1]! + 1] === 123);
  if (!shaped) throw segmentChanged(where, run, `holds ${ends.length} line(s) there, not all sessions`);
  const tail = SESSION_TAILS[run.split];
  const extra = tail.length - 1;
  for (let i = ends.length - 1; i >= 0; i--) {
    const start = i === 0 ? at : ends[i - 1]! + 1;
    const brace = ends[i]! - 1;
    const moved = start + i * extra;
    out.copyWithin(moved, start, brace);
    tail.copy(out, moved + brace - start);
    out[moved + brace - start + tail.length] = 10;
  }
  return at + length + ends.length * extra;
}

/** The session_id of a session's line (the head ingest writes, or the line parsed whole). */
export function leadingSessionId(bytes: Buffer, start: number, end: number): string {
  const idEnd = holdsAt(bytes, start, HEAD) ? jsonStringEnd(bytes, start + HEAD.length - 1, end) : -1;
  if (idEnd > 0) return decodeString(bytes, start + HEAD.length - 1, idEnd);
  return (JSON.parse(bytes.toString('utf8', start, end)) as SplitSession).session_id;
}

/** How many parsed sessions SessionsById keeps: a pair's sides mostly come from one or two, and a task's pairs from a few at a time. */
const RECENT_SESSIONS = 256;

/**
 * The sessions of one bucket file at a time, by id. When a file is first asked of, where each of its
 * sessions lies is read from their heads (a block at a time), and a bucket of the usual size is kept as they
 * are read; a larger bucket's session is read when asked for. The last few asked for are kept parsed. What
 * a large bucket holds is five numbers a session, not its sessions: a task of 500,000 sessions, read whole
 * and kept parsed, took 6.7 GB (and a Map from their ids to where they lie 40 MiB a thread).
 */
export class SessionsById {
  private path: string | null = null;
  private sources: SpanSource[] = [null];
  private fds: number[] = [];
  /** Each session in the bucket's order: its id's hash (fnv1a), then where it lies (a span of one session: source, from, to). */
  private at = new NumberList();
  /** An open-addressed table of the sessions by their ids' hashes: a session's place in `at`, plus one (0: an empty slot). */
  private table = new Uint32Array(0);
  /** The sessions last asked for, the latest last. */
  private recent = new Map<string, StoredSession>();
  /** What was last read: `bytes` from byte `from` of source `source` (a view into `aheadRoom`). */
  private ahead = { source: -1, from: 0, bytes: Buffer.alloc(0) };
  private aheadRoom = Buffer.allocUnsafeSlow(READ_AHEAD);
  /** A bucket of at most `heldBytes` of sessions, held as `sessions` gives it (`heldLines`), with where each session's line starts; null for a larger one. */
  private held: NumberList | null = null;
  private readonly heldLines = new LineBuffer(0);

  /** `heldBytes`: the largest bucket held whole (HELD_BUCKET; a test's 0 reads every session as asked). */
  constructor(
    private readonly ingestDir: string,
    private readonly reader = new StoredBucketReader(),
    private readonly heldBytes = HELD_BUCKET,
  ) {}

  /** Session `id` of bucket file `path`, or undefined where the file has none; the file is indexed when it is not the last one asked of. */
  get(path: string, id: string): StoredSession | undefined {
    if (path !== this.path) this.index(path);
    const kept = this.recent.get(id);
    if (kept) {
      this.recent.delete(id);
      this.recent.set(id, kept);
      return kept;
    }
    const [h, mask] = [fnv1a(id), this.table.length - 1];
    // Sessions whose ids have the same hash are read in turn until one has the id.
    for (let slot = h & mask; this.table[slot] !== 0; slot = (slot + 1) & mask) {
      const n = this.table[slot]! - 1;
      if (this.at.get(4 * n) !== h) continue;
      const session = readStoredSession(this.line(path, n));
      if (session.session_id !== id) continue;
      this.recent.set(id, session);
      if (this.recent.size > RECENT_SESSIONS) this.recent.delete(this.recent.keys().next().value!);
      return session;
    }
    return undefined;
  }

  /** The segments and bucket file read from, closed; the bucket stays indexed, and they open again when a session is read. */
  close(): void {
    for (const fd of this.fds) if (fd !== undefined) closeSync(fd);
    this.fds = [];
  }

  private index(path: string): void {
    this.close();
    this.path = null;
    [this.sources, this.at, this.recent, this.ahead] = [[null], new NumberList(), new Map(), { source: -1, from: 0, bytes: Buffer.alloc(0) }];
    // A bucket of the usual size is held as its heads are read (its sessions are then read at once, not each
    // on its own); a larger one is read as pairs ask.
    const size = this.reader.sessionBytes(path, this.ingestDir);
    const held = (this.held = size <= this.heldBytes ? new NumberList() : null);
    this.heldLines.clear();
    if (held) this.heldLines.reserve(size);
    this.reader.eachSession(
      path,
      this.ingestDir,
      (bytes, start, end, source, from, to) => {
        this.at.push(fnv1a(leadingSessionId(bytes, start, end)));
        this.at.push(source);
        this.at.push(from);
        this.at.push(to);
        if (!held) return;
        const s = this.sources[source];
        held.push(this.heldLines.length);
        pushSessionLine(this.heldLines, bytes, start, end, s ? SESSION_TAILS[s.split] : null);
      },
      this.sources,
    );
    // At most half the slots taken, so that a search meets an empty one soon.
    const n = this.at.length / 4;
    let slots = 16;
    while (slots < 2 * n) slots *= 2;
    this.table = new Uint32Array(slots);
    for (let k = 0; k < n; k++) {
      let slot = this.at.get(4 * k) & (slots - 1);
      while (this.table[slot] !== 0) slot = (slot + 1) & (slots - 1);
      this.table[slot] = k + 1;
    }
    this.path = path;
  }

  /**
   * Session `n`'s line as `sessions` gives it (its tail added), without its newline: a view of the held
   * bucket, or a buffer of its own, read with what follows it in its segment or the bucket file, READ_AHEAD
   * bytes at once (the next pairs mostly ask for the sessions after it).
   */
  private line(path: string, n: number): Buffer {
    const [source, from, to] = [this.at.get(4 * n + 1), this.at.get(4 * n + 2), this.at.get(4 * n + 3)];
    if (this.held) {
      // Valid until the next bucket is indexed, as `sessions` gives them.
      const start = this.held.get(n);
      return this.heldLines.view().subarray(start, start + sessionLineBytes(this.sources, source, from, to) - 1);
    }
    const s = this.sources[source]!;
    let a = this.ahead;
    if (a.source !== source || from < a.from || to > a.from + a.bytes.length) {
      const fd = (this.fds[source] ??= s ? openSegment(this.ingestDir, s.ingest, path).fd : openSync(path, 'r'));
      if (to - from > this.aheadRoom.length) this.aheadRoom = Buffer.allocUnsafeSlow(to - from);
      const got = readAll(fd, this.aheadRoom, this.aheadRoom.length, from);
      const run = s && { ingest: s.ingest, bytes: [from, to] as [number, number], sessions: 1, split: s.split };
      if (got < to - from) throw run ? segmentChanged(`${path} (a run of its lines)`, run, `ended at byte ${from + got} while it was read`) : new PipelineError(`${path}: ended before byte ${to} while it was read again; it changed while this stage ran: run it again`);
      a = this.ahead = { source, from, bytes: this.aheadRoom.subarray(0, got) };
    }
    const line = a.bytes.subarray(from - a.from, to - a.from);
    if (!s) return Buffer.from(line);
    // A run's line ends with its closing brace and newline, which its session's tail replaces.
    if (line[0] !== 123 || line[line.length - 2] !== 125 || line[line.length - 1] !== 10) throw segmentChanged(`${path} (a run of its lines)`, { ingest: s.ingest, bytes: [from, to], sessions: 1, split: s.split }, 'holds no session there');
    return Buffer.concat([line.subarray(0, line.length - 2), SESSION_TAILS[s.split]]);
  }
}

/** What SessionsById reads of a segment or a bucket file at once. */
const READ_AHEAD = 256 << 10;

/**
 * The most bytes of a bucket's sessions SessionsById and readBucketSessions hold at once: buckets are about
 * 17 MiB at the simulator's sessions, and one a task of a million sessions fills takes gigabytes.
 */
const HELD_BUCKET = 32 << 20;

// ── pairs: pairs/<side>.jsonl (a line a pair, bucket by bucket, its sides pointing into split's buckets) and info.json ──

/** What the judge stage needs to know of how pairs were made. */
export interface PairsInfo {
  must_decline: string[];
  /** The model that wrote hard negatives, or null when the rewriter is off. */
  rewriter_model: string | null;
}

export const readPairsInfo = (dir: string) => readJsonFile<PairsInfo>(join(dir, 'info.json'));

/**
 * A side of a pair (prompt, chosen or rejected) as a pairs file holds it: messages `from` to `to` - 1 of a
 * session in split's bucket of the pair's task and side (a pair's sides are runs of its sessions' messages:
 * the file does not copy them), or messages made anew (a rewritten turn), as they are.
 */
export type PairSide = Message[] | { session_id: string; messages: [from: number, to: number] };

/** A pair record (of the pairs, judge or gate stage) with its sides made whole. */
export type WholePair<P extends Pair<PairSide>> = Omit<P, 'prompt' | 'chosen' | 'rejected'> & Pair;

/** A pair record as its file holds it, and made whole. */
export interface ReadPair<P extends Pair<PairSide>> {
  stored: P;
  whole: WholePair<P>;
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
export async function* readPairs<P extends Pair<PairSide>>(file: string, folders: SplitFolders, buckets: number, lines: AsyncIterable<{ line: number; text: string }> | Iterable<{ line: number; text: string }> = readLines(file), shared?: SessionsById): AsyncGenerator<ReadPair<P>> {
  const sessions = shared ?? new SessionsById(folders.ingest);
  const bucketOfTask = taskBuckets(buckets);
  try {
    for await (const { line, text } of lines) {
      if (text.length === 0) continue;
      const pair = JSON.parse(text) as P;
      const whole = (side: PairSide): Message[] => {
        if (Array.isArray(side)) return side;
        const [from, to] = side.messages;
        const bucket = bucketFile(folders.split, pair.split, bucketOfTask(pair.task_id!));
        const session = sessions.get(bucket, side.session_id);
        if (!session || !(Number.isInteger(from) && Number.isInteger(to) && 0 <= from && from < to && to <= session.messages.length)) {
          const what = session ? `has ${session.messages.length} messages, not messages ${from} to ${to}` : 'is not there';
          throw new PipelineError(`${file} line ${line}: pair ${pair.pair_id} points at session ${side.session_id} in ${bucket}, which ${what}; these pairs were made from another split: run \`prefab stage pairs\` to make them again`);
        }
        return session.messages.slice(from, to).all();
      };
      // Spread, so the record keeps its fields' order.
      yield { stored: pair, whole: { ...pair, prompt: whole(pair.prompt), chosen: whole(pair.chosen), rejected: whole(pair.rejected) } };
    }
  } finally {
    if (!shared) sessions.close();
  }
}
