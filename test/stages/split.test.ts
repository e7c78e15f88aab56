import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { SplitSession } from '../../core/records.ts';
import { TaskMatcher, jaccard, shingles } from '../../stages/split/similarity.ts';
import { collect, engineFor, jsonl, manifest, session, tempDir } from '../fixtures/pipeline.ts';

async function splitSessions(dir: string): Promise<SplitSession[]> {
  const folder = join(dir, 'workspace', 'split', 'sessions');
  const out: SplitSession[] = [];
  for (const f of readdirSync(folder).sort()) out.push(...(await collect<SplitSession>(join(folder, f))));
  return out;
}

describe('split', () => {
  it('puts each task wholly on one side, about at the configured ratio', async () => {
    const dir = tempDir();
    const records = [];
    for (let t = 0; t < 200; t++) for (let k = 0; k < 3; k++) records.push(session(`t${t}-${k}`, `task-${t}`, k === 0 ? 1 : 0));
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(records));
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\nsplit:\n  test_ratio: 0.25\n  bucket_size: 64\n').run({ until: 'split' });
    const sessions = await splitSessions(dir);
    expect(sessions).toHaveLength(600);
    const side = new Map<string, Set<string>>();
    for (const s of sessions) side.set(s.task_id!, (side.get(s.task_id!) ?? new Set()).add(s.split));
    expect([...side.values()].every((sides) => sides.size === 1)).toBe(true);
    const testTasks = [...side.values()].filter((s) => s.has('test')).length;
    expect(testTasks).toBeGreaterThan(30);
    expect(testTasks).toBeLessThan(70);
    expect(manifest(dir, 'split').counts.buckets).toBe(10);
  });

  it('groups sessions without task_id with the task whose request reads alike, or with each other', async () => {
    const dir = tempDir();
    const ask = (id: string, task: string | null, text: string, reward: number) => {
      const s = session(id, task, reward);
      s.messages[1] = { role: 'user', content: text };
      return s;
    };
    writeFileSync(
      join(dir, 'logs.jsonl'),
      jsonl([
        ask('k1', 'refund-42', 'Please get me a refund for order 42 from Acme', 1),
        ask('u1', null, 'please get me a refund for order 42 from Acme today', 0),
        ask('u2', null, 'Book a table for two at Luigi on Friday night', 1),
        ask('u3', null, 'book a table for two at Luigi on Friday', 0),
      ]),
    );
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\n').run({ until: 'split' });
    const byId = Object.fromEntries((await splitSessions(dir)).map((s) => [s.session_id, s]));
    expect(byId.u1!.task_id).toBe('refund-42');
    expect(byId.u1!.task_match).toMatchObject({ kind: 'matched_task' });
    expect(byId.u2!.task_id).toMatch(/^group-/);
    expect(byId.u2!.task_match!.kind).toBe('new_group');
    expect(byId.u3!.task_id).toBe(byId.u2!.task_id);
    expect(byId.u3!.task_match!.score).toBeGreaterThanOrEqual(0.5);
    expect(manifest(dir, 'split').counts).toMatchObject({ untasked: 3, matched_to_task: 2, new_groups: 1 });
  });

  it('writes every session as ingest made it with its side added, whatever its id and task hold', async () => {
    const dir = tempDir();
    const odd = ['plain', 'quote"inside', 'back\\slash', 'ünï—code', '"', '\\"', 'comma","task_id":"fake'];
    const records = odd.flatMap((id, i) => [session(id, `task ${odd[(i + 1) % odd.length]}`, 1), session(`${id}-untasked`, null, 0)]);
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(records));
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\nsplit:\n  test_ratio: 0.5\n').run({ until: 'split' });
    const ingested = new Map<string, Record<string, unknown>>();
    for (const f of readdirSync(join(dir, 'workspace', 'ingest', 'sessions'))) for (const s of await collect<Record<string, unknown>>(join(dir, 'workspace', 'ingest', 'sessions', f))) ingested.set(s.session_id as string, s);
    const folder = join(dir, 'workspace', 'split', 'sessions');
    let lines = 0;
    for (const f of readdirSync(folder)) {
      for (const line of readFileSync(join(folder, f), 'utf8').split('\n').filter(Boolean)) {
        const s = JSON.parse(line) as SplitSession;
        expect(line).toBe(JSON.stringify(s)); // well-formed, and as JSON.stringify writes it
        const before = ingested.get(s.session_id)!;
        expect(s).toEqual({ ...before, task_id: before.task_id ?? s.task_id, split: s.split, task_match: before.task_id === null ? expect.any(Object) : null });
        lines++;
      }
    }
    expect(lines).toBe(records.length);
  });

  it('measures request similarity as the Jaccard index of word and word-pair shingles', () => {
    expect([...shingles('Cancel my gym')].sort()).toEqual(['cancel', 'cancel my', 'gym', 'my', 'my gym']);
    expect(jaccard(shingles('a b'), shingles('a b'))).toBe(1);
    expect(jaccard(shingles('a b'), shingles('a c'))).toBeCloseTo(1 / 5);
    const m = new TaskMatcher(0.9);
    m.add('x', 'cancel my gym');
    expect(m.assign('cancel my gym membership').kind).toBe('new_group');
  });
});
