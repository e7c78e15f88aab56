import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { VerifierJudge } from '../../judges/verifier.ts';
import type { Comparison, Completion } from '../../core/verdict.ts';
import { readJsonl } from '../../pipeline/jsonl.ts';
import { WorldCache, sessionTask } from '../../env/replay.ts';
import type { World } from '../../env/world.ts';
import type { Message, Session, ToolCall } from '../../core/records.ts';

const SAMPLE = join(import.meta.dirname, '..', '..', 'data', 'sample', 'sessions.jsonl.gz');

const sample: Session[] = [];
let world: World;

beforeAll(async () => {
  for await (const s of readJsonl<Session>(SAMPLE)) sample.push(s);
  const found = sessionTask(sample[0]!, new WorldCache());
  if ('reason' in found) throw new Error(found.reason);
  world = found.world;
});

const judge = (minRewardGap = 0.1, replay = true) => new VerifierJudge({ minRewardGap, replay });

/** A whole logged session as one side: everything after the system prompt and the request. */
const episode = (s: Session, change: Partial<Completion> = {}): Completion => ({
  id: s.session_id,
  messages: s.messages.slice(2),
  reward: s.reward,
  ...change,
});

function comparison(
  prompt: Message[],
  a: Completion,
  b: Completion,
  task_id: string | null,
  metadata: string,
): Comparison {
  return { prompt, a, b, task_id, metadata };
}

/** Both orders of a comparison of `good` against `bad`, and which side is good in each. */
function bothOrders(
  prompt: Message[],
  good: Completion,
  bad: Completion,
  task_id: string | null,
  metadata: string,
): [Comparison, 'a' | 'b'][] {
  return [
    [comparison(prompt, good, bad, task_id, metadata), 'a'],
    [comparison(prompt, bad, good, task_id, metadata), 'b'],
  ];
}

/** The last digit of a text moved by one: a reference number or phone number that is off by a digit. */
const lastDigitChanged = (text: string) => text.replace(/\d(?=\D*$)/, (d) => String((Number(d) + 1) % 10));

/** Index of the first assistant turn whose `call` the department carried out, in a session that has one. */
function completedCall(s: Session): number {
  return s.messages.findIndex(
    (m, i) => m.tool_calls?.[0]?.function.name === 'call' && /that's done/.test(s.messages[i + 1]?.content ?? ''),
  );
}

/** The first sample sessions that have a completed call, with that call's index. */
function withCompletedCall(n: number): { session: Session; at: number }[] {
  return sample
    .map((session) => ({ session, at: completedCall(session) }))
    .filter((x) => x.at >= 0)
    .slice(0, n);
}

function withCall(message: Message, change: (call: ToolCall) => ToolCall): Message {
  return { ...message, tool_calls: message.tool_calls!.map((call, i) => (i === 0 ? change(call) : call)) };
}

function withArgs(message: Message, change: (args: Record<string, unknown>) => Record<string, unknown>): Message {
  return withCall(message, (call) => ({
    ...call,
    function: { ...call.function, arguments: JSON.stringify(change(JSON.parse(call.function.arguments))) },
  }));
}

/** A phone number shaped like the directory's that no department answers. */
function unservedPhone(real: string): string {
  for (let shift = 1; shift < 10; shift++) {
    const fake = real.replace(/\d{4}$/, (d) => String((Number(d) + shift * 1111) % 10000).padStart(4, '0'));
    if (!world.byPhone.has(fake)) return fake;
  }
  throw new Error(`no unserved number near ${real}`);
}

/** One turn-level comparison: the context before the turn at `at`, that turn against another version of it. */
function turnLevel(
  s: Session,
  at: number,
  good: Message,
  bad: Message,
  rewards: [number | null, number | null] = [null, null],
): [Comparison, 'a' | 'b'][] {
  return bothOrders(
    s.messages.slice(0, at),
    { id: s.session_id, messages: [good], reward: rewards[0] },
    { id: `${s.session_id}~x`, messages: [bad], reward: rewards[1] },
    s.task_id,
    s.metadata,
  );
}

describe('verifier: replay integrity', () => {
  it('prefers an intact session over a copy whose tool result was edited, decisively and in either order', () => {
    for (const s of sample.slice(0, 40)) {
      const k = s.messages.findIndex((m) => m.role === 'tool');
      const tampered = s.messages.map((m, i) => (i === k ? { ...m, content: lastDigitChanged(m.content!) } : m));
      expect(tampered[k]!.content).not.toBe(s.messages[k]!.content);
      for (const [c, good] of bothOrders(
        s.messages.slice(0, 2),
        episode(s),
        episode(s, { id: 'tampered', messages: tampered.slice(2) }),
        s.task_id,
        s.metadata,
      )) {
        const v = judge().verdict(c);
        expect(v).toMatchObject({ winner: good, confidence: 1 });
        expect(v.rationale).toMatch(/disagrees with a replay: tool result/);
      }
    }
  });

  it('prefers an intact session over a copy whose tool result was emptied or deleted', () => {
    const s = sample[0]!;
    const k = s.messages.findIndex((m) => m.role === 'tool');
    const emptied = s.messages.map((m, i) => (i === k ? { ...m, content: null } : m));
    const deleted = s.messages.filter((_, i) => i !== k);
    for (const messages of [emptied, deleted]) {
      for (const [c, good] of bothOrders(
        s.messages.slice(0, 2),
        episode(s),
        episode(s, { id: 'tampered', messages: messages.slice(2) }),
        s.task_id,
        s.metadata,
      )) {
        expect(judge().verdict(c)).toMatchObject({ winner: good, confidence: 1 });
      }
    }
  });

  it('prefers an intact failure over a failure whose logged reward was raised to a success', () => {
    const failures = sample.filter((s) => s.reward <= 0.3).slice(0, 20);
    expect(failures.length).toBe(20);
    for (const s of failures) {
      // Unchecked, the raised reward would win by the reward gap.
      for (const [c, good] of bothOrders(
        s.messages.slice(0, 2),
        episode(s),
        episode(s, { id: 'edited', reward: 1 }),
        s.task_id,
        s.metadata,
      )) {
        const v = judge().verdict(c);
        expect(v).toMatchObject({ winner: good, confidence: 1 });
        expect(v.rationale).toMatch(/logged reward 1, replay gives/);
      }
    }
  });

  it('does not hold a turn-level side to its episode reward, which only the whole episode reaches', () => {
    // A hard negative's chosen side: one turn of a successful session, carrying the session's reward.
    for (const s of sample.filter((x) => x.reward === 1).slice(0, 20)) {
      const at = s.messages.findIndex((m) => m.role === 'assistant');
      const [[c]] = turnLevel(s, at, s.messages[at]!, s.messages[at]!, [1, null]);
      expect(judge().verdict(c!)).toMatchObject({ winner: 'abstain' });
    }
  });

  it('checks nothing against a replay when replay is off', () => {
    const s = sample[0]!;
    const k = s.messages.findIndex((m) => m.role === 'tool');
    const tampered = s.messages.map((m, i) => (i === k ? { ...m, content: lastDigitChanged(m.content!) } : m));
    const c = comparison(
      s.messages.slice(0, 2),
      episode(s),
      episode(s, { messages: tampered.slice(2) }),
      s.task_id,
      s.metadata,
    );
    expect(judge(0.1, false).verdict(c).winner).toBe('abstain');
  });
});

describe('verifier: outcome reward', () => {
  const turn = (content: string, reward: number): Completion => ({
    id: content,
    messages: [{ role: 'assistant', content }],
    reward,
  });
  const prompt: Message[] = [{ role: 'user', content: 'Please cancel my gym membership.' }];

  it('decides by a reward gap of at least minRewardGap, with the gap as margin', () => {
    for (const [ra, rb, winner] of [
      [0.9, 0.7, 'a'],
      [0.2, 0.3, 'b'],
      [0, 1, 'b'],
    ] as const) {
      const v = judge(0.1).verdict(comparison(prompt, turn('x', ra), turn('y', rb), null, '{}'));
      expect(v.winner).toBe(winner);
      expect(v.confidence).toBe(1);
      expect(v.margin).toBeCloseTo(Math.abs(ra - rb), 9);
    }
  });

  it('abstains when the reward gap is below minRewardGap', () => {
    for (const [ra, rb] of [
      [0.9, 0.85],
      [1, 1],
      [0.2, 0.29],
    ]) {
      const v = judge(0.1).verdict(comparison(prompt, turn('x', ra!), turn('y', rb!), null, '{}'));
      expect(v).toMatchObject({ winner: 'abstain', confidence: 0 });
      expect(v.margin).toBeUndefined();
    }
  });

  it('decides between two logged sessions of one task by their replayed rewards', () => {
    const byTask = new Map<string, Session[]>();
    for (const s of sample) byTask.set(s.task_id!, [...(byTask.get(s.task_id!) ?? []), s]);
    const pairs = [...byTask.values()].flatMap((ss) => {
      const best = ss.reduce((x, y) => (y.reward > x.reward ? y : x));
      const worst = ss.reduce((x, y) => (y.reward < x.reward ? y : x));
      return best.reward - worst.reward >= 0.5 ? [[best, worst] as const] : [];
    });
    expect(pairs.length).toBeGreaterThan(20);
    for (const [best, worst] of pairs.slice(0, 20)) {
      for (const [c, good] of bothOrders(
        best.messages.slice(0, 2),
        episode(best),
        episode(worst),
        best.task_id,
        best.metadata,
      )) {
        const v = judge().verdict(c);
        expect(v).toMatchObject({ winner: good, confidence: 1 });
        expect(v.margin).toBeCloseTo(best.reward - worst.reward, 9);
      }
    }
  });
});

describe('verifier: environment steps of turn-level sides', () => {
  it('prefers a call to the real number over the same call to a hallucinated one, which the environment does not serve', () => {
    const found = withCompletedCall(20);
    expect(found.length).toBe(20);
    for (const { session, at } of found) {
      const good = session.messages[at]!;
      const bad = withArgs(good, (args) => ({ ...args, phone_number: unservedPhone(args.phone_number as string) }));
      for (const [c, side] of turnLevel(session, at, good, bad)) {
        const v = judge().verdict(c);
        expect(v).toMatchObject({ winner: side, confidence: 1 });
        expect(v.rationale).toMatch(/failed in the environment: call: .* is not in service/);
      }
    }
  });

  it('abstains when the side without failures made no tool call at all', () => {
    const { session, at } = withCompletedCall(1)[0]!;
    const failing = withArgs(session.messages[at]!, (args) => ({
      ...args,
      phone_number: unservedPhone(args.phone_number as string),
    }));
    const text: Message = { role: 'assistant', content: 'I will phone them for you shortly.' };
    for (const [c] of turnLevel(session, at, text, failing)) expect(judge().verdict(c).winner).toBe('abstain');
  });

  it('does not let a side win by writing a failing call out as text instead of making it', () => {
    const { session, at } = withCompletedCall(1)[0]!;
    const good = session.messages[at]!;
    const failing = {
      ...withArgs(good, (args) => ({ ...args, phone_number: unservedPhone(args.phone_number as string) }))
        .tool_calls![0]!,
      id: 'call_0',
    };
    const made: Message = { ...good, tool_calls: [failing, ...good.tool_calls!] };
    const written: Message = {
      ...good,
      content: JSON.stringify({ name: 'call', arguments: JSON.parse(failing.function.arguments) }),
      tool_calls: good.tool_calls!,
    };
    for (const [c] of turnLevel(session, at, made, written)) expect(judge().verdict(c).winner).toBe('abstain');
  });
});

describe('verifier: tool-call validity', () => {
  const malformed: [string, (m: Message) => Message, RegExp][] = [
    [
      'arguments that are not JSON',
      (m) => withCall(m, (c) => ({ ...c, function: { ...c.function, arguments: c.function.arguments.slice(0, -3) } })),
      /not valid JSON/,
    ],
    [
      'an unknown tool name',
      (m) => withCall(m, (c) => ({ ...c, function: { ...c.function, name: 'dial' } })),
      /unknown tool "dial"/,
    ],
    [
      'a missing required argument',
      (m) => withArgs(m, ({ request: _, ...rest }) => rest),
      /lacks required argument "request"/,
    ],
  ];

  it.each(malformed)('prefers a well-formed call over one with %s, by validity alone', (_, broken, why) => {
    for (const { session, at } of withCompletedCall(10)) {
      const good = session.messages[at]!;
      for (const [c, side] of turnLevel(session, at, good, broken(good))) {
        const v = judge(0.1, false).verdict(c);
        expect(v).toMatchObject({ winner: side, confidence: 1 });
        expect(v.rationale).toMatch(why);
        // With replay on, the environment or the validity check decides it the same way.
        expect(judge().verdict(c)).toMatchObject({ winner: side, confidence: 1 });
      }
    }
  });

  it('abstains when the side without a malformed call made no tool call', () => {
    const { session, at } = withCompletedCall(1)[0]!;
    const text: Message = { role: 'assistant', content: 'I will phone them for you shortly.' };
    for (const [, broken] of malformed) {
      for (const [c] of turnLevel(session, at, text, broken(session.messages[at]!)))
        expect(judge(0.1, false).verdict(c).winner).toBe('abstain');
    }
  });
});

describe('verifier: sessions not from the simulator', () => {
  const prompt: Message[] = [{ role: 'user', content: 'Look up the weather in Lisbon.' }];
  const call = (name: string, args: string): Completion => ({
    id: `${name}:${args}`,
    messages: [
      {
        role: 'assistant',
        content: null,
        tool_calls: [{ id: 'c1', type: 'function', function: { name, arguments: args } }],
      },
    ],
    reward: null,
  });

  it('still decides by the reward gap', () => {
    const c = comparison(
      prompt,
      { ...call('weather', '{"city":"Lisbon"}'), reward: 0.2 },
      { ...call('weather', '{"city":"Lisbon"}'), reward: 0.9 },
      'weather-1',
      '{}',
    );
    expect(judge().verdict(c)).toMatchObject({ winner: 'b', confidence: 1, margin: expect.closeTo(0.7, 9) });
  });

  it('still prefers arguments that parse over arguments that do not', () => {
    for (const [c, good] of bothOrders(
      prompt,
      call('weather', '{"city":"Lisbon"}'),
      call('weather', '{"city":"Lisbon"'),
      'weather-1',
      '{}',
    )) {
      expect(judge().verdict(c)).toMatchObject({ winner: good, confidence: 1 });
    }
  });

  it('knows unknown tools and missing arguments only from a tools list in the metadata', () => {
    const tools = JSON.stringify({
      tools: [{ type: 'function', function: { name: 'weather', parameters: { type: 'object', required: ['city'] } } }],
    });
    for (const bad of [call('forecast', '{"city":"Lisbon"}'), call('weather', '{}')]) {
      const [[unknown]] = bothOrders(prompt, call('weather', '{"city":"Lisbon"}'), bad, null, '{}');
      expect(judge().verdict(unknown!).winner).toBe('abstain');
      for (const [c, good] of bothOrders(prompt, call('weather', '{"city":"Lisbon"}'), bad, null, tools))
        expect(judge().verdict(c)).toMatchObject({ winner: good, confidence: 1 });
    }
  });

  it('cannot see an edited tool result in a session without a world to replay it in', () => {
    const s = sample[0]!;
    const k = s.messages.findIndex((m) => m.role === 'tool');
    const tampered = s.messages.map((m, i) => (i === k ? { ...m, content: lastDigitChanged(m.content!) } : m));
    const c = comparison(
      s.messages.slice(0, 2),
      episode(s),
      episode(s, { messages: tampered.slice(2) }),
      s.task_id,
      '{}',
    );
    expect(judge().verdict(c).winner).toBe('abstain');
  });
});
