// Chat templates of real models: the Jinja template of a Hugging Face folder (tokenizer_config.json's
// chat_template, or chat_template.jinja) rendered with @huggingface/jinja as transformers renders it
// (messages, tools, tool calls, add_generation_prompt), and which characters and tokens the assistant wrote:
// the template's {% generation %} blocks where it has them, else found by rendering prefixes of the
// conversation. The project's own template (chat-template.ts) stays the default for from-scratch runs.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from 'tokenizers';
import type { Message } from '../core/records.ts';

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
    private readonly specials: Record<string, string> = {},
    readonly name = 'chat template',
  ) {
    this.template = new Template(source);
    const generation = /\{%-?\s*generation\s*-?%\}/;
    this.marked = generation.test(source)
      ? // A block's whitespace control moves to the marks: {%- generation %} trims before the start mark, {% endgeneration -%} after the end one.
        new Template(source.replace(/\{%(-?)\s*generation\s*(-?)%\}/g, `{%$1 if true %}{{ '${START}' $2}}`).replace(/\{%(-?)\s*endgeneration\s*(-?)%\}/g, `{{$1 '${END}' }}{% endif $2%}`))
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
  assistantSpans(messages: Message[], o: { tools?: ToolDefinition[] } = {}): { text: string; spans: [number, number][] } {
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
        throw new Error(`${this.name}: rendering the conversation up to assistant message ${i + 1} is not a prefix of rendering it whole, so which tokens the assistant wrote cannot be told; use a template with {% generation %} blocks`);
      }
      if (through.length > before.length) spans.push([before.length, through.length]);
    });
    return { text, spans };
  }
}

/** The chat template of a Hugging Face folder, with the special tokens its tokenizer_config.json names; null when it has none. */
export function readChatTemplate(dir: string): ChatTemplate | null {
  const configPath = join(dir, 'tokenizer_config.json');
  const config = existsSync(configPath) ? (JSON.parse(readFileSync(configPath, 'utf8')) as Record<string, unknown>) : {};
  const specials: Record<string, string> = {};
  for (const key of ['bos_token', 'eos_token', 'pad_token', 'unk_token']) {
    const v = config[key];
    const text = typeof v === 'string' ? v : v && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string' ? (v as { content: string }).content : null;
    if (text !== null) specials[key] = text;
  }
  const jinja = join(dir, 'chat_template.jinja');
  if (existsSync(jinja)) return new ChatTemplate(readFileSync(jinja, 'utf8'), specials, jinja);
  const t = config.chat_template;
  if (typeof t === 'string') return new ChatTemplate(t, specials, `${configPath} chat_template`);
  if (Array.isArray(t)) {
    const named = (t as { name: string; template: string }[]).find((x) => x.name === 'default') ?? (t as { template: string }[])[0];
    if (named) return new ChatTemplate(named.template, specials, `${configPath} chat_template`);
  }
  return null;
}

/**
 * Token ids of a rendered conversation and its assistant mask (1 on every token that lies within a span the
 * assistant wrote), through a Hugging Face tokenizer.json. Added tokens in the text (<|im_start|>, ...) are
 * matched as the tokenizer defines them.
 */
export async function maskedTokens(tokenizerJson: string, rendered: { text: string; spans: [number, number][] }): Promise<{ ids: number[]; mask: number[] }> {
  const tokenizer = Tokenizer.fromString(tokenizerJson);
  const encoding = await tokenizer.encode(rendered.text, null, { addSpecialTokens: false });
  const offsets = encoding.getOffsets();
  // The tokenizer counts offsets in characters (code points); the spans count JavaScript's UTF-16 units.
  const points = new Int32Array(rendered.text.length + 1);
  for (let i = 0, p = 0; i <= rendered.text.length; i++) {
    points[i] = p;
    if (i < rendered.text.length) {
      const c = rendered.text.charCodeAt(i);
      if (c < 0xd800 || c > 0xdbff) p++; // a high surrogate and its low one make one character
    }
  }
  const spans = rendered.spans.map(([s, e]) => [points[s]!, points[e]!] as const);
  const inSpan = (start: number, end: number) => spans.some(([s, e]) => start >= s && end <= e && end > start);
  return { ids: encoding.getIds(), mask: offsets.map(([s, e]) => (inSpan(s!, e!) ? 1 : 0)) };
}
