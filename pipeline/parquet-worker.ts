// A worker thread that reads one Parquet file's records for readParquetBatches (parquet.ts), a batch each time
// it is asked. A row group is read whole, so a large one takes its memory here: a thread that runs out of it
// ends, and the file is reported, rather than the process. A record goes as its text, with its
// value only where the text does not give it back (NaN and the infinities, which JSON writes as null): the
// main thread parses text faster than it takes a value copied across.
import { readParquetHere, recordBatches, type RawRecord } from './records.ts';
import { serveBatches } from './workers.ts';

serveBatches((init: { path: string }) => {
  const batches = recordBatches(readParquetHere(init.path));
  return async (): Promise<RawRecord[] | null> => {
    const next = await batches.next();
    return next.done ? null : next.value;
  };
});
