// What passes between stages on disk: the files one stage writes into its folder and a later one reads.
// A stage reads another's output only through this module, never through the other stage's code.
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { unitHash } from '../pipeline/hash.ts';
import { readJsonl } from '../pipeline/jsonl.ts';
import { readJsonFile } from '../pipeline/workspace.ts';
import type { Split, SplitSession } from '../core/records.ts';

// ── ingest: sessions/<segment>.jsonl, one segment per input file, and index.json ──

/** What index.json records of each ingested file. */
export interface IngestedFile {
  name: string;
  sha256: string;
  segment: string;
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

/** The index of the closing quote of the JSON string whose opening quote is at `at` in `bytes`, or -1. */
export function stringEnd(bytes: Uint8Array, at: number, end = bytes.length): number {
  for (let i = at + 1; i < end; i++) {
    const c = bytes[i];
    if (c === 92) i++; // a backslash: the next byte is escaped
    else if (c === 34) return i;
  }
  return -1;
}

/** A JSON string literal (quotes included) of `bytes`, decoded. */
function decodeString(bytes: Uint8Array, from: number, to: number): string {
  if (bytes.subarray(from, to).includes(92)) return JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset + from, to - from).toString('utf8')) as string;
  return Buffer.from(bytes.buffer, bytes.byteOffset + from + 1, to - from - 2).toString('utf8');
}

const HEAD = Buffer.from('{"session_id":"');
const TASK = Buffer.from(',"task_id":');
const NULL = Buffer.from('null,');

/** Whether `bytes` holds `expected` at `at`. */
function holds(bytes: Uint8Array, at: number, expected: Uint8Array): boolean {
  if (at + expected.length > bytes.length) return false;
  for (let i = 0; i < expected.length; i++) if (bytes[at + i] !== expected[i]) return false;
  return true;
}

/**
 * The task_id of a session's line as ingest writes it (JSON.stringify of a Session: session_id first, then
 * task_id), read from the line's first bytes (`start` to `end` of `bytes`) without parsing the rest;
 * undefined for a line that does not start so.
 */
export function leadingTaskId(bytes: Uint8Array, start = 0, end = bytes.length): string | null | undefined {
  if (!holds(bytes, start, HEAD)) return undefined;
  const idEnd = stringEnd(bytes, start + HEAD.length - 1, end);
  if (idEnd < 0 || !holds(bytes, idEnd + 1, TASK)) return undefined;
  const at = idEnd + 1 + TASK.length;
  if (holds(bytes, at, NULL)) return null;
  if (bytes[at] !== 34) return undefined;
  const close = stringEnd(bytes, at, end);
  return close < 0 ? undefined : decodeString(bytes, at, close + 1);
}

/** The segment files of an ingest folder, in ingestion order. */
export async function sessionSegments(ingestDir: string): Promise<string[]> {
  return (await readdir(join(ingestDir, 'sessions'))).sort().map((f) => join(ingestDir, 'sessions', f));
}

// ── split (and sample, which writes the same layout): sessions/<side>-<bucket>.jsonl and info.json ──

export const SPLITS: readonly Split[] = ['train', 'test'];

/** The bucket file of `split` number `bucket`: a task's sessions are all in one bucket. */
export function bucketFile(dir: string, split: Split, bucket: number): string {
  return join(dir, 'sessions', `${split}-${String(bucket).padStart(3, '0')}.jsonl`);
}

/** The bucket of a task, of `buckets`: by a stable hash, so a task's sessions always share one. */
export const bucketOf = (taskId: string, buckets: number) => Math.floor(unitHash(taskId, 'bucket') * buckets);

export interface SplitInfo {
  buckets: number;
}

export async function readSplitInfo(splitDir: string): Promise<SplitInfo> {
  return (await readJsonFile<SplitInfo>(join(splitDir, 'info.json')))!;
}

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

// ── pairs: pairs/<side>-<bucket>.jsonl and info.json ──

/** What the judge stage needs to know of how pairs were made. */
export interface PairsInfo {
  must_decline: string[];
  /** The model that wrote hard negatives, or null when the rewriter is off. */
  rewriter_model: string | null;
}

export const readPairsInfo = (dir: string) => readJsonFile<PairsInfo>(join(dir, 'info.json'));
