// Parquet output: a small column-type language that becomes a parquetjs schema with the standard
// 3-level LIST layout (read as list<...> by DuckDB, pyarrow, pandas, `datasets`), and a streaming writer.
import parquet from '@dsnp/parquetjs';

export type Column =
  | { kind: 'string' | 'double' | 'bool' | 'int64'; optional?: boolean }
  | { kind: 'list'; of: Column; optional?: boolean }
  | { kind: 'struct'; fields: Record<string, Column>; optional?: boolean };

export type Compression = 'snappy' | 'gzip' | 'uncompressed';

const PRIMITIVE = { string: 'UTF8', double: 'DOUBLE', bool: 'BOOLEAN', int64: 'INT64' } as const;

type FieldDefinition = Record<string, unknown>;

function toField(column: Column, compression: string): FieldDefinition {
  const optional = column.optional ?? false;
  if (column.kind === 'list') {
    return { type: 'LIST', optional, fields: { list: { repeated: true, fields: { element: toField(column.of, compression) } } } };
  }
  if (column.kind === 'struct') {
    return { optional, fields: Object.fromEntries(Object.entries(column.fields).map(([k, c]) => [k, toField(c, compression)])) };
  }
  return { type: PRIMITIVE[column.kind], optional, compression };
}

/** A value in the shape parquetjs expects: lists wrapped as {list: [{element}]}, absent optionals dropped. */
function toParquetValue(column: Column, value: unknown): unknown {
  if (value === null || value === undefined) return undefined;
  if (column.kind === 'list') return { list: (value as unknown[]).map((v) => ({ element: toParquetValue(column.of, v) })) };
  if (column.kind === 'struct') {
    const out: Record<string, unknown> = {};
    for (const [k, c] of Object.entries(column.fields)) {
      const v = toParquetValue(c, (value as Record<string, unknown>)[k]);
      if (v !== undefined) out[k] = v;
    }
    return out;
  }
  if (column.kind === 'int64') return BigInt(value as number);
  return value;
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

export class ParquetTableWriter<Row extends object> {
  rows = 0;
  private constructor(
    private readonly writer: parquet.ParquetWriter,
    private readonly columns: Record<string, Column>,
  ) {}

  static async open<Row extends object>(path: string, columns: Record<string, Column>, options: { rowGroupSize: number; compression: Compression }) {
    const compression = options.compression.toUpperCase();
    const schema = new parquet.ParquetSchema(Object.fromEntries(Object.entries(columns).map(([k, c]) => [k, toField(c, compression)])) as never);
    const writer = await parquet.ParquetWriter.openFile(schema, path, { rowGroupSize: options.rowGroupSize, useDataPageV2: false });
    return new ParquetTableWriter<Row>(writer, columns);
  }

  async append(row: Row): Promise<void> {
    const record: Record<string, unknown> = {};
    for (const [k, c] of Object.entries(this.columns)) {
      const v = toParquetValue(c, (row as Record<string, unknown>)[k]);
      if (v !== undefined) record[k] = v;
    }
    await this.writer.appendRow(record);
    this.rows++;
  }

  async close(): Promise<void> {
    await this.writer.close();
  }
}
