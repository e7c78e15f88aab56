// Parquet: a small column-type language that becomes a Parquet schema with the standard 3-level LIST layout
// (read as list<...> by DuckDB, pyarrow, pandas, `datasets`), a streaming writer that holds one row group in
// memory at a time, and the one reader, a row group at a time.
import { gzipSync } from 'node:zlib';
import {
  asyncBufferFromFile,
  parquetMetadataAsync,
  parquetReadObjects,
  toJson,
  type AsyncBuffer,
  type FileMetaData,
  type SchemaElement,
} from 'hyparquet';
import { compressors } from 'hyparquet-compressors';
import { ParquetWriter, fileWriter } from 'hyparquet-writer';
import { ColumnsDisagree, allFinite, rowGroupTexts, rowPlan } from './parquet-text.ts';
import { damageReason, parseRecord, type RawRecord } from './records.ts';
import { WorkerPool } from './workers.ts';

/**
 * The records of a Parquet file in batches (recordBatches), read on a worker thread of their own
 * (parquet-worker.ts) with a heap as large as this thread's: a row group is read whole, its rows' text some
 * four times its uncompressed size, and pyarrow writes up to a million rows a group. A thread that runs out
 * of memory ends alone: the file then ends in a damaged record that says why and what to do (`heapMb`: a
 * test's smaller heap).
 */
export async function* readParquetBatches(path: string, heapMb?: number): AsyncGenerator<RawRecord[]> {
  // A young generation of 64 MB (the stages' threads have 16): a row group's values outlive many of its collections.
  const reader = new WorkerPool<null, RawRecord[] | null>(
    'parquet-worker',
    new URL('./parquet-worker.ts', import.meta.url),
    1,
    { path },
    undefined,
    { maxYoungGenerationSizeMb: 64, ...(heapMb ? { maxOldGenerationSizeMb: heapMb } : {}) },
  );
  let reached = 'before the first record';
  try {
    // The next batches are read while this one is used.
    const ahead: Promise<RawRecord[] | null>[] = [];
    const ask = () => {
      const next = reader.run(null);
      next.catch(() => {}); // a failure is thrown where it is awaited
      ahead.push(next);
    };
    while (ahead.length < AHEAD) ask();
    for (;;) {
      const records = await ahead.shift()!;
      if (!records) return;
      ask();
      reached = `after ${records.at(-1)!.where}`;
      yield records;
    }
  } catch (error) {
    if ((error as { code?: string }).code !== 'ERR_WORKER_OUT_OF_MEMORY') throw error;
    yield [{ where: reached, raw: '', damaged: true, error: damageReason(path, await outOfMemory(path)) }];
  } finally {
    await reader.close();
  }
}

/** readParquetBatches' records one at a time, each with its value (parsed from its text where it came without). */
export async function* readParquetRecords(path: string): AsyncGenerator<RawRecord> {
  for await (const records of readParquetBatches(path))
    for (const r of records) yield r.value !== undefined || r.damaged ? r : parseRecord(r.where, r.raw);
}

/**
 * Batches asked of a Parquet file's thread ahead of the one being used: more than a row group of 10,000 rows,
 * so that the thread reads the next group while this one takes the batches of the last.
 */
const AHEAD = 16;

/** Why a Parquet file could not be read in the memory there was, and what to do. */
async function outOfMemory(path: string): Promise<string> {
  const { row_groups } = await parquetMetadataAsync(await asyncBufferFromFile(path));
  const largest = row_groups.reduce((a, b) => (Number(b.total_byte_size) > Number(a.total_byte_size) ? b : a));
  const mb = (Number(largest.total_byte_size) / 1e6).toFixed(0);
  return (
    `reading it ran out of memory: a row group is read whole, and its largest holds ${Number(largest.num_rows)} rows, ${mb} MB uncompressed; ` +
    'write the file with smaller row groups (DuckDB: COPY ... (FORMAT parquet, ROW_GROUP_SIZE 10000); pyarrow: pq.write_table(table, path, row_group_size=10000)) ' +
    'or as JSONL, or give Node more memory (NODE_OPTIONS=--max-old-space-size=MB)'
  );
}

/** The rows `rowStart` to `rowEnd` (one row group) as plain JSON values: hyparquet's objects, through its toJson. */
async function groupValues(
  file: AsyncBuffer,
  metadata: FileMetaData,
  rowStart: number,
  rowEnd: number,
): Promise<unknown[]> {
  return (await parquetReadObjects({ file, metadata, rowStart, rowEnd, compressors })).map((row) => toJson(row));
}

/** Every row of a Parquet file (any compression) as plain JSON values, with its 1-based row number, one row group in memory at a time. */
export async function* readParquetRows(path: string): AsyncGenerator<{ row: number; value: unknown }> {
  const file = await asyncBufferFromFile(path);
  const metadata = await parquetMetadataAsync(file);
  let rowStart = 0;
  for (const group of metadata.row_groups) {
    const rowEnd = rowStart + Number(group.num_rows);
    const values = await groupValues(file, metadata, rowStart, rowEnd);
    for (let i = 0; i < values.length; i++) yield { row: rowStart + i + 1, value: values[i] };
    rowStart = rowEnd;
  }
}

/**
 * Every row of a Parquet file as its text, JSON.stringify of readParquetRows' value of it, with its 1-based
 * row number and, only where the text does not give it back (a NaN or an infinity, which JSON writes as
 * null), its value; one row group in memory at a time. The text is assembled from the columns
 * (parquet-text.ts), not from hyparquet's objects of the rows, which take several times the time and memory
 * (docs/experiments.md). A row group that holds such a number, one that fails there, and a file whose schema it does
 * not assemble (maps, variants, legacy lists) are read as readParquetRows reads them (a damaged one then fails
 * as it does there); one whose columns' levels do not fit its schema fails (ColumnsDisagree).
 */
export async function* readParquetTexts(path: string): AsyncGenerator<{ row: number; raw: string; value?: unknown }> {
  const file = await asyncBufferFromFile(path);
  const metadata = await parquetMetadataAsync(file);
  const plan = rowPlan(metadata);
  let rowStart = 0;
  for (const [g, group] of metadata.row_groups.entries()) {
    const rowEnd = rowStart + Number(group.num_rows);
    // Columns that disagree with the schema end the file (hyparquet would lose values); any other failure
    // is hyparquet's to report.
    const texts =
      plan &&
      (await rowGroupTexts(metadata, g, plan, (start, end) => file.slice(start, end), compressors).catch(
        (error: unknown) => {
          if (error instanceof ColumnsDisagree) throw error;
          return null;
        },
      ));
    if (texts) {
      for (let i = 0; i < texts.length; i++) yield { row: rowStart + i + 1, raw: texts[i]! };
    } else {
      const values = await groupValues(file, metadata, rowStart, rowEnd);
      for (let i = 0; i < values.length; i++)
        yield {
          row: rowStart + i + 1,
          raw: JSON.stringify(values[i]),
          ...(allFinite(values[i]) ? {} : { value: values[i] }),
        };
    }
    rowStart = rowEnd;
  }
}

export type Column =
  | {
      kind: 'string' | 'double' | 'bool' | 'int64';
      optional?: boolean;
      /** false: no min/max for free text (see `statistics`) */ statistics?: false;
    }
  | { kind: 'list'; of: Column; optional?: boolean }
  | { kind: 'struct'; fields: Record<string, Column>; optional?: boolean };

export type Compression = 'snappy' | 'gzip' | 'uncompressed';

const PRIMITIVE: Record<'string' | 'double' | 'bool' | 'int64', Partial<SchemaElement>> = {
  string: { type: 'BYTE_ARRAY', converted_type: 'UTF8' },
  double: { type: 'DOUBLE' },
  bool: { type: 'BOOLEAN' },
  int64: { type: 'INT64' },
};

/** The schema elements of one column, depth first, as Parquet's footer lists them. */
function schemaElements(name: string, column: Column): SchemaElement[] {
  const repetition_type = column.optional ? 'OPTIONAL' : 'REQUIRED';
  if (column.kind === 'list') {
    return [
      { name, repetition_type, converted_type: 'LIST', num_children: 1 },
      { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
      ...schemaElements('element', column.of),
    ];
  }
  if (column.kind === 'struct') {
    const fields = Object.entries(column.fields);
    return [
      { name, repetition_type, num_children: fields.length },
      ...fields.flatMap(([k, c]) => schemaElements(k, c)),
    ];
  }
  return [{ name, repetition_type, ...PRIMITIVE[column.kind] } as SchemaElement];
}

/** The column's type as Arrow writes it, for dataset cards: list<struct<role: string, ...>>. */
export function describeColumn(column: Column): string {
  const base =
    column.kind === 'list'
      ? `list<${describeColumn(column.of)}>`
      : column.kind === 'struct'
        ? `struct<${Object.entries(column.fields)
            .map(([k, c]) => `${k}: ${describeColumn(c)}`)
            .join(', ')}>`
        : column.kind;
  return column.optional ? `${base}?` : base;
}

const CODEC = { snappy: 'SNAPPY', gzip: 'GZIP', uncompressed: 'UNCOMPRESSED' } as const;

/**
 * Whether a column's chunks carry min/max statistics: top-level scalars do (ids, rewards, splits: what a
 * reader filters on), nested message lists and columns marked as free text do not. The writer keeps every
 * chunk's statistics until it writes the footer, with strings whole (they are cut to 16 bytes only in the
 * footer), so message text in them made an export's memory grow with its rows.
 */
const statistics = (column: Column) =>
  column.kind !== 'list' && column.kind !== 'struct' && column.statistics !== false;

/** Rows in, Parquet out: rows are buffered up to one row group, then encoded and flushed to the file. */
export class ParquetTableWriter<Row extends object> {
  rows = 0;
  private buffer: Row[] = [];
  private readonly names: string[];

  private constructor(
    private readonly writer: ParquetWriter,
    private readonly columns: Record<string, Column>,
    private readonly rowGroupSize: number,
  ) {
    this.names = Object.keys(columns);
  }

  static async open<Row extends object>(
    path: string,
    columns: Record<string, Column>,
    options: { rowGroupSize: number; compression: Compression },
  ) {
    const entries = Object.entries(columns);
    const schema: SchemaElement[] = [
      { name: 'root', num_children: entries.length },
      ...entries.flatMap(([k, c]) => schemaElements(k, c)),
    ];
    const writer = new ParquetWriter({
      writer: fileWriter(path),
      schema,
      codec: CODEC[options.compression],
      compressors: { GZIP: (input: Uint8Array) => new Uint8Array(gzipSync(input)) },
      createdBy: 'prefab',
    });
    return new ParquetTableWriter<Row>(writer, columns, options.rowGroupSize);
  }

  async append(row: Row): Promise<void> {
    this.buffer.push(row);
    this.rows++;
    if (this.buffer.length >= this.rowGroupSize) this.flush();
  }

  private flush(): void {
    if (this.buffer.length === 0) return;
    const rows = this.buffer as Record<string, unknown>[];
    const columnData = this.names.map((name) => {
      const int64 = this.columns[name]!.kind === 'int64';
      return {
        name,
        statistics: statistics(this.columns[name]!),
        data: rows.map((r) => (int64 && r[name] != null ? BigInt(r[name] as number) : (r[name] ?? null))),
      };
    });
    this.writer.write({ columnData, rowGroupSize: rows.length });
    this.buffer = [];
  }

  async close(): Promise<void> {
    this.flush();
    this.writer.finish();
  }
}
