// A worker thread of ingest: batches of records parsed, checked and mapped as readOne does on the main thread.
import { serveBatches, threadShelf } from '../../pipeline/workers.ts';
import { readBatch, type BatchOutcome, type FileBatch, type WorkerInit } from './segment.ts';

// The block of lines goes back with the outcome, and the lines' buffer comes back once written.
serveBatches(
  ({ options }: WorkerInit) =>
    ({ batch, fileName }: FileBatch): BatchOutcome =>
      readBatch(batch, fileName, options, threadShelf),
  (out) => [
    out.lines.buffer as ArrayBuffer,
    out.records.buffer as ArrayBuffer,
    ...(out.block ? [out.block.buffer as ArrayBuffer] : []),
  ],
);
