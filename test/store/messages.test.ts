// The pairs stage reads its sessions' messages as stored (stages/layout.ts: StoredMessages, StoredSession) and
// writes each pair's sides as where they lie in those sessions. Pinned here: every line is JSON.stringify of
// the pair, its sides pointing at the right messages, which readPairs gives back as the pair the sessions
// make, whatever the sessions' text holds; a line not shaped as ingest writes it is read all the same; equal
// bytes and equal messages agree.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it, vi } from 'vitest';
import { LineBuffer, readJsonl } from '../../pipeline/jsonl.ts';
import { StoredMessages, readStoredSession, type PairSide } from '../../store/messages.ts';
import { PAIR_FIELDS, bucketOptions } from '../../pairing/bucket.ts';
import type { CandidatePair, Message, Session, SplitSession } from '../../core/records.ts';
import { PREFAB_TEMPLATES, readTemplates } from '../../pairing/templates.ts';
import { engineFor, jsonl, splitLines, tempDir, wholePairs } from '../fixtures/pipeline.ts';

const SAMPLE = join(import.meta.dirname, '../../data/sample/sessions.jsonl.gz');

/** Text that JSON escapes, or that looks like the markers the reader finds messages by. */
const ODD = [
  'quote " and \\ backslash',
  'tab\tnew\nline',
  'ünïcödé — ✓ 😀',
  '{"role":"user","content":"x"}',
  '],"reward":1,"feedback":null',
  ',"metadata":"x","split":"test"',
  'bell \u0007 and \u2028',
];

function lines(path: string): string[] {
  return readFileSync(path, 'utf8').split('\n').filter(Boolean);
}

describe('pairs written from their sessions as stored', () => {
  it('writes every pair as JSON.stringify of the pair its sessions make, its sides where they lie in them, odd text and metadata included', async () => {
    const dir = tempDir();
    const sessions: Session[] = [];
    for await (const s of readJsonl<Session>(SAMPLE)) if (sessions.push(s) === 300) break;
    // Odd text in turns, ids, tasks and metadata, which the pairs' lines must carry over as JSON writes it.
    sessions.forEach((s, i) => {
      const odd = ODD[i % ODD.length]!;
      if (i % 3 === 0) s.messages[1] = { ...s.messages[1]!, content: `${s.messages[1]!.content} ${odd}` };
      if (i % 4 === 0) s.metadata = JSON.stringify({ ...JSON.parse(s.metadata), note: odd });
      if (i % 5 === 0) s.session_id = `${s.session_id} ${odd}`;
      if (i % 7 === 0) s.task_id = `${s.task_id} ${odd}`;
    });
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(sessions));
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\nsplit:\n  bucket_size: 64\n').run({ until: 'pairs' });

    const bySession = new Map<string, SplitSession>();
    for (const line of await splitLines(dir)) {
      const s = JSON.parse(line) as SplitSession;
      bySession.set(s.session_id, s);
    }
    let outcome = 0;
    let hardNegative = 0;
    const lying = (session: string, from: number, to: number): PairSide =>
      to > from ? { session_id: session, messages: [from, to] } : [];
    for (const side of ['train', 'test']) {
      const stored = lines(join(dir, 'workspace', 'pairs', `${side}.jsonl`));
      const read = await wholePairs<CandidatePair<PairSide>>(dir, 'pairs', side);
      expect(read).toHaveLength(stored.length);
      for (const [i, line] of stored.entries()) {
        const kept = JSON.parse(line) as CandidatePair<PairSide>;
        expect(JSON.stringify(kept)).toBe(line);
        // Every field of a Pair, in its order, then the metadata.
        expect(Object.keys(kept)).toEqual([...Object.keys(PAIR_FIELDS), 'metadata']);
        const pair = read[i]!;
        expect({ ...pair, prompt: kept.prompt, chosen: kept.chosen, rejected: kept.rejected }).toEqual(kept);
        const chosen = bySession.get(
          pair.source === 'outcome' ? pair.chosen_session_id : pair.chosen_session_id.split('~')[0]!,
        )!;
        expect(pair.metadata).toBe(chosen.metadata);
        expect(pair.split).toBe(side);
        if (pair.source === 'outcome') {
          outcome++;
          const rejected = bySession.get(pair.rejected_session_id)!;
          const n = pair.prompt.length;
          expect([kept.prompt, kept.chosen, kept.rejected]).toEqual([
            lying(chosen.session_id, 0, n),
            lying(chosen.session_id, n, chosen.messages.length),
            lying(rejected.session_id, n, rejected.messages.length),
          ]);
          expect([...pair.prompt, ...pair.chosen]).toEqual(chosen.messages);
          expect([...pair.prompt, ...pair.rejected]).toEqual(rejected.messages);
          expect(pair.chosen[0]).not.toEqual(pair.rejected[0]);
        } else {
          hardNegative++;
          const original = bySession.get(pair.chosen_session_id) ?? bySession.get(pair.rejected_session_id)!;
          const at = pair.prompt.length;
          expect(pair.prompt).toEqual(original.messages.slice(0, at));
          const [turn, made] =
            pair.chosen_session_id === original.session_id
              ? (['chosen', 'rejected'] as const)
              : (['rejected', 'chosen'] as const);
          expect(pair[turn]).toEqual([original.messages[at]]);
          // The original turn points at the session; the turn made anew is written whole.
          expect([kept.prompt, kept[turn]]).toEqual([
            lying(original.session_id, 0, at),
            lying(original.session_id, at, at + 1),
          ]);
          expect(kept[made]).toEqual(pair[made]);
          expect(Array.isArray(kept[made]) && kept[made].length).toBe(1);
        }
      }
    }
    expect(outcome).toBeGreaterThan(50);
    expect(hardNegative).toBeGreaterThan(100);
  });

  it('names the file, the line and the session where a pair points at messages split does not hold', async () => {
    const dir = tempDir();
    const sessions: Session[] = [];
    for await (const s of readJsonl<Session>(SAMPLE)) if (sessions.push(s) === 60) break;
    writeFileSync(join(dir, 'logs.jsonl'), jsonl(sessions));
    await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\nsplit:\n  test_ratio: 0\n').run({ until: 'pairs' });
    const file = join(dir, 'workspace', 'pairs', 'train.jsonl');
    const stored = lines(file);
    expect(stored.length).toBeGreaterThan(2);
    const whole = await wholePairs(dir, 'pairs');
    const second = JSON.parse(stored[1]!) as CandidatePair<PairSide>;
    const side = second.chosen as { session_id: string; messages: [number, number] };
    expect(side.session_id).toBe(second.chosen_session_id.split('~')[0]);
    const length = sessions.find((s) => s.session_id === side.session_id)!.messages.length;
    const broken = (chosen: PairSide) =>
      writeFileSync(file, [stored[0], JSON.stringify({ ...second, chosen }), ...stored.slice(2)].join('\n') + '\n');

    broken({ session_id: 'nobody', messages: side.messages });
    await expect(wholePairs(dir, 'pairs')).rejects.toThrow(
      new RegExp(
        `train\\.jsonl line 2: pair ${second.pair_id} points at session nobody in .*train-\\d+\\.jsonl, which is not there; .*run \`prefab stage pairs\``,
      ),
    );
    broken({ session_id: side.session_id, messages: [side.messages[0], length + 1] });
    await expect(wholePairs(dir, 'pairs')).rejects.toThrow(
      `which has ${length} messages, not messages ${side.messages[0]} to ${length + 1}`,
    );
    broken(side);
    expect(await wholePairs(dir, 'pairs')).toEqual(whole);
  });

  it('reads a line not shaped as ingest writes it by parsing it whole', () => {
    const s: SplitSession = {
      session_id: 's1',
      task_id: 'T',
      reward: 0.8,
      feedback: null,
      model: null,
      source: 'x',
      created_at: null,
      messages: [
        { role: 'user', content: 'hi' },
        {
          role: 'assistant',
          content: null,
          tool_calls: [{ id: 'c', type: 'function', function: { name: 'finish', arguments: '{}' } }],
        },
      ],
      metadata: '{"a":"\\"quoted\\""}',
      split: 'test',
      task_match: null,
    };
    const canonical = readStoredSession(Buffer.from(JSON.stringify(s)));
    const spaced = readStoredSession(Buffer.from(JSON.stringify(s, null, 1).replace(/\n/g, '')));
    const { split, ...rest } = s;
    const reordered = readStoredSession(Buffer.from(JSON.stringify({ split, ...rest })));
    for (const read of [canonical, spaced, reordered]) {
      expect({
        id: read.session_id,
        task: read.task_id,
        reward: read.reward,
        side: read.split,
        metadata: read.metadata,
      }).toEqual({ id: 's1', task: 'T', reward: 0.8, side: 'test', metadata: s.metadata });
      expect(read.messages.all()).toEqual(s.messages);
      expect(read.messages.hasToolCalls(1)).toBe(true);
      expect(read.messages.hasToolCalls(0)).toBe(false);
      expect([read.messages.sideJson(), read.messages.slice(1).sideJson(), read.messages.slice(2).sideJson()]).toEqual([
        '{"session_id":"s1","messages":[0,2]}',
        '{"session_id":"s1","messages":[1,2]}',
        '[]',
      ]);
      expect(StoredMessages.of(read.messages.all()).sideJson()).toBe(JSON.stringify(s.messages));
      const out = new LineBuffer(64);
      read.writeMetadata(out);
      out.end();
      expect(Buffer.from(out.take()).toString('utf8')).toBe(`${JSON.stringify(s.metadata)}\n`);
    }
  });

  it('finds the messages when first asked for, parses whole a list whose messages are not each `{"role":…` after a comma, and reads them again once forgotten', () => {
    const line = (messages: unknown[]) =>
      Buffer.from(
        JSON.stringify({
          session_id: 'n',
          task_id: 't',
          messages,
          reward: 1,
          feedback: null,
          model: null,
          source: 's',
          created_at: null,
          metadata: '{}',
          split: 'train',
          task_match: null,
        }),
      );
    // A message holding an object that starts like one: the list is parsed whole, every message kept apart.
    const nested = [
      { role: 'user', content: 'hi', extra: { role: 'tool' } },
      { role: 'assistant', content: 'ok' },
    ];
    const read = readStoredSession(line(nested));
    expect(read.messages.all()).toEqual(nested);
    expect(read.messages.slice(1).sideJson()).toBe('{"session_id":"n","messages":[1,2]}');
    // Forgotten messages are found again, the same.
    const plain = readStoredSession(
      line([
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: 'ok' },
      ]),
    );
    const before = { all: plain.messages.all(), side: plain.messages.slice(1).sideJson() };
    plain.forgetMessages();
    expect({ all: plain.messages.all(), side: plain.messages.slice(1).sideJson() }).toEqual(before);
    expect(before.side).toBe('{"session_id":"n","messages":[1,2]}');
  });

  it('tells a must-decline session by its metadata without patterns, spelt out or in \\u escapes, and parses no other', () => {
    const session = (metadata: Record<string, unknown> | string, id = 's') =>
      readStoredSession(
        Buffer.from(
          JSON.stringify({
            session_id: id,
            task_id: 't',
            messages: [{ role: 'user', content: 'cancel my order' }],
            reward: 1,
            feedback: null,
            model: null,
            source: 's',
            created_at: null,
            metadata: typeof metadata === 'string' ? metadata : JSON.stringify(metadata),
            split: 'train',
            task_match: null,
          }),
        ),
      );
    const cfg = {
      outcome: { enabled: true, success_min: 1, failure_max: 0, max_pairs_per_task: null },
      steps: { enabled: false, margin: 0.5, min_visits: 1 },
      hard_negatives: { enabled: true, from_min_reward: 1, ratios: {}, salt: 'x', rewriter: { ratios: {} } },
      templates: readTemplates(PREFAB_TEMPLATES),
    };
    const plain = bucketOptions({ ...cfg, must_decline: [] }, null).mustDecline;
    const escaped = session('{"\\u006dust_decline":true}');
    expect(escaped.metadataMayHold('must_decline')).toBe(true);
    expect(
      [
        session({ must_decline: true }),
        escaped,
        session({ must_decline: false }),
        session({ trial: 1 }),
        session('{"note":"must_decline"}'),
      ].map(plain),
    ).toEqual([true, true, false, false, false]);
    expect(session({ trial: 1 }).metadataMayHold('must_decline')).toBe(false);
    // With patterns, the user's turns decide too.
    expect(bucketOptions({ ...cfg, must_decline: ['cancel'] }, null).mustDecline(session({ trial: 1 }))).toBe(true);
  });

  it("reads a turn's call arguments from its bytes as the parsed message holds them", () => {
    const call = (id: string, name: string, args: string) => ({
      id,
      type: 'function' as const,
      function: { name, arguments: args },
    });
    const messages: Message[] = [
      { role: 'user', content: 'call 555-0100 for me' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          call('c1', 'search_directory', '{"company":"Acme"}'),
          call('c2', 'call', '{"phone_number":"1-800-555-0199"}'),
        ],
      },
      {
        role: 'assistant',
        content: 'text that says ,"tool_calls":[{"id":"x"',
        name: 'bot',
        tool_calls: [call('c"3', 'call', '{"phone_number":"\\u0031\\u0032\\u0033","note":"ünï \\"q\\" ✓"}')],
      },
      { role: 'assistant', content: 'no calls here' },
      { role: 'tool', content: 'REF-123456', tool_call_id: 'c2' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [call('c4', 'finish', '{}'), call('c5', 'call', 'not json 12 3')],
      },
    ];
    const line = Buffer.from(
      JSON.stringify({
        session_id: 'a',
        task_id: 't',
        messages,
        reward: 1,
        feedback: null,
        model: null,
        source: 's',
        created_at: null,
        metadata: '{}',
        split: 'train',
        task_match: null,
      }),
    );
    const every = messages.map((m) => m.tool_calls?.map((c) => c.function.arguments) ?? []);
    expect(messages.map((_, i) => readStoredSession(line).messages.callArguments(i))).toEqual(every);
    expect(messages.map((_, i) => StoredMessages.of(messages).callArguments(i))).toEqual(every);
    expect(readStoredSession(line).messages.slice(1).callArguments(0)).toEqual(every[1]);
    // A call not written as ingest writes it (its keys in another order) is read from the parsed message.
    const reordered = Buffer.from(
      line.toString('utf8').replace('{"id":"c4","type":"function"', '{"type":"function","id":"c4"'),
    );
    expect(readStoredSession(reordered).messages.callArguments(5)).toEqual(every[5]);
    // Calls written as ingest writes them are read without parsing their message.
    const parsed = vi.spyOn(JSON, 'parse');
    try {
      const stored = readStoredSession(line).messages;
      expect(messages.map((_, i) => stored.callArguments(i))).toEqual(every);
      expect(parsed.mock.calls.filter(([text]) => typeof text === 'string' && text.startsWith('{"role":'))).toEqual([]);
    } finally {
      parsed.mockRestore();
    }
  });

  it('takes equal bytes for equal messages, and compares messages made anew with those read', () => {
    const messages: Message[] = [
      { role: 'system', content: 'be brief' },
      { role: 'user', content: 'ünï "q"' },
      { role: 'assistant', content: 'ok', name: 'bot' },
    ];
    const line = (m: Message[]) =>
      Buffer.from(
        JSON.stringify({
          session_id: 'a',
          task_id: 't',
          messages: m,
          reward: 1,
          feedback: null,
          model: null,
          source: 's',
          created_at: null,
          metadata: '{}',
          split: 'train',
          task_match: null,
        }),
      );
    const a = readStoredSession(line(messages)).messages;
    const b = readStoredSession(line([...messages.slice(0, 2), { role: 'assistant', content: 'no' }])).messages;
    expect([0, 1, 2].map((i) => a.same(i, b, i))).toEqual([true, true, false]);
    const made = StoredMessages.of(messages);
    expect([0, 1, 2].map((i) => a.same(i, made, i))).toEqual([true, true, true]);
    expect(a.slice(1).same(0, b, 1)).toBe(true);
    expect(a.slice(0, 2).jsonIncludes('"q\\"')).toBe(true);
    expect(a.slice(2).jsonIncludes('"q\\"')).toBe(false);
  });
});
