// prefab's chat template in Jinja (what its model folders carry for transformers, TRL and vLLM) against the
// template prefab trains with: the same tokens and the same assistant mask, rendered by @huggingface/jinja and
// tokenized by Hugging Face tokenizers as transformers would.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from 'tokenizers';
import { describe, expect, it } from 'vitest';
import type { Message } from '../../core/records.ts';
import { openChat, prefabChat } from '../../model/chat.ts';
import {
  PREFAB_CHAT_TEMPLATE,
  PREFAB_LEGACY_CHAT_TEMPLATE,
  conversationTexts,
  prefabTokenizerConfig,
} from '../../model/chat-template.ts';
import { ChatTemplate, maskedTokens } from '../../model/hf-chat.ts';
import { TextTokenizer, trainTokenizer } from '../../model/tokenizer.ts';
import { REPO } from '../fixtures/cli.ts';
import { legacyTokenizerJson } from '../fixtures/legacy-tokenizer.ts';

const sessions = gunzipSync(readFileSync(join(REPO, 'data', 'sample', 'sessions.jsonl.gz')))
  .toString('utf8')
  .split('\n')
  .filter(Boolean)
  .slice(0, 40)
  .map((line) => (JSON.parse(line) as { messages: Message[] }).messages);
// Odd text too: spaces at the ends, newlines, non-ASCII, a call whose arguments are not JSON.
const odd: Message[] = [
  { role: 'system', content: '  Be brief.\n' },
  { role: 'user', content: 'Café — ünïcode 🙂 and <|not special|> text' },
  {
    role: 'assistant',
    content: ' Sure:\n',
    tool_calls: [
      { id: 'a', type: 'function', function: { name: 'call', arguments: '{"phone_number": "555-0100"}' } },
      { id: 'b', type: 'function', function: { name: 'finish', arguments: 'not json' } },
    ],
  },
  { role: 'tool', tool_call_id: 'a', content: 'ok' },
  { role: 'assistant', content: 'Done.' },
];
const conversations = [...sessions, odd];
const json = trainTokenizer(
  conversations.flatMap((c) => conversationTexts(c)),
  600,
);
const legacyJson = legacyTokenizerJson(json);

describe("prefab's chat template in Jinja", () => {
  it('renders every conversation to the tokens prefab trains on, as transformers renders it, in either format', async () => {
    for (const [template, tokenizerJson] of [
      [PREFAB_CHAT_TEMPLATE, json],
      [PREFAB_LEGACY_CHAT_TEMPLATE, legacyJson],
    ] as const) {
      const jinja = new Template(template);
      const tokenizer = Tokenizer.fromString(tokenizerJson);
      const chat = prefabChat(tokenizerJson);
      for (const [i, messages] of conversations.entries()) {
        for (const generation of [false, true]) {
          // As TRL hands a dataset's rows to apply_chat_template: tool-call arguments as their JSON strings.
          const text = jinja.render({ messages, add_generation_prompt: generation });
          const ids = (await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds();
          const [trained] = await chat.encode([messages], generation);
          expect(ids, `conversation ${i}`).toEqual(trained!.ids);
        }
      }
    }
  });

  it('writes calls as Hermes does, whether arguments come as a JSON string or an object, and lists tools a caller passes', () => {
    const jinja = new Template(PREFAB_CHAT_TEMPLATE);
    const call = { id: 'c', type: 'function', function: { name: 'finish', arguments: { ok: true, n: [1, 2] } } };
    const messages = [
      { role: 'user', content: 'go' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [call, { ...call, function: { name: 'f', arguments: '{"a": 1}' } }],
      },
    ];
    expect(jinja.render({ messages })).toBe(
      '<|user|>go<|end|><|assistant|><tool_call>{"name":"finish","arguments":{"ok":true,"n":[1,2]}}</tool_call>' +
        '<tool_call>{"name":"f","arguments":{"a": 1}}</tool_call><|end|>',
    );
    const tools = [{ type: 'function', function: { name: 'finish', parameters: { type: 'object' } } }];
    const listed = jinja.render({ messages: messages.slice(0, 1), tools, add_generation_prompt: true });
    expect(listed).toMatch(
      /^<\|system\|>[^<]*<tool_call>[^<]*<\/tool_call>[^<]*<tools>\n\{.*"name": ?"finish".*\}\n<\/tools><\|end\|><\|user\|>go<\|end\|><\|assistant\|>$/s,
    );
  });

  it("marks the assistant's tokens with {% generation %} as prefab's mask does", async () => {
    const template = new ChatTemplate(PREFAB_CHAT_TEMPLATE, { eos_token: '<|end|>' }, 'prefab');
    const chat = prefabChat(json);
    for (const messages of sessions) {
      const { ids, mask } = await maskedTokens(json, template.assistantSpans(messages));
      const [trained] = await chat.encode([messages]);
      expect(ids).toEqual(trained!.ids);
      expect(mask).toEqual(trained!.mask);
    }
  });

  it('is the template a model folder prefab writes carries, and reading that folder gives prefab’s chat', () => {
    const config = JSON.parse(prefabTokenizerConfig(new TextTokenizer(json), 512)) as Record<string, unknown>;
    expect(config).toMatchObject({ chat_template: PREFAB_CHAT_TEMPLATE, eos_token: '<|end|>', pad_token: '<|pad|>' });
    const chat = openChat({ 'tokenizer.json': json, 'tokenizer_config.json': JSON.stringify(config) }, null, 'folder');
    expect(chat.name).toBe('prefab');
    // A folder written before carries the legacy template and tokenizer: read as it was trained.
    const legacy = JSON.parse(prefabTokenizerConfig(new TextTokenizer(legacyJson), 512)) as Record<string, unknown>;
    expect(legacy.chat_template).toBe(PREFAB_LEGACY_CHAT_TEMPLATE);
    const old = openChat(
      { 'tokenizer.json': legacyJson, 'tokenizer_config.json': JSON.stringify(legacy) },
      null,
      'old',
    );
    expect(old.name).toBe('prefab');
    expect(() =>
      openChat({ 'tokenizer.json': legacyJson, 'tokenizer_config.json': JSON.stringify(config) }, null, 'mixed'),
    ).toThrow(/mixed: its chat template writes calls in prefab's hermes format, its tokenizer.json has the legacy/);
  });
});
