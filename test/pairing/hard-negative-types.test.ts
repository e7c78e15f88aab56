// Each type of hard negative on its own: what it changes in the chosen turn, and what it never does.
import { beforeAll, describe, expect, it } from 'vitest';
import {
  SYSTEM,
  USER,
  buildHardNegatives,
  digitsOf,
  leafDifferences,
  loadSample,
  options,
  pairsOf,
  sample,
  session,
  successes,
  toolCall,
  wordsOf,
} from '../fixtures/hard-negatives.ts';
import { TOOLS, TOOL_NAMES } from '../../env/env.ts';
import { REFUSAL_PATTERN, isRefusal } from '../../core/refusal.ts';
import { pairId, type Message } from '../../core/records.ts';

beforeAll(loadSample);

describe('refusal negatives', () => {
  it('replace the first assistant turn with a refusal that REFUSAL_PATTERN matches, from at least six templates', () => {
    const found = pairsOf('refusal', 200);
    expect(found).toHaveLength(200);
    const texts = new Set<string>();
    for (const { session: s, pair } of found) {
      expect(pair.prompt).toHaveLength(s.messages.findIndex((m) => m.role === 'assistant'));
      const [refusal] = pair.rejected;
      expect(refusal!.tool_calls).toBeUndefined();
      expect(refusal!.content).toMatch(REFUSAL_PATTERN);
      expect(isRefusal(refusal!.content)).toBe(true);
      texts.add(refusal!.content!);
    }
    expect(texts.size).toBeGreaterThanOrEqual(6);
  });

  it('are flipped when the session complied with a request it should have declined', () => {
    const s = successes[0]!;
    const { pairs } = buildHardNegatives(
      s,
      options({ refusal: 1, verbose: 1 }, 'test', () => true),
    );
    const refusal = pairs.find((p) => p.negative_type === 'refusal')!;
    expect(isRefusal(refusal.chosen[0]!.content)).toBe(true);
    expect(refusal.rejected).toEqual([s.messages[refusal.prompt.length]]);
    expect(refusal).toMatchObject({
      pair_id: pairId('hard_negative', `${s.session_id}~refusal`, s.session_id, 'refusal'),
      chosen_session_id: `${s.session_id}~refusal`,
      rejected_session_id: s.session_id,
      chosen_reward: null,
      rejected_reward: s.reward,
    });
    // Only the refusal flips: a padded reply is worse whatever the request was.
    const verbose = pairs.find((p) => p.negative_type === 'verbose')!;
    expect(verbose.chosen).toEqual([s.messages[verbose.prompt.length]]);
    expect(verbose.chosen_session_id).toBe(s.session_id);
  });

  it("are told apart from the agent's ordinary text and from a representative's \"I can't verify\"", () => {
    const assistantTexts = sample.flatMap((s) =>
      s.messages.filter((m) => m.role === 'assistant' && m.content).map((m) => m.content!),
    );
    expect(assistantTexts.length).toBeGreaterThan(1000);
    expect(assistantTexts.filter(isRefusal)).toEqual([]);
    const representative = sample.flatMap((s) =>
      s.messages.filter((m) => m.role === 'tool' && m.content?.includes("I can't verify")).map((m) => m.content!),
    );
    expect(representative.length).toBeGreaterThan(0);
    expect(representative.filter(isRefusal)).toEqual([]);
    for (const text of [
      'I completed 3 of 5 requests; Acme Bank still needs more from you for the rest.',
      'All done: all 5 requests are complete.',
      "I'm sorry for the wait: your refund is done.",
      null,
    ]) {
      expect(isRefusal(text)).toBe(false);
    }
    for (const text of [
      "I'm sorry, but I can't do that.",
      'I cannot assist with that request.',
      'I am unable to help with phone calls.',
      "I won't do that.",
      'As an AI language model, I have no phone.',
      "That's not something I can help with.",
    ]) {
      expect(isRefusal(text)).toBe(true);
    }
  });
});

describe('hallucination negatives', () => {
  it('change one phone number in one tool call to one of the same shape that the context never mentions', () => {
    const found = pairsOf('hallucination', 200);
    expect(found).toHaveLength(200);
    for (const { pair } of found) {
      const [chosen] = pair.chosen;
      const [rejected] = pair.rejected;
      expect(rejected!.content).toBe(chosen!.content);
      const changed = chosen!.tool_calls!.flatMap((call, i) => {
        const other = rejected!.tool_calls![i]!;
        expect(other.id).toBe(call.id);
        expect(other.function.name).toBe(call.function.name);
        return leafDifferences(JSON.parse(call.function.arguments), JSON.parse(other.function.arguments));
      });
      expect(changed).toHaveLength(1);
      const { path, a: before, b: after } = changed[0]!;
      expect(path).toMatch(/\.phone_number$/); // the department's number, or the user's own in `auth`
      expect(typeof after).toBe('string');
      expect((after as string).replace(/\d/g, '#')).toBe((before as string).replace(/\d/g, '#'));
      expect(JSON.stringify(pair.prompt)).not.toContain(after);
      expect(JSON.stringify(chosen)).not.toContain(after);
    }
  });

  it('fall back to another identifier, such as an account number, when no call gives a phone number', () => {
    const s = session('auth', [
      SYSTEM,
      USER,
      { role: 'tool', content: '{"account_number":"6484-3494-092","pin":"2620"}', tool_call_id: 'c0' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          toolCall('c1', 'cancel', {
            auth: { account_number: '6484-3494-092', email: 'a@b.c' },
            request: 'Cancel it.',
          }),
        ],
      },
    ]);
    const [pair] = buildHardNegatives(s, options({ hallucination: 1 })).pairs;
    const args = JSON.parse(pair!.rejected[0]!.tool_calls![0]!.function.arguments);
    expect(Object.keys(args)).toEqual(['auth', 'request']);
    expect(args.auth.email).toBe('a@b.c');
    expect(args.auth.account_number).not.toBe('6484-3494-092');
    expect(args.auth.account_number).toMatch(/^\d{4}-\d{4}-\d{3}$/);
    expect(JSON.stringify(pair!.prompt)).not.toContain(args.auth.account_number);
  });

  it('take a phone number however its key is written or nested, and no other identifier while a call gives one', () => {
    // Raw arguments, as a model may write them: the key spelt with a \u escape, a list of numbers, one deep in `auth`.
    const raw = (id: string, args: string) => ({
      id,
      type: 'function' as const,
      function: { name: 'call', arguments: args },
    });
    // Where the changed value may lie (the other call's company holds an identifier too: `2000`).
    const shapes: [string, string[]][] = [
      ['{"ph\\u006fne_number":"555-0100","request":"ref 4242-99"}', ['.1.phone_number']],
      ['{"phone_number":["555-0100","555-0111"],"request":"ref 4242-99"}', ['.1.phone_number.']],
      ['{"auth":{"phone_number":"555-0199","pin":"2620"},"request":"ref 4242-99"}', ['.1.auth.phone_number']],
      // No phone number of three digits: any identifier.
      ['{"phone_number":"12","auth":{"account_number":"6484-3494-092"}}', ['.1.auth.account_number', '.0.company']],
    ];
    for (const [args, where] of shapes) {
      const changed = ['a', 'b', 'c', 'd', 'e', 'f'].flatMap((salt) => {
        const s = session('s', [
          SYSTEM,
          USER,
          { role: 'assistant', content: null, tool_calls: [raw('c0', '{"company":"Acme 2000 Ltd"}'), raw('c1', args)] },
        ]);
        const [pair] = buildHardNegatives(s, options({ hallucination: 1 }, salt)).pairs;
        const [before, after] = [pair!.chosen[0]!, pair!.rejected[0]!].map((m) =>
          m.tool_calls!.map((c) => JSON.parse(c.function.arguments) as unknown),
        );
        return leafDifferences(before, after).map((d) => d.path);
      });
      expect(changed).toHaveLength(6);
      expect(changed.filter((path) => !where.some((w) => path.startsWith(w)))).toEqual([]);
    }
  });

  it('redraw a value that the context already holds, and give up with a reason when every draw is taken', () => {
    // A three-digit value keeps its first digit and changes one of the other two: 18 possible values.
    const variants = ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']
      .flatMap((d) => [`1${d}3`, `12${d}`])
      .filter((v) => v !== '123');
    expect(variants).toHaveLength(18);
    const withContext = (known: string[]) =>
      session('room', [
        SYSTEM,
        { role: 'user', content: `Codes I have used: ${known.join(' ')}` },
        {
          role: 'assistant',
          content: null,
          tool_calls: [toolCall('c1', 'call', { phone_number: '123', auth: {}, request: 'Hi.' })],
        },
      ]);
    const free = variants.at(-1)!;
    const values = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'].flatMap((salt) =>
      buildHardNegatives(withContext(variants.slice(0, -1)), options({ hallucination: 1 }, salt)).pairs.map(
        (p) => JSON.parse(p.rejected[0]!.tool_calls![0]!.function.arguments).phone_number,
      ),
    );
    expect(values.length).toBeGreaterThan(0);
    expect(new Set(values)).toEqual(new Set([free]));

    const full = buildHardNegatives(withContext(variants), options({ hallucination: 1 }));
    expect(full.pairs).toEqual([]);
    expect(full.skipped).toEqual([
      { session_id: 'room', type: 'hallucination', reason: expect.stringMatching(/already appears/) },
    ]);
  });
});

describe('format negatives', () => {
  const requiredOf = (name: string): readonly string[] => {
    const parameters = TOOLS.find((t) => t.function.name === name)!.function.parameters;
    return 'required' in parameters ? parameters.required : [];
  };

  /** Which breakage turned chosen into rejected, after checking that it fails the check it targets. */
  function breakage(chosen: Message, rejected: Message): string {
    const calls = chosen.tool_calls!;
    if (rejected.tool_calls === undefined) {
      expect(calls).toHaveLength(1);
      const written = JSON.parse(rejected.content!);
      expect(written).toEqual({ name: calls[0]!.function.name, arguments: JSON.parse(calls[0]!.function.arguments) });
      return 'as text';
    }
    expect(rejected.content).toBe(chosen.content);
    const changed = calls.flatMap((call, i) =>
      JSON.stringify(call) === JSON.stringify(rejected.tool_calls![i]) ? [] : [i],
    );
    expect(changed).toHaveLength(1);
    const before = calls[changed[0]!]!;
    const after = rejected.tool_calls![changed[0]!]!;
    expect(after.id).toBe(before.id);
    if (after.function.name !== before.function.name) {
      expect(after.function.arguments).toBe(before.function.arguments);
      expect(TOOL_NAMES as readonly string[]).not.toContain(after.function.name);
      return 'misspelled name';
    }
    let args: Record<string, unknown>;
    try {
      args = JSON.parse(after.function.arguments);
    } catch {
      expect(before.function.arguments.startsWith(after.function.arguments)).toBe(true);
      return 'truncated';
    }
    const original = JSON.parse(before.function.arguments) as Record<string, unknown>;
    const dropped = Object.keys(original).filter((k) => !(k in args));
    expect(dropped).toHaveLength(1);
    expect(requiredOf(before.function.name)).toContain(dropped[0]);
    expect({ ...args, [dropped[0]!]: original[dropped[0]!] }).toEqual(original);
    return 'dropped required';
  }

  it('break one tool call in each of four ways, each failing the check it targets', () => {
    const found = pairsOf('format', 400);
    expect(found).toHaveLength(400);
    const kinds = new Map<string, number>();
    for (const { pair } of found) {
      const kind = breakage(pair.chosen[0]!, pair.rejected[0]!);
      kinds.set(kind, (kinds.get(kind) ?? 0) + 1);
    }
    expect([...kinds.keys()].sort()).toEqual(['as text', 'dropped required', 'misspelled name', 'truncated']);
    for (const count of kinds.values()) expect(count).toBeGreaterThanOrEqual(40);
  });

  it("write the call after the turn's own words when it moves it into the text", () => {
    const said = 'Let me look that up.';
    const s = session('talk', [
      SYSTEM,
      USER,
      { role: 'assistant', content: said, tool_calls: [toolCall('c1', 'search_directory', { company: 'Globo Gym' })] },
    ]);
    const kinds = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l'].map((salt) => {
      const [pair] = buildHardNegatives(s, options({ format: 1 }, salt)).pairs;
      const rejected = pair!.rejected[0]!;
      if (rejected.tool_calls !== undefined) return breakage(pair!.chosen[0]!, rejected);
      expect(rejected.content!.startsWith(`${said}\n\n`)).toBe(true);
      expect(JSON.parse(rejected.content!.slice(said.length + 2))).toEqual({
        name: 'search_directory',
        arguments: { company: 'Globo Gym' },
      });
      return 'as text';
    });
    expect(kinds).toContain('as text');
  });
});

describe('off-topic negatives', () => {
  it('replace an assistant turn with text that shares no word of four or more letters with the domain', () => {
    const domain = new Set([
      'call',
      'calls',
      'phone',
      'account',
      'request',
      'requests',
      'company',
      'companies',
      'department',
      'number',
      'form',
      'directory',
      'reference',
      'user',
      'help',
      'auth',
      'verify',
      'identity',
      'billing',
      'refund',
      'cancel',
      'order',
      'policy',
      'email',
      'done',
      'complete',
      'search',
      'finish',
      'representative',
      'customer',
      'service',
    ]);
    for (const s of sample)
      for (const m of s.messages)
        for (const w of wordsOf(`${m.content ?? ''} ${JSON.stringify(m.tool_calls ?? [])}`)) domain.add(w);
    const found = pairsOf('off_topic', 200);
    expect(found).toHaveLength(200);
    const texts = new Set<string>();
    const turns = new Set<number>();
    for (const { pair } of found) {
      const [reply] = pair.rejected;
      expect(reply!.tool_calls).toBeUndefined();
      expect([...wordsOf(reply!.content!)].filter((w) => domain.has(w))).toEqual([]);
      texts.add(reply!.content!);
      turns.add(pair.prompt.length);
    }
    expect(texts.size).toBeGreaterThanOrEqual(8);
    expect(turns.size).toBeGreaterThan(5); // any assistant turn, not always the same one
  });
});

describe('verbose negatives', () => {
  it('pad the last text reply to at least 2.5 times its length with filler and no new digits', () => {
    const found = pairsOf('verbose', 200);
    expect(found).toHaveLength(200);
    for (const { session: s, pair } of found) {
      const k = s.messages.findLastIndex((m) => m.role === 'assistant' && (m.content?.length ?? 0) >= 20);
      expect(pair.prompt).toHaveLength(k);
      const original = pair.chosen[0]!.content!;
      const padded = pair.rejected[0]!.content!;
      expect(padded).toContain(original);
      expect(padded.length).toBeGreaterThanOrEqual(2.5 * original.length);
      expect(padded.length).toBeGreaterThanOrEqual(original.length + 200);
      expect(digitsOf(padded.replace(original, ''))).toBe('');
    }
  });

  it('keep the tool calls of the padded turn, and pad even a long reply enough', () => {
    const long = 'I called Globo Gym and asked them to cancel the membership, which they have now confirmed. '.repeat(
      8,
    );
    const calls = [toolCall('c1', 'finish', {})];
    const s = session('long', [SYSTEM, USER, { role: 'assistant', content: long, tool_calls: calls }]);
    const [pair] = buildHardNegatives(s, options({ verbose: 1 })).pairs;
    expect(pair!.rejected[0]!.tool_calls).toEqual(calls);
    expect(pair!.rejected[0]!.content!.length).toBeGreaterThanOrEqual(2.5 * long.length);
  });
});

describe('under-explained negatives', () => {
  it('cut the last reply of 40 or more characters to a terse one, keeping its tool calls', () => {
    const calls = [toolCall('c9', 'finish', {})];
    const s = session('terse', [
      SYSTEM,
      USER,
      {
        role: 'assistant',
        content: 'Your Globo Gym membership is cancelled; the reference is REF-123456.',
        tool_calls: calls,
      },
      { role: 'user', content: 'Thanks!' },
      { role: 'assistant', content: 'You are welcome.' },
    ]);
    const [pair] = buildHardNegatives(s, options({ under_explained: 1 })).pairs;
    expect(pair!.prompt).toEqual(s.messages.slice(0, 2));
    const reply = pair!.rejected[0]!;
    expect(reply.tool_calls).toEqual(calls);
    expect(reply.content!.length).toBeLessThanOrEqual(25);
    expect(digitsOf(reply.content!)).toBe('');
  });

  it('make the final summary of real sessions terse', () => {
    const found = pairsOf('under_explained', 200);
    expect(found).toHaveLength(200);
    for (const { pair } of found) {
      expect(pair.chosen[0]!.content!.length).toBeGreaterThanOrEqual(40);
      expect(pair.rejected[0]!.content!.length).toBeLessThanOrEqual(25);
      expect(digitsOf(pair.rejected[0]!.content!)).toBe('');
      expect(pair.rejected[0]!.tool_calls).toEqual(pair.chosen[0]!.tool_calls);
    }
  });
});

describe('repeated-call negatives', () => {
  const call = (id: string, auth: Record<string, string>) =>
    toolCall(id, 'call', { phone_number: '1-800-555-0100', auth, request: 'Cancel my membership.' });
  const retried = session('retry', [
    SYSTEM,
    USER,
    { role: 'assistant', content: null, tool_calls: [call('c1', { account_number: '1234-5678' })] },
    { role: 'tool', tool_call_id: 'c1', content: 'Globo Gym here. I need your ZIP code.' },
    { role: 'assistant', content: null, tool_calls: [call('c2', { account_number: '1234-5678', zip_code: '90210' })] },
    { role: 'tool', tool_call_id: 'c2', content: 'Done. Your reference number is REF-123456.' },
    { role: 'assistant', content: 'Your Globo Gym membership is cancelled: REF-123456.' },
  ]);

  it('make the retry that added what the tool asked for with the arguments of the call before it, keeping its id', () => {
    const [pair] = buildHardNegatives(retried, options({ repeated_call: 1 })).pairs;
    expect(pair!.prompt).toEqual(retried.messages.slice(0, 4));
    expect(pair!.chosen).toEqual([retried.messages[4]]);
    const [rejected] = pair!.rejected[0]!.tool_calls!;
    expect(rejected!.id).toBe('c2');
    expect(rejected!.function.arguments).toBe(retried.messages[2]!.tool_calls![0]!.function.arguments);
  });

  it('leave alone a call to the same tool for something else (most arguments changed), saying why', () => {
    const other = session('next', [
      ...retried.messages.slice(0, 4),
      {
        role: 'assistant',
        content: null,
        tool_calls: [toolCall('c2', 'call', { phone_number: '1-800-555-0199', auth: {}, request: 'Refund me.' })],
      },
    ]);
    const built = buildHardNegatives(other, options({ repeated_call: 1 }));
    expect(built.pairs).toEqual([]);
    expect(built.skipped[0]!.reason).toMatch(/no tool call retries the call before it/);
  });

  it('take retries from real sessions, each keeping most arguments of the call it repeats', () => {
    const found = pairsOf('repeated_call', 300);
    expect(found.length).toBeGreaterThan(30);
    for (const { pair } of found) {
      const prompt = pair.prompt;
      const before = prompt.findLast((m) => m.role === 'assistant' && m.tool_calls?.length)!.tool_calls!;
      const [changed] = pair.rejected[0]!.tool_calls!.filter(
        (c, i) => c.function.arguments !== pair.chosen[0]!.tool_calls![i]!.function.arguments,
      );
      expect(before.map((c) => c.function.arguments)).toContain(changed!.function.arguments);
    }
  });
});
