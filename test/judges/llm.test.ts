import { statSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ChatEndpoint, endpointConfig, type EndpointConfig } from '../../judges/endpoint.ts';
import { LlmJudge, loadPrompt, parseVerdict } from '../../judges/llm.ts';
import type { Comparison } from '../../core/verdict.ts';
import { PipelineError } from '../../pipeline/errors.ts';
import { Redactor } from '../../core/redact.ts';
import { completion, judgePrompt, startChatServer, type ChatServer, type Script } from '../fixtures/chat-server.ts';
import { airline, count, prose, retail } from '../fixtures/personal.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { quietLogger } from '../fixtures/toy-stages.ts';

const PROMPT = loadPrompt(join(import.meta.dirname, '../../judges/prompts/pairwise.md'));
const GOOD = 'I called Billing and disputed the duplicate charge; your reference number is REF-204816.';

function comparison(i: number, goodSide: 'a' | 'b' = 'a'): Comparison {
  const good = { id: `good-${i}`, messages: [{ role: 'assistant' as const, content: GOOD }], reward: null };
  const bad = {
    id: `bad-${i}`,
    messages: [{ role: 'assistant' as const, content: `Here is a lovely recipe for lemon cake number ${i}.` }],
    reward: null,
  };
  return {
    prompt: [
      { role: 'system', content: 'You phone companies for the user.' },
      {
        role: 'user',
        content: `Please dispute the duplicate charge on bill ${i}. My SSN is 123-45-6789, I was born on 1980-02-29.`,
      },
      {
        role: 'tool',
        content: '{"last_4_ssn":"6789","account_number":"6484-3494-092","email":"ann.lee@example.com"}',
        tool_call_id: 'c1',
      },
    ],
    a: goodSide === 'a' ? good : bad,
    b: goodSide === 'a' ? bad : good,
    task_id: `T${i}`,
    metadata: '{}',
  };
}

/** A judge that knows which response is good, P(good first) = p when good is first, plus a pull toward position A. */
function knowing(p: number, firstBias = 0): Script {
  return (req) => {
    const { first } = judgePrompt(req);
    const pFirst = Math.min(0.99, Math.max(0.01, (first.includes('reference number') ? p : 1 - p) + firstBias));
    return {
      json: completion(pFirst >= 0.5 ? 'A' : 'B', {
        top: [
          ['A', pFirst],
          ['B', 1 - pFirst],
        ],
      }),
    };
  };
}

let server: ChatServer | null = null;
afterEach(async () => {
  await server?.close();
  server = null;
});

async function judgeWith(
  script: Script,
  options: { config?: Partial<EndpointConfig>; logprobs?: boolean; samples?: number; cacheDir?: string } = {},
) {
  server ??= await startChatServer(script);
  const config = endpointConfig.parse({ base_url: server.url, model: 'test-judge', backoff_ms: 10, ...options.config });
  const endpoint = await ChatEndpoint.open(
    {
      config,
      cachePath: join(options.cacheDir ?? tempDir(), 'llm.jsonl'),
      redaction: () => new Redactor(),
      log: quietLogger(),
      env: {},
    },
    'judge.llm',
    'PREFAB_JUDGE_MODEL',
  );
  const judge = new LlmJudge({
    endpoint,
    prompt: PROMPT,
    logprobs: options.logprobs ?? true,
    topLogprobs: 5,
    samples: options.samples ?? 1,
    voteTemperature: 0.7,
    maxTokens: 4,
  });
  return { judge, endpoint, server };
}

describe('llm judge', () => {
  it('abstains on every comparison when the judge always prefers the first position', async () => {
    const { judge, server } = await judgeWith(() => ({ json: completion('A') }), { logprobs: false });
    const results = await Promise.all([0, 1, 2, 3].map((i) => judge.judge(comparison(i, i % 2 ? 'a' : 'b'))));
    for (const r of results) {
      expect(r.verdict.winner).toBe('abstain');
      expect(r.stats.flipped).toBe(true);
    }
    expect(server.requests).toHaveLength(8); // both orders of each comparison, nothing more
  });

  it('reads p from the verdict token logprobs and averages the two orders', async () => {
    const { judge } = await judgeWith(knowing(0.9));
    const onA = await judge.judge(comparison(0, 'a'));
    expect(onA.verdict.winner).toBe('a');
    expect(onA.verdict.confidence).toBeCloseTo(0.8, 6);
    const onB = await judge.judge(comparison(1, 'b'));
    expect(onB.verdict.winner).toBe('b');
    expect(onB.verdict.confidence).toBeCloseTo(0.8, 6);
  });

  it('cancels a pull toward the first position by averaging over both orders', async () => {
    // Shown first, the good side gets 0.7 + 0.1; shown second, 0.7 - 0.1. The mean is the unbiased 0.7.
    const { judge } = await judgeWith(knowing(0.7, 0.1));
    const r = await judge.judge(comparison(0, 'b'));
    expect(r.verdict.winner).toBe('b');
    expect(r.verdict.confidence).toBeCloseTo(0.4, 6);
    expect(r.stats.flipped).toBe(false);
  });

  it('counts a garbage reply as a parse failure, never as a preference', async () => {
    const { judge, server } = await judgeWith(() => ({
      json: completion('Both responses have their merits, really.'),
    }));
    const r = await judge.judge(comparison(0));
    expect(r.verdict.winner).toBe('abstain');
    expect(r.stats.parse_failures).toBe(2);
    expect(server.requests).toHaveLength(2);
  });

  it('takes a log-prob above 0 or not a number for an unreadable reply, never a verdict', async () => {
    for (const bad of [1000, 'NaN']) {
      const reply = completion('A', {
        top: [
          ['A', 0.5],
          ['B', 0.5],
        ],
      }) as { choices: { logprobs: { content: { logprob: unknown; top_logprobs: { logprob: unknown }[] }[] } }[] };
      const token = reply.choices[0]!.logprobs.content[0]!;
      token.logprob = bad;
      token.top_logprobs[0]!.logprob = bad;
      const { judge } = await judgeWith(() => ({ json: reply }));
      const r = await judge.judge(comparison(0));
      expect(r.verdict.winner, String(bad)).toBe('abstain');
      expect(r.stats.parse_failures).toBe(2);
      await server?.close();
      server = null;
    }
  });

  it('reads no reply past its bound: a 9 MB answer to max_tokens 4 is a failed request, and nothing of it is cached', async () => {
    const cacheDir = tempDir();
    const huge = completion(`A ${'x'.repeat(9 << 20)}`);
    const { judge, endpoint } = await judgeWith(() => ({ json: huge }), { cacheDir, config: { attempts: 1 } });
    const r = await judge.judge(comparison(0));
    expect(r.verdict.winner).toBe('abstain');
    expect(r.stats.errors).toBe(2);
    await endpoint.close();
    expect(statSync(join(cacheDir, 'llm.jsonl'), { throwIfNoEntry: false })?.size ?? 0).toBe(0);
  });

  it('lets a pair longer than the judge’s context fail alone: that comparison abstains, the others are judged', async () => {
    const tooLong = {
      status: 400,
      json: {
        error: {
          code: 400,
          message: 'request (1136 tokens) exceeds the available context size (1024 tokens), try increasing it',
          type: 'exceed_context_size_error',
        },
      },
    };
    const { judge } = await judgeWith((req, n) =>
      JSON.stringify(req.body).includes('bill 0.') ? tooLong : knowing(0.9)(req, n),
    );
    const long = await judge.judge(comparison(0));
    expect(long.verdict.winner).toBe('abstain');
    expect(long.stats.errors).toBe(2);
    const short = await judge.judge(comparison(1));
    expect(short.verdict.winner).toBe('a');
    // An endpoint that refuses every request so stops the stage, as one failing every request with 5xx does.
    await server?.close();
    server = null;
    const refusing = await judgeWith(() => tooLong, { config: { max_consecutive_failures: 4 } });
    await expect(
      (async () => {
        for (let i = 0; i < 4; i++) await refusing.judge.judge(comparison(i));
      })(),
    ).rejects.toThrow(/failed 4 requests in a row.*exceeds the available context size/);
  });

  it('keeps no unreadable reply as an answer: a judge fixed since is asked again', async () => {
    const cacheDir = tempDir();
    const garbled = await judgeWith(() => ({ json: completion('C. Neither, both are fine.') }), { cacheDir });
    expect((await garbled.judge.judge(comparison(0))).verdict.winner).toBe('abstain');
    await garbled.endpoint.close();
    await server?.close();
    server = null;
    const fixed = await judgeWith(knowing(0.8), { cacheDir });
    const r = await fixed.judge.judge(comparison(0));
    expect(r.verdict.winner).toBe('a');
    expect(r.stats.requests).toBe(2);
    expect(fixed.server.requests).toHaveLength(2);
  });

  it('takes the majority of k samples per order when there are no logprobs', async () => {
    // Two of every three samples are right, whichever order the sides come in.
    const { judge, server } = await judgeWith(
      (req, n) => {
        const { first } = judgePrompt(req);
        const right = first.includes('reference number') ? 'A' : 'B';
        return { json: completion(n % 3 === 2 ? (right === 'A' ? 'B' : 'A') : right) };
      },
      { logprobs: false, samples: 3 },
    );
    const r = await judge.judge(comparison(0, 'a'));
    expect(server.requests).toHaveLength(6);
    expect(server.requests.every((q) => q.body.temperature === 0.7 && q.body.logprobs === undefined)).toBe(true);
    expect(r.verdict.winner).toBe('a');
    expect(r.verdict.confidence).toBeCloseTo(1 / 3, 6); // 4 of 6 votes for a: p = 2/3
  });

  it('asks at temperature 0 with logprobs on, and parses the verdict letter in its usual wrappings', async () => {
    const { judge, server } = await judgeWith(knowing(0.9));
    await judge.judge(comparison(0));
    expect(
      server.requests.every((q) => q.body.temperature === 0 && q.body.logprobs === true && q.body.top_logprobs === 5),
    ).toBe(true);
    for (const [reply, letter] of [
      ['A', 'A'],
      [' b', 'B'],
      ['**B**', 'B'],
      ['Verdict: A', 'A'],
      ['Response B is better.', 'B'],
      ['Tie', 'T'],
      ['"A"', 'A'],
    ] as const) {
      expect(parseVerdict(reply)).toBe(letter);
    }
    for (const reply of ['', 'Both are fine', 'It depends', 'Answer: maybe']) expect(parseVerdict(reply)).toBeNull();
  });

  it('retries a 429 after the Retry-After the server asks for, then uses the answer', async () => {
    const good = knowing(0.9);
    const { judge, server } = await judgeWith(
      (req, n) =>
        n === 0
          ? { status: 429, headers: { 'retry-after-ms': '300' }, json: { error: { message: 'slow down' } } }
          : good(req, n),
      {
        config: { concurrency: 1 },
      },
    );
    const started = Date.now();
    const r = await judge.judge(comparison(0));
    expect(Date.now() - started).toBeGreaterThanOrEqual(280);
    expect(r.verdict.winner).toBe('a');
    expect(r.stats).toMatchObject({ retries: 1, requests: 3, errors: 0 });
    expect(server.requests).toHaveLength(3);
  });

  it('retries a 503 and a timed-out request with backoff, then succeeds', async () => {
    const good = knowing(0.9);
    const { judge, server } = await judgeWith(
      (req, n) =>
        n === 0
          ? { status: 503, json: { error: { message: 'overloaded' } } }
          : n === 1
            ? { ...good(req, n), delayMs: 1500 }
            : good(req, n),
      { config: { concurrency: 1, timeout_s: 0.3 } },
    );
    const r = await judge.judge(comparison(0));
    expect(r.verdict.winner).toBe('a');
    expect(r.stats.retries).toBe(2);
    expect(server.requests).toHaveLength(4);
  });

  it('abstains when a slow server times out on every try, and stops the run when it keeps failing', async () => {
    const { judge, endpoint } = await judgeWith((req, n) => ({ ...knowing(0.9)(req, n), delayMs: 1000 }), {
      config: { concurrency: 1, timeout_s: 0.1, attempts: 2, max_consecutive_failures: 3 },
    });
    const first = await judge.judge(comparison(0));
    expect(first.verdict.winner).toBe('abstain');
    expect(first.stats.errors).toBe(2);
    expect(endpoint.counts.failures).toBe(2);
    await expect(judge.judge(comparison(1))).rejects.toThrow(/failed 3 requests in a row/);
  });

  it('serves a rerun from the disk cache with zero requests', async () => {
    const cacheDir = tempDir();
    const first = await judgeWith(knowing(0.8), { cacheDir });
    const before = await Promise.all([0, 1, 2].map((i) => first.judge.judge(comparison(i, i === 1 ? 'b' : 'a'))));
    await first.endpoint.close();
    expect(first.server.requests).toHaveLength(6);
    const second = await judgeWith(knowing(0.8), { cacheDir });
    const after = await Promise.all([0, 1, 2].map((i) => second.judge.judge(comparison(i, i === 1 ? 'b' : 'a'))));
    expect(second.server.requests).toHaveLength(6); // the same server: nothing new arrived
    expect(after.map((r) => r.verdict)).toEqual(before.map((r) => r.verdict));
    expect(after.every((r) => r.stats.requests === 0 && r.stats.cached === 2)).toBe(true);
  });

  it('stops asking when the request budget is spent, and abstains on what is left', async () => {
    const { judge, server, endpoint } = await judgeWith(knowing(0.9), { config: { max_requests: 4, concurrency: 1 } });
    const results = [];
    for (let i = 0; i < 4; i++) results.push(await judge.judge(comparison(i)));
    expect(server.requests).toHaveLength(4);
    expect(results.slice(0, 2).every((r) => r.verdict.winner === 'a')).toBe(true);
    expect(results.slice(2).every((r) => r.verdict.winner === 'abstain' && r.stats.over_budget)).toBe(true);
    expect(endpoint.counts.over_budget).toBe(4);
  });

  it('never lets personal data reach the server', async () => {
    const { judge, server } = await judgeWith(knowing(0.9));
    await judge.judge(comparison(0));
    expect(server.requests).toHaveLength(2);
    for (const { raw } of server.requests) {
      for (const secret of ['123-45-6789', '6789', '1980-02-29', '6484-3494-092', 'ann.lee@example.com'])
        expect(raw).not.toContain(secret);
    }
    expect(server.requests[0]!.raw).toContain('REF-204816'); // what the judge needs is still there
  });

  it('sends none of what realistic transcripts reveal about a person: names, addresses, dates of birth in any spelling', async () => {
    const { judge, server } = await judgeWith(knowing(0.9));
    for (const [i, transcript] of [airline, prose, retail].entries()) {
      const c = comparison(i);
      await judge.judge({ ...c, prompt: transcript });
      expect(count(JSON.stringify(transcript))).toBeGreaterThan(3);
    }
    expect(server.requests).toHaveLength(6);
    const leaked = server.requests.reduce(
      (n, { raw }) =>
        n +
        count(
          JSON.parse(raw)
            .messages.map((m: { content: string }) => m.content)
            .join('\n'),
        ),
      0,
    );
    expect(leaked).toBe(0);
  });

  it('stops with a clear message when the endpoint refuses the key', async () => {
    const { judge } = await judgeWith(() => ({ status: 401, json: { error: { message: 'invalid api key' } } }));
    const failure = judge.judge(comparison(0));
    await expect(failure).rejects.toThrow(PipelineError);
    await expect(failure).rejects.toThrow(/401.*OPENAI_API_KEY/);
  });
});
