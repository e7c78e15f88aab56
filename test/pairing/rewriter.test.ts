import { appendFileSync, copyFileSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { readJsonl } from '../../pipeline/jsonl.ts';
import { DEFAULT_REWRITE_PROMPT, loadRewritePrompt, type RewritePrompt } from '../../pairing/rewriter.ts';
import { REWRITE_TYPES, type CandidatePair, type Message, type RewriteType, type Session } from '../../core/records.ts';
import {
  completion,
  startChatServer,
  type ChatServer,
  type Script,
  type SeenRequest,
} from '../fixtures/chat-server.ts';
import { collect, engineFor, jsonl, manifest, tempDir, wholePairs } from '../fixtures/pipeline.ts';
import type { PairSide } from '../../store/messages.ts';

const SAMPLE = join(import.meta.dirname, '../../data/sample/sessions.jsonl.gz');
/** The first three sample tasks, four trials each: six successes among them. */
let sessions: Session[] = [];
/** A success whose last text turn also calls a tool: the rewrite of its text must keep the call. */
const WITH_CALL = 'cs-1-train-00001:oracle:1';
let prompt: RewritePrompt;

beforeAll(async () => {
  for await (const s of readJsonl<Session>(SAMPLE)) {
    if (sessions.length === 12) break;
    sessions.push(s);
  }
  sessions = sessions.map((s) => {
    if (s.session_id !== WITH_CALL) return s;
    const [finish, , summary] = s.messages.slice(-3) as [Message, Message, Message];
    return { ...s, messages: [...s.messages.slice(0, -3), { ...finish, content: summary.content }] };
  });
  prompt = loadRewritePrompt(DEFAULT_REWRITE_PROMPT, REWRITE_TYPES);
});

let server: ChatServer | null = null;
afterEach(async () => {
  await server?.close();
  server = null;
});

const successes = () => sessions.filter((s) => s.reward >= 0.7);

/**
 * A workspace over the sample sessions with the rewriter section given (indented under it); the transforms
 * make every type they share with the rewriter, so each rewrite has a transform's pair beside it.
 */
function pipeline(rewriter: string[], records: unknown[] = sessions) {
  const dir = tempDir();
  writeFileSync(join(dir, 'sessions.jsonl'), jsonl(records));
  const config =
    [
      'ingest:',
      '  inputs: [sessions.jsonl]',
      'split:',
      '  test_ratio: 0',
      'pairs:',
      '  hard_negatives:',
      '    ratios: { refusal: 1, off_topic: 1, verbose: 1, under_explained: 1 }',
      '    rewriter:',
      ...rewriter.map((l) => `      ${l}`),
    ].join('\n') + '\n';
  return { dir, engine: () => engineFor(dir, config) };
}

function rewriterOn(url: string, extra: string[] = []) {
  return [
    'enabled: true',
    'ratios: { refusal: 1, off_topic: 1, verbose: 1, under_explained: 1 }',
    `endpoint: { base_url: "${url}", model: rewriter-under-test, backoff_ms: 5 }`,
    ...extra,
  ];
}

const pairsOf = async (dir: string) => wholePairs<CandidatePair<PairSide>>(dir, 'pairs');
const rewritten = async (dir: string) => (await pairsOf(dir)).filter((p) => p.rejected_session_id.endsWith('~llm'));
const droppedOf = (dir: string) =>
  collect<{ rejected_session_id: string; reason: string }>(join(dir, 'workspace', 'pairs', 'dropped.jsonl'));

/** What a rewrite request asks for, read back from the prompt: its type, and the original reply's text as sent. */
function asked(request: SeenRequest): { type: RewriteType; original: string } {
  const text = request.body.messages.at(-1)?.content ?? '';
  const type = REWRITE_TYPES.find((t) => text.includes(prompt.instructions[t]!));
  if (!type) throw new Error('a request that names no rewrite type');
  const reply = text.slice(text.indexOf("## The assistant's reply") + 24, text.indexOf('## How to make it worse'));
  const line = reply.split('\n').find((l) => l.startsWith('[assistant] '));
  return { type, original: line?.slice('[assistant] '.length) ?? '' };
}

const REFUSAL = "I'm sorry, but I can't help with contacting them for you.";
const OFF_TOPIC = 'Basil stays fresh longest standing in a glass of water on the counter.';
const TERSE = 'All sorted.';

/** A rewriter that does its job; the verbose rewrite quotes a masked number, as a model would. */
const goodRewriter: Script = (req) => {
  const { type, original } = asked(req);
  const text = {
    refusal: REFUSAL,
    off_topic: OFF_TOPIC,
    under_explained: TERSE,
    verbose: `Certainly, happy to summarise! ${original} The first number I looked up was [PHONE_1]. I hope this helps!`,
  }[type];
  return { json: completion(`<reply>${text}</reply>`) };
};

/** Every value of the users' filled-in forms that the sessions carry. */
function profileValues(): Set<string> {
  const secrets = new Set<string>();
  for (const s of sessions) {
    for (const m of s.messages) {
      const form =
        m.role === 'tool' && m.content?.startsWith('{"')
          ? (JSON.parse(m.content.split(' (left blank')[0]!) as Record<string, unknown>)
          : {};
      for (const key of ['account_number', 'last_4_ssn', 'date_of_birth', 'email', 'pin', 'phone_number'])
        if (typeof form[key] === 'string') secrets.add(form[key] as string);
    }
  }
  return secrets;
}

describe('the LLM rewriter of hard negatives', () => {
  it("turns each chosen turn into a negative of every configured type, with the server's text as the rejected turn", async () => {
    server = await startChatServer(goodRewriter);
    const { dir, engine } = pipeline(rewriterOn(server.url));
    await engine().run({ until: 'pairs' });
    const pairs = await rewritten(dir);
    const chosen = successes();
    expect(pairs).toHaveLength(chosen.length * REWRITE_TYPES.length);

    for (const s of chosen) {
      for (const type of REWRITE_TYPES) {
        const p = pairs.find((x) => x.rejected_session_id === `${s.session_id}~${type}~llm`)!;
        expect(p, `${s.session_id} ${type}`).toBeDefined();
        expect(p).toMatchObject({
          source: 'hard_negative',
          negative_type: type,
          judge: '',
          confidence: 0,
          chosen_session_id: s.session_id,
          chosen_reward: s.reward,
          rejected_reward: null,
        });
        const at = p.prompt.length;
        expect(p.prompt).toEqual(s.messages.slice(0, at));
        expect(p.chosen).toEqual([s.messages[at]]);
        const [turn] = p.rejected as [Message];
        if (type === 'refusal' || type === 'off_topic') {
          if (type === 'refusal') expect(at).toBe(s.messages.findIndex((m) => m.role === 'assistant'));
          else expect(s.messages[at]!.role).toBe('assistant');
          expect(turn).toEqual({ role: 'assistant', content: type === 'refusal' ? REFUSAL : OFF_TOPIC });
        } else {
          const minText = type === 'verbose' ? 20 : 40;
          expect(at).toBe(
            s.messages.findLastIndex((m) => m.role === 'assistant' && (m.content?.length ?? 0) >= minText),
          );
          expect(turn.tool_calls).toEqual(s.messages[at]!.tool_calls);
          if (type === 'under_explained') expect(turn.content).toBe(TERSE);
        }
      }
    }
    // The text rewrite of a turn that also calls a tool keeps the call as it was.
    const withCall = pairs.find((p) => p.rejected_session_id === `${WITH_CALL}~verbose~llm`)!;
    expect(withCall.rejected[0]!.tool_calls?.map((c) => c.function.name)).toEqual(['finish']);

    // A pair of its own beside the transform's pair of the same session and type.
    const all = await pairsOf(dir);
    expect(new Set(all.map((p) => p.pair_id)).size).toBe(all.length);
    for (const p of pairs)
      expect(
        all.some(
          (t) => t.rejected_session_id === p.rejected_session_id.replace(/~llm$/, '') && t.pair_id !== p.pair_id,
        ),
      ).toBe(true);

    const counts = manifest(dir, 'pairs').counts;
    for (const type of REWRITE_TYPES) expect(counts[`hard_negative_llm_${type}`]).toBe(chosen.length);
    expect(counts.requests).toBe(server.requests.length);
    expect(counts.requests! + counts.cached!).toBe(pairs.length);
    expect(server.requests.every((r) => r.body.model === 'rewriter-under-test' && r.body.temperature === 0.5)).toBe(
      true,
    );
    expect(manifest(dir, 'pairs').summary).toContain(`${pairs.length} hard negatives rewritten by rewriter-under-test`);
  });

  it('never sends profile values, and puts the real values back where the rewrite names a placeholder', async () => {
    server = await startChatServer(goodRewriter);
    const { dir, engine } = pipeline(rewriterOn(server.url));
    await engine().run({ until: 'pairs' });

    const secrets = profileValues();
    expect(secrets.size).toBeGreaterThan(5);
    for (const { body } of server.requests) {
      const text = body.messages.map((m) => m.content ?? '').join('\n');
      for (const secret of secrets) {
        if (/^\d{4}$/.test(secret)) expect(text).not.toMatch(new RegExp(`"(last_4_ssn|pin)"\\s*:\\s*"${secret}"`));
        else expect(text, `a request carried ${secret}`).not.toContain(secret);
      }
    }
    expect(server.requests.some((r) => r.raw.includes('[PHONE_1]'))).toBe(true);

    const verbose = (await rewritten(dir)).filter((p) => p.negative_type === 'verbose');
    expect(verbose.length).toBeGreaterThan(0);
    for (const p of verbose) {
      const content = p.rejected[0]!.content!;
      expect(content).not.toMatch(/\[[A-Z]+_\d+\]/);
      const number = /The first number I looked up was (.+?)\. I hope/.exec(content)?.[1];
      expect(number).toMatch(/^1-\d{3}-\d{3}-\d{4}$/);
      expect(JSON.stringify(p.prompt)).toContain(number);
      // The original text, sent masked, comes back whole.
      expect(content).toContain(p.chosen[0]!.content!);
    }
  });

  it('skips, with a reason in dropped.jsonl, a rewrite that is empty, unreadable, identical to the original or names a made-up placeholder', async () => {
    server = await startChatServer((req) => {
      const { type, original } = asked(req);
      const content = {
        refusal: '   ',
        off_topic: 'Sure! Here is a reply about cooking.',
        verbose: `<reply>\n${original}\n</reply>`,
        under_explained: '<reply>Done, see [ACCOUNT_9].</reply>',
      }[type];
      return { json: completion(content) };
    });
    const { dir, engine } = pipeline(rewriterOn(server.url));
    await engine().run({ until: 'pairs' });
    expect(server.requests.length).toBeGreaterThan(0);
    expect(await rewritten(dir)).toEqual([]);

    const dropped = await droppedOf(dir);
    const reasonsOf = (type: RewriteType) =>
      dropped.filter((d) => d.rejected_session_id.endsWith(`~${type}~llm`)).map((d) => d.reason);
    const n = successes().length;
    expect(reasonsOf('refusal')).toEqual(
      Array(n).fill('hard negative refusal (llm rewrite): the rewrite came back empty'),
    );
    expect(reasonsOf('off_topic')).toHaveLength(n);
    expect(
      reasonsOf('off_topic').every((r) =>
        r.startsWith('hard negative off_topic (llm rewrite): unreadable rewrite, no <reply>…</reply> in "Sure!'),
      ),
    ).toBe(true);
    expect(reasonsOf('verbose')).toEqual(
      Array(n).fill('hard negative verbose (llm rewrite): the rewrite is identical to the original'),
    );
    expect(reasonsOf('under_explained')).toEqual(
      Array(n).fill(
        'hard negative under_explained (llm rewrite): the rewrite holds [ACCOUNT_9], a placeholder that stands for nothing in the conversation',
      ),
    );
    const counts = manifest(dir, 'pairs').counts;
    expect(counts).toMatchObject({ hard_negative_llm: 0, rewrite_skipped: 4 * n });
  });

  it('sends no request when the pairs stage runs again, and writes the same pairs', async () => {
    server = await startChatServer(goodRewriter);
    const { dir, engine } = pipeline(rewriterOn(server.url));
    await engine().run({ until: 'pairs' });
    const first = server.requests.length;
    expect(first).toBeGreaterThan(0);
    const read = (name: string) => readFileSync(join(dir, 'workspace', 'pairs', name), 'utf8');
    const [train, dropped] = [read('train.jsonl'), read('dropped.jsonl')];
    const before = manifest(dir, 'pairs').counts;

    await engine().run({ force: 'pairs' });
    expect(server.requests.length).toBe(first);
    expect(read('train.jsonl')).toBe(train);
    expect(read('dropped.jsonl')).toBe(dropped);
    expect(manifest(dir, 'pairs').counts).toMatchObject({
      requests: 0,
      cached: before.requests! + before.cached!,
      hard_negative_llm: before.hard_negative_llm,
    });
  });

  it('asks again when the rewrite prompt file is edited: the pairs stage goes stale', async () => {
    server = await startChatServer(goodRewriter);
    const { dir, engine } = pipeline([...rewriterOn(server.url), 'prompt: my-rewrite.md']);
    copyFileSync(DEFAULT_REWRITE_PROMPT, join(dir, 'my-rewrite.md'));
    await engine().run({ until: 'pairs' });
    const first = server.requests.length;
    expect((await engine().run({ until: 'pairs' })).find((o) => o.stage === 'pairs')!.action).toBe('fresh');

    appendFileSync(join(dir, 'my-rewrite.md'), 'Keep it plausible.\n');
    const rerun = (await engine().run({ until: 'pairs' })).find((o) => o.stage === 'pairs')!;
    expect(rerun.action).toBe('ran');
    expect(rerun.reasons.join(' ')).toMatch(/input files: 1 changed/);
    expect(server.requests.length).toBe(2 * first);
    // The line lands in the file's last section (under_explained): the rerun's requests of that type carry
    // it, in whatever order the concurrent requests arrived; none of the first run's did.
    const carries = (from: number, to: number) =>
      server!.requests.slice(from, to).filter((r) => r.raw.includes('Keep it plausible.')).length;
    expect(carries(0, first)).toBe(0);
    expect(carries(first, 2 * first)).toBeGreaterThan(0);
  });

  it('leaves sessions that must be declined to the transforms', async () => {
    server = await startChatServer(goodRewriter);
    const declined = successes()[0]!.session_id;
    const records = sessions.map((s) => (s.session_id === declined ? { ...s, must_decline: true } : s));
    const { dir, engine } = pipeline(rewriterOn(server.url), records);
    await engine().run({ until: 'pairs' });
    const pairs = await rewritten(dir);
    expect(pairs).toHaveLength((successes().length - 1) * REWRITE_TYPES.length);
    expect(pairs.some((p) => p.chosen_session_id === declined)).toBe(false);
    expect(manifest(dir, 'pairs').counts.rewrite_must_decline).toBe(1);
  });

  it('drops what the request budget leaves unasked, saying so', async () => {
    server = await startChatServer(goodRewriter);
    const { dir, engine } = pipeline(
      rewriterOn(server.url).map((l) => l.replace('backoff_ms: 5', 'backoff_ms: 5, max_requests: 3, concurrency: 1')),
    );
    await engine().run({ until: 'pairs' });
    expect(server.requests).toHaveLength(3);
    const counts = manifest(dir, 'pairs').counts;
    expect(counts.rewrite_over_budget).toBeGreaterThan(0);
    expect(counts.hard_negative_llm! + counts.rewrite_over_budget!).toBe(successes().length * REWRITE_TYPES.length);
    expect(
      (await droppedOf(dir)).filter((d) => d.reason.endsWith('(llm rewrite): the request budget is spent')),
    ).toHaveLength(counts.rewrite_over_budget!);
  });

  it('is off by default: no request, no rewritten pair, no prompt file among the inputs', async () => {
    server = await startChatServer(goodRewriter);
    const { dir, engine } = pipeline([`endpoint: { base_url: "${server.url}", model: rewriter-under-test }`]);
    await engine().run({ until: 'pairs' });
    expect(server.requests).toHaveLength(0);
    expect(await rewritten(dir)).toEqual([]);
    expect((await pairsOf(dir)).some((p) => p.source === 'hard_negative')).toBe(true);
    expect(manifest(dir, 'pairs').external).toEqual([]);
    expect(manifest(dir, 'pairs').counts.requests).toBe(0);
  });
});
