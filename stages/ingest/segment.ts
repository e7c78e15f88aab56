// One input file read into a segment of sessions: each record mapped and validated; what cannot become a
// session, and a session id seen before, goes to the quarantine with its file, place and reason.
import { closeSync, constants, openSync, readSync } from 'node:fs';
import { access } from 'node:fs/promises';
import { join } from 'node:path';
import { JsonlWriter, LineBuffer, readJsonl } from '../../pipeline/jsonl.ts';
import { BufferShelf } from '../../pipeline/buffers.ts';
import { flatString } from '../../pipeline/memory.ts';
import { every, safePoint } from '../../pipeline/interrupt.ts';
import type { Logger, Progress } from '../../pipeline/log.ts';
import type { ExternalFile } from '../../pipeline/stage.ts';
import { UsageError } from '../../pipeline/errors.ts';
import { leadingSessionId } from '../../store/session-line.ts';
import { taskRunsFile, type IngestedFile, type TaskRun } from '../layout.ts';
import { SessionIdSet } from './id-set.ts';
import { RecordError, toSession, type MappingOptions } from './mapping.ts';
import { storedReader, type StoredReader } from './canonical.ts';
import type { Session } from '../../core/records.ts';
import {
  ELEMENT_FIELDS,
  damageReason,
  detectFormat,
  elementWhere,
  forEachLine,
  jsonDepth,
  parseRecord,
  quarantineText,
  reasonKind,
  readElementBlocks,
  readLineBlocks,
  recordLimit,
  type ElementBlock,
  type InputFormat,
  type LineBlock,
  type LineLimit,
  type QuarantineRecord,
  type RawRecord,
} from '../../pipeline/records.ts';
import { WorkerPool, inOrder, workerCount } from '../../pipeline/workers.ts';

export interface ReadingOptions {
  format: InputFormat | 'auto';
  mapping: MappingOptions;
  /** A record longer than this (its text, in bytes) is quarantined with its size, unread. */
  maxRecordBytes: number;
}

/** The duplicates of a file listed in the quarantine; those after are counted (run.ts writes how many). */
export const DUPLICATES_LISTED = 20;

/** Deeper than this, a record is quarantined rather than walked (mapping and hashing recurse). */
const MAX_DEPTH = 200;

/**
 * Whether the text has more than `limit` '[' and '{': a record with fewer cannot nest deeper than that, so
 * most are never walked. indexOf jumps from one to the next (a session has some fifty).
 */
function moreOpenings(raw: string, limit: number): boolean {
  let n = 0;
  for (const c of ['{', '[']) {
    for (let i = raw.indexOf(c); i >= 0; i = raw.indexOf(c, i + 1)) if (++n > limit) return true;
  }
  return false;
}

/** Whether a record (its text and its value) nests deeper than MAX_DEPTH. */
const tooDeep = (record: { value?: unknown; raw: string }) =>
  moreOpenings(record.raw, MAX_DEPTH) && jsonDepth(record.value, MAX_DEPTH) > MAX_DEPTH;

/** Why a record cannot be read, before it is mapped: too large, nested too deep; null when it can. */
function unreadable(record: { value?: unknown; raw: string }, maxBytes: number): string | null {
  // A UTF-16 code unit is at most 3 bytes of UTF-8: most records need no count.
  const bytes = record.raw.length * 3 > maxBytes ? Buffer.byteLength(record.raw) : 0;
  if (bytes > maxBytes)
    return `the record is ${bytes.toLocaleString('en-US')} bytes, more than ingest.max_record_bytes (${maxBytes.toLocaleString('en-US')})`;
  if (tooDeep(record)) return `the record nests more than ${MAX_DEPTH} levels deep`;
  return null;
}

/**
 * What one record became, worked out apart from every other record (on a worker thread, where there are
 * some): a session (with its messages' JSON as stored, when they were kept so), or why not.
 */
type RecordOutcome = { notUtf8: boolean } & (
  { reason: string } | { session: Session; stored?: Uint8Array } | { fault: string }
);

/** A batch of work: whole lines of a JSONL file as bytes, whole elements of a JSON array as bytes, Parquet's records, or where a file broke off. */
export type Batch = LineBlock | ElementBlock | { records: RawRecord[] };

// A batch's outcomes are numbers, FIELDS a record, so that thousands of them cross between threads as one
// copy: what became of it (KIND), its line (a JSONL block's; an element is named by its place in the batch), where
// its text lies in the block (a block of bytes), where its session's line ends in `lines`, its id's key
// (SessionIdSet.key) and FLAGS.
const FIELDS = 8;
const [KIND, LINE, RAW_START, RAW_END, END, KEY_HI, KEY_LO, FLAGS] = [0, 1, 2, 3, 4, 5, 6, 7];
const [SESSION, REASON, FAULT, DAMAGED] = [0, 1, 2, 3];
// NEW_TASK: the session's task is not the one of the batch's session before it (the batch's first always).
const [NOT_UTF8, UNTASKED, NEW_TASK] = [1, 2, 4];

/**
 * What became of a batch's records, in order: `records` (FIELDS numbers each), the reasons and faults in
 * `notes` in the order they occur, and the sessions' lines as one block of UTF-8 (moved, not copied, to the
 * main thread, which writes slices of it).
 */
export interface BatchOutcome {
  records: Uint32Array;
  notes: string[];
  /** The task of each session flagged NEW_TASK, in order (split's tasks file is made from them). */
  tasks: (string | null)[];
  lines: Uint8Array;
  /** A block of lines, given back: it moved to the thread, and comes back for the main thread to read from and fill again. */
  block?: Uint8Array;
}

/**
 * A session's line with its messages as stored (their bytes, as the record held them): JSON.stringify of the
 * session, field by field in the order toSession makes them, around them (the test of stored records holds
 * it to JSON.stringify): a fifth faster than stringifying the session without messages and splicing them in.
 */
export function writeStoredSession(out: LineBuffer, s: Session, messages: Uint8Array): void {
  const q = JSON.stringify;
  out.write(`{"session_id":${q(s.session_id)},"task_id":${q(s.task_id)},"messages":`);
  out.writeBytes(messages);
  out.write(
    `,"reward":${q(s.reward)},"feedback":${q(s.feedback)},"model":${q(s.model)},"source":${q(s.source)},"created_at":${q(s.created_at)},"metadata":${q(s.metadata)}}`,
  );
  out.end();
}

/** Collects a batch's outcomes as BatchOutcome packs them. */
class Outcomes {
  private readonly numbers: number[] = [];
  private readonly notes: string[] = [];
  private readonly tasks: (string | null)[] = [];
  /** The task of the last session added; undefined before the first. */
  private task: string | null | undefined = undefined;
  private readonly lines: LineBuffer;

  /** `bytes`: about what the batch's records take as text (their sessions' lines take a little more); the lines' buffer comes from `shelf`. */
  constructor(bytes: number, shelf: BufferShelf) {
    this.lines = new LineBuffer(bytes + (bytes >> 2) + (64 << 10), shelf);
  }

  add(out: RecordOutcome, line = 0, rawStart = 0, rawEnd = 0): void {
    const flags = out.notUtf8 ? NOT_UTF8 : 0;
    if ('session' in out) {
      if (out.stored) writeStoredSession(this.lines, out.session, out.stored);
      else this.lines.push(JSON.stringify(out.session));
      const [hi, lo] = SessionIdSet.key(out.session.session_id);
      const task = out.session.task_id;
      const newTask = task !== this.task;
      if (newTask) this.tasks.push((this.task = task));
      this.numbers.push(
        SESSION,
        line,
        rawStart,
        rawEnd,
        this.lines.length,
        hi,
        lo,
        flags | (task === null ? UNTASKED : 0) | (newTask ? NEW_TASK : 0),
      );
      return;
    }
    this.notes.push('reason' in out ? out.reason : out.fault);
    this.numbers.push('reason' in out ? REASON : FAULT, line, rawStart, rawEnd, this.lines.length, 0, 0, flags);
  }

  damaged(reason: string): void {
    this.notes.push(reason);
    this.numbers.push(DAMAGED, 0, 0, 0, this.lines.length, 0, 0, 0);
  }

  done(): BatchOutcome {
    return { records: Uint32Array.from(this.numbers), notes: this.notes, tasks: this.tasks, lines: this.lines.take() };
  }
}

/** Per reading options, the reader that keeps records' messages as stored, if they allow one. */
const storedReaders = new WeakMap<ReadingOptions, StoredReader | null>();

/**
 * A batch's records read as readOne reads them; a JSONL line or a JSON array's element whose messages are
 * written as ingest writes them keeps them as they are (canonical.ts): the same session, the same line. The
 * lines' buffer comes from `shelf`; a block of bytes is given back with the outcome.
 */
export function readBatch(batch: Batch, fileName: string, o: ReadingOptions, shelf: BufferShelf): BatchOutcome {
  if (!storedReaders.has(o))
    storedReaders.set(
      o,
      storedReader(o.mapping, o.maxRecordBytes, (text, value) => tooDeep({ raw: text, value })),
    );
  const reader = storedReaders.get(o)!;
  const out = new Outcomes(
    'bytes' in batch
      ? batch.bytes.byteLength
      : 'records' in batch
        ? batch.records.reduce((n, r) => n + r.raw.length, 0)
        : 0,
    shelf,
  );
  if ('damaged' in batch) out.damaged(batch.damaged);
  else if ('records' in batch) {
    for (const record of batch.records) {
      if (record.damaged) out.damaged(record.error!);
      else out.add(readOne(record, fileName, o));
    }
  } else if ('elements' in batch) {
    const block = Buffer.from(batch.bytes.buffer, batch.bytes.byteOffset, batch.bytes.byteLength);
    const { elements } = batch;
    for (let e = 0; e < elements.length; e += ELEMENT_FIELDS) {
      const [start, end, where] = [elements[e]!, elements[e + 1]!, elementWhere(elements, e)];
      const stored = reader?.(block, start, end, `${fileName} ${where}`);
      if (stored) out.add({ notUtf8: false, session: stored.session, stored: stored.messages }, 0, start, end);
      else out.add(readOne({ where, raw: block.toString('utf8', start, end) }, fileName, o), 0, start, end);
    }
  } else {
    const block = Buffer.from(batch.bytes.buffer, batch.bytes.byteOffset, batch.bytes.byteLength);
    // Empty lines are counted, not called: they are nothing.
    forEachLine(
      block,
      (start, end, n) => {
        const line = batch.firstLine - 1 + n;
        if (start === end) return;
        const stored = reader?.(block, start, end, `${fileName} line ${line}`);
        if (stored)
          return out.add({ notUtf8: false, session: stored.session, stored: stored.messages }, line, start, end);
        const raw = block.toString('utf8', start, end);
        if (raw.trim() !== '') out.add(readOne({ where: `line ${line}`, raw }, fileName, o), line, start, end);
      },
      true,
    );
  }
  return { ...out.done(), ...('bytes' in batch ? { block: batch.bytes } : {}) };
}

/**
 * Reads one record: parsed (when the reader left it as text), checked, mapped, and the session made into
 * its line. Which ids are duplicates is decided afterwards, in order, on the main thread.
 */
export function readOne(given: RawRecord, fileName: string, o: ReadingOptions): RecordOutcome {
  const record = given.value === undefined && given.error === undefined ? parseRecord(given.where, given.raw) : given;
  // Bytes that are not UTF-8 are read as U+FFFD: counted, and the record kept.
  const notUtf8 = record.raw.includes('\uFFFD');
  if (record.error !== undefined) return { notUtf8, reason: record.error };
  const cannot = unreadable(record, o.maxRecordBytes);
  if (cannot) return { notUtf8, reason: cannot };
  try {
    return { notUtf8, session: toSession(record.value, `${fileName} ${record.where}`, o.mapping) };
  } catch (error) {
    // Anything but a reason the record is bad is a fault of ingest's own: the caller says where it happened.
    if (!(error instanceof RecordError)) return { notUtf8, fault: (error as Error).message };
    return { notUtf8, reason: error.message };
  }
}

/**
 * A file's work in batches: a JSONL file as blocks of whole lines, a JSON array as blocks of whole elements
 * (about 1 MiB: a thread's share worth sending, and the main thread never decodes a record it only writes);
 * Parquet as records, in batches of about 1 MiB of text (or 1,024 records), read on a thread of their own
 * (readParquetBatches: a row group is decoded whole, and one too large for memory ends that thread, not the
 * process). Batches, not records, so that a buffer of lines serves many records and no text is decoded twice.
 */
async function* batchesOf(
  path: string,
  format: InputFormat,
  shelf: BufferShelf,
  blockBytes: number,
  limit: LineLimit,
  parquetHeapMb?: number,
): AsyncGenerator<Batch> {
  if (format === 'jsonl') {
    yield* readLineBlocks(path, blockBytes, shelf, limit);
    return;
  }
  if (format === 'json') {
    try {
      yield* readElementBlocks(path, blockBytes, shelf, limit.bytes, limit.key);
    } catch (error) {
      yield { damaged: damageReason(path, error) };
    }
    return;
  }
  const { readParquetBatches } = await import('../../pipeline/parquet.ts'); // the Parquet libraries only when a file is Parquet
  for await (const records of readParquetBatches(path, parquetHeapMb)) yield { records };
}

/** What a worker thread of ingest is started with. */
export interface WorkerInit {
  options: ReadingOptions;
}

/** A batch of a file's, as a worker thread reads it. */
export interface FileBatch {
  batch: Batch;
  fileName: string;
}

/** The threads that read the files of an ingest, one after another. */
type IngestThreads = WorkerPool<FileBatch, BatchOutcome>;

/** Files of this many bytes or more in all (JSONL and JSON) are read with worker threads by default (`--workers` overrides). */
const LARGE_INPUT = 16 << 20;

const formatOf = (file: ExternalFile, o: ReadingOptions): InputFormat | null =>
  o.format === 'auto' ? detectFormat(file.path) : o.format;

/**
 * About the bytes a file's records take as text: a .gz file's as its trailer says (their size modulo 4 GiB:
 * a small gzip can hold enough to want threads), at least the file's own and at most what deflate can make of
 * it (1,032 to 1: a damaged trailer says anything).
 */
function contentBytes(file: ExternalFile): number {
  if (!file.path.endsWith('.gz') || file.bytes < 18) return file.bytes;
  let fd: number;
  try {
    fd = openSync(file.path, 'r');
  } catch {
    return file.bytes; // gone or unreadable: its turn comes to say so (ingestFiles)
  }
  try {
    const trailer = Buffer.alloc(4);
    readSync(fd, trailer, 0, 4, file.bytes - 4);
    return Math.max(file.bytes, Math.min(trailer.readUInt32LE(0), 1032 * file.bytes));
  } finally {
    closeSync(fd);
  }
}

/**
 * The threads that read files of `bytes` (as contentBytes has them) in all, JSONL and JSON, started once for
 * all of them; none where there is one thread, or nothing but Parquet (read on a thread of its own, its
 * records mapped on this one). A JSONL file or JSON array is read in blocks of at most 1 MiB, and of about
 * half a thread's share of all the files where that is smaller, so that every thread works on small input
 * too: the share is of all the files, not of each, or many small files would be cut needlessly fine.
 */
function startThreads(bytes: number, o: ReadingOptions, workers: unknown): IngestThreads | null {
  const threads = workerCount(workers, bytes >= LARGE_INPUT);
  if (bytes === 0 || threads <= 1) return null;
  return new WorkerPool<FileBatch, BatchOutcome>(
    'ingest-worker',
    new URL('./worker.ts', import.meta.url),
    threads,
    { options: o } satisfies WorkerInit,
    ({ batch }) => ('bytes' in batch ? [batch.bytes.buffer as ArrayBuffer] : []),
  );
}

/** A file being read into its segment: what becomes of each of its batches (taken in order), and its end. */
interface FileReading {
  file: ExternalFile;
  /** The threads its batches go to; none for a file read on this thread (Parquet, or no threads). */
  pool: IngestThreads | null;
  use(outcome: BatchOutcome, batch: Batch): Promise<void>;
  /** Its end: what it became, and its segment's closing (awaited once every file is read). */
  done(): { file: IngestedFile; closed: Promise<void>; kept: FinishedFile };
  /** Its files closed as they are, where the stage failed while reading it. */
  abort(): Promise<void>;
}

/** A file read to its end, its segment and tasks file closed: what the stage keeps of it should a later file fail. */
export interface FinishedFile {
  file: IngestedFile;
  /** The quarantine's size once this file's records were in it (its bytes before this writer, plus the writer's). */
  quarantineBytes: number;
  /** Why its records were quarantined, counted as `reasons` counts them; absent where none was (most files). */
  reasons?: [string, number][];
}

/** What ingestFiles reads into, and how. */
export interface IngestTarget {
  /** The ingest folder being made (layout.ts: sessions/ and tasks/). */
  out: string;
  /** Every session id ingested so far; the files' ids are added. */
  ids: SessionIdSet;
  quarantine: JsonlWriter;
  /** The quarantine file's size before `quarantine` wrote to it. */
  quarantineStart: number;
  /** Why records were quarantined (numbers and quoted values blanked, so alike reasons count together). */
  reasons: Map<string, number>;
  log: Logger;
  signal: AbortSignal;
  /** `--workers`: threads that parse and map records (startThreads). */
  workers: unknown;
  /** A test's smaller heap for the thread that reads a Parquet file. */
  parquetHeapMb?: number;
  /**
   * Each file as it is finished, in order (a file only once every one before it is): where a later file fails,
   * these are the work kept for the next run (run.ts).
   */
  finished: FinishedFile[];
}

/**
 * Reads `files` into their segments (`seq`: each one's number) and tasks files in the ingest folder
 * `target.out`. Blocks read, and buffers of lines written, are filled again (one BufferShelf for
 * all the files): by this thread, or by the threads they came from. With threads (startThreads; `workers`,
 * `--workers`), batches are parsed and mapped on them, the files' one after another (a file is read while
 * the one before is still on the threads), and the results used in order: the segments and the quarantine
 * are the same byte for byte. One shelf for all the files, so that many small files do not each map new memory.
 */
export async function ingestFiles(
  files: { file: ExternalFile; seq: number }[],
  o: ReadingOptions,
  target: IngestTarget,
): Promise<IngestedFile[]> {
  const { log, signal, workers, parquetHeapMb, finished } = target;
  // A file whose format cannot be told stops the stage before any is read.
  const formats = files.map(({ file }) => {
    const format = formatOf(file, o);
    if (!format)
      throw new UsageError(
        `${file.name}: cannot tell its format from the name; use .jsonl, .json or .parquet, or set ingest.format`,
      );
    return format;
  });
  const sizes = files.map(({ file }, i) => (formats[i] === 'parquet' ? 0 : contentBytes(file)));
  const shelf = new BufferShelf();
  const total = sizes.reduce((n, b) => n + b, 0);
  const threads = startThreads(total, o, workers);
  type Job = { reading: FileReading; batch: Batch | null };
  async function* jobs(): AsyncGenerator<Job> {
    for (const [i, { file, seq }] of files.entries()) {
      // A file of fewer records than a safe point's interval never reaches one inside it: between files too.
      await safePoint(
        signal,
        () =>
          `ingest: stopped before reading ${file.name}; the ${finished.length} file(s) read before it are kept for the next run`,
      );
      // Parquet's records come from the thread that reads the file (readParquetBatches) and are mapped on this
      // one: sent on to ingest's threads, as records or as blocks of text, they were no faster, the reading
      // thread being the slower side (docs/experiments.md, "Parquet rows assembled as text").
      const pool = formats[i] === 'parquet' ? null : threads;
      const blockBytes = pool ? Math.min(1 << 20, Math.max(64 << 10, Math.ceil(total / (2 * pool.size)))) : 1 << 20;
      // A file gone since it was listed (a rotated log) or unreadable is skipped, saying so, and the others go
      // on: looked at before its reader opens it (a .gz or .json reader would take the failure for damage).
      // Once open, it reads to its end (an unlinked file's data stays).
      const unopened = (error: unknown) => {
        const code = (error as NodeJS.ErrnoException).code;
        if (code !== 'ENOENT' && code !== 'EACCES' && code !== 'EISDIR') throw error;
        log.warn('skipped an input file that could not be opened: gone since it was listed, or unreadable', {
          file: file.name,
          error: (error as Error).message,
        });
      };
      try {
        await access(file.path, constants.R_OK);
      } catch (error) {
        unopened(error);
        continue;
      }
      const limit = recordLimit(o.maxRecordBytes, 'ingest.max_record_bytes', signal);
      const batches = batchesOf(file.path, formats[i]!, shelf, blockBytes, limit, parquetHeapMb);
      let next: IteratorResult<Batch>;
      try {
        next = await batches.next();
      } catch (error) {
        unopened(error);
        continue;
      }
      const begun = fileReading(file, seq, target, shelf, pool);
      reading.add(begun);
      try {
        for (; !next.done; next = await batches.next()) yield { reading: begun, batch: next.value };
      } finally {
        // Stopped early (a failure, an interrupt): its reader closes its file or thread, as for-await would.
        await batches.return(undefined);
      }
      // Its end, once its batches are used.
      yield { reading: begun, batch: null };
    }
  }
  const here = ({ reading, batch }: Job) => (batch ? readBatch(batch, reading.file.name, o, shelf) : null);
  const work = threads
    ? {
        size: threads.size,
        run: (job: Job) =>
          job.batch && job.reading.pool
            ? threads.run({ batch: job.batch, fileName: job.reading.file.name })
            : Promise.resolve(here(job)),
      }
    : here;
  const ingested: IngestedFile[] = [];
  const closing: Promise<void>[] = [];
  // Files are finished in order: each once its own closing and the one before it are done.
  let inOrderClosed = Promise.resolve();
  // Files begun and not done: where the stage fails, their segment and tasks file are closed as they are.
  const reading = new Set<FileReading>();
  try {
    await inOrder(jobs(), work, async (outcome, job) => {
      if (job.batch) await job.reading.use(outcome!, job.batch);
      else {
        // Its segment is closed meanwhile: waiting for each of hundreds of small files' would serialize them.
        const { file, closed, kept } = job.reading.done();
        reading.delete(job.reading);
        ingested.push(file);
        closing.push(closed);
        inOrderClosed = inOrderClosed.then(async () => {
          await closed;
          finished.push(kept);
        });
        inOrderClosed.catch(() => {}); // a failed closing is awaited below, as `closing`'s are
        // At most CLOSING_AT_ONCE files' segments still closing: 50,000 small files must not hold a
        // descriptor each (EMFILE at ulimit -n 1024), nor a promise each.
        if (closing.length > CLOSING_AT_ONCE) await closing.shift();
      }
    });
  } finally {
    await threads?.close();
    await Promise.allSettled([...closing, inOrderClosed, ...[...reading].map((r) => r.abort())]);
  }
  await Promise.all(closing);
  return ingested;
}

/**
 * Bytes of a segment in flight to disk past which its writer waits. A batch's lines are up to a MiB, so with
 * the writers' default (1 MiB) this thread would wait on each write before handing out more work.
 */
const SEGMENT_IN_FLIGHT = 16 << 20;

/** Files whose segment and tasks file may still be closing while the next ones are read. */
const CLOSING_AT_ONCE = 64;

function fileReading(
  file: ExternalFile,
  seq: number,
  { out, ids, quarantine, quarantineStart, reasons, log, signal }: IngestTarget,
  shelf: BufferShelf,
  pool: IngestThreads | null,
): FileReading {
  const segment = flatString(`${String(seq).padStart(5, '0')}-${file.xxh64.slice(0, 12)}.jsonl`); // the index keeps one a file
  const writer = new JsonlWriter(join(out, 'sessions', segment), 'w', SEGMENT_IN_FLIGHT);
  const tasks = new TaskRunsWriter(taskRunsFile(out, segment));
  // The task of the session being read, from its batch's tasks (BatchOutcome).
  let task: string | null = null;
  // Its progress starts when its first batch is used (the one before may still be going).
  let progress: Progress | null = null;
  let quarantined = 0;
  let duplicates = 0;
  let untasked = 0;
  let invalidUtf8 = 0;
  let damaged: string | null = null;
  // Its own reasons, added to the run's when it is done (a file that fails adds none).
  const fileReasons = new Map<string, number>();
  // Where record `i` of a batch is (its reader's name for it, its element's or its line), and the last one
  // read before a damage: named only when needed (a string a record costs).
  const whereOf = (batch: Batch, i: number, line: number) =>
    'records' in batch
      ? batch.records[i]!.where
      : 'elements' in batch
        ? elementWhere(batch.elements, i * ELEMENT_FIELDS)
        : `line ${line}`;
  const reached = { batch: null as Batch | null, i: 0, line: 0 };
  const due = every(1000);
  const stopped = () =>
    `ingest: stopped while reading ${file.name}; the next run reads again every file this run was reading`;
  // A damaged file's reason is not counted among the common ones: a failing run tells it whole (run.ts).
  const quarantineRecord = async (where: string, reason: string, raw: string, counted = true) => {
    quarantined++;
    if (counted) {
      const kind = reasonKind(reason);
      fileReasons.set(kind, (fileReasons.get(kind) ?? 0) + 1);
    }
    await quarantine.write({ file: file.name, where, reason, raw: quarantineText(raw) } satisfies QuarantineRecord);
  };
  const use = async ({ records, notes, tasks: batchTasks, lines, block: returned }: BatchOutcome, batch: Batch) => {
    const bytes = returned ?? ('bytes' in batch ? batch.bytes : null);
    const block = bytes && Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const sessionLines = Buffer.from(lines.buffer, lines.byteOffset, lines.byteLength);
    // A record's text, for the quarantine: its reader's, or its line's or element's bytes in the block.
    const rawOf = (given: RawRecord | null, r: number) =>
      given?.raw ?? block!.toString('utf8', records[r + RAW_START], records[r + RAW_END]);
    let note = 0;
    let nextTask = 0;
    let start = 0;
    // Sessions' lines follow one another in `lines`: each run of them between duplicates is written at once.
    const runs: { from: number; to: number; lines: number }[] = [];
    let run = { from: 0, to: 0, lines: 0 };
    for (let i = 0, r = 0; r < records.length; i++, r += FIELDS) {
      const given = 'records' in batch ? batch.records[i]! : null;
      const line = records[r + LINE]!;
      if (due()) await safePoint(signal, stopped);
      (progress ??= log.progress(`ingest ${file.name}`)).tick();
      const kind = records[r + KIND];
      if (kind === DAMAGED) {
        // What was read before the damage is kept; the rest of the file is one quarantine entry.
        damaged = notes[note++]!;
        const at =
          given?.where ??
          (reached.batch ? `after ${whereOf(reached.batch, reached.i, reached.line)}` : 'before the first record');
        log.warn('a damaged file: its records before the damage are kept, the rest is quarantined', {
          file: file.name,
          where: at,
          reason: damaged,
        });
        await quarantineRecord(at, damaged, given?.raw ?? '', false);
        continue;
      }
      reached.batch = batch;
      reached.i = i;
      reached.line = line;
      if (records[r + FLAGS]! & NOT_UTF8) invalidUtf8++;
      if (kind === FAULT) throw new Error(`ingest: ${file.name} ${whereOf(batch, i, line)}: ${notes[note]}`);
      if (kind === REASON) {
        await quarantineRecord(whereOf(batch, i, line), notes[note++]!, rawOf(given, r));
        continue;
      }
      const lineStart = start;
      start = records[r + END]!;
      if (records[r + FLAGS]! & NEW_TASK) task = batchTasks[nextTask++]!;
      if (!ids.addKey(records[r + KEY_HI]!, records[r + KEY_LO]!)) {
        if (run.lines > 0) runs.push(run);
        run = { from: start, to: start, lines: 0 };
        // A file's first duplicates are listed (with an excerpt: the whole is the session kept); the rest are
        // counted, so a file of 100,000 copies of one line does not copy them into the quarantine.
        if (++duplicates > DUPLICATES_LISTED) continue;
        // Which id it was is read from the head of its session's line (ids do not cross between threads),
        // rather than the record parsed and mapped again on this thread.
        const id = leadingSessionId(sessionLines, lineStart, start);
        await quarantine.write({
          file: file.name,
          where: whereOf(batch, i, line),
          reason: `duplicate session_id '${id}' (dropped; the first one is kept)`,
          raw: quarantineText(rawOf(given, r), 1024),
        } satisfies QuarantineRecord);
        continue;
      }
      if (records[r + FLAGS]! & UNTASKED) untasked++;
      tasks.add(task, start - lineStart);
      run.to = start;
      run.lines++;
      if (run.lines === 1) run.from = lineStart;
    }
    if (run.lines > 0) runs.push(run);
    if (block) shelf.put(block.buffer as ArrayBuffer);
    // The lines' buffer is filled again once the last write from it is on its way to disk.
    const recycle = () =>
      pool ? pool.giveBack([lines.buffer as ArrayBuffer]) : shelf.put(lines.buffer as ArrayBuffer);
    if (runs.length === 0) recycle();
    for (const [k, { from, to, lines: count }] of runs.entries())
      await writer.writeBlock(lines.subarray(from, to), count, k === runs.length - 1 ? recycle : undefined);
    await tasks.drain();
  };
  const done = () => {
    (progress ?? log.progress(`ingest ${file.name}`)).done();
    const closed = Promise.all([writer.close(), tasks.close()]).then(() => {});
    closed.catch(() => {}); // its failure is awaited with the others'
    if (invalidUtf8)
      log.warn('records with bytes that are not UTF-8 (read as U+FFFD)', { file: file.name, records: invalidUtf8 });
    log.info('ingested', { file: file.name, sessions: writer.count, quarantined, duplicates });
    for (const [kind, n] of fileReasons) reasons.set(kind, (reasons.get(kind) ?? 0) + n);
    const ingested: IngestedFile = {
      name: file.name,
      xxh64: file.xxh64,
      segment,
      segment_bytes: writer.bytes,
      sessions: writer.count,
      untasked,
      quarantined,
      duplicates,
      invalid_utf8: invalidUtf8,
      damaged,
      ingested_at: new Date().toISOString(),
    };
    const kept: FinishedFile = { file: ingested, quarantineBytes: quarantineStart + quarantine.bytes };
    if (fileReasons.size > 0) kept.reasons = [...fileReasons];
    return { closed, file: ingested, kept };
  };
  const abort = async () => {
    await Promise.allSettled([writer.abort(), tasks.abort()]);
  };
  return { file, pool, use, done, abort };
}

/**
 * A segment's tasks file (layout.ts TaskRun), written as its sessions are: a run's line once the next task
 * starts. The threads, which have each session at hand, say where a batch's task changes (BatchOutcome's
 * `tasks`): this thread hands out the threads' work, so it reads no line's head for its task.
 */
class TaskRunsWriter {
  private run: TaskRun | null = null;
  private readonly lines = new LineBuffer(64 << 10);
  private readonly writer: JsonlWriter;

  constructor(path: string) {
    this.writer = new JsonlWriter(path);
  }

  /** The segment's next session: its task, and its line's bytes. */
  add(task: string | null, bytes: number): void {
    if (this.run?.[0] === task) {
      this.run[1]++;
      this.run[2] += bytes;
      return;
    }
    if (this.run) this.lines.push(JSON.stringify(this.run));
    this.run = [task, 1, bytes];
  }

  /** Writes the runs' lines gathered so far, once there are 64 KiB of them. */
  async drain(least = 64 << 10): Promise<void> {
    if (this.lines.length < least || this.lines.length === 0) return;
    const count = this.lines.count;
    await this.writer.writeBlock(this.lines.take(), count);
  }

  async close(): Promise<void> {
    if (this.run) this.lines.push(JSON.stringify(this.run));
    this.run = null;
    await this.drain(0);
    await this.writer.close();
  }

  abort(): Promise<void> {
    return this.writer.abort();
  }
}

/** The session ids of a segment, in order. */
export async function* readSegmentIds(path: string): AsyncGenerator<string> {
  for await (const s of readJsonl<{ session_id: string }>(path)) yield s.session_id;
}
