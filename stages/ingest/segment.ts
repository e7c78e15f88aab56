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
import { detectFormat, quarantineText, readRecords, type InputFormat } from '../../pipeline/records.ts';

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

/** How many '[' and '{' the text has: a record with fewer cannot nest deeper than that, so most are never walked. */
function openings(raw: string): number {
  let n = 0;
  for (let i = 0; i < raw.length; i++) {
    const c = raw.charCodeAt(i);
    if (c === 91 || c === 123) n++;
  }
  return n;
}

/** Why a record cannot be read, before it is mapped: too large, nested too deep; null when it can. */
function unreadable(record: { value?: unknown; raw: string }, maxBytes: number): string | null {
  const bytes = Buffer.byteLength(record.raw);
  if (bytes > maxBytes) return `the record is ${bytes.toLocaleString('en-US')} bytes, more than ingest.max_record_bytes (${maxBytes.toLocaleString('en-US')})`;
  if (openings(record.raw) > MAX_DEPTH && depthOf(record.value, MAX_DEPTH) > MAX_DEPTH) return `the record nests more than ${MAX_DEPTH} levels deep`;
  return null;
}

/**
 * Reads `file` into segment number `seq` in `dir`; `ids` holds every session id ingested so far. `reasons`
 * counts why records were quarantined (numbers and quoted values blanked, so alike reasons count together).
 */
export async function ingestFile(file: ExternalFile, o: ReadingOptions, dir: string, seq: number, ids: SessionIdSet, quarantine: JsonlWriter, reasons: Map<string, number>, log: Logger, signal: AbortSignal): Promise<IngestedFile> {
  const format: InputFormat | null = o.format === 'auto' ? detectFormat(file.path) : o.format;
  if (!format) throw new UsageError(`${file.name}: cannot tell its format from the name; use .jsonl, .json or .parquet, or set ingest.format`);
  const segment = `${String(seq).padStart(5, '0')}-${file.sha256.slice(0, 12)}.jsonl`;
  const writer = new JsonlWriter(join(dir, segment));
  const options = o.mapping;
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
  for await (const record of readRecords(file.path, format)) {
    if (due()) await safePoint(signal, stopped);
    progress.tick();
    if (record.damaged) {
      // What was read before the damage is kept; the rest of the file is one quarantine entry.
      damaged = record.error!;
      log.warn('a damaged file: its records before the damage are kept, the rest is quarantined', { file: file.name, where: record.where, reason: record.error });
    }
    const source = `${file.name} ${record.where}`;
    // Bytes that are not UTF-8 are read as U+FFFD: counted, and the record kept.
    if (record.raw.includes('\uFFFD')) invalidUtf8++;
    if (record.error !== undefined) {
      await quarantineRecord(record.where, record.error, record.raw);
      continue;
    }
    const cannot = unreadable(record, o.maxRecordBytes);
    if (cannot) {
      await quarantineRecord(record.where, cannot, record.raw);
      continue;
    }
    let session;
    try {
      session = toSession(record.value, source, options);
    } catch (error) {
      // Anything but a reason the record is bad is a fault of ingest's own: it says where it happened.
      if (!(error instanceof RecordError)) throw new Error(`ingest: ${source}: ${(error as Error).message}`, { cause: error });
      await quarantineRecord(record.where, error.message, record.raw);
      continue;
    }
    if (!ids.add(session.session_id)) {
      duplicates++;
      await quarantine.write({ file: file.name, where: record.where, reason: `duplicate session_id '${session.session_id}' (dropped; the first one is kept)`, raw: quarantineText(record.raw) } satisfies QuarantineRecord);
      continue;
    }
    if (session.task_id === null) untasked++;
    await writer.write(session);
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
