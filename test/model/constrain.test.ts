import { beforeAll, describe, expect, it } from 'vitest';
import { TOOLS } from '../../env/env.ts';
import { ToolCallConstraint, readCall, readHermesCall, readJson, type JsonSchema } from '../../model/constrain.ts';
import { openDevice } from '../../runtime/device.ts';
import { KVCache } from '../../runtime/decode.ts';
import { Llama } from '../../model/llama.ts';
import { tinyLlama } from '../fixtures/llama.ts';

const FORM: JsonSchema = TOOLS[1].function.parameters as JsonSchema;
const CALL: JsonSchema = TOOLS[2].function.parameters as JsonSchema;

/** Every prefix of a text reads as partial, and the whole as `whole`. */
function prefixes(schema: JsonSchema, text: string): Set<string> {
  return new Set(Array.from({ length: text.length }, (_, i) => readJson(schema, text.slice(0, i + 1))).slice(0, -1));
}

beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
});

describe('reading JSON against a schema, a token at a time', () => {
  it("reads every prefix of the environment's own calls as partial, and each call as complete", () => {
    const form = '{"fields":["account_number","last_4_ssn","zip_code"]}';
    const call =
      '{"phone_number":"[PHONE_3]","auth":{"account_number":"[ACCOUNT_1]","pin":"4\\"2\\u00e9"},"request":"I\'d like to cancel. Ref: REF-000123."}';
    expect(prefixes(FORM, form)).toEqual(new Set(['partial']));
    expect(readJson(FORM, form)).toBe('complete');
    expect(prefixes(CALL, call)).toEqual(new Set(['partial']));
    expect(readJson(CALL, call)).toBe('complete');
    expect(readCall(TOOLS, 'finish {}')).toBe('complete');
    expect(readCall(TOOLS, 'search_dir')).toBe('partial');
    expect(readCall(TOOLS, 'search_directory {"company":"Acme"}')).toBe('complete');
    const hermes = `{"name":"call","arguments":${call}}`;
    expect(new Set(Array.from(hermes.slice(0, -1), (_, i) => readHermesCall(TOOLS, hermes.slice(0, i + 1))))).toEqual(
      new Set(['partial']),
    );
    expect(readHermesCall(TOOLS, hermes)).toBe('complete');
    expect(readHermesCall(TOOLS, '{"name":"finish","arguments":{}}')).toBe('complete');
  });

  it('refuses a Hermes call with a name no tool has, arguments its schema refuses, or anything after its close', () => {
    expect(readHermesCall(TOOLS, '{"name":"search_phone')).toBe('invalid');
    expect(readHermesCall(TOOLS, '{"name":"finish","arguments":{}}}')).toBe('invalid');
    expect(readHermesCall(TOOLS, '{"name":"finish","arguments":{}},')).toBe('invalid');
    expect(readHermesCall(TOOLS, '{"name":"finish","arguments":{"x":1}}')).toBe('invalid');
    expect(readHermesCall(TOOLS, '{"arguments":{},"name":"finish"}')).toBe('invalid'); // name first, as rendered
    expect(readHermesCall(TOOLS, '{"name": "finish"')).toBe('invalid'); // compact, as rendered
  });

  it('refuses, as soon as they cannot become valid, names no tool has, fields outside an enum, missing required keys, repeated keys and bad JSON', () => {
    expect(readCall(TOOLS, 'search_phone')).toBe('invalid');
    expect(readCall(TOOLS, 'auth_number {')).toBe('invalid');
    expect(readJson(FORM, '{"fields":["zip_4')).toBe('invalid'); // no field starts so
    expect(readJson(FORM, '{"fields":["zip_')).toBe('partial');
    expect(readJson(FORM, '{"fields":["zip"]')).toBe('invalid'); // a prefix of zip_code, but not a field
    expect(readJson(FORM, '{"fieldz"')).toBe('invalid'); // the form's object allows only its properties
    expect(readJson(CALL, '{"phone_number":"1","auth":{"zip_number"')).toBe('invalid'); // auth keys are field names
    expect(readJson(CALL, '{"phone_number":"1","auth":{},"request":"x"}')).toBe('complete');
    expect(readJson(CALL, '{"phone_number":"1","auth":{}}')).toBe('invalid'); // request is required
    expect(readJson(CALL, '{"phone_number":"1","phone_number"')).toBe('invalid');
    expect(readJson(CALL, '{"phone_1]"')).toBe('invalid');
    expect(readJson(CALL, '{"phone_number":"1"}}')).toBe('invalid');
    expect(readJson(CALL, '{"phone_number": "1"')).toBe('invalid'); // compact JSON, as calls are rendered
    expect(readJson(CALL, '{"request":"a\nb')).toBe('invalid'); // a raw control character in a string
  });

  it('reads numbers, literals and untyped values', () => {
    const schema: JsonSchema = {
      type: 'object',
      properties: { n: { type: 'number' }, i: { type: 'integer' }, b: { type: 'boolean' }, x: {} },
    };
    expect(readJson(schema, '{"n":-1.5e+3,"i":42,"b":false,"x":[null,{"k":"v"},true,0.5]}')).toBe('complete');
    for (const p of ['{"n":-', '{"n":1.', '{"n":1e+', '{"b":fa', '{"x":[nu'])
      expect(readJson(schema, p), p).toBe('partial');
    for (const p of ['{"n":01,', '{"i":1.5,', '{"b":fx', '{"n":1.}', '{"x":[nul]'])
      expect(readJson(schema, p), p).toBe('invalid');
  });
});

describe('decoding under the constraint', () => {
  // A vocabulary of single characters and a few words, so that a random model can write anything.
  const chars = [...new Set('abcdefghijklmnopqrstuvwxyz_0123456789{}[]":, ')];
  const marks = ['<|assistant|>', '<|end|>', '<|user|>', '<tool_call>', '</tool_call>', '<|call|>'];
  const texts = [
    ...chars,
    'search_directory',
    'call',
    '"fields"',
    '"phone_number"',
    '{"name":',
    ',"arguments":',
    ...marks,
  ];
  const id = (t: string) => texts.indexOf(t);
  const ids = (...parts: string[]) => parts.map(id);
  const [end, user, open, close, legacy] = ['<|end|>', '<|user|>', '<tool_call>', '</tool_call>', '<|call|>'].map(
    id,
  ) as [number, number, number, number, number];
  const hermesTokens = { calls: { format: 'hermes' as const, open, close }, end, control: marks.slice(0, 5).map(id) };
  const legacyTokens = {
    calls: { format: 'legacy' as const, open: legacy },
    end,
    control: [...marks.slice(0, 3), '<|call|>'].map(id),
  };

  it('lets content be free text, allows a Hermes call to close only once it is complete, and then only another call or the end', () => {
    const constraint = new ToolCallConstraint(TOOLS, texts, hermesTokens);
    expect(constraint.allows(ids('a', ' '), id('}'))).toBe(true);
    expect(constraint.allows(ids('a'), close)).toBe(false); // no call is open
    const writing = [open, ...ids('{"name":', '"', 's', 'e', 'a', 'r', 'c', 'h', '_')];
    expect(constraint.allows(writing, id('d'))).toBe(true);
    expect(constraint.allows(writing, id('x'))).toBe(false);
    expect(constraint.allows(writing, close)).toBe(false);
    expect(constraint.allows(writing, end)).toBe(false);
    const finish = [open, ...ids('{"name":', '"', 'f', 'i', 'n', 'i', 's', 'h', '"', ',"arguments":', '{', '}')];
    expect(constraint.allows(finish, close)).toBe(false); // the object around name and arguments is open
    expect(constraint.allows([...finish, id('}')], close)).toBe(true);
    expect(constraint.allows([...finish, id('}')], end)).toBe(false);
    const after = [...finish, id('}'), close];
    expect([end, open].map((c) => constraint.allows(after, c))).toEqual([true, true]);
    expect([id('a'), id(' '), close, user].map((c) => constraint.allows(after, c))).toEqual([
      false,
      false,
      false,
      false,
    ]);
    const none = new ToolCallConstraint(TOOLS, texts, hermesTokens, 'none');
    expect(none.allows([], open)).toBe(false);
    const required = new ToolCallConstraint(TOOLS, texts, hermesTokens, 'required');
    expect([open, id('a')].map((c) => required.allows([], c))).toEqual([true, false]);
  });

  it('lets a legacy call end at the next call or the end, once it is complete', () => {
    const constraint = new ToolCallConstraint(TOOLS, texts, legacyTokens);
    const writing = [legacy, ...ids('search_directory', ' ', '{', '"', 'c')];
    expect(constraint.allows(writing, end)).toBe(false);
    expect(constraint.allows(writing, id('o'))).toBe(true);
    expect(constraint.allows(writing, id('x'))).toBe(false);
    expect(constraint.allows(writing, user)).toBe(false);
    const finish = [legacy, ...ids('f', 'i', 'n', 'i', 's', 'h', ' ', '{', '}')];
    expect(constraint.allows(finish, end)).toBe(true);
    expect(constraint.allows(finish, legacy)).toBe(true);
    expect(constraint.allows(finish, id(' '))).toBe(false);
  });

  it("makes an untrained model's sampled calls parse as calls of the tools, in either format", () => {
    const model = Llama.create(tinyLlama({ vocabSize: texts.length, maxPositions: 400, layers: 1 }), 'constrained');
    const cache = new KVCache(model);
    const text = (out: number[]) => out.map((i) => texts[i]).join('');
    const calls = { hermes: 0, legacy: 0 };
    for (const tokens of [hermesTokens, legacyTokens]) {
      const constraint = new ToolCallConstraint(TOOLS, texts, tokens);
      for (let episode = 0; episode < 6; episode++) {
        let seed = episode + 1;
        const random = () => (seed = (seed * 16807) % 2147483647) / 2147483647;
        // Start inside a call: from there on every token must keep it a call of a tool.
        const out = cache.generate([id('<|assistant|>'), tokens.calls.open], {
          maxTokens: 300,
          temperature: 1.5,
          topP: 1,
          random,
          stop: [end],
          constraint: { allows: (g, c) => constraint.allows([tokens.calls.open, ...g], c) },
        });
        // One or more calls, and the message ends at <|end|> or at maxTokens.
        const ended = out.at(-1) === end;
        const body = out.filter((i) => i !== end);
        if (tokens.calls.format === 'hermes') {
          // call</tool_call><tool_call>call</tool_call>…: split at the opens, each but an unfinished last closed.
          const segments = text([open, ...body])
            .split('<tool_call>')
            .slice(1);
          for (const [k, segment] of segments.entries()) {
            const last = k === segments.length - 1;
            if (last && !ended && !segment.endsWith('</tool_call>')) {
              expect(readHermesCall(TOOLS, segment), segment).not.toBe('invalid');
              continue;
            }
            expect(segment.endsWith('</tool_call>'), segment).toBe(true);
            expect(readHermesCall(TOOLS, segment.slice(0, -'</tool_call>'.length)), segment).toBe('complete');
            calls.hermes++;
          }
        } else {
          const segments = text(body).split('<|call|>');
          for (const [k, segment] of segments.entries()) {
            const last = k === segments.length - 1;
            expect(readCall(TOOLS, segment), segment).toBe(last && !ended ? 'partial' : 'complete');
            if (!last || ended) calls.legacy++;
          }
        }
      }
    }
    expect(calls.hermes).toBeGreaterThan(0);
    expect(calls.legacy).toBeGreaterThan(0);
    model.dispose();
  });
});
