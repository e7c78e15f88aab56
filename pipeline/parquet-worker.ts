// A worker thread that reads one Parquet file's records for readParquetBatches (parquet.ts), a batch each time
// it is asked. hyparquet decodes a row group whole, so a large one takes its memory here: a thread that runs
// out of it ends, and the file is reported, where the process itself used to end.
import { readParquetHere, recordBatches, type RawRecord } from './records.ts';
import { serveBatches } from './workers.ts';

serveBatches((init: { path: string }) => {
  const batches = recordBatches(readParquetHere(init.path));
  return async (): Promise<RawRecord[] | null> => {
    const next = await batches.next();
    if (next.done) return null;
    // A record goes as its text alone where its text gives back its value (all but NaN and the infinities,
    // which JSON writes as null): the main thread parses text faster than it takes a value copied across.
    for (const record of next.value) if (record.value !== undefined && allFinite(record.value)) delete record.value;
    return next.value;
  };
});

/** Whether every number in a JSON value is finite. */
function allFinite(value: unknown): boolean {
  if (typeof value === 'number') return Number.isFinite(value);
  if (value === null || typeof value !== 'object') return true;
  for (const v of Array.isArray(value) ? value : Object.values(value)) if (!allFinite(v)) return false;
  return true;
}
