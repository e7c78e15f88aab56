// `prefab serve` as a real process on 127.0.0.1: OpenAI-shaped answers with tool calls and SSE, the A/B split
// sticky per conversation, every malformed, oversized and unauthorised request answered by the right error,
// 50 concurrent clients each answered or cleanly refused with 429, SIGHUP (as SIGTERM) letting a request in
// flight finish, and no server opened without a key by accident.
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync, readdirSync } from 'node:fs';
import { connect } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Registry } from '../../loop/registry.ts';
import { Logger } from '../../pipeline/log.ts';
import { CONSTRAINT_BYTES, loadCatalog } from '../../loop/serve/batcher.ts';
import { armOf, atLeast, conversationKey } from '../../loop/serve/protocol.ts';
import { SERVE_DEFAULTS, parseSplit, serveApiKey } from '../../loop/settings.ts';
import { TOOLS } from '../../env/env.ts';
import { deviceOn, openDevice } from '../../runtime/device.ts';
import type { Session } from '../../core/records.ts';
import { prefab, prefabAsync } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { servedModelFolder } from '../fixtures/served-model.ts';

const KEY = 'test-key';
let workdir: string;
let server: ChildProcessWithoutNullStreams;
let url: string;
let stderr = '';

/** Starts `prefab serve` and resolves with its URL once it listens. */
async function serve(args: string[]): Promise<{ child: ChildProcessWithoutNullStreams; url: string }> {
  const child = prefabAsync(['--workdir', workdir, 'serve', '--port', '0', ...args]) as ChildProcessWithoutNullStreams;
  const started = new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /at (http:\/\/\S+\/v1)/.exec(out);
      if (m) resolve(m[1]!);
    });
    child.on('exit', (code) => reject(new Error(`prefab serve exited ${code}: ${stderr}`)));
  });
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return { child, url: await started };
}

const auth = { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' };
const post = (body: unknown, headers: Record<string, string> = auth) =>
  fetch(`${url}/chat/completions`, {
    method: 'POST',
    headers,
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });

const conversation = (who: string) => [
  { role: 'system', content: 'You are a customer-service agent. Use the tools.' },
  { role: 'user', content: `Hi, I am ${who}. Please update my phone number with Acme Billing.` },
];

beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
  workdir = join(tempDir(), 'workspace');
  const registry = new Registry(join(workdir, 'registry'));
  registry.register(await servedModelFolder(tempDir(), 'first', 1024), {
    source: { stage: 'dpo' },
    config: {},
    eval: null,
  });
  registry.register(await servedModelFolder(tempDir(), 'second', 1024), {
    source: { stage: 'refresh' },
    config: {},
    eval: null,
  });
  process.env.PREFAB_SERVE_API_KEY = KEY;
  const started = await serve([
    '--split',
    'production=0.5,candidate=0.5',
    '--max-batch',
    '8',
    '--max-queue',
    '8',
    '--max-tokens',
    '48',
    '--max-body-bytes',
    '200000',
    '--follow-ms',
    '100',
  ]);
  delete process.env.PREFAB_SERVE_API_KEY;
  server = started.child;
  url = started.url;
});

afterAll(() => {
  server?.kill('SIGKILL');
});

describe('prefab serve', () => {
  it('lists its versions and answers a chat completion in OpenAI’s shape, saying which version answered', async () => {
    const models = (await (await fetch(`${url}/models`, { headers: auth })).json()) as {
      data: { id: string; version: string }[];
    };
    expect(models.data.map((m) => m.id).sort()).toEqual(['candidate', 'production', 'v0001', 'v0002']);
    const r = await post({
      model: 'v0001',
      messages: conversation('Ana'),
      tools: TOOLS,
      max_tokens: 32,
      temperature: 1,
      seed: 7,
    });
    expect(r.status).toBe(200);
    expect(r.headers.get('x-prefab-version')).toBe('v0001');
    const body = (await r.json()) as {
      object: string;
      model: string;
      choices: { message: { role: string; content: string | null; tool_calls?: unknown[] }; finish_reason: string }[];
      usage: { completion_tokens: number; prompt_tokens: number };
    };
    expect(body).toMatchObject({ object: 'chat.completion', model: 'v0001' });
    expect(body.choices[0]!.message.role).toBe('assistant');
    expect(['stop', 'length', 'tool_calls']).toContain(body.choices[0]!.finish_reason);
    expect(body.usage.completion_tokens).toBeGreaterThan(0);
    expect(body.usage.completion_tokens).toBeLessThanOrEqual(32);
    expect(body.usage.prompt_tokens).toBeGreaterThan(10);
    // ignore_eos (vLLM's benchmark extension): exactly max_tokens, whatever the model would end with.
    const long = (await (
      await post({ model: 'v0001', messages: conversation('Ana'), max_tokens: 20, ignore_eos: true })
    ).json()) as typeof body;
    expect(long.usage.completion_tokens).toBe(20);
    expect(long.choices[0]!.finish_reason).toBe('length');
    // min_tokens (vLLM's): the end token is not drawn before it; more than the reply may have is refused.
    const least = (await (
      await post({ model: 'v0001', messages: conversation('Ana'), max_tokens: 12, min_tokens: 12, temperature: 1 })
    ).json()) as typeof body;
    expect(least.usage.completion_tokens).toBe(12);
    const over = await post({ model: 'v0001', messages: conversation('Ana'), max_tokens: 8, min_tokens: 9 });
    expect(over.status).toBe(400);
    expect(((await over.json()) as { error: { param: string } }).error.param).toBe('min_tokens');
  });

  it('keeps the end token back until min_tokens, and leaves the rest to the tool constraint', () => {
    const inner = { allows: (_: readonly number[], c: number) => c !== 4 };
    const gate = atLeast(3, [9], inner)!;
    expect([9, 5, 4].map((c) => gate.allows([1, 2], c))).toEqual([false, true, false]);
    expect([9, 5, 4].map((c) => gate.allows([1, 2, 3], c))).toEqual([true, true, false]);
    expect(atLeast(3, [9])!.allows([1, 2], 9)).toBe(false);
    expect(atLeast(0, [9], inner)).toBe(inner);
    expect(atLeast(3, [], inner)).toBe(inner); // ignore_eos: nothing to hold back
  });

  it('sends a conversation to one arm of the split on every turn, and shares conversations between the arms', async () => {
    const arms = parseSplit('production=0.5,candidate=0.5');
    const versionOf = { production: 'v0001', candidate: 'v0002' } as Record<string, string>;
    const seen = new Set<string>();
    for (const who of ['Ana', 'Bo', 'Cy', 'Di', 'Ed', 'Flo']) {
      const first = await post({ model: 'production', messages: conversation(who), max_tokens: 8 });
      const expected = versionOf[armOf(conversationKey(conversation(who) as never), arms).name]!;
      expect(first.headers.get('x-prefab-version')).toBe(expected);
      const reply = ((await first.json()) as { choices: { message: unknown }[] }).choices[0]!.message;
      const next = await post({
        model: 'production',
        messages: [...conversation(who), reply, { role: 'user', content: 'Any news?' }],
        max_tokens: 8,
      });
      expect(next.headers.get('x-prefab-version')).toBe(expected);
      await next.json();
      seen.add(expected);
    }
    expect([...seen].sort()).toEqual(['v0001', 'v0002']);
    expect(() => parseSplit('production=0.8,candidate=0.1')).toThrow(/add up to 0.9/);
  });

  it('does what tool_choice says (text only without tools or with none, a call first when required, the named tool) and ends at a stop string', async () => {
    type Body = {
      choices: {
        message: { content: string | null; tool_calls?: { function: { name: string; arguments: string } }[] };
        finish_reason: string;
      }[];
    };
    const ask = async (extra: Record<string, unknown>, seed: number) => {
      const r = await post({
        model: 'v0001',
        messages: conversation(`seed ${seed}`),
        max_tokens: 40,
        temperature: 1,
        seed,
        ...extra,
      });
      expect(r.status).toBe(200);
      return ((await r.json()) as Body).choices[0]!;
    };
    const seeds = [1, 2, 3, 4, 5, 6];
    const free = await Promise.all(seeds.map((seed) => ask({ tools: TOOLS }, seed)));
    // The untrained model calls tools on its own: what follows is the choice's doing, not the model's.
    expect(free.some((c) => c.message.tool_calls?.length)).toBe(true);
    for (const extra of [{}, { tools: TOOLS, tool_choice: 'none' }]) {
      for (const c of await Promise.all(seeds.map((seed) => ask(extra, seed)))) {
        expect(c.message.tool_calls, JSON.stringify(extra)).toBeUndefined();
        expect(typeof c.message.content).toBe('string');
        expect(['stop', 'length']).toContain(c.finish_reason);
      }
    }
    const names = TOOLS.map((t) => t.function.name);
    for (const c of await Promise.all(
      seeds.map((seed) => ask({ tools: TOOLS, tool_choice: 'required', max_tokens: 48 }, seed)),
    )) {
      expect(c.message.content ?? '').toBe('');
      if (c.finish_reason === 'length') continue; // a call cut by max_tokens
      expect(names).toContain(c.message.tool_calls![0]!.function.name);
    }
    const one = names.at(-1)!;
    const named = { tools: TOOLS, tool_choice: { type: 'function', function: { name: one } }, max_tokens: 48 };
    const calls = (await Promise.all(seeds.map((seed) => ask(named, seed)))).flatMap((c) => c.message.tool_calls ?? []);
    expect(calls.length).toBeGreaterThan(0);
    expect(calls.every((call) => call.function.name === one)).toBe(true);
    for (const bad of [
      { tool_choice: 'required' },
      { tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } },
    ]) {
      const r = await post({ model: 'v0001', messages: conversation('bad'), ...bad });
      expect(r.status).toBe(400);
      expect(((await r.json()) as { error: { param: string } }).error.param).toBe('tool_choice');
    }
    // stop: the same draw, ended before the first stop string, which is not returned; streamed alike.
    const stop = ['e', 'a'];
    for (const seed of seeds) {
      const whole = await ask({ tool_choice: 'none' }, seed);
      const cut = await ask({ tool_choice: 'none', stop }, seed);
      const at = Math.min(...stop.map((x) => whole.message.content!.indexOf(x)).filter((i) => i >= 0));
      if (!Number.isFinite(at)) continue;
      expect(cut.message.content).toBe(whole.message.content!.slice(0, at));
      expect(cut.finish_reason).toBe('stop');
      const streamed = await (
        await post({
          model: 'v0001',
          messages: conversation(`seed ${seed}`),
          max_tokens: 40,
          temperature: 1,
          seed,
          tool_choice: 'none',
          stop,
          stream: true,
        })
      ).text();
      const text = streamed
        .split('\n\n')
        .filter((e) => e.startsWith('data: {'))
        .map(
          (e) =>
            (JSON.parse(e.slice(6)) as { choices: { delta: { content?: string } }[] }).choices[0]!.delta.content ?? '',
        )
        .join('');
      expect(text).toBe(cut.message.content);
    }
  });

  it('streams a reply as server-sent events ending in [DONE]', async () => {
    const r = await post({ model: 'candidate', messages: conversation('Gus'), max_tokens: 24, stream: true });
    expect(r.status).toBe(200);
    expect(r.headers.get('content-type')).toMatch(/text\/event-stream/);
    const events = (await r.text())
      .split('\n\n')
      .filter(Boolean)
      .map((e) => e.replace(/^data: /, ''));
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1).map(
      (e) =>
        JSON.parse(e) as {
          model: string;
          choices: { delta: { role?: string; content?: string }; finish_reason: string | null }[];
        },
    );
    expect(chunks[0]!.choices[0]!.delta.role).toBe('assistant');
    expect(chunks.every((c) => c.model === 'v0002')).toBe(true);
    expect(['stop', 'length', 'tool_calls']).toContain(chunks.at(-1)!.choices[0]!.finish_reason);
    expect(chunks.slice(0, -1).every((c) => c.choices[0]!.finish_reason === null)).toBe(true);
    // A client that goes away mid-stream costs the server nothing but its request.
    const abort = new AbortController();
    const gone = await fetch(`${url}/chat/completions`, {
      method: 'POST',
      headers: auth,
      body: JSON.stringify({
        model: 'candidate',
        messages: conversation('Hal'),
        max_tokens: 48,
        ignore_eos: true,
        stream: true,
      }),
      signal: abort.signal,
    });
    await gone.body!.getReader().read();
    abort.abort();
    expect((await post({ model: 'candidate', messages: conversation('Ivy'), max_tokens: 4 })).status).toBe(200);
  });

  it('answers malformed, oversized, unauthorised and unknown requests with OpenAI-shaped errors, and stays up', async () => {
    const error = async (r: Response) => ({
      status: r.status,
      ...((await r.json()) as { error: { type: string; code: string; param: string | null; message: string } }).error,
    });
    expect(await error(await post('{"model": "production", "messages": ['))).toMatchObject({
      status: 400,
      code: 'invalid_json',
      type: 'invalid_request_error',
    });
    expect(await error(await post({ model: 'production' }))).toMatchObject({ status: 400, param: 'messages' });
    expect(await error(await post({ model: 'production', messages: [{ role: 'robot', content: 'x' }] }))).toMatchObject(
      { status: 400, param: 'messages.0.role' },
    );
    expect(await error(await post({ model: 'production', messages: conversation('H'), n: 3 }))).toMatchObject({
      status: 400,
      param: 'n',
    });
    expect(
      await error(await post({ model: 'production', messages: conversation('H'), max_tokens: 4096 })),
    ).toMatchObject({ status: 400, param: 'max_tokens' });
    expect(await error(await post({ model: 'gpt-9', messages: conversation('H') }))).toMatchObject({
      status: 404,
      code: 'model_not_found',
      param: 'model',
    });
    expect(
      await error(
        await post({ model: 'production', messages: conversation('H') }, { 'content-type': 'application/json' }),
      ),
    ).toMatchObject({ status: 401, code: 'invalid_api_key' });
    expect(
      await error(
        await post({ model: 'production', messages: conversation('H') }, { ...auth, authorization: 'Bearer wrong' }),
      ),
    ).toMatchObject({ status: 401 });
    expect(
      await error(await post({ model: 'production', messages: [{ role: 'user', content: 'x'.repeat(300_000) }] })),
    ).toMatchObject({ status: 413, code: 'request_too_large' });
    const long = 'please '.repeat(4000);
    expect(await error(await post({ model: 'production', messages: [{ role: 'user', content: long }] }))).toMatchObject(
      { status: 413, code: 'context_length_exceeded' },
    );
    expect(await error(await fetch(`${url}/completions`, { method: 'POST', headers: auth, body: '{}' }))).toMatchObject(
      { status: 404, code: 'not_found' },
    );
    // Tool parameters nested 90,000 deep (within the body's limit): a clean 400, not a stack overflow.
    const deep = JSON.stringify({
      model: 'production',
      messages: conversation('H'),
      tools: [{ type: 'function', function: { name: 'f', parameters: { a: 0 } } }],
    }).replace('{"a":0}', `{"a":${'['.repeat(90_000)}${']'.repeat(90_000)}}`);
    expect(await error(await post(deep))).toMatchObject({ status: 400, code: 'invalid_request' });
    // A request target that is not a path: the key is checked first, then a 400.
    const raw = async (headers: string) => {
      const socket = connect(Number(new URL(url).port), '127.0.0.1');
      socket.end(`GET http://[ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n${headers}\r\n`);
      let text = '';
      for await (const chunk of socket) text += String(chunk);
      return Number(text.split(' ')[1]);
    };
    expect(await raw('')).toBe(401);
    expect(await raw(`Authorization: Bearer ${KEY}\r\n`)).toBe(400);
    expect((await fetch(url.replace('/v1', '/health'))).status).toBe(200);
  });

  it('answers 50 concurrent clients: each gets a completion or a clean 429', async () => {
    const replies = await Promise.all(
      Array.from({ length: 50 }, (_, i) =>
        post({ model: 'v0001', messages: conversation(`client ${i}`), max_tokens: 16, temperature: 1 }),
      ),
    );
    const statuses = await Promise.all(
      replies.map(async (r) => {
        const body = (await r.json()) as { choices?: unknown[]; error?: { code: string } };
        if (r.status === 200) expect(body.choices).toHaveLength(1);
        else expect(body.error?.code).toBe('rate_limit_exceeded');
        if (r.status === 429) expect(r.headers.get('retry-after')).toBe('1');
        return r.status;
      }),
    );
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThanOrEqual(16); // 8 decoding + 8 queued at the least
    expect(statuses.every((s) => s === 200 || s === 429)).toBe(true);
    expect((await post({ model: 'v0001', messages: conversation('after'), max_tokens: 4 })).status).toBe(200);
  });

  it('collects sessions from the served model: `prefab simulate --agent URL` writes them tagged with the version that acted', () => {
    const out = join(tempDir(), 'inbox', 'day-1.jsonl');
    process.env.PREFAB_SERVE_API_KEY = KEY;
    const r = prefab([
      'simulate',
      '--agent',
      url,
      '--model',
      'production',
      '--tasks',
      '3',
      '--trials',
      '2',
      '--max-tokens',
      '24',
      '--max-turns',
      '3',
      '--concurrency',
      '4',
      '--date',
      '2026-03-02',
      '--out',
      out,
      '--stats',
    ]);
    delete process.env.PREFAB_SERVE_API_KEY;
    expect(r.code, r.stderr).toBe(0);
    const sessions = readFileSync(out, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Session);
    expect(sessions.map((s) => `${s.task_id}/${JSON.parse(s.metadata).trial}`)).toEqual([
      'cs-1-train-00000/0',
      'cs-1-train-00000/1',
      'cs-1-train-00001/0',
      'cs-1-train-00001/1',
      'cs-1-train-00002/0',
      'cs-1-train-00002/1',
    ]);
    for (const s of sessions) {
      expect(['v0001', 'v0002']).toContain(s.model);
      expect(s.session_id).toBe(`${s.task_id}:${s.model}:${JSON.parse(s.metadata).trial}`);
      expect(s.created_at!.startsWith('2026-03-02T')).toBe(true);
      expect(s.messages.filter((m) => m.role === 'assistant').length).toBeGreaterThan(0);
    }
    expect(r.stdout).toMatch(/^v000[12] +\d/m); // the stats, by the version that acted
    // Without the key: a clear 401 and no stack, and no --out file (nor a part of one) for a night to ingest.
    const inbox = tempDir();
    const refused = prefab([
      'simulate',
      '--agent',
      url,
      '--tasks',
      '1',
      '--trials',
      '1',
      '--out',
      join(inbox, 'x.jsonl'),
    ]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(
      /the agent at http:\/\/127\.0\.0\.1:\d+\/v1 \(model production\) failed: 401 .*\(is its API key in --api-key-env's variable\?\)/,
    );
    expect(refused.stderr).not.toMatch(/^\s+at /m);
    expect(readdirSync(inbox)).toEqual([]);
  });

  it('follows a promotion made while it serves: production moves to the promoted version', async () => {
    new Registry(join(workdir, 'registry')).promote('v0002', 'promoted while serving');
    const answeredBy = async () =>
      (await post({ model: 'production', messages: conversation('Ana'), max_tokens: 2 })).headers.get(
        'x-prefab-version',
      );
    const deadline = Date.now() + 10_000;
    while ((await answeredBy()) !== 'v0002' && Date.now() < deadline)
      await new Promise((resolve) => setTimeout(resolve, 100));
    for (const who of ['Ana', 'Bo', 'Cy', 'Di'])
      expect(
        (await post({ model: 'production', messages: conversation(who), max_tokens: 2 })).headers.get(
          'x-prefab-version',
        ),
      ).toBe('v0002');
    expect(stderr).toMatch(/now serving production: v0001 → v0002/);
  });

  it('forgets the constraints of the least recently used tool lists past a bound, however many lists clients send', async () => {
    const registry = new Registry(join(workdir, 'registry'));
    const settings = {
      ...SERVE_DEFAULTS,
      apiKey: null,
      split: null,
      device: deviceOn({ kind: 'reference' }),
      log: new Logger('json', process.stderr, {}, true),
    };
    const model = loadCatalog(registry, ['production'], settings).get('production')!;
    const described = (i: number) =>
      TOOLS.map((t) => ({ ...t, function: { ...t.function, description: `${i} ${'long words '.repeat(1500)}` } }));
    const kept = model.constraint(described(0));
    let most = 0;
    for (let i = 1; i <= 3000; i++) {
      await model.constraint(described(i));
      if (i % 50 === 0) expect(model.constraint(described(0)), 'a list in use stays').toBe(kept);
      most = Math.max(most, model.heldConstraints.bytes);
    }
    // 3,000 lists of some 66 KB each: only what fits the bound is held.
    expect(most).toBeLessThanOrEqual(CONSTRAINT_BYTES);
    expect(model.heldConstraints.lists).toBeLessThan(300);
  });

  it('refuses to open without a key by accident: an empty PREFAB_SERVE_API_KEY, or another address than 127.0.0.1 without --no-auth', () => {
    const empty = prefab(['--workdir', workdir, 'serve', '--port', '0'], undefined, { PREFAB_SERVE_API_KEY: ' ' });
    expect(empty.code).toBe(2);
    expect(empty.stderr).toMatch(/PREFAB_SERVE_API_KEY is set but empty/);
    const open = prefab(['--workdir', workdir, 'serve', '--port', '0', '--host', '0.0.0.0']);
    expect(open.code).toBe(2);
    expect(open.stderr).toMatch(/serving on 0\.0\.0\.0 without a key: set PREFAB_SERVE_API_KEY, or pass --no-auth/);
    expect(serveApiKey(undefined, { host: '127.0.0.1', noAuth: false })).toBeNull();
    expect(serveApiKey(undefined, { host: '0.0.0.0', noAuth: true })).toBeNull();
    expect(serveApiKey('k', { host: '0.0.0.0', noAuth: false })).toBe('k');
    expect(() => serveApiKey('k', { host: '127.0.0.1', noAuth: true })).toThrow(/contradict/);
  });

  it('finishes the request in flight on SIGHUP (a closed terminal) as on SIGTERM, then exits 0', async () => {
    const inFlight = post({ model: 'v0001', messages: conversation('last'), max_tokens: 48, temperature: 1, seed: 1 });
    await new Promise((resolve) => setTimeout(resolve, 50));
    server.kill('SIGHUP');
    const r = await inFlight;
    expect(r.status).toBe(200);
    expect(((await r.json()) as { choices: unknown[] }).choices).toHaveLength(1);
    const [code] = await once(server, 'exit');
    expect(code, stderr).toBe(0);
    await expect(fetch(`${url}/models`, { headers: auth })).rejects.toThrow();
  });
});
