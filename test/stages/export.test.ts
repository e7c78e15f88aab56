import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { gunzipSync } from 'node:zlib';
import { join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Pair } from '../../core/records.ts';
import type { PairSide } from '../../store/messages.ts';
import { prefab, REPO } from '../fixtures/cli.ts';
import { engineFor, tempDir, wholePairs } from '../fixtures/pipeline.ts';

let workdir: string;
const query = async (sql: string) => {
  const db = await DuckDBInstance.create(':memory:');
  const c = await db.connect();
  return (await c.runAndReadAll(sql)).getRowObjectsJson() as Record<string, unknown>[];
};

beforeAll(() => {
  workdir = join(tempDir(), 'workspace');
  const r = prefab([
    '--workdir',
    workdir,
    '--config',
    join(REPO, 'configs', 'default.yaml'),
    '--log-format',
    'json',
    'run',
    '--until',
    'export',
  ]);
  expect(r.code, r.stderr).toBe(0);
});

describe('export', () => {
  it('writes every dataset as train and test Parquet that DuckDB reads, with the counts the manifest reports', async () => {
    const counts = JSON.parse(readFileSync(join(workdir, 'export', 'manifest.json'), 'utf8')).counts as Record<
      string,
      number
    >;
    for (const dataset of ['sessions', 'sft', 'pairs', 'kto']) {
      for (const side of ['train', 'test']) {
        const [row] = await query(
          `SELECT count(*)::INTEGER AS n FROM '${join(workdir, 'export', dataset, `${side}.parquet`)}'`,
        );
        expect(row!.n, `${dataset}/${side}`).toBe(counts[`${dataset}_${side}`]);
      }
      expect(counts[`${dataset}_train`]).toBeGreaterThan(0);
    }
  });

  it('gives messages as lists of structs with the fields of an OpenAI message', async () => {
    const rows = await query(`DESCRIBE SELECT * FROM '${join(workdir, 'export', 'pairs', 'train.parquet')}'`);
    const type = Object.fromEntries(rows.map((r) => [r.column_name, r.column_type]));
    const message =
      'STRUCT("role" VARCHAR, "content" VARCHAR, "name" VARCHAR, tool_calls STRUCT(id VARCHAR, "type" VARCHAR, "function" STRUCT("name" VARCHAR, arguments VARCHAR))[], tool_call_id VARCHAR)[]';
    expect(type.prompt).toBe(message);
    expect(type.chosen).toBe(message);
    expect(type.rejected).toBe(message);
    expect(type).toMatchObject({
      margin: 'DOUBLE',
      confidence: 'DOUBLE',
      source: 'VARCHAR',
      negative_type: 'VARCHAR',
      pair_id: 'VARCHAR',
    });
    const kto = Object.fromEntries(
      (await query(`DESCRIBE SELECT * FROM '${join(workdir, 'export', 'kto', 'train.parquet')}'`)).map((r) => [
        r.column_name,
        r.column_type,
      ]),
    );
    expect(kto).toMatchObject({ prompt: message, completion: message, label: 'BOOLEAN' });
  });

  it('gives min/max statistics to the scalar columns a reader filters on, not to messages or free text', async () => {
    const stats = async (dataset: string) => {
      const rows = await query(
        `SELECT path_in_schema AS path, bool_or(coalesce(stats_min_value, stats_min) IS NOT NULL) AS has FROM parquet_metadata('${join(workdir, 'export', dataset, 'train.parquet')}') GROUP BY path_in_schema`,
      );
      return Object.fromEntries(rows.map((r) => [String(r.path), r.has]));
    };
    const pairs = await stats('pairs');
    for (const column of ['pair_id', 'task_id', 'source', 'confidence', 'chosen_reward'])
      expect(pairs[column], column).toBe(true);
    const nested = Object.keys(pairs).filter((p) => /^(prompt|chosen|rejected)\b/.test(p));
    expect(nested.length).toBeGreaterThan(10); // every leaf of three message lists
    for (const column of nested) expect(pairs[column], column).toBe(false);
    const sessions = await stats('sessions');
    expect([sessions.session_id, sessions.reward, sessions.metadata]).toEqual([true, true, false]);
  });

  it('round-trips pairs exactly: what DuckDB reads back equals what the gate kept', async () => {
    // The gate's pairs point at their sessions' messages: read back whole, as export reads them.
    const made = await wholePairs<Pair<PairSide>>(join(workdir, '..'), 'gate');
    const read = await query(
      `SELECT to_json(prompt)::VARCHAR AS prompt, to_json(chosen)::VARCHAR AS chosen, to_json(rejected)::VARCHAR AS rejected, pair_id, margin FROM '${join(workdir, 'export', 'pairs', 'train.parquet')}'`,
    );
    expect(read).toHaveLength(made.length);
    // DuckDB spells absent optional fields as null; the pairs stage leaves them out.
    const normal = (messages: unknown[]) =>
      messages.map((m) => ({ name: null, tool_calls: null, tool_call_id: null, ...(m as object) }));
    for (let i = 0; i < made.length; i += 37) {
      expect(read[i]!.pair_id).toBe(made[i]!.pair_id);
      expect(read[i]!.margin).toBe(made[i]!.margin);
      expect(JSON.parse(read[i]!.chosen as string)).toEqual(normal(made[i]!.chosen));
      expect(JSON.parse(read[i]!.rejected as string)).toEqual(normal(made[i]!.rejected));
      expect(JSON.parse(read[i]!.prompt as string)).toEqual(normal(made[i]!.prompt));
    }
    const [nulls] = await query(
      `SELECT count(*)::INTEGER AS n FROM (SELECT unnest(chosen) AS m FROM '${join(workdir, 'export', 'pairs', 'train.parquet')}') WHERE m.content IS NULL AND len(m.tool_calls) > 0`,
    );
    expect(nulls!.n).toBeGreaterThan(0);
  });

  it('keeps no task on both sides of the split in any dataset', async () => {
    const [row] = await query(
      `SELECT count(*)::INTEGER AS n FROM (SELECT task_id FROM '${join(workdir, 'export', 'sessions', 'train.parquet')}' INTERSECT SELECT task_id FROM '${join(workdir, 'export', 'sessions', 'test.parquet')}')`,
    );
    expect(row!.n).toBe(0);
  });

  it('writes a dataset card with counts, schema and config hash beside each dataset', () => {
    const card = readFileSync(join(workdir, 'export', 'pairs', 'README.md'), 'utf8');
    const counts = JSON.parse(readFileSync(join(workdir, 'export', 'manifest.json'), 'utf8')).counts;
    expect(card).toContain(`| train | ${counts.pairs_train} |`);
    expect(card).toContain('| `chosen` | `list<struct<role: string, content: string?');
    expect(card).toMatch(/Config hash \(every stage that led here\): `[0-9a-f]{64}`/);
    expect(card).toMatch(/\| ingest \|.*\| split \|.*\| pairs \|.*\| judge \|.*\| gate \|/s);
    for (const d of ['sessions', 'sft', 'kto']) expect(existsSync(join(workdir, 'export', d, 'README.md'))).toBe(true);
  });

  it('masks personal data in every exported dataset when export.redaction is on, and only then', async () => {
    const dir = tempDir();
    const lines = readFileSync(join(REPO, 'data', 'sample', 'sessions.jsonl.gz'));
    writeFileSync(
      join(dir, 'sessions.jsonl'),
      gunzipSync(lines).toString('utf8').split('\n').slice(0, 40).join('\n') + '\n',
    );
    const base = 'ingest:\n  inputs: [sessions.jsonl]\nsplit:\n  test_ratio: 0\n';
    const leaks = async (workspace: string) => {
      let n = 0;
      const texts = {
        sessions: 'struct_pack(messages, feedback, metadata)',
        sft: 'messages',
        pairs: 'struct_pack(prompt, chosen, rejected)',
        kto: 'struct_pack(prompt, completion)',
      };
      for (const [d, columns] of Object.entries(texts)) {
        const [row] = await query(
          `SELECT count(*)::INTEGER AS n FROM '${join(workspace, 'export', d, 'train.parquet')}' t WHERE regexp_matches(to_json(${columns})::VARCHAR, '@example\\.com|\\d{4}-\\d{2}-\\d{2}|\\d{4}-\\d{4}-\\d{3}')`,
        );
        n += row!.n as number;
      }
      return n;
    };
    await engineFor(dir, base).run({});
    expect(await leaks(join(dir, 'workspace'))).toBeGreaterThan(0);
    await engineFor(dir, base + 'export:\n  redaction: { enabled: true }\n').run({});
    expect(await leaks(join(dir, 'workspace'))).toBe(0);
    const [masked] = await query(
      `SELECT count(*)::INTEGER AS n FROM '${join(dir, 'workspace', 'export', 'sessions', 'train.parquet')}' t WHERE to_json(t)::VARCHAR LIKE '%[EMAIL_1]%'`,
    );
    expect(masked!.n).toBeGreaterThan(0);
    expect(readFileSync(join(dir, 'workspace', 'export', 'pairs', 'README.md'), 'utf8')).toMatch(
      /Personal data .* masked/,
    );
  });
});
