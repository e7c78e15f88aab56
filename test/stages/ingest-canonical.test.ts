// Ingest keeps a record's messages as stored when they are written exactly as it would write them
// (stages/ingest/canonical.ts), and reads every other record the ordinary way. Whichever way a record is
// read, its session's line is the same: checked here on records written every way a log might be.
import { describe, expect, it } from 'vitest';
import { seeded } from '../../core/random.ts';
import { storedReader } from '../../stages/ingest/canonical.ts';
import { RecordError, toSession, type MappingOptions } from '../../stages/ingest/mapping.ts';
import { writeStoredSession } from '../../stages/ingest/segment.ts';
import { LineBuffer } from '../../pipeline/jsonl.ts';

const MAPPING: MappingOptions = {
  fields: { messages: 'messages', reward: 'reward', feedback: 'feedback', model: 'model', created_at: 'created_at' },
  message: { role: 'role', content: 'content', roles: {} },
  outOfRangeReward: 'reject',
  tools: null,
};

/** The session's line the ordinary way (parse, map, JSON.stringify), or null where the record is bad. */
function ordinaryLine(line: string, o = MAPPING): string | null {
  try {
    return JSON.stringify(toSession(JSON.parse(line), 'logs.jsonl line 1', o));
  } catch (error) {
    if (error instanceof SyntaxError || error instanceof RecordError) return null;
    throw error;
  }
}

/** The session's line read keeping the messages as stored, or null where the reader leaves it to the ordinary way. */
function storedLine(line: string | Buffer, o = MAPPING): string | null {
  const bytes = Buffer.isBuffer(line) ? line : Buffer.from(line);
  const read = storedReader(o, 16_000_000, () => false)!(bytes, 0, bytes.length, 'logs.jsonl line 1');
  if (!read) return null;
  const out = new LineBuffer(64);
  writeStoredSession(out, read.session, read.messages);
  return Buffer.from(out.take()).toString('utf8').slice(0, -1);
}

const call = (id: string, name: string, args: string) => ({
  id,
  type: 'function',
  function: { name, arguments: args },
});

/** A session as a Node program logs it: every message as the mapping writes it. */
function record(i: number, text: string) {
  return {
    session_id: `s-${i}`,
    task_id: i % 7 === 0 ? null : `T${i % 5}`,
    messages: [
      { role: 'system', content: 'You phone companies.' },
      { role: 'user', content: text, ...(i % 3 === 0 ? { name: 'ana' } : {}) },
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          call('c1', 'search_directory', JSON.stringify({ company: text.slice(0, 12) })),
          ...(i % 4 === 0 ? [call('c2', 'finish', '{}')] : []),
        ],
      },
      { role: 'tool', content: JSON.stringify({ phone: '1-800-555-0101', note: text }), tool_call_id: 'c1' },
      { role: 'assistant', content: `Done: ${text}` },
    ],
    reward: (i % 11) / 10,
    feedback: i % 2 ? null : `feedback ${text}`,
    model: 'agent-v2',
    created_at: i % 5 === 0 ? 1767225600 + i : '2026-01-01T00:00:00.000Z',
    metadata: JSON.stringify({ trial: i, note: text }),
    source: 'the logger',
    extra: { nested: [i, { deep: text }] },
  };
}

/** JSON as Python's json.dumps writes it by default: ", " and ": " between tokens. */
function pythonJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(pythonJson).join(', ')}]`;
  if (value !== null && typeof value === 'object')
    return `{${Object.entries(value)
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => `${JSON.stringify(k)}: ${pythonJson(v)}`)
      .join(', ')}}`;
  return JSON.stringify(value);
}

const TEXTS = [
  'plain',
  'quote " and backslash \\ inside',
  'tab\tnew\nline\r',
  'ünïcödé — ✓ 😀 日本',
  'bell \u0007 escape \u001b del \u007f',
  'line sep \u2028 para \u2029',
  '{"role":"user"} ],"reward": 1',
  '',
];

describe('reading records whose messages are stored as ingest writes them', () => {
  it('keeps the messages of a record written by JSON.stringify as they are, and makes the line the ordinary reading makes', () => {
    for (const [i, text] of TEXTS.entries()) {
      const line = JSON.stringify(record(i, text));
      const expected = ordinaryLine(line);
      expect(expected, text).not.toBeNull();
      expect(storedLine(line), text).toBe(expected);
    }
  });

  it('leaves every other way of writing a record to the ordinary reading, which agrees wherever both read it', () => {
    const base = JSON.stringify(record(1, 'plain text'));
    const variants: Record<string, string | Buffer> = {
      'key order within a message': base
        .replace('{"role":"tool","content":', '{"content":')
        .replace('"tool_call_id":"c1"}', '"tool_call_id":"c1","role":"tool"}'),
      '\\u escapes of plain characters': base.replace('plain text', 'pl\\u0061in text'),
      'an escaped slash': base.replace('phone companies.', 'phone companies\\/firms.'),
      'a lone surrogate': base.replace('plain text', 'plain \\ud800 text'),
      'content parts': base.replace(
        '"content":"You phone companies."',
        '"content":[{"type":"text","text":"You phone "},{"type":"text","text":"companies."}]',
      ),
      'arguments as an object': base.replace(
        /"arguments":"\{\\"company\\":\\"plain text\\"\}"/,
        '"arguments":{"company":"plain text"}',
      ),
      'a message key the mapping moves to metadata': base.replace('{"role":"system",', '{"role":"system","weight":1,'),
      'an empty list of tool calls': base.replace(
        '{"role":"system","content":"You phone companies."}',
        '{"role":"system","content":"You phone companies.","tool_calls":[]}',
      ),
      'a null name': base.replace('{"role":"system",', '{"role":"system","name":null,'),
      'a number for a name': base.replace('{"role":"system",', '{"role":"system","name":7,'),
      'a tool call without its type': base.replace(',"type":"function"', ''),
      'an empty function name': base.replace('"name":"search_directory"', '"name":""'),
      'a tool message without tool_call_id': base.replace(',"tool_call_id":"c1"', ''),
      'a role the mapping does not know': base.replace('"role":"system"', '"role":"bot"'),
      'no content key': base.replace('{"role":"system","content":"You phone companies."}', '{"role":"system"}'),
      'empty messages': base.replace(/"messages":\[.*\],"reward"/, '"messages":[],"reward"'),
      'messages twice': base.replace('"reward":', '"messages":[{"role":"user","content":"x"}],"reward":'),
      'a key spelt with an escape': base.replace(
        '"reward":',
        '"mess\\u0061ges":[{"role":"user","content":"x"}],"reward":',
      ),
      'no session id (named by a hash of the messages)': base.replace('"session_id":"s-1",', ''),
      'an empty session id': base.replace('"session_id":"s-1"', '"session_id":""'),
      'a reward out of range': base.replace(/"reward":[0-9.]+/, '"reward":1.5'),
      'a raw control character': base.replace('plain text', 'plain\u0001text'),
      'not JSON after the messages': base.replace('"model":"agent-v2"', '"model":agent-v2'),
      'something after the record': `${base} x`,
      'bytes that are not UTF-8': Buffer.concat([
        Buffer.from(base.slice(0, 100)),
        Buffer.from([0xff, 0xfe]),
        Buffer.from(base.slice(100)),
      ]),
      'a replacement character written as such': base.replace('plain text', 'plain \uFFFD text'),
    };
    for (const [what, variant] of Object.entries(variants)) {
      const text = Buffer.isBuffer(variant) ? variant.toString('utf8') : variant;
      expect(text === base, `${what}: the variant differs from the record`).toBe(false);
      expect(storedLine(variant), what).toBeNull();
    }
  });

  it('keeps messages written with white space between tokens, as Python writes them, and writes them without it', () => {
    for (const [i, text] of TEXTS.filter((t) => /^[\x20-\x7e\t\n\r]*$/.test(t)).entries()) {
      const r = record(i, text);
      // json.dumps(record) in Python: ", " and ": " between tokens, non-ASCII escaped (so only ASCII texts here).
      const python = pythonJson(r);
      expect(python).toContain('", "');
      expect(python).toMatch(/"messages": \[\{"role": "system", "content": /);
      expect(storedLine(python), text).toBe(ordinaryLine(python));
      expect(storedLine(python), text).toBe(ordinaryLine(JSON.stringify(r)));
    }
    const base = JSON.stringify(record(1, 'plain text'));
    for (const spaced of [
      base.replace('"session_id":"s-1","task_id":"T1",', '"session_id": "s-1",  "task_id" : "T1" ,\t'),
      base.replace(/\{"role":/g, '{ "role" :\t'),
      base.replace(/,"content":/g, ' ,\r\n "content":'),
    ]) {
      expect(spaced).not.toBe(base);
      expect(storedLine(spaced)).toBe(ordinaryLine(spaced));
    }
  });

  it('agrees with the ordinary reading on records cut, spliced and shuffled at random', () => {
    const random = seeded('canonical fuzz');
    const lines = TEXTS.map((t, i) => JSON.stringify(record(i, t)));
    let kept = 0;
    for (let n = 0; n < 3000; n++) {
      const line = lines[Math.floor(random() * lines.length)]!;
      const at = Math.floor(random() * line.length);
      const other = lines[Math.floor(random() * lines.length)]!;
      const from = Math.floor(random() * other.length);
      const pieces = [
        line.slice(0, at) +
          other.slice(from, from + Math.floor(random() * 12)) +
          line.slice(at + Math.floor(random() * 4)),
        line.slice(0, at) + line.slice(at + 1),
      ];
      for (const variant of pieces) {
        const stored = storedLine(variant);
        if (stored === null) continue;
        kept++;
        expect(stored, variant).toBe(ordinaryLine(variant));
      }
    }
    expect(kept).toBeGreaterThan(500);
  });

  it('reads the ordinary way with a mapping of other keys, roles or session id templates', () => {
    expect(
      storedReader({ ...MAPPING, fields: { ...MAPPING.fields, messages: 'data.turns' } }, 1e6, () => false),
    ).toBeNull();
    expect(
      storedReader({ ...MAPPING, message: { role: 'from', content: 'value', roles: {} } }, 1e6, () => false),
    ).toBeNull();
    expect(
      storedReader({ ...MAPPING, message: { ...MAPPING.message, roles: { user: 'assistant' } } }, 1e6, () => false),
    ).toBeNull();
    expect(
      storedReader({ ...MAPPING, fields: { ...MAPPING.fields, session_id: '{task_id}-{trial}' } }, 1e6, () => false),
    ).toBeNull();
    // A roles map for names other than OpenAI's changes nothing stored as OpenAI's.
    const sharegpt = {
      ...MAPPING,
      message: { ...MAPPING.message, roles: { human: 'user', gpt: 'assistant' } as MappingOptions['message']['roles'] },
    };
    const line = JSON.stringify(record(3, 'x'));
    expect(storedLine(line, sharegpt)).toBe(ordinaryLine(line, sharegpt));
  });
});
