// A worker thread of the export stage: one side's tables written as the main thread writes them (tables.ts).
import { serveBatches } from '../../pipeline/workers.ts';
import {
  writePairTable,
  writeSessionTables,
  type SessionTable,
  type TableSource,
  type TablesWritten,
} from './tables.ts';
import type { Split } from '../../core/records.ts';

/** Tables of one side to write: some of those made from sessions, or the pairs table. */
export type TableJob = { side: Split; tables: SessionTable[] } | { side: Split; pairs: true };

serveBatches(
  (source: TableSource) =>
    (job: TableJob): Promise<TablesWritten> =>
      'pairs' in job ? writePairTable(source, job.side) : writeSessionTables(source, job.side, job.tables),
);
