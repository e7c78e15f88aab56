// A worker thread of ingest: batches of records parsed, checked and mapped as readOne does on the main thread.
import { serveBatches } from '../../pipeline/workers.ts';
import { readBatch, type Batch, type BatchOutcome, type WorkerInit } from './segment.ts';

serveBatches(
  ({ options, fileName }: WorkerInit) => (batch: Batch): BatchOutcome => readBatch(batch, fileName, options),
  (out) => [out.lines.buffer as ArrayBuffer, out.records.buffer as ArrayBuffer],
);
