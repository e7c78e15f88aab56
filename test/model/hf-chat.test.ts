// Chat templates of real models, written in the style of Llama 3.1's, Qwen2.5's and SmolLM2's
// (test/fixtures/chat-templates), rendered with tools and tool calls, with the assistant's characters and
// tokens found by rendering prefixes, or by the template's {% generation %} blocks.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { Message } from '../../core/records.ts';
import { Tokenizer } from 'tokenizers';
import { openChat } from '../../model/chat.ts';
import { ChatTemplate, maskedTokens, readChatTemplate, type ToolDefinition } from '../../model/hf-chat.ts';
import { trainTokenizer } from '../../model/tokenizer.ts';
import { tempDir } from '../fixtures/pipeline.ts';

const TEMPLATES = join(import.meta.dirname, '..', 'fixtures', 'chat-templates');
const template = (file: string) =>
  new ChatTemplate(
    readFileSync(join(TEMPLATES, file), 'utf8'),
    { bos_token: '<|begin_of_text|>', eos_token: '<|eot_id|>' },
    file,
  );

const tools: ToolDefinition[] = [
  {
    type: 'function',
    function: {
      name: 'search_directory',
      description: 'Find a company',
      parameters: { type: 'object', properties: { company: { type: 'string' } }, required: ['company'] },
    },
  },
];
const conversation: Message[] = [
  { role: 'system', content: 'You call companies for the user.' },
  { role: 'user', content: 'Please cancel my Acme gym membership.' },
  {
    role: 'assistant',
    content: null,
    tool_calls: [
      { id: 'c1', type: 'function', function: { name: 'search_directory', arguments: '{"company":"Acme"}' } },
    ],
  },
  { role: 'tool', content: '{"company":"Acme","phone":"555-0100"}', tool_call_id: 'c1' },
  { role: 'assistant', content: 'I found Acme; calling them now.' },
  { role: 'user', content: 'Thanks!' },
  { role: 'assistant', content: 'Your membership is cancelled.' },
];

const spanTexts = (r: { text: string; spans: [number, number][] }) => r.spans.map(([s, e]) => r.text.slice(s, e));
const outside = (r: { text: string; spans: [number, number][] }) => {
  let rest = '';
  let at = 0;
  for (const [s, e] of r.spans) {
    rest += r.text.slice(at, s);
    at = e;
  }
  return rest + r.text.slice(at);
};

describe.each([
  ['qwen2.5-style.jinja', '<|im_end|>'],
  ['llama3-style.jinja', '<|eot_id|>'],
  ['smollm2-style.jinja', '<|im_end|>'],
])('%s', (file, endOfTurn) => {
  const t = template(file);
  const withTools =
    file === 'smollm2-style.jinja' ? conversation.filter((m) => !m.tool_calls && m.role !== 'tool') : conversation;

  it('renders the conversation, tools and tool calls included, and ends with the generation prompt when asked', () => {
    const text = t.render(withTools, { tools });
    for (const m of withTools) if (m.content && m.role !== 'system') expect(text).toContain(m.content.trim());
    if (file !== 'smollm2-style.jinja') {
      expect(text).toContain('"company": "Acme"');
      expect(text).toContain('search_directory');
    }
    expect(t.render(withTools.slice(0, 2), { tools, addGenerationPrompt: true }).length).toBeGreaterThan(
      t.render(withTools.slice(0, 2), { tools }).length,
    );
  });

  it('marks exactly the assistant’s turns, each through its end-of-turn token, and nothing the user, the tools or the system wrote', () => {
    const r = t.assistantSpans(withTools, { tools });
    const assistant = withTools.filter((m) => m.role === 'assistant');
    const texts = spanTexts(r);
    expect(texts).toHaveLength(assistant.length);
    assistant.forEach((m, i) => {
      expect(texts[i]).toContain(m.content ?? m.tool_calls![0]!.function.name);
      expect(texts[i]!.trimEnd().endsWith(endOfTurn)).toBe(true);
    });
    const rest = outside(r);
    for (const m of withTools)
      if (m.role !== 'assistant') expect(rest).toContain((m.content ?? '').trim().slice(0, 20));
    for (const m of assistant) if (m.content) expect(rest).not.toContain(m.content);
  });
});

describe('{% generation %} blocks', () => {
  it('mark the assistant’s text, the markers themselves leaving no trace', () => {
    const t = template('chatml-generation.jinja');
    const r = t.assistantSpans(conversation);
    expect(r.text).toBe(t.render(conversation));
    expect(spanTexts(r)).toEqual([
      '<tool_call>\n{"name": "search_directory", "arguments": {"company": "Acme"}}\n</tool_call><|im_end|>',
      'I found Acme; calling them now.<|im_end|>',
      'Your membership is cancelled.<|im_end|>',
    ]);
  });

  it('are needed when earlier turns render differently once later ones follow, and the error says so', () => {
    // A template that shows only the last assistant turn's content, as templates that drop past reasoning do.
    const t = new ChatTemplate(
      "{%- for m in messages %}{%- if m.role == 'assistant' and not loop.last %}<a>…</a>{%- else %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{%- endif %}{%- endfor %}",
      {},
      'drops-past',
    );
    expect(() => t.assistantSpans(conversation.filter((m) => !m.tool_calls && m.role !== 'tool'))).toThrow(
      /drops-past: rendering the conversation up to assistant message \d+ is not a prefix .* \{% generation %\} blocks/,
    );
  });
});

describe('a Hugging Face folder', () => {
  it('gives its template from tokenizer_config.json with the special tokens it names, and masks tokens by character', async () => {
    const dir = join(tempDir(), 'model');
    mkdirSync(dir);
    const source = readFileSync(join(TEMPLATES, 'qwen2.5-style.jinja'), 'utf8');
    writeFileSync(
      join(dir, 'tokenizer_config.json'),
      JSON.stringify({ chat_template: source, eos_token: { content: '<|im_end|>' }, bos_token: null }),
    );
    const t = readChatTemplate(
      { 'tokenizer_config.json': readFileSync(join(dir, 'tokenizer_config.json'), 'utf8') },
      dir,
    )!;
    const r = t.assistantSpans(conversation, { tools });
    // A tokenizer whose added tokens are the template's markers, as a real model's tokenizer.json has them.
    const json = JSON.parse(trainTokenizer([r.text], 400));
    const next = Object.keys(json.model.vocab).length + json.added_tokens.length;
    json.added_tokens.push(
      ...['<|im_start|>', '<|im_end|>'].map((content, i) => ({
        id: next + i,
        content,
        single_word: false,
        lstrip: false,
        rstrip: false,
        normalized: false,
        special: true,
      })),
    );
    const { ids, mask } = await maskedTokens(JSON.stringify(json), r);
    expect(mask).toHaveLength(ids.length);
    const imEnd = next + 1;
    // Every assistant turn's closing <|im_end|> is trained on; the user's and the tool's are not.
    const ends = ids.flatMap((id, i) => (id === imEnd ? [mask[i]] : []));
    expect(ends.filter((m) => m === 1)).toHaveLength(3);
    expect(ends.filter((m) => m === 0).length).toBeGreaterThanOrEqual(4);
    expect(readChatTemplate({ 'tokenizer.json': '{}' }, tempDir())).toBeNull();

    // Characters outside the BMP (an emoji is two UTF-16 units, one character) before a turn move no mark.
    const emoji: Message[] = [
      { role: 'user', content: 'Cancel it 😀😀 please' },
      { role: 'assistant', content: 'Done 👍' },
    ];
    const e = t.assistantSpans(emoji);
    const em = await maskedTokens(JSON.stringify(json), e);
    const decoded = (await import('tokenizers')).Tokenizer.fromString(JSON.stringify(json));
    const trainedText = await decoded.decode(
      em.ids.filter((_, i) => em.mask[i] === 1),
      false,
    );
    expect(trainedText).toBe('Done 👍<|im_end|>\n');
  });
});

describe('a Hugging Face chat (model/chat.ts over the folder’s files)', () => {
  const source = readFileSync(join(TEMPLATES, 'qwen2.5-style.jinja'), 'utf8');
  const json = JSON.parse(trainTokenizer(['You call companies for the user. Please cancel my gym membership.'], 300));
  const next = Object.keys(json.model.vocab).length + json.added_tokens.length;
  json.added_tokens.push(
    ...['<|im_start|>', '<|im_end|>'].map((content, i) => ({
      id: next + i,
      content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true,
    })),
  );
  const files = {
    'tokenizer.json': JSON.stringify(json),
    'tokenizer_config.json': JSON.stringify({ chat_template: source, eos_token: '<|im_end|>' }),
  };
  const chat = openChat(files, null, 'folder');

  it('encodes where each message starts, the assistant mask, and an open assistant turn to generate into', async () => {
    const [e] = await chat.encode([conversation]);
    const [open] = await chat.encode([conversation.slice(0, 2)], true);
    expect(e!.starts).toHaveLength(conversation.length + 1);
    expect(e!.starts.every((s, i) => i === 0 || s > e!.starts[i - 1]!)).toBe(true);
    expect(e!.starts.at(-1)).toBe(e!.ids.length);
    const tokenizer = Tokenizer.fromString(files['tokenizer.json']);
    // Each message's tokens begin with its <|im_start|>; the assistant's are the ones masked in.
    for (const [i, m] of conversation.entries()) {
      expect(e!.ids[e!.starts[i]!]).toBe(next);
      const trained = e!.mask.slice(e!.starts[i], e!.starts[i + 1]).some((x) => x === 1);
      expect(trained, `message ${i + 1}`).toBe(m.role === 'assistant');
    }
    expect(await tokenizer.decode(open!.ids.slice(open!.starts.at(-1)), false)).toBe('<|im_start|>assistant\n');
    expect(chat.stop).toEqual([next + 1]);
  });

  it('reads tool calls in the forms templates write them, and text as content', async () => {
    const ids = async (text: string) => [
      ...(await Tokenizer.fromString(files['tokenizer.json']).encode(text, null, { addSpecialTokens: false })).getIds(),
      next + 1,
      5,
      6,
    ];
    const qwen = await chat.parseAssistant(
      await ids(
        'Looking it up.\n<tool_call>\n{"name": "search_directory", "arguments": {"company": "Acme"}}\n</tool_call>',
      ),
      3,
    );
    expect(qwen).toEqual({
      role: 'assistant',
      content: 'Looking it up.',
      tool_calls: [
        { id: 'call_3', type: 'function', function: { name: 'search_directory', arguments: '{"company":"Acme"}' } },
      ],
    });
    const llama = await chat.parseAssistant(await ids('{"name": "finish", "parameters": {}}'), 1);
    expect(llama.tool_calls?.[0]?.function).toEqual({ name: 'finish', arguments: '{}' });
    expect(llama.content).toBeNull();
    const list = await chat.parseAssistant(
      await ids('<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]</tool_call>'),
      1,
    );
    expect(list.tool_calls?.map((c) => c.function.name)).toEqual(['a', 'b']);
    const broken = await chat.parseAssistant(await ids('<tool_call>{"name": "a", "argu'), 1);
    expect(broken).toEqual({ role: 'assistant', content: '<tool_call>{"name": "a", "argu' });
    expect(await chat.toolConstraint([])).toBeNull();
  });

  it('needs a chat template, or prefab’s own special tokens', () => {
    expect(() => openChat({ 'tokenizer.json': JSON.stringify({ ...json, added_tokens: [] }) }, null, 'bare')).toThrow(
      /bare has no chat template/,
    );
    expect(openChat({ 'tokenizer.json': trainTokenizer(['hello'], 300) }, null, 'prefab').name).toBe('prefab');
  });
});
