// Chat templates of real models: the Jinja template of a Hugging Face folder (tokenizer_config.json's
// chat_template, or chat_template.jinja) rendered with @huggingface/jinja as transformers renders it
// (messages, tools, tool calls, add_generation_prompt), and which characters and tokens the assistant wrote:
// the template's {% generation %} blocks where it has them, else found by rendering prefixes of the
// conversation. The project's own template (chat-template.ts) stays the default for from-scratch runs.
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from 'tokenizers';
import type { Message } from '../core/records.ts';
import type { Encoded } from './chat-template.ts';

/** A tool as the OpenAI API and transformers' templates take it. */
export interface ToolDefinition {
  type: 'function';
  function: { name: string; description?: string; parameters?: Record<string, unknown> };
}

/** Marks the template's {% generation %} blocks leave in the text, then removed. Control characters no template writes. */
const START = '\u0002GEN\u0002';
const END = '\u0003GEN\u0003';

/** A message as templates read it: tool-call arguments as an object, as transformers' docs ask. */
function templateMessage(m: Message): Record<string, unknown> {
  const out: Record<string, unknown> = { role: m.role, content: m.content ?? '' };
  if (m.name) out.name = m.name;
  if (m.tool_call_id) out.tool_call_id = m.tool_call_id;
  if (m.tool_calls?.length) {
    out.tool_calls = m.tool_calls.map((c) => {
      let args: unknown = c.function.arguments;
      try {
        args = JSON.parse(c.function.arguments);
      } catch {
        // left as the string it is: a broken call renders as written
      }
      return { id: c.id, type: 'function', function: { name: c.function.name, arguments: args } };
    });
  }
  return out;
}

export interface RenderOptions {
  tools?: ToolDefinition[];
  /** End with the header of an assistant turn, for generation. */
  addGenerationPrompt?: boolean;
}

export class ChatTemplate {
  private readonly template: Template;
  private readonly marked: Template | null;

  /**
   * `source` is the Jinja text; `specials` the tokens templates refer to by name (bos_token, eos_token, ...).
   * `name` says where the template came from, for errors.
   */
  constructor(
    readonly source: string,
    readonly specials: Record<string, string> = {},
    readonly name = 'chat template',
  ) {
    this.template = new Template(source);
    const generation = /\{%-?\s*generation\s*-?%\}/;
    this.marked = generation.test(source)
      ? // A block's whitespace control moves to the marks: {%- generation %} trims before the start mark, {% endgeneration -%} after the end one.
        new Template(
          source
            .replace(/\{%(-?)\s*generation\s*(-?)%\}/g, `{%$1 if true %}{{ '${START}' $2}}`)
            .replace(/\{%(-?)\s*endgeneration\s*(-?)%\}/g, `{{$1 '${END}' }}{% endif $2%}`),
        )
      : null;
  }

  /** The conversation as the model reads it. */
  render(messages: Message[], o: RenderOptions = {}): string {
    return this.renderWith(this.template, messages, o);
  }

  private renderWith(template: Template, messages: Message[], o: RenderOptions): string {
    try {
      return template.render({
        ...this.specials,
        messages: messages.map(templateMessage),
        ...(o.tools ? { tools: o.tools } : {}),
        add_generation_prompt: o.addGenerationPrompt ?? false,
      });
    } catch (error) {
      throw new Error(`${this.name}: ${(error as Error).message}`);
    }
  }

  /**
   * The conversation rendered, and the character spans [start, end) the assistant wrote (its turns' content,
   * calls and end-of-turn marker): the {% generation %} blocks when the template has them; otherwise, for each
   * assistant message, what rendering up to and including it adds to rendering the messages before it with
   * the generation prompt. A template whose earlier turns render differently once a later turn follows
   * (one that drops past reasoning, say) needs {% generation %} blocks, and says so.
   */
  assistantSpans(
    messages: Message[],
    o: { tools?: ToolDefinition[] } = {},
  ): { text: string; spans: [number, number][] } {
    if (this.marked) {
      const raw = this.renderWith(this.marked, messages, o);
      const spans: [number, number][] = [];
      let text = '';
      let at = 0;
      for (;;) {
        const s = raw.indexOf(START, at);
        if (s < 0) break;
        const e = raw.indexOf(END, s);
        if (e < 0) throw new Error(`${this.name}: a {% generation %} block is not closed`);
        text += raw.slice(at, s);
        const begin = text.length;
        text += raw.slice(s + START.length, e);
        spans.push([begin, text.length]);
        at = e + END.length;
      }
      return { text: text + raw.slice(at), spans };
    }
    const text = this.render(messages, o);
    const spans: [number, number][] = [];
    messages.forEach((m, i) => {
      if (m.role !== 'assistant') return;
      const before = this.render(messages.slice(0, i), { ...o, addGenerationPrompt: true });
      const through = this.render(messages.slice(0, i + 1), o);
      if (!through.startsWith(before) || !text.startsWith(through)) {
        throw new Error(
          `${this.name}: rendering the conversation up to assistant message ${i + 1} is not a prefix of rendering it whole, so which tokens the assistant wrote cannot be told; use a template with {% generation %} blocks`,
        );
      }
      if (through.length > before.length) spans.push([before.length, through.length]);
    });
    return { text, spans };
  }
}

/** The chat template of a Hugging Face folder's tokenizer files (file name → content), with the special tokens its tokenizer_config.json names; null when it has none. */
export function readChatTemplate(files: Record<string, string>, dir: string): ChatTemplate | null {
  const configPath = join(dir, 'tokenizer_config.json');
  const config = tokenizerConfig(files, dir);
  const specials: Record<string, string> = {};
  for (const key of ['bos_token', 'eos_token', 'pad_token', 'unk_token']) {
    const text = tokenText(config[key]);
    if (text !== null) specials[key] = text;
  }
  const jinja = files['chat_template.jinja'];
  if (jinja !== undefined) return new ChatTemplate(jinja, specials, join(dir, 'chat_template.jinja'));
  const t = config.chat_template;
  if (typeof t === 'string') return new ChatTemplate(t, specials, `${configPath} chat_template`);
  if (Array.isArray(t)) {
    const named =
      (t as { name: string; template: string }[]).find((x) => x.name === 'default') ?? (t as { template: string }[])[0];
    if (named) return new ChatTemplate(named.template, specials, `${configPath} chat_template`);
  }
  return null;
}

/** tokenizer_config.json's object ({} when the folder has none); names the file when it is not JSON. */
function tokenizerConfig(files: Record<string, string>, dir: string): Record<string, unknown> {
  const text = files['tokenizer_config.json'];
  if (text === undefined) return {};
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch (error) {
    throw new Error(`${join(dir, 'tokenizer_config.json')}: not JSON (${(error as Error).message})`);
  }
}

/** A special token as tokenizer_config.json gives it: a string, or {content: ...}. */
function tokenText(v: unknown): string | null {
  if (typeof v === 'string') return v;
  if (v && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string')
    return (v as { content: string }).content;
  return null;
}

/** For each UTF-16 index of `text` (and its end), the character (code point) index: tokenizers count offsets in characters. */
function codePoints(text: string): Int32Array {
  const points = new Int32Array(text.length + 1);
  for (let i = 0, p = 0; i <= text.length; i++) {
    points[i] = p;
    if (i < text.length) {
      const c = text.charCodeAt(i);
      if (c < 0xd800 || c > 0xdbff) p++; // a high surrogate and its low one make one character
    }
  }
  return points;
}

/**
 * Token ids of a rendered conversation and its assistant mask (1 on every token that lies within a span the
 * assistant wrote), through a Hugging Face tokenizer.json. Added tokens in the text (<|im_start|>, ...) are
 * matched as the tokenizer defines them.
 */
export async function maskedTokens(
  tokenizerJson: string,
  rendered: { text: string; spans: [number, number][] },
): Promise<{ ids: number[]; mask: number[] }> {
  const { ids, mask } = await tokenize(Tokenizer.fromString(tokenizerJson), rendered.text, rendered.spans, []);
  return { ids, mask };
}

/** `text` as ids, with the mask of `spans` and the token index at which each of `marks` (UTF-16 offsets, ascending) falls. */
async function tokenize(
  tokenizer: Tokenizer,
  text: string,
  spans: [number, number][],
  marks: number[],
): Promise<{ ids: number[]; mask: number[]; at: number[] }> {
  const encoding = await tokenizer.encode(text, null, { addSpecialTokens: false });
  const offsets = encoding.getOffsets();
  const points = codePoints(text);
  const inChars = spans.map(([s, e]) => [points[s]!, points[e]!] as const);
  const inSpan = (start: number, end: number) => inChars.some(([s, e]) => start >= s && end <= e && end > start);
  // A mark falls at the first token that starts at or after it: a token across a boundary stays with what it began in.
  const at = marks.map((m) => {
    const c = points[m]!;
    const i = offsets.findIndex(([s]) => s! >= c);
    return i < 0 ? offsets.length : i;
  });
  return { ids: encoding.getIds(), mask: offsets.map(([s, e]) => (inSpan(s!, e!) ? 1 : 0)), at };
}

/**
 * A Hugging Face folder's tokenizer and chat template (model/chat.ts's Chat): conversations rendered by the
 * template and tokenized with the assistant's spans masked in; where each message starts found by rendering
 * the messages before it; a reply's tool calls read in the forms templates write them: <tool_call>{...}
 * </tool_call> blocks (Qwen2.5, Hermes, SmolLM2; an object or a list) or a reply that is one JSON call
 * (Llama 3.1), with "arguments" or "parameters".
 */
export class HfChat {
  readonly name: string;
  readonly vocabSize: number;
  readonly pad: number;
  readonly stop: number[];
  private readonly tokenizer: Tokenizer;

  constructor(
    tokenizerJson: string,
    private readonly template: ChatTemplate,
    eos: number | number[] | null,
  ) {
    this.name = template.name;
    this.tokenizer = Tokenizer.fromString(tokenizerJson);
    this.vocabSize = this.tokenizer.getVocabSize(true);
    const id = (key: string) => {
      const text = template.specials[key];
      return text === undefined ? null : this.tokenizer.tokenToId(text);
    };
    this.stop = [
      ...new Set([...(eos === null ? [] : [eos].flat()), ...[id('eos_token')].filter((x): x is number => x !== null)]),
    ];
    if (this.stop.length === 0)
      throw new Error(
        `${template.name}: no end-of-turn token: neither config.json's eos_token_id nor tokenizer_config.json's eos_token`,
      );
    this.pad = id('pad_token') ?? this.stop[0]!;
  }

  async encode(conversations: Message[][], openAssistant = false): Promise<Encoded[]> {
    return Promise.all(
      conversations.map(async (messages) => {
        const { text, spans } = this.template.assistantSpans(messages);
        // Where each message begins: the length of the messages before it, rendered (0 for the first).
        const begins = messages.map((_, i) => {
          if (i === 0) return 0;
          const before = this.template.render(messages.slice(0, i));
          if (!text.startsWith(before))
            throw new Error(
              `${this.template.name}: the conversation rendered up to message ${i} is not a prefix of it rendered whole, so it cannot be cut between messages`,
            );
          return before.length;
        });
        const full = openAssistant ? this.template.render(messages, { addGenerationPrompt: true }) : text;
        if (!full.startsWith(text))
          throw new Error(`${this.template.name}: the generation prompt does not extend the rendered conversation`);
        const { ids, mask, at } = await tokenize(this.tokenizer, full, spans, [...begins, text.length]);
        return { ids, mask, starts: at };
      }),
    );
  }

  async parseAssistant(ids: number[], firstCallId: number): Promise<Message> {
    const end = ids.findIndex((id) => this.stop.includes(id));
    const text = await this.tokenizer.decode(end >= 0 ? ids.slice(0, end) : ids, true);
    const calls: { name: string; arguments: unknown }[] = [];
    const asCall = (v: unknown) => {
      if (!v || typeof v !== 'object' || typeof (v as { name?: unknown }).name !== 'string') return false;
      const o = v as { name: string; arguments?: unknown; parameters?: unknown };
      calls.push({ name: o.name, arguments: o.arguments ?? o.parameters ?? {} });
      return true;
    };
    const parsed = (s: string): unknown => {
      try {
        return JSON.parse(s);
      } catch {
        return undefined;
      }
    };
    let content = text.replace(/<tool_call>([\s\S]*?)(?:<\/tool_call>|$)/g, (block, body: string) => {
      const v = parsed(body.trim());
      return (Array.isArray(v) ? v.every(asCall) && v.length > 0 : asCall(v)) ? '' : block;
    });
    if (calls.length === 0 && asCall(parsed(content.trim()))) content = '';
    const message: Message = { role: 'assistant', content: content.trim() ? content.trim() : null };
    if (calls.length) {
      message.tool_calls = calls.map((c, i) => ({
        id: `call_${firstCallId + i}`,
        type: 'function' as const,
        function: {
          name: c.name,
          arguments: typeof c.arguments === 'string' ? c.arguments : JSON.stringify(c.arguments),
        },
      }));
    }
    return message;
  }

  /** Constrained tool calls are written for prefab's template only: a Hugging Face template's calls are free text. */
  async toolConstraint(): Promise<null> {
    return null;
  }
}
