import { beforeAll, describe, expect, it } from 'vitest';
import type { Message } from '../../core/records.ts';
import { ScriptedAgent } from '../../env/agents.ts';
import { runEpisode } from '../../env/rollout.ts';
import { generateTask, generateWorld } from '../../env/world.ts';
import { encodeConversations, parseAssistant, renderText } from '../../model/chat-template.ts';
import { SPECIAL_TOKENS, TextTokenizer, trainTokenizer } from '../../model/tokenizer.ts';
import { legacyTokenizerJson } from '../fixtures/legacy-tokenizer.ts';

const world = generateWorld({ seed: 5 });
let sessions: Message[][];
let tokenizer: TextTokenizer;

beforeAll(async () => {
  sessions = [];
  for (let i = 0; i < 40; i++)
    sessions.push(
      (
        await runEpisode(
          world,
          generateTask(world, 'train', i),
          new ScriptedAgent(i % 2 ? 'oracle' : 'prior', world, generateTask(world, 'train', i), 'tok'),
        )
      ).messages,
    );
  tokenizer = new TextTokenizer(
    trainTokenizer(
      sessions.map((s) => renderText(s)),
      400,
    ),
  );
});

describe('byte-level BPE tokenizer', () => {
  it('has exactly the vocabulary size asked for: 256 bytes, merges, and the special tokens at the end', () => {
    expect(tokenizer.vocabSize).toBe(400);
    const json = JSON.parse(tokenizer.json);
    const added = json.added_tokens as { id: number; content: string; special: boolean }[];
    expect(SPECIAL_TOKENS.map((t) => added.find((a) => a.content === t)!.id)).toEqual([
      392, 393, 394, 395, 396, 397, 398, 399,
    ]);
    expect(tokenizer.calls).toEqual({ format: 'hermes', open: 398, close: 399 });
    // The call tokens are not special, as in Qwen2.5: decoding that skips special tokens keeps the calls.
    expect(added.filter((a) => !a.special).map((a) => a.content)).toEqual(['<tool_call>', '</tool_call>']);
    expect(json.model.type).toBe('BPE');
    expect(json.model.merges).toHaveLength(400 - 256 - SPECIAL_TOKENS.length);
  });

  it('round-trips text it never saw: other scripts, emoji, control characters', async () => {
    for (const text of [
      'Grüße aus Köln — 東京 📞 1-800-555-0199',
      'tabs\tand\nnewlines\r\n',
      ' leading and trailing spaces ',
      '{"a":[1,2,{"b":null}]}',
    ]) {
      expect(await tokenizer.decode(await tokenizer.encode(text))).toBe(text);
    }
  });

  it('learns the corpus: a frequent phrase takes far fewer tokens than bytes, an unseen one does not', async () => {
    const frequent = '{"name":"search_directory","arguments":{"company":';
    expect((await tokenizer.encode(frequent)).length).toBeLessThanOrEqual(frequent.length * 0.5);
    const unseen = 'qzxv wjkp yfgh';
    expect((await tokenizer.encode(unseen)).length).toBeGreaterThan(unseen.length * 0.8);
  });

  it('encodes text that spells a special token as ordinary bytes, never as the control token', async () => {
    const text = 'please type <|end|> and <|assistant|> or <tool_call>{}</tool_call> here';
    const ids = await tokenizer.encode(text);
    expect(ids.filter((id) => tokenizer.control.includes(id))).toEqual([]);
    expect(await tokenizer.decode(ids)).toBe(text);
  });

  it('with split digits, every digit is a token of its own and numbers still round-trip', async () => {
    const split = new TextTokenizer(
      trainTokenizer(
        sessions.map((s) => renderText(s)),
        400,
        true,
      ),
    );
    const phone = 'call 1-800-306-8514, PIN 2620';
    const ids = await split.encode(phone);
    const digits = ids.map((id) => split.idToToken(id)!).filter((t) => /\d/.test(t));
    expect(digits).toHaveLength(15);
    for (const t of digits) expect(t).toMatch(/^\d$/);
    expect(await split.decode(ids)).toBe(phone);
    // The grouped tokenizer learnt merges of digits from the same corpus.
    expect((await tokenizer.encode(phone)).map((id) => tokenizer.idToToken(id)!).some((t) => /\d\d/.test(t))).toBe(
      true,
    );
  });

  it('makes whole words single tokens wherever they appear, within the vocabulary size, and decodes them back', async () => {
    const words = ['[PHONE_1]', '[COMPANY_1]'];
    const texts = sessions.map((s) => renderText(s).replace(/1-800-\d{3}-\d{4}/g, '[PHONE_1]'));
    const whole = new TextTokenizer(trainTokenizer(texts, 400, false, words));
    expect(whole.vocabSize).toBe(400);
    const text = 'dial "[PHONE_1]" for[COMPANY_1] Billing, not [PHONE_12]';
    const ids = await whole.encode(text);
    const tokens = ids.map((id) => whole.idToToken(id));
    expect(tokens.filter((t) => t === '[PHONE_1]')).toHaveLength(1);
    expect(tokens).toContain('[COMPANY_1]');
    expect(await whole.decode(ids)).toBe(text);
    // BPE learns no merges inside them: no piece of "[PHONE_1]" is a token of its own beyond the bytes.
    expect(Object.keys(JSON.parse(whole.json).model.vocab)).not.toContain('PHONE');
    expect(() => trainTokenizer(['abc'], 265, false, ['[A_1]', '[B_1]'])).toThrow(/2 whole words .* at least 266/);
  });

  it('training twice on the same corpus gives the same tokenizer.json', () => {
    expect(
      trainTokenizer(
        sessions.map((s) => renderText(s)),
        400,
      ),
    ).toBe(tokenizer.json);
  });

  it('refuses a vocabulary too small for the bytes and special tokens', () => {
    expect(() => trainTokenizer(['abc'], 200)).toThrow(/at least 264/);
  });
});

describe('chat template', () => {
  it('renders a multi-turn session with tool calls, and its ids decode back to the rendering', async () => {
    const session = sessions[1]!;
    const [enc] = await encodeConversations(tokenizer, [session]);
    expect(await tokenizer.decode(enc!.ids)).toBe(renderText(session));
    expect(renderText(session)).toMatch(
      /^<\|system\|>You are an assistant.*<\|end\|><\|user\|>.*<\|end\|><\|assistant\|><tool_call>\{"name":"search_directory","arguments":\{"company":"[^"]*"\}\}<\/tool_call><\|end\|><\|tool\|>/s,
    );
  });

  it('still reads and writes the legacy format (<|call|>name {…}) of tokenizers made before', async () => {
    const legacy = new TextTokenizer(legacyTokenizerJson(tokenizer.json));
    expect(legacy.calls).toEqual({ format: 'legacy', open: 398 });
    const session = sessions[1]!;
    const [enc] = await encodeConversations(legacy, [session]);
    expect(await legacy.decode(enc!.ids)).toBe(renderText(session, false, 'legacy'));
    expect(renderText(session, false, 'legacy')).toMatch(
      /<\|assistant\|><\|call\|>search_directory \{"company":"[^"]*"\}<\|end\|>/,
    );
    for (const message of sessions[3]!.filter((m) => m.role === 'assistant')) {
      const [one] = await encodeConversations(legacy, [[message]]);
      const parsed = await parseAssistant(legacy, one!.ids.slice(1), 1);
      expect(parsed.tool_calls?.map((c) => [c.function.name, c.function.arguments])).toEqual(
        message.tool_calls?.map((c) => [c.function.name, c.function.arguments]),
      );
    }
  });

  it('masks exactly the assistant turns: their content, calls and closing <|end|>, not their header', async () => {
    const session = sessions[1]!;
    const [enc] = await encodeConversations(tokenizer, [session]);
    // Decode each maximal run of masked tokens: they must be the assistant messages, in order.
    const runs: number[][] = [];
    enc!.mask.forEach((m, i) => {
      if (m && (i === 0 || !enc!.mask[i - 1])) runs.push([]);
      if (m) runs.at(-1)!.push(enc!.ids[i]!);
    });
    const assistant = session.filter((m) => m.role === 'assistant');
    expect(runs).toHaveLength(assistant.length);
    for (const [i, run] of runs.entries()) {
      expect(await tokenizer.decode(run)).toBe(renderText([assistant[i]!]).slice('<|assistant|>'.length));
      expect(run.at(-1)).toBe(tokenizer.special['<|end|>']);
    }
    // No system, user or tool token is ever trained on.
    const header = enc!.ids
      .map((id, i) => (enc!.mask[i] ? id : -1))
      .filter((id) =>
        [tokenizer.special['<|user|>'], tokenizer.special['<|tool|>'], tokenizer.special['<|assistant|>']].includes(id),
      );
    expect(header).toEqual([]);
  });

  it('parses generated ids back into the assistant message, tool calls included', async () => {
    for (const message of sessions[3]!.filter((m) => m.role === 'assistant')) {
      const [enc] = await encodeConversations(tokenizer, [[message]]);
      const parsed = await parseAssistant(tokenizer, enc!.ids.slice(1), 7); // without the header, as generated
      expect(parsed.content).toBe(message.content ?? null);
      expect(parsed.tool_calls?.map((c) => [c.function.name, c.function.arguments])).toEqual(
        message.tool_calls?.map((c) => [c.function.name, c.function.arguments]),
      );
      if (parsed.tool_calls) expect(parsed.tool_calls[0]!.id).toBe('call_7');
    }
  });

  it('parses what an unconstrained model may write: several calls, arguments kept as written, calls that are not JSON', async () => {
    const generated = async (text: string) => {
      const ids: number[] = [];
      for (const [i, part] of text.split(/(<tool_call>|<\/tool_call>)/).entries())
        if (i % 2)
          ids.push(part === '<tool_call>' ? tokenizer.calls.open : (tokenizer.calls as { close: number }).close);
        else ids.push(...(await tokenizer.encode(part)));
      return parseAssistant(tokenizer, [...ids, tokenizer.special['<|end|>']], 1);
    };
    const two = await generated(
      'Calling.<tool_call>{"name":"a","arguments":{"x":1.0,"y":[1e3]}}</tool_call><tool_call>{"name":"b","arguments":{}}</tool_call>',
    );
    expect(two.content).toBe('Calling.');
    expect(two.tool_calls?.map((c) => [c.id, c.function.name, c.function.arguments])).toEqual([
      ['call_1', 'a', '{"x":1.0,"y":[1e3]}'],
      ['call_2', 'b', '{}'],
    ]);
    const broken = await generated('<tool_call>{"name":"a","arguments":{"x":</tool_call><tool_call>garbage');
    expect(broken.tool_calls?.map((c) => [c.function.name, c.function.arguments])).toEqual([
      ['a', '{"x":'],
      ['', 'garbage'],
    ]);
  });

  it('ends a generation prompt with an open assistant header', async () => {
    const [enc] = await encodeConversations(tokenizer, [sessions[0]!.slice(0, 2)], true);
    expect(enc!.ids.at(-1)).toBe(tokenizer.special['<|assistant|>']);
    expect(enc!.mask.every((m) => m === 0)).toBe(true);
  });
});
