// Rows of a Parquet row group assembled as text from the columns' levels (pipeline/parquet-text.ts), held to
// what hyparquet's objects give: JSON.stringify(toJson(row)) of parquetReadObjects' row, for every row of files
// written by DuckDB (data pages v1, plain, dictionary and delta encodings, several codecs and row groups) and by
// prefab's own writer (data pages v2, required columns), with nulls at every level of nested lists and
// structs, empty lists, and every type DuckDB writes that JSON has no word for. Schemas the text cannot be
// assembled for, and row groups that hold a NaN, go to hyparquet; a row group whose levels do not fit its
// schema fails.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects, toJson } from 'hyparquet';
import { compressors } from 'hyparquet-compressors';
import { describe, expect, it } from 'vitest';
import { ParquetTableWriter, readParquetTexts } from '../../pipeline/parquet.ts';
import { rowGroupTexts, rowPlan } from '../../pipeline/parquet-text.ts';
import { seeded, type Random } from '../../core/random.ts';
import { tempDir } from '../fixtures/pipeline.ts';

/** Each row as hyparquet's objects give its text. */
async function expectedTexts(path: string): Promise<string[]> {
  return (await parquetReadObjects({ file: await asyncBufferFromFile(path), compressors })).map((row) =>
    JSON.stringify(toJson(row)),
  );
}

/** Every row group of a file assembled as text (none given back to hyparquet), in order. */
async function assembledTexts(path: string): Promise<string[]> {
  const file = await asyncBufferFromFile(path);
  const metadata = await parquetMetadataAsync(file);
  const plan = rowPlan(metadata);
  expect(plan, `${path}: a plan of its rows`).not.toBeNull();
  const texts: string[] = [];
  for (let g = 0; g < metadata.row_groups.length; g++) {
    const group = await rowGroupTexts(metadata, g, plan!, (start, end) => file.slice(start, end), compressors);
    expect(group, `${path}: row group ${g + 1} as text`).not.toBeNull();
    texts.push(...group!);
  }
  return texts;
}

/** A value, or (one time in `nulls`) null. */
const maybe = <T>(rand: Random, nulls: number, make: () => T): T | null => (rand() < 1 / nulls ? null : make());
const list = <T>(rand: Random, make: () => T): T[] => Array.from({ length: Math.floor(rand() * 4) }, make);
const text = (rand: Random) =>
  ['', 'x', 'quote " and \\ é 😀', 'line\nbreak', String(Math.floor(rand() * 1e6))][Math.floor(rand() * 5)]!;
const number = (rand: Random) => [0, -0, 1.5, 1e21, 5e-324, -2.25, Math.floor(rand() * 1000)][Math.floor(rand() * 7)]!;

/** A session-like row with nulls, empty lists and missing keys at every level. */
function randomRow(rand: Random, id: number): Record<string, unknown> {
  const call = () => ({
    id: maybe(rand, 5, () => text(rand)),
    function: maybe(rand, 5, () => ({
      name: maybe(rand, 5, () => text(rand)),
      arguments: maybe(rand, 5, () => text(rand)),
    })),
  });
  const message = () => ({
    role: maybe(rand, 6, () => text(rand)),
    content: maybe(rand, 4, () => text(rand)),
    tool_calls: maybe(rand, 3, () => list(rand, () => maybe(rand, 5, call))),
  });
  return {
    id,
    s: maybe(rand, 5, () => text(rand)),
    d: maybe(rand, 5, () => number(rand)),
    b: maybe(rand, 5, () => rand() < 0.5),
    messages: maybe(rand, 6, () => list(rand, () => maybe(rand, 6, message))),
    lists: maybe(rand, 5, () =>
      list(rand, () => maybe(rand, 4, () => list(rand, () => maybe(rand, 4, () => Math.floor(rand() * 100))))),
    ),
    nested: maybe(rand, 5, () => ({
      x: maybe(rand, 4, () => ({
        y: maybe(rand, 4, () => Math.floor(rand() * 1e15)),
        z: maybe(rand, 4, () => list(rand, () => maybe(rand, 4, () => text(rand)))),
      })),
    })),
  };
}

const COLUMNS = {
  id: 'BIGINT',
  s: 'VARCHAR',
  d: 'DOUBLE',
  b: 'BOOLEAN',
  messages:
    'STRUCT(role VARCHAR, content VARCHAR, tool_calls STRUCT(id VARCHAR, "function" STRUCT(name VARCHAR, arguments VARCHAR))[])[]',
  lists: 'INTEGER[][]',
  nested: 'STRUCT(x STRUCT(y BIGINT, z VARCHAR[]))',
};

/** Writes `rows` random rows as JSONL and has DuckDB write them as Parquet with `options`, with types JSON has no word for beside them. */
async function duckdbFile(dir: string, name: string, rows: number, seed: number, options: string): Promise<string> {
  const rand = seeded('parquet-text', seed);
  const jsonl = join(dir, `${name}.jsonl`);
  writeFileSync(jsonl, Array.from({ length: rows }, (_, i) => JSON.stringify(randomRow(rand, i))).join('\n') + '\n');
  const path = join(dir, `${name}.parquet`);
  const c = await (await DuckDBInstance.create(':memory:')).connect();
  const columns = `{${Object.entries(COLUMNS)
    .map(([k, v]) => `'${k}': '${v}'`)
    .join(', ')}}`;
  await c.run(`COPY (
    SELECT *, 9007199254740993 + id AS big, ('\\x00\\xFF' || id::VARCHAR)::BLOB AS bytes, TIMESTAMP '2026-01-01 00:00:00' + INTERVAL (id) SECOND AS at,
      DATE '2026-01-01' + id::INTEGER AS day, (id * 1.25)::DECIMAL(10, 2) AS amount, CASE WHEN id % 3 = 0 THEN NULL ELSE id::SMALLINT END AS small
    FROM read_json('${jsonl}', format = 'newline_delimited', columns = ${columns}) ORDER BY id
  ) TO '${path}' (FORMAT parquet, ${options})`);
  return path;
}

describe('Parquet rows as text', () => {
  it('are what hyparquet gives for every row, nulls at every level, in files DuckDB writes', async () => {
    const dir = tempDir();
    const files = [
      await duckdbFile(dir, 'v1', 3000, 1, 'ROW_GROUP_SIZE 700'),
      await duckdbFile(dir, 'delta', 2000, 2, 'ROW_GROUP_SIZE 1500, PARQUET_VERSION V2, COMPRESSION gzip'), // delta encodings
      await duckdbFile(dir, 'plain', 1500, 3, 'COMPRESSION uncompressed'),
    ];
    for (const path of files) {
      const expected = await expectedTexts(path);
      expect(await assembledTexts(path)).toEqual(expected);
      const read: { row: number; raw: string; value?: unknown }[] = [];
      for await (const r of readParquetTexts(path)) read.push(r);
      expect(read.map((r) => r.raw)).toEqual(expected);
      expect(read.map((r) => r.row)).toEqual(expected.map((_, i) => i + 1));
      expect(read.filter((r) => 'value' in r)).toEqual([]);
    }
    // The rows hold what the test means them to: nulls, empty lists and values at each depth.
    const some = (await expectedTexts(files[0]!)).join('\n');
    for (const part of [
      '"messages":[null',
      '"tool_calls":[]',
      '"tool_calls":[null',
      '"function":{"name":null',
      '"lists":[[],',
      '[null,',
      '"x":{"y":null',
      '"bytes":"\\u0000',
      '"at":"2026-01-01T00:',
      '"d":0,',
      '"d":1e+21',
    ]) {
      expect(some).toContain(part);
    }
  });

  it('are what hyparquet gives for a file prefab writes (data pages v2), with required columns', async () => {
    const path = join(tempDir(), 'export.parquet');
    const writer = await ParquetTableWriter.open<Record<string, unknown>>(
      path,
      {
        id: { kind: 'string' },
        reward: { kind: 'double', optional: true },
        steps: { kind: 'int64' },
        messages: {
          kind: 'list',
          of: { kind: 'struct', fields: { role: { kind: 'string' }, content: { kind: 'string', optional: true } } },
        },
        tags: { kind: 'list', of: { kind: 'string' }, optional: true },
      },
      { rowGroupSize: 300, compression: 'snappy' },
    );
    const rand = seeded('parquet-text', 'export');
    for (let i = 0; i < 1000; i++) {
      await writer.append({
        id: `s-${i}`,
        reward: i % 4 === 0 ? null : rand(),
        steps: i,
        messages: list(rand, () => ({ role: text(rand), content: maybe(rand, 3, () => text(rand)) })),
        tags: i % 3 === 0 ? null : list(rand, () => text(rand)),
      });
    }
    await writer.close();
    expect(await assembledTexts(path)).toEqual(await expectedTexts(path));
  });

  it('leaves to hyparquet a row group with a NaN or an infinity (its value goes with the text) and schemas it does not assemble, and fails on columns that do not fit their schema', async () => {
    const dir = tempDir();
    const c = await (await DuckDBInstance.create(':memory:')).connect();
    // Row group 2 of 3 holds a NaN and an infinity: only those rows come with their values.
    const nan = join(dir, 'nan.parquet');
    await c.run(
      `COPY (SELECT i AS id, CASE WHEN i = 2500 THEN 'NaN'::DOUBLE WHEN i = 3000 THEN 'Infinity'::DOUBLE ELSE i / 4 END AS x, [{'v': i}] AS l FROM range(6000) t(i)) TO '${nan}' (FORMAT parquet, ROW_GROUP_SIZE 2048)`,
    );
    const read: { row: number; raw: string; value?: unknown }[] = [];
    for await (const r of readParquetTexts(nan)) read.push(r);
    expect(read.map((r) => r.raw)).toEqual(await expectedTexts(nan));
    const file = await asyncBufferFromFile(nan);
    const metadata = await parquetMetadataAsync(file);
    const groups = await Promise.all(
      [0, 1, 2].map((g) => rowGroupTexts(metadata, g, rowPlan(metadata)!, (s, e) => file.slice(s, e), compressors)),
    );
    expect(groups.map((g) => g !== null)).toEqual([true, false, true]);
    expect(metadata.row_groups).toHaveLength(3);
    expect(read.filter((r) => 'value' in r).map((r) => r.row)).toEqual([2501, 3001]);
    expect(read[2500]!.value).toEqual({ id: 2500, x: NaN, l: [{ v: 2500 }] });
    // A map, keys an object would put first or drop, and dotted names inside a struct (hyparquet keys a
    // struct's parts by their dotted path: `a.b` beside `a` holding `b` overwrites the other's values, and
    // its reading is the one kept): read by hyparquet, to the same text.
    const others = {
      map: `SELECT i AS id, MAP {'k': i} AS m FROM range(50) t(i)`,
      index: `SELECT i AS "1", i AS id FROM range(50) t(i)`,
      proto: `SELECT i AS id, {'__proto__': i} AS s FROM range(50) t(i)`,
      dotted: `SELECT i AS id, {'a.b': [i], 'a': {'b': i + 1}} AS s FROM range(50) t(i)`,
      dottedStruct: `SELECT i AS id, {'k8s.io': {'x': i}, 'k8s': {'io': 'v'}} AS labels FROM range(50) t(i)`,
    };
    for (const [name, sql] of Object.entries(others)) {
      const path = join(dir, `${name}.parquet`);
      await c.run(`COPY (${sql}) TO '${path}' (FORMAT parquet)`);
      expect(rowPlan(await parquetMetadataAsync(await asyncBufferFromFile(path))), name).toBeNull();
      const texts: string[] = [];
      for await (const r of readParquetTexts(path)) texts.push(r.raw);
      expect(texts, name).toEqual(await expectedTexts(path));
    }
    // A row group whose columns' levels do not fit its schema (DuckDB's fixed-size ARRAY holding a NULL
    // writes three entries for the null) is not given to hyparquet, which reads it and loses the next row's
    // values: reading the file fails, saying where and what to do.
    const array = join(dir, 'array.parquet');
    await c.run(
      `COPY (SELECT NULL::INTEGER[3] AS c, 1 AS id UNION ALL SELECT [1, 2, 3], 2) TO '${array}' (FORMAT parquet)`,
    );
    expect(await expectedTexts(array)).toEqual(['{"id":1}', '{"id":2}']); // hyparquet 1.31's reading: row 2's list lost
    const arrayRows: string[] = [];
    await expect(async () => {
      for await (const r of readParquetTexts(array)) arrayRows.push(r.raw);
    }).rejects.toThrow(
      /^row group 1 \(rows 1 to 2\): row 1 does not end where its columns do, so its columns' levels do not fit its schema .* cast it to a list, c::INTEGER\[\]/,
    );
    expect(arrayRows).toEqual([]);
    // A dotted name at the top, and a name past the array indices (2^32 - 1), are assembled.
    const plain = join(dir, 'plain-names.parquet');
    await c.run(
      `COPY (SELECT i AS "a.b", {'4294967295': i, 'x': [i]} AS s FROM range(50) t(i)) TO '${plain}' (FORMAT parquet)`,
    );
    expect(await assembledTexts(plain)).toEqual(await expectedTexts(plain));
  });
});
