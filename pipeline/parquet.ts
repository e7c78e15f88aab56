// Parquet: a small column-type language that becomes a Parquet schema with the standard 3-level LIST layout
// (read as list<...> by DuckDB, pyarrow, pandas, `datasets`), a streaming writer that holds one row group in
// memory at a time, and the one reader, a row group at a time.
import { gzipSync } from 'node:zlib';
import { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects, toJson, type SchemaElement } from 'hyparquet';
import { compressors } from 'hyparquet-compressors';
import { ParquetWriter, fileWriter } from 'hyparquet-writer';

/** Every row of a Parquet file (any compression) as plain JSON values, with its 1-based row number, one row group in memory at a time. */
export async function* readParquetRows(path: string): AsyncGenerator<{ row: number; value: unknown }> {
  const file = await asyncBufferFromFile(path);
  const metadata = await parquetMetadataAsync(file);
  let rowStart = 0;
  for (const group of metadata.row_groups) {
    const rowEnd = rowStart + Number(group.num_rows);
    const rows = await parquetReadObjects({ file, metadata, rowStart, rowEnd, compressors });
    for (let i = 0; i < rows.length; i++) yield { row: rowStart + i + 1, value: toJson(rows[i]) };
    rowStart = rowEnd;
  }
}

export type Column =
  | { kind: 'string' | 'double' | 'bool' | 'int64'; optional?: boolean; /** false: no min/max for free text (see `statistics`) */ statistics?: false }
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
    return [{ name, repetition_type, num_children: fields.length }, ...fields.flatMap(([k, c]) => schemaElements(k, c))];
  }
  return [{ name, repetition_type, ...PRIMITIVE[column.kind] } as SchemaElement];
}

/** The column's type as Arrow writes it, for dataset cards: list<struct<role: string, ...>>. */
export function describeColumn(column: Column): string {
  const base =
    column.kind === 'list'
      ? `list<${describeColumn(column.of)}>`
      : column.kind === 'struct'
        ? `struct<${Object.entries(column.fields).map(([k, c]) => `${k}: ${describeColumn(c)}`).join(', ')}>`
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
const statistics = (column: Column) => column.kind !== 'list' && column.kind !== 'struct' && column.statistics !== false;

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

  static async open<Row extends object>(path: string, columns: Record<string, Column>, options: { rowGroupSize: number; compression: Compression }) {
    const entries = Object.entries(columns);
    const schema: SchemaElement[] = [{ name: 'root', num_children: entries.length }, ...entries.flatMap(([k, c]) => schemaElements(k, c))];
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
      return { name, statistics: statistics(this.columns[name]!), data: rows.map((r) => (int64 && r[name] != null ? BigInt(r[name] as number) : (r[name] ?? null))) };
    });
    this.writer.write({ columnData, rowGroupSize: rows.length });
    this.buffer = [];
  }

  async close(): Promise<void> {
    this.flush();
    this.writer.finish();
  }
}
