import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { Session, SplitSession } from '../../core/records.ts';
import { int, pick, seeded } from '../../core/random.ts';
import { sha256 } from '../../pipeline/hash.ts';
import { TaskMatcher, jaccard, shingles } from '../../stages/split/similarity.ts';
import { StoredBucketReader } from '../../store/bucket-reader.ts';
import { sessionRunLine, type SessionRun } from '../../store/runs.ts';
import type { IngestIndex, TaskRun } from '../../stages/layout.ts';
import { collect, engineFor, jsonl, manifest, session, splitLines, tempDir } from '../fixtures/pipeline.ts';

async function splitSessions(dir: string): Promise<SplitSession[]> {
  return (await splitLines(dir)).map((line) => JSON.parse(line) as SplitSession);
}

describe('split', () => {
  it('puts each task wholly on one side, about at the configured ratio', async () => {
    const dir = tempDir();
    const records = [];
    for (let t = 0; t < 200; t++)
      for (let k = 0; k < 3; k++) records.push(session(`t${t}-${k}`, `task-${t}`, k === 0 ? 1 : 0));
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(records));
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\nsplit:\n  test_ratio: 0.25\n  bucket_size: 64\n').run({
      until: 'split',
    });
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

  it("points at runs of ingest's lines instead of copying them, and writes whole only the sessions it gave a task", async () => {
    const dir = tempDir();
    // Tasks' sessions one after another (four each), then two tasks' sessions in turn, and untasked ones.
    const records = [];
    for (let t = 0; t < 30; t++)
      for (let k = 0; k < 4; k++) records.push(session(`t${t}-${k}`, `task-${t}`, k === 0 ? 1 : 0));
    for (let k = 0; k < 20; k++) records.push(session(`a${k}`, 'task-a', k % 2), session(`b${k}`, 'task-b', k % 2));
    records.push(session('u1', null, 1), session('u2', null, 0));
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(records));
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\nsplit:\n  test_ratio: 0.3\n  bucket_size: 40\n').run({
      until: 'split',
    });
    const workspace = join(dir, 'workspace');
    const [segment] = readdirSync(join(workspace, 'ingest', 'sessions'));
    const ingested = readFileSync(join(workspace, 'ingest', 'sessions', segment!));
    const folder = join(workspace, 'split', 'sessions');
    let pointed = 0;
    let runs = 0;
    const whole: string[] = [];
    for (const f of readdirSync(folder)) {
      for (const line of readFileSync(join(folder, f), 'utf8').split('\n').filter(Boolean)) {
        const entry = JSON.parse(line) as SessionRun | SplitSession;
        if ('session_id' in entry) {
          whole.push(entry.session_id);
          continue;
        }
        expect(line).toBe(sessionRunLine(entry));
        expect(line).toBe(JSON.stringify(entry));
        expect(entry).toMatchObject({ ingest: segment, split: f.startsWith('test') ? 'test' : 'train' });
        // The bytes are the run's sessions' lines as ingest wrote them, each newline included.
        const lines = ingested.toString('utf8', entry.bytes[0], entry.bytes[1]).split('\n');
        expect(lines.pop()).toBe('');
        expect(lines).toHaveLength(entry.sessions);
        for (const l of lines) expect(JSON.parse(l)).toHaveProperty('task_id');
        pointed += entry.sessions;
        runs++;
      }
    }
    expect(whole.sort()).toEqual(['u1', 'u2']);
    expect(pointed).toBe(records.length - 2);
    // Consecutive sessions of a bucket file are one run: at most a run a task of the first 30, and one for
    // each of the 40 taken in turn.
    expect(runs).toBeLessThanOrEqual(30 + 40);
    expect(runs).toBeLessThan(pointed / 2);
    expect((await splitLines(dir)).map((l) => (JSON.parse(l) as SplitSession).session_id).sort()).toEqual(
      records.map((r) => r.session_id).sort(),
    );
  });

  it("places the runs of ingest's tasks files as reading every line does, and says which tasks file was changed", async () => {
    const dir = tempDir();
    // Two input files (two segments): tasks in runs and in turn, untasked sessions among them, repeated ids
    // (dropped, so a run goes on over them), ids and tasks that need escapes.
    const day1 = [];
    for (let t = 0; t < 40; t++)
      for (let k = 0; k < 3; k++) day1.push(session(`t${t}-${k}`, `task-${t}`, k === 0 ? 1 : 0, `answer ${t} ${k}`));
    for (let k = 0; k < 30; k++)
      day1.push(
        session(`i${k}`, `turn-${k % 3}`, k % 2),
        ...(k % 7 === 0 ? [session(undefined, null, 0.5, `untasked ${k}`)] : []),
      );
    day1.push(session('t3-1', 'task-3', 1), session('q"1', 'ünï "task"\\', 1), session('q"2', 'ünï "task"\\', 0));
    const day2 = [
      session('t5-0', 'task-5', 0),
      session('late-1', 'task-5', 1),
      session('late-2', null, 0),
      session('late-3', 'task-41', 1),
    ];
    writeFileSync(join(dir, 'day1.jsonl'), jsonl(day1));
    writeFileSync(join(dir, 'day2.jsonl'), jsonl(day2));
    const engine = engineFor(
      dir,
      'ingest:\n  inputs: [day1.jsonl, day2.jsonl]\nsplit:\n  test_ratio: 0.3\n  bucket_size: 16\n',
    );
    await engine.run({ until: 'split' });
    const ingest = join(dir, 'workspace', 'ingest');
    const segments = readdirSync(join(ingest, 'sessions')).sort();
    expect(segments).toHaveLength(2);
    expect(readdirSync(join(ingest, 'tasks')).sort()).toEqual(segments);
    const index = JSON.parse(readFileSync(join(ingest, 'index.json'), 'utf8')) as IngestIndex;
    // A segment's tasks file is its lines' tasks in runs, as the lines themselves tell them.
    for (const segment of segments) {
      const bytes = readFileSync(join(ingest, 'sessions', segment));
      const runs: TaskRun[] = [];
      for (const line of bytes.toString('utf8').split('\n').slice(0, -1)) {
        const task = (JSON.parse(line) as Session).task_id;
        const run = runs.at(-1);
        if (run && run[0] === task) {
          run[1]++;
          run[2] += Buffer.byteLength(line) + 1;
        } else runs.push([task, 1, Buffer.byteLength(line) + 1]);
      }
      expect(readFileSync(join(ingest, 'tasks', segment), 'utf8')).toBe(jsonl(runs));
      expect(index.files.find((f) => f.segment === segment)!.segment_bytes).toBe(bytes.length);
    }
    const split = () =>
      Object.fromEntries(
        readdirSync(join(dir, 'workspace', 'split', 'sessions')).map((f) => [
          f,
          readFileSync(join(dir, 'workspace', 'split', 'sessions', f), 'utf8'),
        ]),
      );
    const fromRuns = split();
    expect(manifest(dir, 'split').counts).toMatchObject({ train_sessions: expect.any(Number), untasked: 6 });
    const counts = manifest(dir, 'split').counts;
    // Without the tasks files (an ingest from before them), every line is read: the same buckets, byte for byte.
    const runsOf = Object.fromEntries(segments.map((s) => [s, readFileSync(join(ingest, 'tasks', s))]));
    rmSync(join(ingest, 'tasks'), { recursive: true });
    await engine.run({ from: 'split', until: 'split', force: 'split' });
    expect(split()).toEqual(fromRuns);
    expect(manifest(dir, 'split').counts).toEqual(counts);
    // A tasks file changed (one run a byte short) while its segment was not: the error names it and what to run.
    mkdirSync(join(ingest, 'tasks'));
    for (const s of segments) writeFileSync(join(ingest, 'tasks', s), runsOf[s]!);
    const changed = join(ingest, 'tasks', segments[0]!);
    writeFileSync(
      changed,
      readFileSync(changed, 'utf8').replace(/,(\d+)\]\n/, (_, n: string) => `,${Number(n) - 1}]\n`),
    );
    const [outcome] = await engine.run({ from: 'split', until: 'split', force: 'split' });
    expect(outcome!.action).toBe('failed');
    expect(outcome!.error).toMatch(
      /tasks\/00000-[0-9a-f]{12}\.jsonl: its runs add up to \d+ bytes, and .*00000-[0-9a-f]{12}\.jsonl has \d+; .*run `prefab stage ingest`/,
    );
    writeFileSync(changed, '["task-0",3]\n');
    const [again] = await engine.run({ from: 'split', until: 'split', force: 'split' });
    expect(again!.error).toMatch(
      /tasks\/00000-[0-9a-f]{12}\.jsonl line 1: not a task run \(\[task, sessions, bytes\]\).*run `prefab stage ingest`/,
    );
  });

  it('says which bucket line to make again when what it points at is not what ingest holds', async () => {
    const dir = tempDir();
    const records = [];
    for (let t = 0; t < 30; t++) for (let k = 0; k < 2; k++) records.push(session(`t${t}-${k}`, `task-${t}`, k));
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(records));
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\nsplit:\n  test_ratio: 0\n').run({ until: 'split' });
    const workspace = join(dir, 'workspace');
    const bucket = join(workspace, 'split', 'sessions', 'train-000.jsonl');
    const lines = readFileSync(bucket, 'utf8').split('\n').filter(Boolean);
    const first = JSON.parse(lines[0]!) as SessionRun;
    const read = () => new StoredBucketReader().sessions(bucket, join(workspace, 'ingest'));
    const broken = (line: string) => writeFileSync(bucket, [line, ...lines.slice(1)].join('\n') + '\n');

    broken(sessionRunLine({ ...first, ingest: '00009-gone.jsonl' }));
    await expect(read()).rejects.toThrow(
      /train-000\.jsonl line 1: points at ingest's segment 00009-gone\.jsonl, which .*sessions does not hold .*run `prefab stage split`/,
    );
    broken(sessionRunLine({ ...first, sessions: first.sessions + 1 }));
    await expect(read()).rejects.toThrow(
      /train-000\.jsonl line 1: split found \d+ session\(s\) at bytes \d+ to \d+ of ingest's segment .*, which holds \d+ line\(s\) there, not all sessions; it has changed since: run `prefab stage split`/,
    );
    broken(sessionRunLine({ ...first, bytes: [first.bytes[0] + 1, first.bytes[1]] }));
    await expect(read()).rejects.toThrow(/not all sessions/);
    broken(sessionRunLine({ ...first, bytes: [first.bytes[0], first.bytes[1] + 10 ** 9] }));
    await expect(read()).rejects.toThrow(/which ends at byte \d+; it has changed since/);
    broken('{"ingest":"../../etc/passwd","bytes":[0,10],"sessions":1,"split":"train"}');
    await expect(read()).rejects.toThrow(/line 1: not a run of ingest's sessions/);
    // Read by its shape or parsed, a run is held to the same: a name that escapes its folder, a side
    // not known, a count past what a number holds exactly.
    for (const line of [
      '{"ingest":"..","bytes":[0,10],"sessions":1,"split":"train"}',
      `{"ingest":"a\\u002f${first.ingest}","bytes":[0,10],"sessions":1,"split":"train"}`,
      sessionRunLine(first).replace('"train"', '"val"'),
      sessionRunLine(first).replace(`[${first.bytes[0]},`, '[99999999999999999999,'),
    ]) {
      broken(line);
      await expect(read(), line).rejects.toThrow(/line 1: not a run of ingest's sessions/);
    }
    // More sessions than its bytes could hold lines: refused before any memory is taken for them.
    broken(sessionRunLine({ ...first, sessions: 10 ** 12 }));
    await expect(read()).rejects.toThrow(/line 1: not a run of ingest's sessions/);
    broken(sessionRunLine(first));
    const sessions = (await read())
      .toString('utf8')
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as SplitSession);
    expect(sessions.map((s) => s.session_id).sort()).toEqual(records.map((r) => r.session_id).sort());
    expect(sessions.every((s) => s.split === 'train' && s.task_match === null)).toBe(true);
  });

  it('writes whole a segment line that does not end as ingest ends one, and names the segment and byte of a line cut short', async () => {
    const dir = tempDir();
    const records = [];
    for (let t = 0; t < 10; t++)
      for (let k = 0; k < 3; k++) records.push(session(`t${t}-${k}`, `task-${t}`, k === 0 ? 1 : 0));
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(records));
    const engine = engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\nsplit:\n  test_ratio: 0.3\n');
    await engine.run({ until: 'split' });
    const before = (await splitLines(dir))
      .map((l) => JSON.parse(l) as SplitSession)
      .sort((a, b) => (a.session_id < b.session_id ? -1 : 1));
    const sessions = join(dir, 'workspace', 'ingest', 'sessions');
    const [segment] = readdirSync(sessions);
    const lines = readFileSync(join(sessions, segment!), 'utf8').split('\n').filter(Boolean);
    // White space after a session's closing brace (its line still JSON), on a line within the file and on its
    // last line, which then has no newline.
    writeFileSync(
      join(sessions, segment!),
      [lines[4] + ' ', ...lines.slice(0, 4), ...lines.slice(5, -1), `${lines.at(-1)}\t`].join('\n'),
    );
    await engine.run({ from: 'split', until: 'split', force: 'split' });
    const after = (await splitLines(dir))
      .map((l) => JSON.parse(l) as SplitSession)
      .sort((a, b) => (a.session_id < b.session_id ? -1 : 1));
    expect(after).toEqual(before);
    // A line cut short after its head: an error that says which file, where, and what to run.
    const cut = lines[7]!.slice(0, 120);
    writeFileSync(join(sessions, segment!), [...lines.slice(0, 7), cut, ...lines.slice(8)].join('\n') + '\n');
    const at = lines.slice(0, 7).join('\n').length + 1;
    const [outcome] = await engine.run({ from: 'split', until: 'split', force: 'split' });
    expect(outcome!.action).toBe('failed');
    expect(outcome!.error).toMatch(
      new RegExp(`${segment}: the line at byte ${at} is not a session's JSON \\(.*\\); .*run \`prefab stage ingest\``),
    );
  });

  it('writes every session as ingest made it with its side added, whatever its id and task hold', async () => {
    const dir = tempDir();
    const odd = ['plain', 'quote"inside', 'back\\slash', 'ünï—code', '"', '\\"', 'comma","task_id":"fake'];
    const records = odd.flatMap((id, i) => [
      session(id, `task ${odd[(i + 1) % odd.length]}`, 1),
      session(`${id}-untasked`, null, 0),
    ]);
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(records));
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\nsplit:\n  test_ratio: 0.5\n').run({ until: 'split' });
    const ingested = new Map<string, Record<string, unknown>>();
    for (const f of readdirSync(join(dir, 'workspace', 'ingest', 'sessions')))
      for (const s of await collect<Record<string, unknown>>(join(dir, 'workspace', 'ingest', 'sessions', f)))
        ingested.set(s.session_id as string, s);
    let lines = 0;
    for (const line of await splitLines(dir)) {
      const s = JSON.parse(line) as SplitSession;
      expect(line).toBe(JSON.stringify(s)); // well-formed, and as JSON.stringify writes it
      const before = ingested.get(s.session_id)!;
      expect(s).toEqual({
        ...before,
        task_id: before.task_id ?? s.task_id,
        split: s.split,
        task_match: before.task_id === null ? expect.any(Object) : null,
      });
      lines++;
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

  it('matches an untasked request to the group that comparing every candidate whole finds', () => {
    // The matcher as it was first written: every group sharing a shingle held by at most `limit` groups
    // compared whole, the most alike (the first made among equals) joined when it reaches the threshold.
    const everyCandidate = (threshold: number, limit: number) => {
      const groups: { id: string; shingles: Set<string> }[] = [];
      const index = new Map<string, number[]>();
      const add = (id: string, text: string) => {
        const set = shingles(text);
        for (const s of set) index.set(s, [...(index.get(s) ?? []), groups.length]);
        groups.push({ id, shingles: set });
      };
      const assign = (text: string) => {
        const set = shingles(text);
        const candidates = new Set<number>();
        for (const s of set)
          if ((index.get(s)?.length ?? Infinity) <= limit) for (const g of index.get(s)!) candidates.add(g);
        let best: { g: number; score: number } | null = null;
        for (const g of [...candidates].sort((x, y) => x - y)) {
          const score = jaccard(set, groups[g]!.shingles);
          if (!best || score > best.score) best = { g, score };
        }
        if (best && best.score >= threshold)
          return { task_id: groups[best.g]!.id, score: best.score, kind: 'matched_task' };
        const id = `group-${sha256(text).slice(0, 12)}`;
        add(id, text);
        return { task_id: id, score: 1, kind: 'new_group' };
      };
      return { add, assign };
    };
    // Requests of a few words from a small vocabulary: most share something with many groups, a few nothing.
    // Known tasks come first, some of them with the same request.
    const words = Array.from({ length: 40 }, (_, i) => `w${i}`);
    const rand = seeded('split similarity');
    const request = () =>
      Array.from({ length: int(rand, 0, 12) }, () => pick(rand, words.slice(0, int(rand, 4, 40)))).join(' ');
    const known = Array.from({ length: 60 }, request).flatMap((text, i) =>
      i % 3 === 0 ? [text, text, `${text} ${text}`] : [text],
    );
    const texts = Array.from({ length: 1500 }, request);
    let matched = 0;
    for (const threshold of [0, 0.3, 0.5, 0.75, 1]) {
      for (const limit of [3, 40, 2000]) {
        const matcher = new TaskMatcher(threshold, limit);
        const reference = everyCandidate(threshold, limit);
        known.forEach((text, i) => [matcher, reference].forEach((m) => m.add(`task-${i}`, text)));
        const assigned = texts.map((text) => matcher.assign(text));
        expect(assigned).toEqual(texts.map((text) => reference.assign(text)));
        matched += assigned.filter((m) => m.kind === 'matched_task').length;
      }
    }
    expect(matched).toBeGreaterThan(5000);
  });
});
