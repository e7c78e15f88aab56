// Step pairs through the data stages (pairs.steps): one policy's sessions of a task, which start alike and
// part where the scripted agent drops a field, give pairs on the one turn where they part, read back from the
// export as TRL reads them; the judges keep them (the environment's outcomes decided them).
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Message, Pair, Session } from '../../core/records.ts';
import { simulate } from '../../env/simulate.ts';
import { DEFAULT_WORLD } from '../../env/world.ts';
import { engineFor, manifest, tempDir } from '../fixtures/pipeline.ts';

type Row = Omit<Pair, 'prompt' | 'chosen' | 'rejected'> & { prompt: Message[]; chosen: Message[]; rejected: Message[] };

let dir: string;
const sessions: Session[] = [];

async function pairsOf(side: string): Promise<Row[]> {
  const db = await DuckDBInstance.create(':memory:');
  const c = await db.connect();
  const file = join(dir, 'workspace', 'export', 'pairs', `${side}.parquet`);
  const rows = (await c.runAndReadAll(`SELECT to_json(t)::VARCHAR AS j FROM '${file}' t`)).getRowObjectsJson();
  return rows.map((r) => JSON.parse(r.j as string) as Row);
}

beforeAll(async () => {
  dir = tempDir();
  // One policy (the noisy agent: the oracle, dropping each needed field with p 0.5), 8 tries of each task.
  const o = { tasks: 12, trials: 8, agent: 'noisy' as const, noise: 0.5, split: 'train' as const, offset: 0 };
  for await (const s of simulate({ ...o, seed: DEFAULT_WORLD.seed, companies: DEFAULT_WORLD.companies }))
    sessions.push(s);
  const file = join(dir, 'sessions.jsonl');
  writeFileSync(file, sessions.map((s) => JSON.stringify(s)).join('\n') + '\n');
  const engine = engineFor(
    dir,
    `ingest:
  inputs: [${JSON.stringify(file)}]
split:
  test_ratio: 0
pairs:
  outcome: { enabled: false }
  hard_negatives: { enabled: false }
  steps: { enabled: true, margin: 0.5 }
`,
  );
  const outcomes = await engine.run();
  expect(outcomes.filter((o) => o.action === 'failed')).toEqual([]);
});

describe('step pairs in the pipeline', () => {
  it('pairs the turn where a task’s sessions part, the prompt their shared messages, as TRL reads it', async () => {
    // Best-of-N adds its own, judged among a task's sessions whole.
    const pairs = (await pairsOf('train')).filter((p) => p.source === 'step');
    const made = manifest(dir, 'pairs').counts;
    expect(made).toMatchObject({ outcome: 0, hard_negative: 0 });
    expect(pairs.length).toBeGreaterThan(0);
    expect(pairs.length).toBe(made.step);
    const byId = new Map(sessions.map((s) => [s.session_id, s]));
    for (const p of pairs) {
      expect(['user', 'tool'], p.pair_id).toContain(p.prompt.at(-1)?.role);
      expect(p.chosen.map((m) => m.role)).toEqual(['assistant']);
      expect(p.rejected.map((m) => m.role)).toEqual(['assistant']);
      // Both sessions say the prompt, then part at its end: the chosen turn is the chosen session's next message.
      const chosen = byId.get(p.chosen_session_id)!;
      const rejected = byId.get(p.rejected_session_id)!;
      const at = p.prompt.length;
      expect(chosen.task_id).toBe(rejected.task_id);
      expect(JSON.stringify(chosen.messages.slice(0, at))).toBe(JSON.stringify(rejected.messages.slice(0, at)));
      expect(p.chosen[0]!.content).toBe(chosen.messages[at]!.content);
      expect(p.rejected[0]!.content).toBe(rejected.messages[at]!.content);
      expect(JSON.stringify([p.chosen[0]!.content, p.chosen[0]!.tool_calls ?? null])).not.toBe(
        JSON.stringify([p.rejected[0]!.content, p.rejected[0]!.tool_calls ?? null]),
      );
      // The chosen turn led to success more often: its value is the margin above the rejected one's at least.
      expect(p.chosen_reward! - p.rejected_reward!).toBeGreaterThanOrEqual(0.5);
      expect(p.margin).toBeCloseTo(p.chosen_reward! - p.rejected_reward!, 9);
    }
  });
});
