import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { DuckDBInstance } from '@duckdb/node-api';
import { describe, expect, it } from 'vitest';
import xxhash from 'xxhash-wasm';
import type { QuarantineRecord } from '../../pipeline/records.ts';
import { sessionSegments } from '../../store/runs.ts';
import { taskRunsFile } from '../../stages/layout.ts';
import type { Session } from '../../core/records.ts';
import { collect, engineFor, jsonl, manifest, session, tempDir, wholePairs } from '../fixtures/pipeline.ts';

const ingestOnly = { until: 'ingest' };

// A file's XXH64 as xxhsum -H1 prints it, and its SHA-256 (what an older ingest knew it by).
const { h64Raw } = await xxhash();
const xxh64 = (text: string) => h64Raw(Buffer.from(text)).toString(16).padStart(16, '0');
const sha256 = (text: string) => createHash('sha256').update(text).digest('hex');

async function ingested(dir: string): Promise<Session[]> {
  const out: Session[] = [];
  for (const seg of await sessionSegments(join(dir, 'workspace', 'ingest'))) out.push(...(await collect<Session>(seg)));
  return out;
}

describe('ingest', () => {
  it('quarantines every bad line with its line number and reason, and keeps every good record', async () => {
    const dir = tempDir();
    const lines = [
      session('ok-1', 'A', 1), // line 1
      '{"session_id": "broken", "messages": [', // 2: not JSON
      session('ok-2', 'A', 0), // 3
      { ...session('bad-type', 'A', 1), messages: 'hello' }, // 4: messages not an array
      session('bad-range', 'A', 1.5), // 5: reward out of range
      { ...session('bad-reward', 'A', 1), reward: 'high' }, // 6: reward wrong type
      { ...session('bad-role', 'A', 1), messages: [{ role: 'bot', content: 'hi' }] }, // 7
      { ...session('bad-tool', 'A', 1), messages: [{ role: 'tool', content: 'x' }] }, // 8: tool without tool_call_id
      session('ok-1', 'A', 0.5), // 9: duplicate id
      '', // 10: blank, ignored
      session('ok-3', 'B', 0.2), // 11
      { ...session('no-reward', 'B', 1), reward: undefined }, // 12
      // 13, 14: tool-call arguments stored as objects with numbers a double cannot keep; 15: small ones are fine.
      ...['{"phone":1e400}', '{"acct":12345678901234567890123}', '{"acct":12345,"amount":1.5e3}'].map(
        (args, i) =>
          `{"session_id":"args-${i}","task_id":"B","reward":1,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"update","arguments":${args}}}]}]}`,
      ),
      // 16–18: ids with lone surrogates, which UTF-8 would make one id (U+FFFD); 19: a pair, which is text.
      ...['DUP\ud800', 'DUP\udbff', 'DUP\udc00', 'DUP\ud83d\ude00'].map((id) => session(id, 'B', 1)),
    ];
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(lines));
    // Most of these lines are bad: allowed here (max_quarantined), so the stage quarantines them and goes on.
    const outcomes = await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\n  max_quarantined: 1\n').run(ingestOnly);
    expect(outcomes[0]!.action).toBe('ran');

    const kept = await ingested(dir);
    expect(kept.map((s) => s.session_id)).toEqual(['ok-1', 'ok-2', 'ok-3', 'args-2', 'DUP\ud83d\ude00']);
    expect(kept[3]!.messages[1]!.tool_calls![0]!.function.arguments).toBe('{"acct":12345,"amount":1500}');
    const q = await collect<QuarantineRecord>(join(dir, 'workspace', 'ingest', 'quarantine.jsonl'));
    const byLine = Object.fromEntries(q.map((r) => [r.where, r.reason]));
    expect(Object.keys(byLine)).toEqual([
      'line 2',
      'line 4',
      'line 5',
      'line 6',
      'line 7',
      'line 8',
      'line 9',
      'line 12',
      'line 13',
      'line 14',
      'line 16',
      'line 17',
      'line 18',
    ]);
    expect(byLine['line 2']).toMatch(/not valid JSON/);
    expect(byLine['line 4']).toMatch(/messages must be an array .*got the string "hello"/);
    expect(byLine['line 5']).toMatch(/reward 1\.5 is outside \[0, 1\].*clamp/);
    expect(byLine['line 6']).toMatch(/reward must be a number/);
    expect(byLine['line 7']).toMatch(
      /messages\[0\]\.role: the string "bot" is not one of system, user, assistant, tool/,
    );
    expect(byLine['line 8']).toMatch(/messages\[0\]: a tool message needs tool_call_id/);
    expect(byLine['line 9']).toMatch(/duplicate session_id 'ok-1'/);
    expect(byLine['line 12']).toMatch(/reward is missing/);
    expect(byLine['line 13']).toMatch(
      /messages\[1\]\.tool_calls\[0\]\.function\.arguments\.phone holds a number too large for a double/,
    );
    expect(byLine['line 16']).toBe('session_id "DUP\\ud800" holds a lone surrogate, which is not Unicode text');
    expect(byLine['line 18']).toMatch(/session_id "DUP\\udc00" holds a lone surrogate/);
    expect(byLine['line 14']).toMatch(/arguments\.acct holds 1\.2345678901234568e\+22, past 2\^53.*JSON string/);
    expect(q.every((r) => r.file.endsWith('logs.jsonl'))).toBe(true);
    expect(q.find((r) => r.where === 'line 2')!.raw).toBe(lines[1]);
    expect(manifest(dir, 'ingest').counts).toMatchObject({ sessions: 5, quarantined: 12, duplicates: 1 });
  });

  it('lists a file’s first duplicates and counts the rest: a bomb of 5,000 copies of one line adds 21 quarantine lines, an appended log no more', async () => {
    const dir = tempDir();
    const line = JSON.stringify(session('same', 'A', 1));
    writeFileSync(join(dir, 'bomb.jsonl'), `${line}\n`.repeat(5000));
    const config = 'ingest:\n  inputs: [bomb.jsonl]\n';
    expect((await engineFor(dir, config).run(ingestOnly))[0]!.action).toBe('ran');
    const quarantine = join(dir, 'workspace', 'ingest', 'quarantine.jsonl');
    const q = await collect<QuarantineRecord>(quarantine);
    expect(q).toHaveLength(21);
    expect(q[0]).toMatchObject({
      where: 'line 2',
      reason: "duplicate session_id 'same' (dropped; the first one is kept)",
    });
    expect(q[20]).toMatchObject({
      where: 'after the duplicates listed',
      reason: expect.stringMatching(/^4979 more duplicate session ids/),
    });
    expect(manifest(dir, 'ingest').counts).toMatchObject({ sessions: 1, duplicates: 4999, quarantined: 0 });
    // The log appended to: read again whole, its old lines are duplicates, listed no more than the first 20.
    writeFileSync(join(dir, 'bomb.jsonl'), `${line}\n`.repeat(5000) + JSON.stringify(session('new', 'A', 1)) + '\n');
    expect((await engineFor(dir, config).run(ingestOnly))[0]!.action).toBe('ran');
    expect(await collect<QuarantineRecord>(quarantine)).toHaveLength(42);
    expect(statSync(quarantine).size).toBeLessThan(42 * 1024);
    expect((await ingested(dir)).map((s) => s.session_id)).toEqual(['same', 'new']);
  });

  it('names a repeated session id in the quarantine as it was written, escapes and all, and one made from the content', async () => {
    const dir = tempDir();
    const odd = 'dup "é" \\ \u2028 end';
    const { session_id: _, ...anonymous } = session('none', 'A', 1);
    writeFileSync(join(dir, 'logs.jsonl'), jsonl([session(odd, 'A', 1), anonymous, session(odd, 'A', 0), anonymous]));
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\n  max_quarantined: 1\n').run(ingestOnly);
    const kept = await ingested(dir);
    expect(kept.map((s) => s.session_id)).toEqual([odd, expect.stringMatching(/^h-/)]);
    const q = await collect<QuarantineRecord>(join(dir, 'workspace', 'ingest', 'quarantine.jsonl'));
    expect(q.map((r) => [r.where, r.reason])).toEqual([
      ['line 3', `duplicate session_id '${odd}' (dropped; the first one is kept)`],
      ['line 4', `duplicate session_id '${kept[1]!.session_id}' (dropped; the first one is kept)`],
    ]);
  });

  it('clamps out-of-range rewards when configured to', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'logs.jsonl'), jsonl([session('a', 'A', 1.5), session('b', 'A', -0.2)]));
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\n  out_of_range_reward: clamp\n').run(ingestOnly);
    expect((await ingested(dir)).map((s) => s.reward)).toEqual([1, 0]);
  });

  it('keeps messages losslessly and every unmapped field in metadata', async () => {
    const dir = tempDir();
    const record = session('s1', 'T', 1, 'ok', { trial: 3, extra: { nested: [1, 2] } });
    (record.messages[2] as Record<string, unknown>).reasoning_content = 'thinking…';
    (record.messages[0] as Record<string, unknown>).name = 'sys';
    writeFileSync(join(dir, 'logs.jsonl'), jsonl([record]));
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\n').run(ingestOnly);
    const [s] = await ingested(dir);
    expect(s!.messages).toEqual(
      record.messages.map((m) => {
        const { reasoning_content: _r, ...rest } = m as Record<string, unknown>;
        return rest;
      }),
    );
    expect(s!.messages[2]!.content).toBeNull();
    expect(JSON.parse(s!.metadata)).toEqual({
      trial: 3,
      extra: { nested: [1, 2] },
      _message_extras: { 2: { reasoning_content: 'thinking…' } },
    });
    expect(s!.source).toMatch(/logs\.jsonl line 1$/);
  });

  it("merges a record's own metadata, a string or an object, its keys first and the record's other fields after", async () => {
    const dir = tempDir();
    const own = '{"trial":1,"source":"sim","__proto__":{"x":1},"n":{"k":[1,2]}}';
    const base = (id: string) => ({ ...session(id, 'T', 1), metadata: undefined });
    // Written as text: a `__proto__` key is a field like any other, in the record and in its metadata.
    const line = (id: string, metadata: string) =>
      JSON.stringify(base(id)).replace(/}$/, `,"metadata":${metadata},"source":"tool","__proto__":"p","z":0}`);
    const lines = [
      line('as-string', JSON.stringify(own)),
      line('as-object', own),
      line('not-an-object', '"[1,2]"'),
      line('without-proto', JSON.stringify('{"a":1}')),
    ];
    writeFileSync(join(dir, 'logs.jsonl'), lines.join('\n') + '\n');
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\n').run(ingestOnly);
    const [a, b, c, d] = await ingested(dir);
    // What spreading the two would give: the metadata's keys in their order, a repeated one taking the record's value.
    const merged = '{"trial":1,"source":"tool","__proto__":"p","n":{"k":[1,2]},"z":0}';
    expect([a!.metadata, b!.metadata]).toEqual([merged, merged]);
    expect(c!.metadata).toBe('{"metadata":"[1,2]","source":"tool","__proto__":"p","z":0}');
    // The record's `__proto__` is a key of the merged metadata where the metadata has none of its own.
    expect(d!.metadata).toBe('{"a":1,"source":"tool","__proto__":"p","z":0}');
    // Metadata given as an object is merged into a copy: the record read is left as it was.
    const { toSession } = await import('../../stages/ingest/mapping.ts');
    const record = JSON.parse(lines[1]!) as Record<string, unknown>;
    const before = JSON.stringify(record);
    expect(
      toSession(record, 'x', {
        fields: {
          messages: 'messages',
          reward: 'reward',
          feedback: 'feedback',
          model: 'model',
          created_at: 'created_at',
        },
        message: { role: 'role', content: 'content', roles: {} },
        outOfRangeReward: 'reject',
        tools: null,
      }).metadata,
    ).toBe(merged);
    expect(JSON.stringify(record)).toBe(before);
  });

  it('names a session without an id by a hash of its content, so a repeat is a duplicate', async () => {
    const dir = tempDir();
    writeFileSync(
      join(dir, 'logs.jsonl'),
      jsonl([session(undefined, 'A', 1), session(undefined, 'A', 1), session(undefined, 'A', 0)]),
    );
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\n').run(ingestOnly);
    const ids = (await ingested(dir)).map((s) => s.session_id);
    expect(ids).toHaveLength(2);
    expect(ids[0]).toMatch(/^h-[0-9a-f]{32}$/);
    expect(ids[0]).not.toBe(ids[1]);
    expect(manifest(dir, 'ingest').counts.duplicates).toBe(1);
  });

  it('reads a JSON array and a Parquet file written by another tool, from a folder and a glob', async () => {
    const dir = tempDir();
    mkdirSync(join(dir, 'logs', 'deep'), { recursive: true });
    writeFileSync(join(dir, 'logs', 'a.json'), JSON.stringify([session('j1', 'A', 1), session('j2', 'A', 0)], null, 2));
    writeFileSync(join(dir, 'src.jsonl'), jsonl([session('p1', 'B', 1), session('p2', 'B', 0)]));
    const db = await DuckDBInstance.create(':memory:');
    const c = await db.connect();
    // DuckDB writes messages as a list of structs with ZSTD pages: an independent writer.
    await c.run(
      `COPY (SELECT * FROM read_json('${join(dir, 'src.jsonl')}')) TO '${join(dir, 'logs', 'deep', 'b.parquet')}' (FORMAT parquet, COMPRESSION zstd)`,
    );
    writeFileSync(join(dir, 'other.jsonl'), jsonl([session('g1', 'C', 1)]));
    await engineFor(dir, 'ingest:\n  inputs: [logs, "oth*.jsonl"]\n').run(ingestOnly);
    const sessions = await ingested(dir);
    expect(sessions.map((s) => s.session_id).sort()).toEqual(['g1', 'j1', 'j2', 'p1', 'p2']);
    const p1 = sessions.find((s) => s.session_id === 'p1')!;
    expect(p1.messages).toEqual(session('p1', 'B', 1).messages);
    expect(p1.source).toMatch(/b\.parquet row 1$/);
    expect(sessions.find((s) => s.session_id === 'j2')!.source).toMatch(/a\.json element 2 \(line \d+\)$/);
  });

  it('ingests only new files on later runs and appends them, leaving earlier segments untouched', async () => {
    const dir = tempDir();
    mkdirSync(join(dir, 'inbox'));
    writeFileSync(join(dir, 'inbox', 'day1.jsonl'), jsonl([session('d1-a', 'A', 1), session('d1-b', 'A', 0)]));
    const cfg = 'ingest:\n  inputs: [inbox]\n';
    await engineFor(dir, cfg).run(ingestOnly);
    const [firstSegment] = await sessionSegments(join(dir, 'workspace', 'ingest'));
    const inode = statSync(firstSegment!).ino;
    const tasksFile = taskRunsFile(join(dir, 'workspace', 'ingest'), basename(firstSegment!));
    const tasksInode = statSync(tasksFile).ino;

    writeFileSync(join(dir, 'inbox', 'day2.jsonl'), jsonl([session('d2-a', 'B', 1), session('d1-a', 'A', 1)]));
    const outcomes = await engineFor(dir, cfg).run(ingestOnly);
    expect(outcomes[0]!.reasons).toEqual(['input files: 1 new']);
    expect(manifest(dir, 'ingest').counts).toMatchObject({
      sessions: 3,
      new_sessions: 1,
      duplicates: 1,
      files: 2,
      files_skipped: 1,
    });
    const segments = await sessionSegments(join(dir, 'workspace', 'ingest'));
    expect(segments).toHaveLength(2);
    expect(statSync(segments[0]!).ino).toBe(inode);
    // Each segment's tasks file beside it (layout.ts TaskRun), the earlier one linked as its segment is.
    expect(statSync(tasksFile).ino).toBe(tasksInode);
    expect(
      segments.map((s) => readFileSync(taskRunsFile(join(dir, 'workspace', 'ingest'), basename(s)), 'utf8')),
    ).toEqual(['["A",2,' + statSync(segments[0]!).size + ']\n', '["B",1,' + statSync(segments[1]!).size + ']\n']);
    expect((await ingested(dir)).map((s) => s.session_id)).toEqual(['d1-a', 'd1-b', 'd2-a']);
  });

  it("names a segment by its file's XXH64, records it in the manifest and the hash cache, and skips a copy under another name", async () => {
    const dir = tempDir();
    mkdirSync(join(dir, 'inbox'));
    const day1 = jsonl([session('d1-a', 'A', 1), session('d1-b', 'A', 0)]);
    writeFileSync(join(dir, 'inbox', 'day1.jsonl'), day1);
    const cfg = 'ingest:\n  inputs: [inbox]\n';
    const recorded = () =>
      Object.fromEntries(
        (manifest(dir, 'ingest') as unknown as { external: { name: string; xxh64: string }[] }).external.map((f) => [
          basename(f.name),
          f.xxh64,
        ]),
      );
    await engineFor(dir, cfg).run(ingestOnly);
    expect(recorded()).toEqual({ 'day1.jsonl': xxh64(day1) });
    expect((await sessionSegments(join(dir, 'workspace', 'ingest'))).map((p) => basename(p))).toEqual([
      `00000-${xxh64(day1).slice(0, 12)}.jsonl`,
    ]);
    const cache = JSON.parse(readFileSync(join(dir, 'workspace', '.cache', 'file-hashes.json'), 'utf8')) as Record<
      string,
      { xxh64: string }
    >;
    expect(Object.values(cache).map((e) => e.xxh64)).toEqual([xxh64(day1)]);

    // The copy has day1's content, so it is skipped (as day1 is); day2 is new.
    const day2 = jsonl([session('d2-a', 'B', 1)]);
    writeFileSync(join(dir, 'inbox', 'copy.jsonl'), day1);
    writeFileSync(join(dir, 'inbox', 'day2.jsonl'), day2);
    await engineFor(dir, cfg).run(ingestOnly);
    expect(manifest(dir, 'ingest').counts).toMatchObject({
      sessions: 3,
      new_sessions: 1,
      duplicates: 0,
      files: 2,
      files_skipped: 2,
    });
    expect(recorded()).toEqual({ 'copy.jsonl': xxh64(day1), 'day1.jsonl': xxh64(day1), 'day2.jsonl': xxh64(day2) });
    expect((await sessionSegments(join(dir, 'workspace', 'ingest'))).map((p) => basename(p))).toEqual([
      `00000-${xxh64(day1).slice(0, 12)}.jsonl`,
      `00001-${xxh64(day2).slice(0, 12)}.jsonl`,
    ]);
    expect((await ingested(dir)).map((s) => s.session_id)).toEqual(['d1-a', 'd1-b', 'd2-a']);
    // Every file's hash is in the cache: nothing is stale, and nothing is hashed again.
    expect(await engineFor(dir, cfg).run(ingestOnly)).toMatchObject([{ stage: 'ingest', action: 'fresh' }]);
    expect(
      Object.keys(JSON.parse(readFileSync(join(dir, 'workspace', '.cache', 'file-hashes.json'), 'utf8')) as object),
    ).toHaveLength(3);
  });

  it('takes over a workspace from before files were known by XXH64: nothing read again, a segment whose file is gone kept', async () => {
    const dir = tempDir();
    mkdirSync(join(dir, 'inbox'));
    const days = {
      'day1.jsonl': jsonl([session('d1-a', 'A', 1), session('d1-b', 'A', 0)]),
      'day2.jsonl': jsonl([session('d2-a', 'B', 1)]),
    };
    for (const [name, text] of Object.entries(days)) writeFileSync(join(dir, 'inbox', name), text);
    const cfg = 'ingest:\n  inputs: [inbox]\n';
    await engineFor(dir, cfg).run(ingestOnly);
    // The workspace as the older ingest left it: files known by their SHA-256 in its index, its manifest and the hash cache.
    const ws = join(dir, 'workspace');
    const rewrite = <T>(path: string, change: (value: T) => unknown) =>
      writeFileSync(path, JSON.stringify(change(JSON.parse(readFileSync(path, 'utf8')) as T)));
    type Known = { name: string; xxh64: string };
    const older = ({ xxh64, ...f }: Known) => ({ ...f, sha256: sha256(days[basename(f.name) as keyof typeof days]) });
    rewrite(join(ws, 'ingest', 'index.json'), (index: { files: Known[] }) => ({
      ...index,
      files: index.files.map(older),
    }));
    const indexNow = statSync(join(ws, 'ingest', 'index.json'));
    type Output = { path: string; bytes: number; xxh64: string; mtime_ms: number };
    // Its outputs were known by SHA-256 too (not checked while their size and time are as recorded).
    const output = ({ xxh64, ...o }: Output) => ({
      ...o,
      sha256: 'older',
      ...(o.path === 'index.json' ? { bytes: indexNow.size, mtime_ms: indexNow.mtimeMs } : {}),
    });
    rewrite(join(ws, 'ingest', 'manifest.json'), (m: { external: Known[]; outputs: Output[] }) => ({
      ...m,
      external: m.external.map(older),
      outputs: m.outputs.map(output),
    }));
    rewrite(join(ws, '.cache', 'file-hashes.json'), (cache: Record<string, { xxh64: string }>) =>
      Object.fromEntries(Object.entries(cache).map(([path, { xxh64, ...e }]) => [path, { ...e, sha256: 'older' }])),
    );
    const before = await ingested(dir);
    rmSync(join(dir, 'inbox', 'day2.jsonl'));

    const outcomes = await engineFor(dir, cfg).run(ingestOnly);
    expect(outcomes[0]!.reasons).toEqual(['input files: 1 new, 1 gone']);
    expect(manifest(dir, 'ingest').counts).toMatchObject({
      sessions: 3,
      new_sessions: 0,
      duplicates: 0,
      files: 2,
      files_skipped: 1,
    });
    expect(await ingested(dir)).toEqual(before);
    const index = JSON.parse(readFileSync(join(ws, 'ingest', 'index.json'), 'utf8')) as {
      files: Record<string, unknown>[];
    };
    expect(index.files.map((f) => [basename(f.name as string), f.xxh64, f.sha256])).toEqual([
      ['day1.jsonl', xxh64(days['day1.jsonl']), undefined],
      ['day2.jsonl', `sha256:${sha256(days['day2.jsonl'])}`, undefined],
    ]);
    expect(await engineFor(dir, cfg).run(ingestOnly)).toMatchObject([{ stage: 'ingest', action: 'fresh' }]);
  });

  it('turns a foreign log shape into sessions with a field mapping alone, and pairs its trials', async () => {
    const dir = tempDir();
    const trial = (task: string, n: number, ok: boolean) => ({
      traj: [
        { from: 'system', value: 'You are a support agent.' },
        { from: 'human', value: `Task ${task}: refund order 12.` },
        {
          from: 'gpt',
          value: null,
          tool_calls: [
            { id: `t${n}`, type: 'function', function: { name: 'refund', arguments: { order: 12, try: n } } },
          ],
        },
        { from: 'tool', value: ok ? 'refunded' : 'error: missing email', tool_call_id: `t${n}` },
        { from: 'gpt', value: ok ? 'Refunded.' : 'Failed.' },
      ],
      meta: { task, env: 'prod' },
      trial: n,
      outcome: { success: ok },
      agent: 'v3',
    });
    writeFileSync(
      join(dir, 'agent.jsonl'),
      jsonl([trial('T1', 0, true), trial('T1', 1, false), trial('T1', 2, false), trial('T2', 0, true)]),
    );
    const cfg = [
      'ingest:',
      '  inputs: [agent.jsonl]',
      '  mapping:',
      '    messages: traj',
      '    task_id: meta.task',
      '    session_id: "{meta.task}-{trial}"',
      '    reward: outcome.success',
      '    model: agent',
      '  message:',
      '    role: from',
      '    content: value',
      '    roles: { human: user, gpt: assistant }',
      'split:',
      '  test_ratio: 0',
    ].join('\n');
    const outcomes = await engineFor(dir, cfg).run({ until: 'pairs' });
    expect(outcomes.map((o) => o.action)).toEqual(['ran', 'ran', 'ran', 'ran', 'ran']); // ingest, import (nothing to import), split, sample, pairs
    const sessions = await ingested(dir);
    expect(sessions.map((s) => [s.session_id, s.task_id, s.reward, s.model])).toEqual([
      ['T1-0', 'T1', 1, 'v3'],
      ['T1-1', 'T1', 0, 'v3'],
      ['T1-2', 'T1', 0, 'v3'],
      ['T2-0', 'T2', 1, 'v3'],
    ]);
    expect(JSON.parse(sessions[0]!.metadata)).toEqual({ meta: { env: 'prod' }, trial: 0 });
    expect(sessions[0]!.messages[2]!.tool_calls![0]!.function.arguments).toBe('{"order":12,"try":0}');

    const pairs = (await wholePairs(dir, 'pairs')).filter((p) => p.source === 'outcome');
    expect(pairs.map((p) => [p.chosen_session_id, p.rejected_session_id])).toEqual([
      ['T1-0', 'T1-1'],
      ['T1-0', 'T1-2'],
    ]);
    expect(pairs[0]!.prompt.map((m) => m.role)).toEqual(['system', 'user']);
    expect(pairs[0]!.chosen[0]!.role).toBe('assistant');
    expect(pairs[0]!.margin).toBe(1);
  });

  it('stops with a clear error when an input matches nothing', async () => {
    const dir = tempDir();
    await expect(engineFor(dir, 'ingest:\n  inputs: ["missing/*.jsonl"]\n').run(ingestOnly)).rejects.toThrow(
      /'missing\/\*\.jsonl' matches no file/,
    );
  });

  it('stops before reading any file when one has a name that tells no format', async () => {
    const dir = tempDir();
    writeFileSync(join(dir, 'a.jsonl'), jsonl([session('a', 'A', 1)]));
    writeFileSync(join(dir, 'notes.txt'), jsonl([session('b', 'A', 0)]));
    const [outcome] = await engineFor(dir, 'ingest:\n  inputs: [a.jsonl, notes.txt]\n').run(ingestOnly);
    expect(outcome).toMatchObject({
      action: 'failed',
      error: expect.stringMatching(
        /notes\.txt: cannot tell its format from the name; use \.jsonl, \.json or \.parquet, or set ingest\.format$/,
      ),
    });
    expect(existsSync(join(dir, 'workspace', 'ingest', 'sessions'))).toBe(false);
  });
});
