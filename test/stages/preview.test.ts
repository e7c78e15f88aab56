// `prefab preview`: input records mapped as ingest maps them, before any run; pairs side by side after one.
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { prefab, REPO } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { AIRLINE_TOOLS, writeAirlineTrials } from '../fixtures/public-shaped.ts';

const lines = (text: string) =>
  text
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>);

describe('prefab preview', () => {
  it('maps the first records of each input as ingest would, says why one would be quarantined, and writes nothing', () => {
    const dir = tempDir();
    const { sessions, tools } = writeAirlineTrials(dir, 2);
    writeFileSync(join(dir, 'bad.jsonl'), JSON.stringify({ conversation: [], score: 1 }) + '\n');
    const config = join(dir, 'c.yaml');
    writeFileSync(
      config,
      `ingest:\n  inputs: [${sessions}, bad.jsonl]\n  mapping: { messages: traj, session_id: "{task_id}-{trial}" }\n  tools: ${tools}\n`,
    );
    const workdir = join(dir, 'workspace');
    const r = prefab(['--workdir', workdir, '--config', config, 'preview', 'inputs', '--records', '2', '--json']);
    expect(r.code, r.stderr).toBe(0);
    const [first, second, bad] = lines(r.stdout) as { session: Record<string, unknown> | null; reason: string }[];
    expect(first!.session).toMatchObject({ session_id: '0-0', task_id: '0', reward: 1 });
    expect(JSON.parse(first!.session!.metadata as string).tools).toEqual(AIRLINE_TOOLS);
    expect(second!.session).toMatchObject({ session_id: '0-1', reward: 0 });
    expect(bad!.session).toBeNull();
    expect(bad!.reason).toMatch(/messages must be an array .*; the record's keys: conversation, score/);
    expect(existsSync(workdir)).toBe(false);
    // As text: a few lines a record.
    const text = prefab(['--workdir', workdir, '--config', config, 'preview', 'inputs', '--records', '1']);
    expect(text.stdout).toMatch(/line 1\n {4}session 0-0 {2}task 0 {2}reward 1/);
    expect(text.stdout).toMatch(/quarantined: messages must be an array/);
  });

  it('prints pairs of one source and type, whole as JSON or side by side', () => {
    const workdir = join(tempDir(), 'workspace');
    const config = join(REPO, 'configs', 'default.yaml');
    expect(prefab(['--workdir', workdir, '--config', config, 'run', '--until', 'gate']).code).toBe(0);
    const args = ['--workdir', workdir, '--config', config, 'preview', 'pairs', '--source', 'hard_negative'];
    const json = prefab([...args, '--type', 'refusal', '-n', '2', '--json']);
    expect(json.code, json.stderr).toBe(0);
    const pairs = lines(json.stdout);
    expect(pairs).toHaveLength(2);
    for (const p of pairs) expect(p).toMatchObject({ source: 'hard_negative', negative_type: 'refusal' });
    const text = prefab([...args, '--type', 'verbose', '-n', '1']);
    expect(text.stdout).toMatch(/hard_negative\/verbose/);
    expect(text.stdout).toMatch(/^chosen +│ rejected$/m);
    const none = prefab([...args, '--type', 'nonsense']);
    expect(none.stdout).toMatch(/no pair in .* of type nonsense/);
  });
});
