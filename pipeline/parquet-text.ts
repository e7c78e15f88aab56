// A Parquet row group's rows as text, straight from its columns: each row as JSON.stringify(toJson(row)) of
// the object hyparquet's parquetReadObjects makes of it, without the objects. hyparquet decodes each column's
// pages, builds every list of every row as arrays, turns the columns of a struct into objects, then the
// rows into objects, and toJson copies them all again: at 100k sessions in row groups of 10,000, 40% of
// its thread's time went to collecting the garbage and 17% to making structs' objects. Here each column's
// pages are decoded by hyparquet's own functions (its types, encodings and conversions), and the rows are
// assembled from the columns' definition and repetition levels (Dremel's record assembly) as text.
// Schemas it does not know how to assemble (maps, variants, two-level lists, repeated fields outside a
// LIST, keys an object would reorder or drop, dotted names inside a struct) give null, and the caller reads
// them with hyparquet.
import {
  parquetSchema,
  toJson,
  type ColumnMetaData,
  type DecodedArray,
  type FileMetaData,
  type SchemaTree,
} from 'hyparquet';
import { parquetHeader } from 'hyparquet/src/column.js';
import { DEFAULT_PARSERS, convert, convertWithDictionary } from 'hyparquet/src/convert.js';
import { decompressPage, readDataPage, readDataPageV2 } from 'hyparquet/src/datapage.js';
import { readPlain } from 'hyparquet/src/plain.js';
import { getMaxDefinitionLevel, getTreePath } from 'hyparquet/src/schema.js';
import type { Compressors } from 'hyparquet';

/**
 * How a row's value is put together from its columns. A node is null where its first column's definition
 * level at the cursor is below `def` (its own level); a list is empty where it is below `filled`. As
 * hyparquet reads them: a null struct or list is left out of its object (undefined, written as null in a
 * list), a null primitive is null.
 */
type Node =
  | { kind: 'value'; column: number; def: number }
  | { kind: 'struct'; fields: { key: string; node: Node }[]; def: number; optional: boolean; columns: number[] }
  | { kind: 'list'; element: Node; def: number; optional: boolean; filled: number; rep: number; columns: number[] };

/**
 * A row group whose columns' levels do not fit its schema (a row's entries running on past it): hyparquet
 * reads such a group without an error but loses values (found by fuzzing: a DuckDB fixed-size ARRAY that
 * holds a NULL), so the file is reported as damaged here rather than given to it.
 */
export class ColumnsDisagree extends Error {}

/** A column chunk decoded: its entries' levels, and its values (one an entry at the column's full definition level). */
interface Column {
  defs: Uint8Array;
  reps: Uint8Array;
  values: unknown[];
  /** The next entry, and the next value. */
  at: number;
  next: number;
}

/** The plan of a file's rows (its top-level fields), or null where hyparquet's reading is needed. */
export function rowPlan(metadata: FileMetaData): { key: string; node: Node }[] | null {
  const schema = parquetSchema(metadata);
  const columns = new Map<string, number>();
  const first = metadata.row_groups[0]?.columns ?? [];
  for (const [i, chunk] of first.entries()) columns.set(chunk.meta_data?.path_in_schema.join('.') ?? '', i);
  const fields = fieldsOf(schema, 0, 0, columns);
  // Every column is in the plan, once.
  const used = fields?.flatMap((f) => columnsOf(f.node)) ?? [];
  return fields && used.length === columns.size && new Set(used).size === used.length ? fields : null;
}

/**
 * Names an object keeps in the order given, each once: not an array index (a canonical integer below
 * 2^32 - 1, which objects put first) nor `__proto__`. Below the top level, no dot either: hyparquet keys a
 * struct's parts by their path joined with dots, so a field `a.b` beside a field `a` holding `b` overwrites
 * or drops the other's values in its objects (found by fuzzing), and that reading is the one to match.
 */
function plainKeys(names: string[], nested: boolean): boolean {
  const index = (n: string) => /^(0|[1-9]\d*)$/.test(n) && Number(n) < 2 ** 32 - 1;
  return (
    new Set(names).size === names.length &&
    names.every((n) => n !== '__proto__' && !index(n) && !(nested && n.includes('.')))
  );
}

function fieldsOf(
  group: SchemaTree,
  def: number,
  rep: number,
  columns: Map<string, number>,
): { key: string; node: Node }[] | null {
  if (
    !plainKeys(
      group.children.map((c) => c.element.name),
      group.path.length > 0,
    )
  )
    return null;
  const fields: { key: string; node: Node }[] = [];
  for (const child of group.children) {
    const node = nodeOf(child, def, rep, columns);
    if (!node) return null;
    fields.push({ key: `${JSON.stringify(child.element.name)}:`, node });
  }
  return fields;
}

function nodeOf(tree: SchemaTree, parentDef: number, rep: number, columns: Map<string, number>): Node | null {
  const e = tree.element;
  if (e.repetition_type === 'REPEATED') return null;
  const optional = e.repetition_type === 'OPTIONAL';
  const def = parentDef + (optional ? 1 : 0);
  if (tree.children.length === 0) {
    const column = columns.get(tree.path.join('.'));
    return column === undefined ? null : { kind: 'value', column, def };
  }
  if (e.converted_type === 'LIST') {
    // The three levels: the list, a repeated group, the element in it.
    const repeated = tree.children[0]!;
    if (tree.children.length !== 1 || repeated.element.repetition_type !== 'REPEATED' || repeated.children.length !== 1)
      return null;
    const element = nodeOf(repeated.children[0]!, def + 1, rep + 1, columns);
    return (
      element && { kind: 'list', element, def, optional, filled: def + 1, rep: rep + 1, columns: columnsOf(element) }
    );
  }
  if (e.converted_type || e.logical_type) return null; // a map, a variant: hyparquet makes them
  const fields = fieldsOf(tree, def, rep, columns);
  return fields && { kind: 'struct', fields, def, optional, columns: fields.flatMap((f) => columnsOf(f.node)) };
}

function columnsOf(node: Node): number[] {
  return node.kind === 'value' ? [node.column] : node.columns;
}

/**
 * The rows of row group `g` as text, or null where a value is a number JSON has no word for (NaN, an
 * infinity: hyparquet's value of its row must go with the text). `bytes` reads a range of the file.
 */
export async function rowGroupTexts(
  metadata: FileMetaData,
  g: number,
  plan: { key: string; node: Node }[],
  bytes: (start: number, end: number) => ArrayBuffer | Promise<ArrayBuffer>,
  compressors: Compressors,
): Promise<string[] | null> {
  const group = metadata.row_groups[g]!;
  const schema = parquetSchema(metadata);
  const columns: Column[] = [];
  for (const [i, chunk] of group.columns.entries()) {
    const meta = chunk.meta_data!;
    if (chunk.file_path) throw new Error('parquet file_path not supported');
    // The plan numbers the columns as the first row group lists them.
    if (meta.path_in_schema.join('.') !== metadata.row_groups[0]!.columns[i]?.meta_data?.path_in_schema.join('.'))
      throw new Error(`parquet: row group ${g + 1} lists its columns in another order`);
    const start = Number(meta.dictionary_page_offset || meta.data_page_offset);
    columns.push(
      decodeColumn(
        await bytes(start, start + Number(meta.total_compressed_size)),
        meta,
        getTreePath(schema, meta.path_in_schema),
        compressors,
      ),
    );
  }
  const rows = Number(group.num_rows);
  const firstRow = metadata.row_groups.slice(0, g).reduce((n, r) => n + Number(r.num_rows), 1);
  const disagree = (what: string) =>
    new ColumnsDisagree(
      `row group ${g + 1} (rows ${firstRow} to ${firstRow + rows - 1}): ${what}, so its columns' levels do not fit its schema and it cannot be read without losing values ` +
        '(DuckDB writes a fixed-size ARRAY column that holds a NULL so: cast it to a list, c::INTEGER[], before writing the file, or write it as JSONL)',
    );
  const writer = new RowWriter(columns);
  const texts: string[] = new Array(rows);
  for (let r = 0; r < rows; r++) {
    const text = writer.fields(plan);
    // Made flat now, so its pieces go while young rather than outlive collections as a rope.
    text.charCodeAt(0);
    texts[r] = text;
    if (writer.lossy) return null;
    // Each column's next entry starts a row.
    for (const c of columns)
      if (c.at < c.defs.length && c.reps[c.at] !== 0)
        throw disagree(`row ${firstRow + r} does not end where its columns do`);
  }
  for (const c of columns)
    if (c.at !== c.defs.length || c.next !== c.values.length)
      throw disagree(`its columns hold more than its ${rows} rows`);
  return texts;
}

/** A column chunk's pages decoded as hyparquet's readColumn decodes them, with their levels kept. */
function decodeColumn(
  buffer: ArrayBuffer,
  meta: ColumnMetaData,
  schemaPath: SchemaTree[],
  compressors: Compressors,
): Column {
  const element = schemaPath.at(-1)!.element;
  const decoder = {
    pathInSchema: meta.path_in_schema,
    element,
    schemaPath,
    type: meta.type,
    codec: meta.codec,
    compressors,
    parsers: DEFAULT_PARSERS,
  };
  const maxDef = getMaxDefinitionLevel(schemaPath);
  const reader = { view: new DataView(buffer), offset: 0 };
  const pages: { defs: number[] | undefined; reps: number[]; entries: number; values: DecodedArray }[] = [];
  let dictionary: DecodedArray | undefined;
  while (reader.offset < buffer.byteLength - 1) {
    const header = parquetHeader(reader);
    const compressed = new Uint8Array(buffer, reader.offset, header.compressed_page_size);
    reader.offset += header.compressed_page_size;
    if (header.type === 'DICTIONARY_PAGE') {
      const page = decompressPage(compressed, Number(header.uncompressed_page_size), meta.codec, compressors);
      const values = readPlain(
        { view: new DataView(page.buffer, page.byteOffset, page.byteLength), offset: 0 },
        meta.type,
        header.dictionary_page_header!.num_values,
        element.type_length,
      );
      dictionary = convert(values, decoder);
    } else if (header.type === 'DATA_PAGE') {
      const daph = header.data_page_header!;
      const page = decompressPage(compressed, Number(header.uncompressed_page_size), meta.codec, compressors);
      const { definitionLevels, repetitionLevels, dataPage } = readDataPage(page, daph, decoder);
      pages.push({
        defs: definitionLevels,
        reps: repetitionLevels,
        entries: daph.num_values,
        values: convertWithDictionary(dataPage, dictionary, daph.encoding, decoder),
      });
    } else if (header.type === 'DATA_PAGE_V2') {
      const daph2 = header.data_page_header_v2!;
      const { definitionLevels, repetitionLevels, dataPage } = readDataPageV2(compressed, header, decoder);
      pages.push({
        defs: definitionLevels,
        reps: repetitionLevels,
        entries: daph2.num_values,
        values: convertWithDictionary(dataPage, dictionary, daph2.encoding, decoder),
      });
    } else {
      throw new Error(`parquet unsupported page type: ${header.type}`);
    }
  }
  let entries = 0;
  let count = 0;
  for (const p of pages) [entries, count] = [entries + p.entries, count + p.values.length];
  const column: Column = {
    defs: new Uint8Array(entries),
    reps: new Uint8Array(entries),
    values: new Array(count),
    at: 0,
    next: 0,
  };
  let e = 0;
  let v = 0;
  for (const p of pages) {
    // A page without nulls has no definition levels, one without repetition none of those.
    if (p.defs?.length) column.defs.set(p.defs, e);
    else column.defs.fill(maxDef, e, e + p.entries);
    if (p.reps.length) column.reps.set(p.reps, e);
    for (let i = 0; i < p.values.length; i++) column.values[v++] = p.values[i];
    e += p.entries;
  }
  return column;
}

/**
 * A value as JSON.stringify(toJson(value)) writes it (undefined for undefined), made as its row is written
 * (with its column instead, the texts would outlive many collections); null for a number JSON cannot hold
 * (NaN, an infinity).
 */
function valueText(v: unknown): string | undefined | null {
  switch (typeof v) {
    case 'string':
      return JSON.stringify(v);
    case 'number':
      return Number.isFinite(v) ? String(v) : null;
    case 'bigint': {
      const n = Number(v);
      return Number.isFinite(n) ? String(n) : null;
    }
    case 'boolean':
      return v ? 'true' : 'false';
    case 'undefined':
      return undefined;
    default: {
      const json = toJson(v);
      return allFinite(json) ? JSON.stringify(json) : null;
    }
  }
}

/** Writes rows from the columns' cursors; `lossy` once a number JSON cannot hold was met. */
class RowWriter {
  lossy = false;

  constructor(private readonly columns: Column[]) {}

  /** A struct's (or a row's) fields as an object's text: a field that comes out undefined is left out. */
  fields(fields: { key: string; node: Node }[]): string {
    let text = '{';
    for (const { key, node } of fields) {
      const value = this.node(node);
      if (value === undefined) continue;
      text += text.length > 1 ? `,${key}${value}` : key + value;
    }
    return `${text}}`;
  }

  node(node: Node): string | undefined {
    if (node.kind === 'value') {
      const c = this.columns[node.column]!;
      if (c.defs[c.at++] !== node.def) return 'null';
      const text = valueText(c.values[c.next++]);
      if (text !== null) return text;
      this.lossy = true;
      return 'null';
    }
    const first = this.columns[node.columns[0]!]!;
    const def = first.defs[first.at]!;
    if (node.optional && def < node.def) return this.skip(node.columns, undefined);
    if (node.kind === 'struct') return this.fields(node.fields);
    if (def < node.filled) return this.skip(node.columns, '[]');
    let text = '[';
    for (;;) {
      text += this.node(node.element) ?? 'null';
      // The first column's next entry goes on with this list where it repeats at the list's level.
      if (first.at < first.reps.length && first.reps[first.at] === node.rep) text += ',';
      else return `${text}]`;
    }
  }

  /** A null or empty node: one entry in each of its columns, and no value. */
  private skip<T>(columns: number[], as: T): T {
    for (const i of columns) this.columns[i]!.at++;
    return as;
  }
}

/** Whether every number in a JSON value is finite. */
export function allFinite(value: unknown): boolean {
  if (typeof value === 'number') return Number.isFinite(value);
  if (value === null || typeof value !== 'object') return true;
  for (const v of Array.isArray(value) ? value : Object.values(value)) if (!allFinite(v)) return false;
  return true;
}
