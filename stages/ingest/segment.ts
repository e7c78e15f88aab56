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
import { detectFormat, readRecords, type InputFormat } from './readers.ts';

export interface QuarantineRecord {
  file: string;
  where: string;
  reason: string;
  raw: string;
}

export interface ReadingOptions {
  format: InputFormat | 'auto';
  mapping: MappingOptions;
}

/** Reads `file` into segment number `seq` in `dir`; `ids` holds every session id ingested so far. */
export async function ingestFile(file: ExternalFile, o: ReadingOptions, dir: string, seq: number, ids: SessionIdSet, quarantine: JsonlWriter, log: Logger, signal: AbortSignal): Promise<IngestedFile> {
  const format: InputFormat | null = o.format === 'auto' ? detectFormat(file.path) : o.format;
  if (!format) throw new UsageError(`${file.name}: cannot tell its format from the name; use .jsonl, .json or .parquet, or set ingest.format`);
  const segment = `${String(seq).padStart(5, '0')}-${file.sha256.slice(0, 12)}.jsonl`;
  const writer = new JsonlWriter(join(dir, segment));
  const options = o.mapping;
  const progress = log.progress(`ingest ${file.name}`);
  let quarantined = 0;
  let duplicates = 0;
  let untasked = 0;
  const due = every(1000);
  const stopped = () => `ingest: stopped while reading ${file.name}; the next run reads again every file this run was reading`;
  for await (const record of readRecords(file.path, format)) {
    if (due()) await safePoint(signal, stopped);
    progress.tick();
    const source = `${file.name} ${record.where}`;
    if (record.error !== undefined) {
      quarantined++;
      await quarantine.write({ file: file.name, where: record.where, reason: record.error, raw: record.raw } satisfies QuarantineRecord);
      continue;
    }
    let session;
    try {
      session = toSession(record.value, source, options);
    } catch (error) {
      if (!(error instanceof RecordError)) throw error;
      quarantined++;
      await quarantine.write({ file: file.name, where: record.where, reason: error.message, raw: record.raw } satisfies QuarantineRecord);
      continue;
    }
    if (!ids.add(session.session_id)) {
      duplicates++;
      await quarantine.write({ file: file.name, where: record.where, reason: `duplicate session_id '${session.session_id}' (dropped; the first one is kept)`, raw: record.raw } satisfies QuarantineRecord);
      continue;
    }
    if (session.task_id === null) untasked++;
    await writer.write(session);
  }
  progress.done();
  await writer.close();
  log.info('ingested', { file: file.name, sessions: writer.count, quarantined, duplicates });
  return { name: file.name, sha256: file.sha256, segment, sessions: writer.count, untasked, quarantined, duplicates, ingested_at: new Date().toISOString() };
}

/** The session ids of a segment, in order. */
export async function* readSegmentIds(path: string): AsyncGenerator<string> {
  for await (const s of readJsonl<{ session_id: string }>(path)) yield s.session_id;
}
