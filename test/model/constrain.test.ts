import { beforeAll, describe, expect, it } from 'vitest';
import { TOOLS } from '../../env/env.ts';
import { ToolCallConstraint, readCall, readJson, type JsonSchema } from '../../model/constrain.ts';
import { openDevice } from '../../runtime/device.ts';
import { KVCache } from '../../runtime/decode.ts';
import { Llama } from '../../model/llama.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { SPECIAL_TOKENS } from '../../model/tokenizer.ts';

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
  const texts = [...chars, 'search_directory', 'call', '"fields"', '"phone_number"', ...SPECIAL_TOKENS];
  const special = Object.fromEntries(SPECIAL_TOKENS.map((t) => [t, texts.indexOf(t)])) as Record<
    (typeof SPECIAL_TOKENS)[number],
    number
  >;
  const constraint = new ToolCallConstraint(TOOLS, texts, special);

  it('lets content be free text, and allows a call to end only once it is complete', () => {
    const ids = (...parts: string[]) => parts.map((p) => texts.indexOf(p));
    expect(constraint.allows(ids('a', ' '), texts.indexOf('}'))).toBe(true);
    const open = [special['<|call|>'], ...ids('search_directory', ' ', '{', '"', 'c')];
    expect(constraint.allows(open, special['<|end|>'])).toBe(false);
    expect(constraint.allows(open, texts.indexOf('o'))).toBe(true);
    expect(constraint.allows(open, texts.indexOf('x'))).toBe(false);
    expect(constraint.allows(open, special['<|user|>'])).toBe(false);
    const finish = [special['<|call|>'], ...ids('f', 'i', 'n', 'i', 's', 'h', ' ', '{', '}')];
    expect(constraint.allows(finish, special['<|end|>'])).toBe(true);
    expect(constraint.allows(finish, special['<|call|>'])).toBe(true);
    expect(constraint.allows(finish, texts.indexOf(' '))).toBe(false);
  });

  it("makes an untrained model's sampled calls parse as calls of the tools", () => {
    const model = Llama.create(tinyLlama({ vocabSize: texts.length, maxPositions: 400, layers: 1 }), 'constrained');
    const cache = new KVCache(model);
    let calls = 0;
    for (let episode = 0; episode < 6; episode++) {
      let seed = episode + 1;
      const random = () => (seed = (seed * 16807) % 2147483647) / 2147483647;
      // Start inside a call: from there on every token must keep it a call of a tool.
      const out = cache.generate([special['<|assistant|>']!, special['<|call|>']], {
        maxTokens: 300,
        temperature: 1.5,
        topP: 1,
        random,
        stop: [special['<|end|>']],
        constraint: { allows: (g, c) => constraint.allows([special['<|call|>'], ...g], c) },
      });
      // One or more calls: each <|call|> starts the next, and the message ends at <|end|> or at maxTokens.
      const ended = out.at(-1) === special['<|end|>'];
      const segments = out
        .filter((i) => i !== special['<|end|>'])
        .map((i) => (i === special['<|call|>'] ? '\u0000' : texts[i]))
        .join('')
        .split('\u0000');
      for (const [k, text] of segments.entries()) {
        const last = k === segments.length - 1;
        expect(readCall(TOOLS, text), text).toBe(last && !ended ? 'partial' : 'complete');
        if (!last || ended) calls++;
      }
    }
    expect(calls).toBeGreaterThan(0);
    model.dispose();
  });
});
