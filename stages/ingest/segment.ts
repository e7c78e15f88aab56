// One input file read into a segment of sessions: each record mapped and validated; what cannot become a
// session, and a session id seen before, goes to the quarantine with its file, place and reason.
import { join } from 'node:path';
import { JsonlWriter, readJsonl } from '../../pipeline/jsonl.ts';
import { every, safePoint } from '../../pipeline/interrupt.ts';
import type { Logger } from '../../pipeline/log.ts';
import type { ExternalFile } from '../../pipeline/stage.ts';
import { UsageError } from '../../pipeline/errors.ts';
import type { IngestedFile } from '../layout.ts';
import type { SessionIdSet } from './id-set.ts';
import { RecordError, toSession, type MappingOptions } from './mapping.ts';
import { detectFormat, parseRecord, quarantineText, readRecords, type InputFormat, type RawRecord } from '../../pipeline/records.ts';
import { WorkerPool, inOrder, workerCount } from '../../pipeline/workers.ts';

export interface QuarantineRecord {
  file: string;
  where: string;
  reason: string;
  raw: string;
}

export interface ReadingOptions {
  format: InputFormat | 'auto';
  mapping: MappingOptions;
  /** A record longer than this (its text, in bytes) is quarantined with its size, unread. */
  maxRecordBytes: number;
}

/** Deeper than this, a record is quarantined rather than walked (mapping and hashing recurse). */
const MAX_DEPTH = 200;

/** How deep `value` nests, counted without recursion; stops counting past `limit`. */
function depthOf(value: unknown, limit: number): number {
  let deepest = 0;
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length) {
    const [v, d] = stack.pop()!;
    if (v === null || typeof v !== 'object') continue;
    deepest = Math.max(deepest, d);
    if (deepest > limit) return deepest;
    for (const child of Array.isArray(v) ? v : Object.values(v)) if (child !== null && typeof child === 'object') stack.push([child, d + 1]);
  }
  return deepest;
}

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

/** Why a record cannot be read, before it is mapped: too large, nested too deep; null when it can. */
function unreadable(record: { value?: unknown; raw: string }, maxBytes: number): string | null {
  // A UTF-16 code unit is at most 3 bytes of UTF-8: most records need no count.
  const bytes = record.raw.length * 3 > maxBytes ? Buffer.byteLength(record.raw) : 0;
  if (bytes > maxBytes) return `the record is ${bytes.toLocaleString('en-US')} bytes, more than ingest.max_record_bytes (${maxBytes.toLocaleString('en-US')})`;
  if (moreOpenings(record.raw, MAX_DEPTH) && depthOf(record.value, MAX_DEPTH) > MAX_DEPTH) return `the record nests more than ${MAX_DEPTH} levels deep`;
  return null;
}

/** What one record became, worked out apart from every other record (on a worker thread, where there are some). */
type RecordOutcome = { notUtf8: boolean } & ({ reason: string } | { id: string; untasked: boolean; json: string } | { fault: string });

/**
 * A batch's outcomes from a worker thread: the sessions' lines come as one block of UTF-8 (moved, not
 * copied, to the main thread, which writes slices of it), each session's `json` then empty and `end` where
 * its line ends in the block.
 */
export interface BatchOutcome {
  outcomes: (RecordOutcome & { end?: number })[];
  lines: Uint8Array;
}

const encoder = new TextEncoder();

/** The records of a batch read as readOne reads them, their lines packed into one block. */
export function readBatch(batch: RawRecord[], fileName: string, o: ReadingOptions): BatchOutcome {
  const outcomes: BatchOutcome['outcomes'] = batch.map((r) => readOne(r, fileName, o));
  const texts: string[] = [];
  let end = 0;
  for (const out of outcomes) {
    if (!('json' in out)) continue;
    texts.push(out.json, '\n');
    end += Buffer.byteLength(out.json) + 1;
    out.end = end;
    out.json = '';
  }
  return { outcomes, lines: encoder.encode(texts.join('')) };
}

/**
 * Reads one record: parsed (when the reader left it as text), checked, mapped, and the session made into
 * its line. Which ids are duplicates is decided afterwards, in order, on the main thread.
 */
function readOne(given: RawRecord, fileName: string, o: ReadingOptions): RecordOutcome {
  const record = given.value === undefined && given.error === undefined ? parseRecord(given.where, given.raw) : given;
  // Bytes that are not UTF-8 are read as U+FFFD: counted, and the record kept.
  const notUtf8 = record.raw.includes('\uFFFD');
  if (record.error !== undefined) return { notUtf8, reason: record.error };
  const cannot = unreadable(record, o.maxRecordBytes);
  if (cannot) return { notUtf8, reason: cannot };
  try {
    const session = toSession(record.value, `${fileName} ${record.where}`, o.mapping);
    return { notUtf8, id: session.session_id, untasked: session.task_id === null, json: JSON.stringify(session) };
  } catch (error) {
    // Anything but a reason the record is bad is a fault of ingest's own: the caller says where it happened.
    if (!(error instanceof RecordError)) return { notUtf8, fault: (error as Error).message };
    return { notUtf8, reason: error.message };
  }
}

/**
 * Records in batches of about 1 MiB of text for worker threads, so a thread's share is worth sending; one at
 * a time on this thread (a parsed record then lives only as long as it takes to write it).
 */
async function* batchesOf(records: AsyncIterable<RawRecord>, threaded: boolean): AsyncGenerator<RawRecord[]> {
  let batch: RawRecord[] = [];
  let chars = 0;
  for await (const record of records) {
    batch.push(record);
    chars += record.raw.length;
    if (!threaded || chars >= 1 << 20 || batch.length >= 1024) {
      yield batch;
      batch = [];
      chars = 0;
    }
  }
  if (batch.length) yield batch;
}

/** What a worker thread of ingest is started with. */
export interface WorkerInit {
  options: ReadingOptions;
  fileName: string;
}

/** A file this large or larger is read with worker threads by default (`--workers` overrides). */
const LARGE_FILE = 16 << 20;

/**
 * Reads `file` into segment number `seq` in `dir`; `ids` holds every session id ingested so far. `reasons`
 * counts why records were quarantined (numbers and quoted values blanked, so alike reasons count together).
 * With `workers` above 1, text records are parsed and mapped on that many threads, and the results used in
 * file order: the segment and the quarantine are the same byte for byte.
 */
export async function ingestFile(file: ExternalFile, o: ReadingOptions, dir: string, seq: number, ids: SessionIdSet, quarantine: JsonlWriter, reasons: Map<string, number>, log: Logger, signal: AbortSignal, workers?: unknown): Promise<IngestedFile> {
  const format: InputFormat | null = o.format === 'auto' ? detectFormat(file.path) : o.format;
  if (!format) throw new UsageError(`${file.name}: cannot tell its format from the name; use .jsonl, .json or .parquet, or set ingest.format`);
  const segment = `${String(seq).padStart(5, '0')}-${file.sha256.slice(0, 12)}.jsonl`;
  const writer = new JsonlWriter(join(dir, segment));
  const progress = log.progress(`ingest ${file.name}`);
  let quarantined = 0;
  let duplicates = 0;
  let untasked = 0;
  let invalidUtf8 = 0;
  let damaged: string | null = null;
  const due = every(1000);
  const stopped = () => `ingest: stopped while reading ${file.name}; the next run reads again every file this run was reading`;
  const quarantineRecord = async (where: string, reason: string, raw: string) => {
    quarantined++;
    const kind = reason.replace(/\d+/g, '#').replace(/'[^']*'/g, "'…'").slice(0, 100);
    reasons.set(kind, (reasons.get(kind) ?? 0) + 1);
    await quarantine.write({ file: file.name, where, reason, raw: quarantineText(raw) } satisfies QuarantineRecord);
  };
  const use = async ({ outcomes, lines }: BatchOutcome, batch: RawRecord[]) => {
    let start = 0;
    for (const [i, out] of outcomes.entries()) {
      const record = batch[i]!;
      if (due()) await safePoint(signal, stopped);
      progress.tick();
      if (record.damaged) {
        // What was read before the damage is kept; the rest of the file is one quarantine entry.
        damaged = record.error!;
        log.warn('a damaged file: its records before the damage are kept, the rest is quarantined', { file: file.name, where: record.where, reason: record.error });
      }
      if (out.notUtf8) invalidUtf8++;
      if ('fault' in out) throw new Error(`ingest: ${file.name} ${record.where}: ${out.fault}`);
      if ('reason' in out) {
        await quarantineRecord(record.where, out.reason, record.raw);
        continue;
      }
      const line = lines.subarray(start, out.end);
      start = out.end ?? start;
      if (!ids.add(out.id)) {
        duplicates++;
        await quarantine.write({ file: file.name, where: record.where, reason: `duplicate session_id '${out.id}' (dropped; the first one is kept)`, raw: quarantineText(record.raw) } satisfies QuarantineRecord);
        continue;
      }
      if (out.untasked) untasked++;
      await (out.json ? writer.writeLine(out.json) : writer.writeBytes(line));
    }
  };
  // Parquet rows come as values, not text: they are read on this thread.
  const threads = format === 'parquet' ? 1 : workerCount(workers, file.bytes >= LARGE_FILE);
  const pool = threads > 1 ? new WorkerPool<RawRecord[], BatchOutcome>('ingest-worker', new URL('./worker.ts', import.meta.url), threads, { options: o, fileName: file.name } satisfies WorkerInit) : null;
  try {
    const none = new Uint8Array(0);
    const local = (batch: RawRecord[]): BatchOutcome => ({ outcomes: batch.map((r) => readOne(r, file.name, o)), lines: none });
    await inOrder(batchesOf(readRecords(file.path, format, pool === null), pool !== null), pool ?? local, use);
  } finally {
    await pool?.close();
  }
  progress.done();
  await writer.close();
  if (invalidUtf8) log.warn('records with bytes that are not UTF-8 (read as U+FFFD)', { file: file.name, records: invalidUtf8 });
  log.info('ingested', { file: file.name, sessions: writer.count, quarantined, duplicates });
  return { name: file.name, sha256: file.sha256, segment, sessions: writer.count, untasked, quarantined, duplicates, invalid_utf8: invalidUtf8, damaged, ingested_at: new Date().toISOString() };
}

/** The session ids of a segment, in order. */
export async function* readSegmentIds(path: string): AsyncGenerator<string> {
  for await (const s of readJsonl<{ session_id: string }>(path)) yield s.session_id;
}
