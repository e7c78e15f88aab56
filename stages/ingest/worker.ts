// A worker thread of ingest: batches of records parsed, checked and mapped as readOne does on the main thread.
import { serveBatches } from '../../pipeline/workers.ts';
import type { RawRecord } from '../../pipeline/records.ts';
import { readBatch, type BatchOutcome, type WorkerInit } from './segment.ts';

serveBatches(
  ({ options, fileName }: WorkerInit) => (batch: RawRecord[]): BatchOutcome => readBatch(batch, fileName, options),
  (out) => [out.lines.buffer as ArrayBuffer],
);
