import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { readJsonl } from '../../pipeline/jsonl.ts';
import { TOOLS } from '../../env/env.ts';
import { WorldCache, replaySession, sessionTask } from '../../env/replay.ts';
import type { Department, Task, World } from '../../env/world.ts';
import type { Message, Session } from '../../core/records.ts';
import type { SampledSession } from '../../stages/sample/candidate.ts';
import {
  completion,
  startChatServer,
  type ChatServer,
  type Script,
  type SeenRequest,
} from '../fixtures/chat-server.ts';
import { collect, engineFor, jsonl, manifest, session, tempDir } from '../fixtures/pipeline.ts';

const SAMPLE = join(import.meta.dirname, '../../data/sample/sessions.jsonl.gz');
const MIN_CANDIDATES = 3;
const PLAIN_TASK = 'support-plain';
const PLAIN_REPLY = 'I have cancelled your subscription; you will get a confirmation by e-mail.';
const CLOSING = 'All done: every request went through.';
const PLACEHOLDER = /^\[[A-Z][A-Z0-9_]*_\d+\]$/;

interface SimTask {
  task: Task;
  departments: Department[];
}

interface Fixture {
  world: World;
  tasks: SimTask[];
  /** The input file's records: one logged session for each simulator task, two for the plain task. */
  input: unknown[];
}

/** The first three simulator tasks of the bundled sample, one logged session each, and a plain task with two. */
async function buildFixture(): Promise<Fixture> {
  const worlds = new WorldCache();
  const tasks: SimTask[] = [];
  const input: unknown[] = [];
  let world: World | null = null;
  for await (const s of readJsonl<Session>(SAMPLE)) {
    if (tasks.some((t) => t.task.task_id === s.task_id)) continue;
    const found = sessionTask(s, worlds);
    if ('reason' in found) throw new Error(`sample session ${s.session_id}: ${found.reason}`);
    world = found.world;
    const company = world.companies.find((c) => c.name === found.task.company)!;
    tasks.push({
      task: found.task,
      departments: found.task.calls.map((c) => company.departments.find((d) => d.name === c.department)!),
    });
    input.push(s);
    if (tasks.length === 3) break;
  }
  input.push(session('plain-1', PLAIN_TASK, 1, 'Cancelled.'), session('plain-2', PLAIN_TASK, 0, 'I cannot do that.'));
  return { world: world!, tasks, input };
}

/** Requests one rollout of a task sends: search, form, one call per department, finish, closing line. */
const rolloutRequests = (t: SimTask) => t.departments.length + 4;
/** Every request a full sampling run sends: two rollouts per simulator task, one reply for the plain task. */
const fullRunRequests = (f: Fixture) => f.tasks.reduce((n, t) => n + (MIN_CANDIDATES - 1) * rolloutRequests(t), 0) + 1;

/**
 * A competent policy over HTTP. It sees only what the endpoint sent, so every personal value it passes on
 * is copied from the masked tool results: placeholders that the sampler must put back.
 */
function competentPolicy(fixture: Fixture, dialled: string[]): Script {
  const byRequest = new Map(fixture.tasks.map((t) => [t.task.request, t]));
  return (request: SeenRequest) => {
    const messages = request.body.messages as Message[];
    if (!request.body.tools) return { json: completion(PLAIN_REPLY, { model: 'test-policy' }) };
    const user = messages.find((m) => m.role === 'user')!.content!;
    const sim = byRequest.get(user);
    if (!sim) return { status: 400, json: { error: { message: `no task asks: ${user}` } } };
    const { task, departments } = sim;
    const turn = messages.filter((m) => m.role === 'assistant').length;
    const results = messages.filter((m) => m.role === 'tool').map((m) => m.content ?? '');
    const act = (name: string, args: unknown) => ({
      json: completion(null, {
        model: 'test-policy',
        tool_calls: [{ id: `call_${turn + 1}`, type: 'function', function: { name, arguments: JSON.stringify(args) } }],
      }),
    });

    if (turn === 0) return act('search_directory', { company: task.company });
    if (turn === 1) return act('auth_info_form', { fields: [...new Set(departments.flatMap((d) => d.requires))] });
    const i = turn - 2;
    if (i < departments.length) {
      const directory = JSON.parse(results[0]!) as { departments: { name: string; phone: string }[] };
      const form = JSON.parse(results[1]!) as Record<string, string>;
      const department = departments[i]!;
      const phone = directory.departments.find((d) => d.name === department.name)!.phone;
      dialled.push(phone);
      let ask = task.calls[i]!.request;
      if (department.needsReferenceFrom) {
        const prior = departments.findIndex((d) => d.type === department.needsReferenceFrom);
        const reference = /REF-\d+/.exec(results[2 + prior] ?? '')?.[0];
        if (reference) ask += ` My reference number is ${reference}.`;
      }
      return act('call', {
        phone_number: phone,
        auth: Object.fromEntries(department.requires.map((f) => [f, form[f]])),
        request: ask,
      });
    }
    if (i === departments.length) return act('finish', {});
    return { json: completion(CLOSING, { model: 'test-policy' }) };
  };
}

function configYaml(server: ChatServer, extra = ''): string {
  return [
    'ingest:',
    '  inputs: [logs.jsonl]',
    'split:',
    '  test_ratio: 0',
    'sample:',
    '  enabled: true',
    `  min_candidates: ${MIN_CANDIDATES}`,
    '  endpoint:',
    `    base_url: ${server.url}`,
    '    model: test-policy',
    '    backoff_ms: 10',
    extra,
  ].join('\n');
}

function sampleFiles(dir: string): Record<string, string> {
  const sessions = join(dir, 'workspace', 'sample', 'sessions');
  return Object.fromEntries(
    readdirSync(sessions)
      .sort()
      .map((f) => [f, readFileSync(join(sessions, f), 'utf8')]),
  );
}

async function candidates(dir: string): Promise<SampledSession[]> {
  const out: SampledSession[] = [];
  for (const file of Object.keys(sampleFiles(dir)))
    out.push(...(await collect<SampledSession>(join(dir, 'workspace', 'sample', 'sessions', file))));
  return out;
}

/** A candidate that ran to its end: a closing text, the finish tool's result, or a plain reply. */
function isComplete(c: SampledSession): boolean {
  const last = c.messages.at(-1)!;
  if (last.role === 'assistant') return !last.tool_calls?.length && !!last.content;
  return last.role === 'tool' && last.content!.startsWith('Task ended');
}

/** Every string under one of `keys` in the JSON of a request's message contents and tool-call arguments. */
function valuesUnder(request: SeenRequest, keys: ReadonlySet<string>): string[] {
  const found: string[] = [];
  const walk = (v: unknown, key: string | null): void => {
    if (Array.isArray(v)) v.forEach((x) => walk(x, key));
    else if (v !== null && typeof v === 'object') for (const [k, x] of Object.entries(v)) walk(x, k);
    else if (key !== null && keys.has(key)) found.push(String(v));
  };
  const parse = (text: string | null | undefined) => {
    try {
      walk(JSON.parse(text ?? ''), null);
    } catch {
      // plain text: the detectors' business, checked on the raw body
    }
  };
  for (const m of request.body.messages as Message[]) {
    parse(m.content);
    for (const c of m.tool_calls ?? []) parse(c.function.arguments);
  }
  return found;
}

const seedOf = (r: SeenRequest) => r.body.seed as number | undefined;
const userText = (r: SeenRequest) => (r.body.messages as Message[]).find((m) => m.role === 'user')!.content!;

describe('sample', () => {
  let fixture: Fixture;
  let server: ChatServer;
  const dialled: string[] = [];
  let dir: string;
  let firstRun: Record<string, string>;

  beforeAll(async () => {
    // A local base_url needs no key; the model comes from the config alone.
    vi.stubEnv('OPENAI_API_KEY', undefined);
    vi.stubEnv('OPENAI_BASE_URL', undefined);
    vi.stubEnv('PREFAB_SAMPLE_MODEL', undefined);
    fixture = await buildFixture();
    server = await startChatServer(competentPolicy(fixture, dialled));
    dir = tempDir();
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(fixture.input));
    const outcomes = await engineFor(dir, configYaml(server)).run({ until: 'sample' });
    expect(outcomes.map((o) => [o.stage, o.action, o.error])).toEqual([
      ['ingest', 'ran', undefined],
      ['import', 'ran', undefined],
      ['split', 'ran', undefined],
      ['sample', 'ran', undefined],
    ]);
    firstRun = sampleFiles(dir);
  });

  afterAll(async () => {
    await server?.close();
    vi.unstubAllEnvs();
  });

  it('tops each simulator task up to min_candidates with rollouts that replay cleanly after the placeholders are put back', async () => {
    expect(fixture.tasks.some((t) => t.departments.some((d) => d.needsReferenceFrom))).toBe(true); // a reference is passed on
    const all = await candidates(dir);
    for (const { task, departments } of fixture.tasks) {
      const logged = fixture.input.find((s) => (s as Session).task_id === task.task_id) as Session;
      const mine = all.filter((c) => c.task_id === task.task_id);
      expect(mine.map((c) => c.session_id)).toEqual([1, 2].map((i) => `sample:test-policy:${task.task_id}:${i}`));
      for (const c of mine) {
        expect(c.messages.slice(0, 2)).toEqual(logged.messages.slice(0, 2)); // the logged sessions' prompt, so best-of-N compares like with like
        const replay = replaySession(c as Session);
        expect(replay.problems).toEqual([]);
        expect(replay.ok).toBe(true);
        expect(c.reward).toBe(1);
        expect(c.feedback).toBeNull();
        expect(JSON.parse(c.metadata)).toMatchObject({
          success: true,
          sampled: { model: 'test-policy', temperature: 0.7 },
        });
        // The environment got the real values: every call was done, with the number the directory listed.
        const calls = c.messages.flatMap((m) => m.tool_calls ?? []).filter((t) => t.function.name === 'call');
        expect(calls.map((t) => (JSON.parse(t.function.arguments) as { phone_number: string }).phone_number)).toEqual(
          departments.map((d) => d.phone),
        );
        const callResults = c.messages.filter((m) => m.role === 'tool' && / here\. /.test(m.content ?? ''));
        expect(callResults).toHaveLength(departments.length);
        for (const r of callResults) expect(r.content).toMatch(/that's done/);
        expect(c.messages.at(-1)).toEqual({ role: 'assistant', content: CLOSING });
      }
    }
    // What the server dialled were placeholders, never the numbers themselves.
    expect(dialled.length).toBeGreaterThan(0);
    for (const phone of dialled) expect(phone).toMatch(/^\[PHONE_\d+\]$/);
  });

  it('gives a task without a simulator world one sampled reply with no reward', async () => {
    const plain = (await candidates(dir)).filter((c) => c.task_id === PLAIN_TASK);
    expect(plain).toHaveLength(1);
    expect(plain[0]!.session_id).toBe(`sample:test-policy:${PLAIN_TASK}:2`);
    expect(plain[0]!.reward).toBeNull();
    expect(plain[0]!.messages.at(-1)).toEqual({ role: 'assistant', content: PLAIN_REPLY });
    expect(plain[0]!.messages.slice(0, -1).map((m) => m.role)).toEqual(['system', 'user']);
    expect(manifest(dir, 'sample').counts).toMatchObject({
      tasks_sampled: 4,
      sampled: 7,
      rollouts: 6,
      replies: 1,
      failed: 0,
      over_budget: 0,
    });
    expect(server.requests).toHaveLength(fullRunRequests(fixture));
  });

  it('never sends a profile value or a department phone number in the clear', () => {
    const masked = new Set(['email', 'date_of_birth', 'account_number', 'last_4_ssn', 'pin', 'phone_number', 'phone']);
    let seen = 0;
    for (const request of server.requests) {
      const keyed = valuesUnder(request, masked);
      seen += keyed.length;
      for (const value of keyed) expect(value).toMatch(PLACEHOLDER);
      for (const { task, departments } of fixture.tasks) {
        const v = task.profile.values;
        for (const clear of [
          v.email,
          v.date_of_birth,
          v.account_number,
          v.phone_number,
          ...departments.map((d) => d.phone),
        ])
          expect(request.raw).not.toContain(clear);
        for (const secret of [v.pin, v.last_4_ssn]) expect(keyed).not.toContain(secret);
      }
    }
    expect(seen).toBeGreaterThan(0); // the masked fields did travel, as placeholders
  });

  it('samples at temperature 0.7 with the candidate index as seed, and sends the tools for simulator tasks', () => {
    for (const r of server.requests) expect(r.body.temperature).toBe(0.7);
    const plain = server.requests.filter((r) => !r.body.tools);
    expect(plain.map(seedOf)).toEqual([2]);
    for (const { task, departments } of fixture.tasks) {
      const mine = server.requests.filter((r) => userText(r) === task.request);
      for (const r of mine) expect(r.body.tools).toEqual(JSON.parse(JSON.stringify(TOOLS)));
      for (const seed of [1, 2]) expect(mine.filter((r) => seedOf(r) === seed)).toHaveLength(departments.length + 4);
    }
  });

  it('sends nothing on a forced rerun and writes the same bytes', async () => {
    const before = server.requests.length;
    const outcomes = await engineFor(dir, configYaml(server)).run({ force: 'sample' });
    expect(outcomes.map((o) => [o.stage, o.action])).toEqual([['sample', 'ran']]);
    expect(server.requests).toHaveLength(before);
    expect(sampleFiles(dir)).toEqual(firstRun);
    expect(manifest(dir, 'sample').counts).toMatchObject({ requests: 0, cached: fullRunRequests(fixture), sampled: 7 });
  });

  it('leaves out a candidate the request budget cannot finish, and writes the others whole', async () => {
    const budgetDir = tempDir();
    const budgetServer = await startChatServer(competentPolicy(fixture, []));
    try {
      // One request short of a full run: exactly one candidate is left without its last answer.
      const budget = fullRunRequests(fixture) - 1;
      writeFileSync(join(budgetDir, 'logs.jsonl'), jsonl(fixture.input));
      const outcomes = await engineFor(budgetDir, configYaml(budgetServer, `    max_requests: ${budget}`)).run({
        until: 'sample',
      });
      expect(outcomes.at(-1)).toMatchObject({ stage: 'sample', action: 'ran' });
      expect(budgetServer.requests).toHaveLength(budget);
      const written = await candidates(budgetDir);
      expect(written).toHaveLength(6);
      for (const c of written) expect(isComplete(c)).toBe(true);
      for (const c of written.filter((c) => c.reward !== null)) expect(replaySession(c as Session).ok).toBe(true);
      expect(manifest(budgetDir, 'sample').counts).toMatchObject({ sampled: 6, over_budget: 1, failed: 0 });
    } finally {
      await budgetServer.close();
    }
  });
});
