// A Parquet file's records (pipeline/parquet.ts readParquetRecords) come from a thread of their own as each
// row's text. Pinned here: the text is JSON.stringify of the row's plain JSON values (hyparquet's toJson), for
// every type DuckDB writes that JSON has no word for, and a record carries its value from the thread only
// where the text does not give it back (NaN and the infinities, which JSON writes as null).
import { join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { asyncBufferFromFile, parquetReadObjects, toJson } from 'hyparquet';
import { compressors } from 'hyparquet-compressors';
import { describe, expect, it } from 'vitest';
import { readParquetBatches } from '../../pipeline/parquet.ts';
import type { RawRecord } from '../../pipeline/records.ts';
import { tempDir } from '../fixtures/pipeline.ts';

describe('records of a Parquet file', () => {
  it('are the text of each row as toJson makes it, with a value only where the text loses a number', async () => {
    const path = join(tempDir(), 'types.parquet');
    const db = await DuckDBInstance.create(':memory:');
    const c = await db.connect();
    // Two row groups; a bigint past 2^53, -0, bytes, times and dates, nested lists of structs with nulls,
    // and in some rows a NaN or an infinity, deep or at the top.
    await c.run(`COPY (
      SELECT i AS id, 9007199254740993 + i AS big, CASE WHEN i % 7 = 0 THEN 'NaN'::DOUBLE WHEN i % 11 = 0 THEN '-Infinity'::DOUBLE ELSE -0.0 END AS x,
        ('\\x00\\xFF' || i::VARCHAR)::BLOB AS bytes, TIMESTAMP '2026-01-01 00:00:00' + INTERVAL (i) SECOND AS at, DATE '2026-01-01' + i::INTEGER AS day,
        [{'role': 'user', 'content': 'quote " é ' || i::VARCHAR, 'score': CASE WHEN i % 5 = 0 THEN 'Infinity'::DOUBLE ELSE i / 3 END},
         {'role': 'assistant', 'content': NULL, 'score': NULL}] AS messages,
        CASE WHEN i % 2 = 0 THEN NULL ELSE [1, NULL, 3] END AS maybe
      FROM range(3000) t(i)
    ) TO '${path}' (FORMAT parquet, ROW_GROUP_SIZE 2048)`);
    const records: RawRecord[] = [];
    for await (const batch of readParquetBatches(path)) records.push(...batch);
    const rows = await parquetReadObjects({ file: await asyncBufferFromFile(path), compressors });
    expect(records).toHaveLength(3000);
    let withValue = 0;
    for (const [i, record] of records.entries()) {
      const value = toJson(rows[i]);
      const text = JSON.stringify(value);
      expect(record.where).toBe(`row ${i + 1}`);
      expect(record.raw).toBe(text);
      const lossy = JSON.stringify(JSON.parse(text)) !== text || !sameNumbers(JSON.parse(text), value);
      expect(record.value).toEqual(lossy ? value : undefined);
      if (record.value !== undefined) withValue++;
    }
    // Every seventh, eleventh and fifth row holds a NaN or an infinity.
    expect(withValue).toBe(records.filter((_, i) => i % 7 === 0 || i % 11 === 0 || i % 5 === 0).length);
  });
});

/** Whether two JSON values hold the same numbers (NaN as NaN), where JSON.parse of a text gives null for a non-finite one. */
function sameNumbers(a: unknown, b: unknown): boolean {
  if (typeof b === 'number') return Object.is(a, b) || (a === 0 && b === 0);
  if (b === null || typeof b !== 'object') return a === b;
  if (a === null || typeof a !== 'object') return false;
  const keys = Object.keys(b as object);
  return keys.every((k) => sameNumbers((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}
