// `prefab run --shard i/N` on three shards, `prefab merge`, and the run going on from there, against one
// run on all the data: the same bytes in every stage's folder.
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Session } from '../../core/records.ts';
import { readJsonl } from '../../pipeline/jsonl.ts';
import { mergeShards } from '../../pipeline/merge.ts';
import { Workspace, acquireLock } from '../../pipeline/workspace.ts';
import { completion, startChatServer, type ChatServer } from '../fixtures/chat-server.ts';
import { prefab } from '../fixtures/cli.ts';
import { engineFor, jsonl, manifest, session, tempDir } from '../fixtures/pipeline.ts';
import { quietLogger } from '../fixtures/toy-stages.ts';

const SAMPLE = join(import.meta.dirname, '../../data/sample/sessions.jsonl.gz');
const SAMPLE_PAIRS = join(import.meta.dirname, '../../data/sample-pairs');
let sessions: Session[] = [];

beforeAll(async () => {
  for await (const s of readJsonl<Session>(SAMPLE)) {
    if (sessions.length === 240) break; // 60 tasks, 4 trials each
    sessions.push(s);
  }
});

let server: ChatServer | null = null;
afterEach(async () => {
  await server?.close();
  server = null;
});

/** Every file under `dir`, relative, except what records when it was made rather than what was made. */
function files(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (d: string) => {
    for (const e of readdirSync(d)) {
      const p = join(d, e);
      if (statSync(p).isDirectory()) walk(p);
      else out.set(relative(dir, p), createHash('sha256').update(readFileSync(p)).digest('hex'));
    }
  };
  walk(dir);
  return out;
}

/**
 * Two input files: tasked sample sessions, some with their task_id taken away (they match their task again
 * by request), untasked ones of their own (new groups), a record to quarantine and a duplicate id across
 * the files; imported pairs beside them; an LLM judge whose answer depends only on what it is asked.
 */
function inputs(dir: string, url: string): string {
  const untask = (s: Session, i: number) => (i % 9 === 0 ? { ...s, task_id: null } : s);
  writeFileSync(
    join(dir, 'a.jsonl'),
    jsonl([
      ...sessions.slice(0, 160).map(untask),
      '{"session_id": "cut',
      session('gym-1', null, 1),
      session('gym-2', null, 0, 'no luck'),
    ]),
  );
  writeFileSync(join(dir, 'b.jsonl'), jsonl([...sessions.slice(160).map(untask), sessions[3]]));
  return (
    [
      'ingest:',
      `  inputs: [${join(dir, 'a.jsonl')}, ${join(dir, 'b.jsonl')}]`,
      'import:',
      `  inputs: [${SAMPLE_PAIRS}]`,
      'split:',
      '  bucket_size: 16',
      'judge:',
      '  llm:',
      '    enabled: true',
      `    endpoint: { base_url: "${url}", model: judge-under-test, backoff_ms: 5 }`,
    ].join('\n') + '\n'
  );
}

/** Prefers A or B by a hash of the request, as sure as the hash says: the same question, the same answer. */
const hashedJudge = () =>
  startChatServer((req) => {
    const h = createHash('sha256').update(req.raw).digest()[0]!;
    const [first, second] = h % 2 ? ['A', 'B'] : ['B', 'A'];
    return {
      json: completion(first, {
        top: [
          [first, 0.6 + (h % 40) / 100],
          [second, 0.4 - (h % 40) / 100],
        ],
      }),
    };
  });

describe('prefab run --shard and prefab merge', () => {
  it('three shards joined are byte for byte one run on all the data, and the run goes on from the gate', async () => {
    server = await hashedJudge();
    const dir = tempDir();
    const config = inputs(dir, server.url);
    const single = engineFor(join(dir, 'single'), config);
    await single.run({});
    const asked = server.requests.length;

    const shards = [0, 1, 2].map((index) => join(dir, `shard-${index}`));
    for (const [index, at] of shards.entries()) {
      const outcomes = await engineFor(at, config).run({ shard: { index, count: 3 } });
      expect(outcomes.map((o) => o.stage)).toEqual(['ingest', 'import', 'split', 'sample', 'pairs', 'judge']);
      expect(manifest(at, 'pairs').counts.train).toBeGreaterThan(0);
      expect(manifest(at, 'judge').shard).toEqual({ index, count: 3 });
    }
    // Each comparison was asked on exactly one shard.
    expect(server.requests.length).toBe(2 * asked);

    const merged = engineFor(join(dir, 'merged'), config);
    await mergeShards(
      merged,
      shards.map((s) => join(s, 'workspace')),
      quietLogger(),
    );
    const outcomes = await merged.run({});
    expect(outcomes.map((o) => [o.stage, o.action])).toEqual([
      ['ingest', 'fresh'],
      ['import', 'fresh'],
      ['split', 'fresh'],
      ['sample', 'fresh'],
      ['pairs', 'fresh'],
      ['judge', 'fresh'],
      ['gate', 'ran'],
      ['export', 'ran'],
    ]);

    // What the test data is there to exercise happened, and the same way in both.
    const counts = (at: string, stage: string) => manifest(at, stage).counts;
    expect(counts(join(dir, 'single'), 'ingest')).toMatchObject({ quarantined: 1, duplicates: 1 });
    expect(counts(join(dir, 'single'), 'split').matched_to_task).toBeGreaterThan(0);
    expect(counts(join(dir, 'single'), 'split').new_groups).toBe(1);
    expect(counts(join(dir, 'single'), 'split').buckets).toBeGreaterThan(9);
    expect(counts(join(dir, 'single'), 'judge').best_of_n).toBeGreaterThan(0);
    expect(counts(join(dir, 'single'), 'judge').imported).toBeGreaterThan(0);
    for (const stage of ['ingest', 'import', 'split', 'sample', 'pairs', 'judge', 'gate', 'export']) {
      expect(counts(join(dir, 'merged'), stage), stage).toEqual(counts(join(dir, 'single'), stage));
      const [one, joined] = [
        files(join(dir, 'single', 'workspace', stage)),
        files(join(dir, 'merged', 'workspace', stage)),
      ];
      // Times: when each file was ingested, when the dataset cards were made.
      for (const volatile of [
        'manifest.json',
        'index.json',
        ...[...one.keys()].filter((f) => f.endsWith('README.md')),
      ]) {
        expect(joined.has(volatile), `${stage}/${volatile}`).toBe(one.has(volatile));
        one.delete(volatile);
        joined.delete(volatile);
      }
      expect(joined, stage).toEqual(one);
      expect(one.size, stage).toBeGreaterThan(0);
    }
    const ingested = (at: string) =>
      (
        JSON.parse(readFileSync(join(at, 'workspace', 'ingest', 'index.json'), 'utf8')) as {
          files: { ingested_at?: string }[];
        }
      ).files.map(({ ingested_at: _, ...f }) => f);
    expect(ingested(join(dir, 'merged'))).toEqual(ingested(join(dir, 'single')));
    expect(existsSync(join(dir, 'merged', 'workspace', 'judge', 'shard.json'))).toBe(false);

    // The shards' answers came along: judging again here asks nothing.
    await merged.run({ force: 'judge' });
    expect(server.requests.length).toBe(2 * asked);
    const once = manifest(join(dir, 'single'), 'judge').counts;
    expect(manifest(join(dir, 'merged'), 'judge').counts).toMatchObject({
      requests: 0,
      cached: once.requests! + once.cached!,
    });
    // Merging again (as a nightly job would) adds no line the caches already hold.
    const cache = join(dir, 'merged', 'workspace', '.cache', 'judge');
    const cached = files(cache);
    expect(cached.size).toBeGreaterThan(0);
    await mergeShards(
      merged,
      shards.map((s) => join(s, 'workspace')),
      quietLogger(),
    );
    expect(files(cache)).toEqual(cached);
  });

  it('refuses what cannot be joined or run on a shard, saying why', async () => {
    server = await hashedJudge();
    const dir = tempDir();
    const config = inputs(dir, server.url);
    const shards = [0, 1, 2].map((index) => join(dir, `shard-${index}`));
    for (const [index, at] of shards.entries())
      if (index < 2) await engineFor(at, config).run({ shard: { index, count: 3 }, until: 'pairs' });

    const merged = () => engineFor(join(dir, 'merged'), config);
    await expect(
      mergeShards(
        merged(),
        shards.slice(0, 2).map((s) => join(s, 'workspace')),
        quietLogger(),
      ),
    ).rejects.toThrow(/holds? shards 0\/3, 1\/3; a merge needs each of 0\/3 … 2\/3 once/);
    await expect(engineFor(shards[2]!, config).run({ shard: { index: 2, count: 3 }, until: 'gate' })).rejects.toThrow(
      /gate needs all the data, so it cannot run on a shard/,
    );
    await expect(
      mergeShards(
        merged(),
        [join(shards[0]!, 'workspace'), join(shards[0]!, 'workspace'), join(shards[1]!, 'workspace')],
        quietLogger(),
      ),
    ).rejects.toThrow(/a merge needs each of/);

    // A shard's folders are its part of the data: a run on all of it makes them again.
    const again = await engineFor(shards[0]!, config).run({ until: 'split' });
    expect(again.find((o) => o.stage === 'split')).toMatchObject({
      action: 'ran',
      reasons: [expect.stringMatching(/made for shard 0\/3, wanted for all the data/)],
    });

    // A shard still running is not merged.
    const release = await acquireLock(
      new Workspace(join(shards[1]!, 'workspace')),
      'prefab run --shard 1/3',
      quietLogger(),
    );
    await expect(
      mergeShards(
        merged(),
        shards.map((s) => join(s, 'workspace')),
        quietLogger(),
      ),
    ).rejects.toThrow(/shard-1\/workspace is still being written \(pid \d+/);
    release();

    const other = engineFor(join(dir, 'other'), config.replace('bucket_size: 16', 'bucket_size: 32'));
    await expect(
      mergeShards(
        other,
        shards.slice(0, 2).map((s) => join(s, 'workspace')),
        quietLogger(),
      ),
    ).rejects.toThrow(/another config section 'split'/);
  });

  it('takes --shard i/N from the command line, numbered from 0, and joins the workspaces with prefab merge', () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(sessions.slice(0, 120)));
    writeFileSync(join(dir, 'config.yaml'), 'ingest:\n  inputs: [logs.jsonl]\nsplit:\n  bucket_size: 16\n');
    const run = (...args: string[]) =>
      prefab(['-c', join(dir, 'config.yaml'), '--log-format', 'json', '-q', ...args], dir);
    expect(run('-w', 's', 'run', '--shard', '2/2')).toMatchObject({
      code: 2,
      stderr: expect.stringContaining('shards are numbered from 0, so the last of 2 is 1/2'),
    });
    // 120 sessions in buckets of 16 are 8 buckets: a tenth shard owns none, and says so.
    const idle = run('-w', 'idle', 'run', '--shard', '9/10', '--until', 'split');
    expect(idle.code, idle.stderr).toBe(0);
    expect(idle.stderr).toMatch(/shard 9\/10 owns none of the 8 bucket\(s\): it has nothing to do/);
    for (const i of [0, 1]) expect(run('-w', `s${i}`, 'run', '--shard', `${i}/2`).code).toBe(0);
    const merge = run('-w', 'all', 'merge', 's0', 's1');
    expect(merge.code, merge.stderr).toBe(0);
    expect(merge.stdout).toMatch(/"stage":"judge","action":"ran"/);
    const status = JSON.parse(run('-w', 'all', 'status', '--json').stdout) as {
      stages: { stage: string; state: string }[];
    };
    expect(status.stages.filter((s) => s.state === 'fresh').map((s) => s.stage)).toEqual([
      'ingest',
      'import',
      'split',
      'sample',
      'pairs',
      'judge',
    ]);
  });
});
