// Exports from logs prefab did not write, read as TRL reads them: tau-bench-style airline trials whose simulated
// user words the request differently in each trial, and HH-RLHF transcripts, through ingest, import and export.
import { join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Message, Pair } from '../../core/records.ts';
import { trlPair } from '../../stages/export/rows.ts';
import { AIRLINE_TOOLS, writeAirlineTrials, writeHhRlhf } from '../fixtures/public-shaped.ts';
import { engineFor, manifest, tempDir } from '../fixtures/pipeline.ts';

type Row = Omit<Pair, 'prompt' | 'chosen' | 'rejected'> & {
  prompt: Message[];
  chosen: Message[];
  rejected: Message[];
  tools: string | null;
};

let dir: string;
const rowsOf = async (table: string, side: string): Promise<Row[]> => {
  const db = await DuckDBInstance.create(':memory:');
  const c = await db.connect();
  const file = join(dir, 'workspace', 'export', table, `${side}.parquet`);
  const rows = (await c.runAndReadAll(`SELECT to_json(t)::VARCHAR AS j FROM '${file}' t`)).getRowObjectsJson();
  return rows.map((r) => JSON.parse(r.j as string) as Row);
};

beforeAll(async () => {
  dir = tempDir();
  const { sessions, tools } = writeAirlineTrials(dir);
  const hh = writeHhRlhf(dir);
  const engine = engineFor(
    dir,
    `ingest:
  inputs: [${JSON.stringify(sessions)}]
  mapping: { messages: traj, session_id: "{task_id}-{trial}" }
  tools: ${JSON.stringify(tools)}
import:
  inputs: [${JSON.stringify(hh)}]
  test_ratio: 0
split:
  test_ratio: 0
`,
  );
  const outcomes = await engine.run();
  expect(outcomes.filter((o) => o.action === 'failed')).toEqual([]);
});

describe('exports TRL reads right', () => {
  it('gives TRL only pairs whose prompt ends on a user or tool turn and whose sides start with an assistant turn', async () => {
    const pairs = await rowsOf('pairs', 'train');
    expect(pairs.length).toBeGreaterThan(0);
    for (const p of pairs) {
      expect(['user', 'tool'], p.pair_id).toContain(p.prompt.at(-1)?.role);
      expect(p.chosen[0]?.role, p.pair_id).toBe('assistant');
      expect(p.rejected[0]?.role, p.pair_id).toBe('assistant');
    }
    // Outcome pairs of trials worded alike, hard negatives, imported HH pairs (best-of-N adds none: its pairs are the outcome pairs').
    expect(new Set(pairs.map((p) => p.source))).toEqual(new Set(['outcome', 'hard_negative', 'imported']));
  });

  it('leaves trials that part before any assistant turn to the trajectories table, whole, and loses no pair', async () => {
    const trajectories = await rowsOf('trajectories', 'train');
    expect(trajectories.length).toBeGreaterThan(0);
    for (const t of trajectories) {
      expect(trlPair(t), t.pair_id).toBeNull();
      // They part at the user's request: the prompt is the policy alone.
      expect(t.prompt.map((m) => m.role)).toEqual(['system']);
      expect(t.chosen[0]!.role).toBe('user');
      expect(t.chosen[0]!.content).not.toBe(t.rejected[0]!.content);
    }
    expect(new Set(trajectories.map((p) => p.source))).toEqual(new Set(['outcome']));
    const pairs = await rowsOf('pairs', 'train');
    expect(pairs.length + trajectories.length).toBe(manifest(dir, 'gate').counts.train);
    expect(new Set([...pairs, ...trajectories].map((p) => p.pair_id)).size).toBe(pairs.length + trajectories.length);
  });

  it('gives every row of the sessions the tools their agent had, as the JSON list TRL renders into the template', async () => {
    const pairs = await rowsOf('pairs', 'train');
    for (const p of pairs.filter((p) => p.source !== 'imported')) expect(JSON.parse(p.tools!)).toEqual(AIRLINE_TOOLS);
    for (const p of pairs.filter((p) => p.source === 'imported')) expect(p.tools).toBeNull();
    for (const r of await rowsOf('sft', 'train')) expect(JSON.parse(r.tools!)).toEqual(AIRLINE_TOOLS);
  });
});

describe('trlPair', () => {
  const m = (role: Message['role'], content: string): Message => ({ role, content });
  const pair = (prompt: Message[], chosen: Message[], rejected: Message[]) =>
    ({ pair_id: 'p', prompt, chosen, rejected }) as Pair;

  it('keeps a pair TRL reads right as it is', () => {
    const p = pair([m('system', 's'), m('user', 'u')], [m('assistant', 'a')], [m('assistant', 'b')]);
    expect(trlPair(p)).toBe(p);
  });

  it('cuts a prompt that ends on an assistant turn back to the last user or tool turn, the rest opening both sides', () => {
    const call = m('assistant', 'call');
    const p = pair([m('system', 's'), m('user', 'u'), call], [m('tool', 'ok'), m('assistant', 'a')], [m('tool', 'no')]);
    const cut = trlPair(p)!;
    expect(cut.prompt).toEqual([m('system', 's'), m('user', 'u')]);
    expect(cut.chosen).toEqual([call, m('tool', 'ok'), m('assistant', 'a')]);
    expect(cut.rejected).toEqual([call, m('tool', 'no')]);
  });

  it('has no cut for trajectories that part before any assistant turn, or share nothing', () => {
    expect(trlPair(pair([m('system', 's')], [m('user', 'a')], [m('user', 'b')]))).toBeNull();
    expect(trlPair(pair([], [m('user', 'a')], [m('user', 'b')]))).toBeNull();
  });
});
