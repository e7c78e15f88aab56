// The chat template: messages (tool calls included) → token ids, with the mask of tokens the model is trained
// on (the assistant's), and back from generated ids to an assistant message.
//
//   <|system|>…<|end|><|user|>…<|end|><|assistant|>text<tool_call>{"name":"n","arguments":{…}}</tool_call><|end|><|tool|>result<|end|>
//
// Calls are written as Hermes and Qwen2.5 write them, so that serving stacks' tool-call parsers read them.
// Tokenizers made before wrote `<|call|>name {…}` (the legacy format): their models still load and run.
// The assistant's content, its calls and its closing <|end|> are trained on; its header is not, since it is
// the cue the prompt ends with at generation time. Tool-call ids are not rendered: they are bookkeeping, and
// a generated message gets fresh ones.
import type { Message, ToolCall } from '../core/records.ts';
import type { SpecialToken, TextTokenizer } from './tokenizer.ts';

const HEADER: Record<Message['role'], SpecialToken> = {
  system: '<|system|>',
  user: '<|user|>',
  assistant: '<|assistant|>',
  tool: '<|tool|>',
};

/** The text between a call's tokens: compact JSON, the arguments as given (OpenAI's JSON string). */
const hermesCallText = (call: ToolCall): string =>
  `{"name":${JSON.stringify(call.function.name)},"arguments":${call.function.arguments}}`;

// Every message as its role's header and its body; the assistant's marked for training. Both formats end so.
const MESSAGES = [
  '{%- for message in messages -%}',
  "{{- '<|' + message['role'] + '|>' -}}",
  "{%- if message['role'] == 'assistant' -%}{%- generation -%}{{- body(message) -}}{%- endgeneration -%}",
  '{%- else -%}{{- body(message) -}}{%- endif -%}',
  '{%- endfor -%}',
  "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}",
];

/**
 * The same template in Jinja, for the model folders prefab writes (tokenizer_config.json's chat_template), so
 * that transformers' apply_chat_template, TRL and vLLM render what prefab trains on, token for token. Tool-call
 * arguments are written as given (OpenAI's JSON string), or as compact JSON where a caller passes an object;
 * `{% generation %}` marks the assistant's tokens (transformers' return_assistant_tokens_mask, TRL's
 * assistant_only_loss). `tools`, where a caller passes them (a serving stack's request), come first as a
 * system message, as Hermes lists them; prefab's own models learn their tools from the conversation and are
 * trained without it. One difference stays: text that spells a special token (`<|end|>` in a user's
 * message) is text to prefab, and that special token to a tokenizer reading the rendered string whole.
 */
export const PREFAB_CHAT_TEMPLATE = [
  '{%- macro body(message) -%}',
  "{%- if message['content'] -%}{{- message['content'] -}}{%- endif -%}",
  "{%- for call in message['tool_calls'] or [] -%}",
  "{%- set arguments = call['function']['arguments'] -%}",
  "{%- if arguments is not string -%}{%- set arguments = arguments | tojson(separators=(',', ':')) -%}{%- endif -%}",
  "{{- '<tool_call>{\"name\":' + call['function']['name'] | tojson + ',\"arguments\":' + arguments + '}</tool_call>' -}}",
  '{%- endfor -%}',
  "{{- '<|end|>' -}}",
  '{%- endmacro -%}',
  '{%- if tools -%}',
  "{{- '<|system|>You may call functions. Write each call as a JSON object with its name and arguments between <tool_call> and </tool_call>. The functions:\\n<tools>' -}}",
  "{%- for tool in tools -%}{{- '\\n' + tool | tojson -}}{%- endfor -%}",
  "{{- '\\n</tools><|end|>' -}}",
  '{%- endif -%}',
  ...MESSAGES,
].join('\n');

/** The template of the legacy format, which folders written before carry, unchanged: how they are told apart. */
export const PREFAB_LEGACY_CHAT_TEMPLATE = [
  '{%- macro body(message) -%}',
  "{%- if message['content'] -%}{{- message['content'] -}}{%- endif -%}",
  "{%- for call in message['tool_calls'] or [] -%}",
  "{{- '<|call|>' + call['function']['name'] + ' ' -}}",
  "{%- if call['function']['arguments'] is string -%}{{- call['function']['arguments'] -}}",
  "{%- else -%}{{- call['function']['arguments'] | tojson(separators=(',', ':')) -}}{%- endif -%}",
  '{%- endfor -%}',
  "{{- '<|end|>' -}}",
  '{%- endmacro -%}',
  ...MESSAGES,
].join('\n');

/** tokenizer_config.json of a folder whose model reads prefab's template (the format `tokenizer` writes calls in). */
export function prefabTokenizerConfig(tokenizer: TextTokenizer, context: number): string {
  const config = {
    tokenizer_class: 'PreTrainedTokenizerFast',
    chat_template: tokenizer.calls.format === 'hermes' ? PREFAB_CHAT_TEMPLATE : PREFAB_LEGACY_CHAT_TEMPLATE,
    eos_token: '<|end|>',
    pad_token: '<|pad|>',
    bos_token: null,
    unk_token: null,
    model_max_length: context,
    clean_up_tokenization_spaces: false,
  };
  return JSON.stringify(config, null, 2) + '\n';
}

/** How calls are written: between Hermes's tokens, or after the legacy `<|call|>`. */
export type CallFormat = TextTokenizer['calls']['format'];

/** A token that is never text: a role header, the end, or where a call opens or closes. */
type Mark = SpecialToken | 'call' | 'call-end';

/** A piece of a rendered conversation: a special token or text, whether it is trained on, and its message. */
type Piece = ({ mark: Mark } | { text: string }) & { train: boolean; message: number };

function pieces(messages: Message[], openAssistant: boolean, format: CallFormat): Piece[] {
  const out: Piece[] = [];
  messages.forEach((m, message) => {
    const train = m.role === 'assistant';
    out.push({ mark: HEADER[m.role], train: false, message });
    if (m.content) out.push({ text: m.content, train, message });
    for (const call of m.tool_calls ?? [])
      if (format === 'hermes')
        out.push(
          { mark: 'call', train, message },
          { text: hermesCallText(call), train, message },
          { mark: 'call-end', train, message },
        );
      else
        out.push(
          { mark: 'call', train, message },
          { text: `${call.function.name} ${call.function.arguments}`, train, message },
        );
    out.push({ mark: '<|end|>', train, message });
  });
  if (openAssistant) out.push({ mark: '<|assistant|>', train: false, message: messages.length });
  return out;
}

/** The plain text of a conversation, piece by piece (contents and calls, no special tokens): what the tokenizer learns from. */
export function conversationTexts(messages: Message[], format: CallFormat = 'hermes'): string[] {
  return pieces(messages, false, format).flatMap((p) => ('text' in p ? [p.text] : []));
}

const spelling = (mark: Mark, format: CallFormat): string =>
  mark === 'call' ? (format === 'hermes' ? '<tool_call>' : '<|call|>') : mark === 'call-end' ? '</tool_call>' : mark;

/** The rendered text, special tokens spelt out: what the ids decode to. */
export function renderText(messages: Message[], openAssistant = false, format: CallFormat = 'hermes'): string {
  return pieces(messages, openAssistant, format)
    .map((p) => ('mark' in p ? spelling(p.mark, format) : p.text))
    .join('');
}

export interface Encoded {
  ids: number[];
  /** 1 where the token is the assistant's (trained on), else 0. */
  mask: number[];
  /** Where each message's tokens begin, and at the end the length without the open assistant header. */
  starts: number[];
}

/** Encodes conversations; `openAssistant` ends each with an assistant header, as a generation prompt. */
export async function encodeConversations(
  tokenizer: TextTokenizer,
  conversations: Message[][],
  openAssistant = false,
): Promise<Encoded[]> {
  const format = tokenizer.calls.format;
  const all = conversations.map((c) => pieces(c, openAssistant, format));
  const texts = conversations.flatMap((c) => conversationTexts(c, format));
  const calls = tokenizer.calls;
  const id = (mark: Mark) =>
    mark === 'call'
      ? calls.open
      : mark === 'call-end'
        ? calls.format === 'hermes'
          ? calls.close
          : -1
        : tokenizer.special[mark];
  const encoded = await tokenizer.encodeBatch(texts);
  let k = 0;
  return all.map((ps, c) => {
    const ids: number[] = [];
    const mask: number[] = [];
    const starts: number[] = [];
    for (const p of ps) {
      while (starts.length <= p.message) starts.push(ids.length);
      const piece = 'mark' in p ? [id(p.mark)] : encoded[k++]!;
      for (const id of piece) {
        ids.push(id);
        mask.push(p.train ? 1 : 0);
      }
    }
    while (starts.length <= conversations[c]!.length) starts.push(ids.length);
    return { ids, mask, starts };
  });
}

/**
 * The assistant message in generated ids (up to and without <|end|>): text before the first call is its
 * content. Hermes: each <tool_call>…</tool_call> holds {"name": …, "arguments": …}; legacy: each <|call|>
 * starts a call "name arguments". Calls get ids call_{start}, call_{start+1}, ….
 */
export async function parseAssistant(tokenizer: TextTokenizer, ids: number[], firstCallId = 1): Promise<Message> {
  const end = ids.indexOf(tokenizer.special['<|end|>']);
  const body = end >= 0 ? ids.slice(0, end) : ids;
  const { calls: marks } = tokenizer;
  const segments: number[][] = [[]];
  for (const id of body) {
    if (id === marks.open) segments.push([]);
    else if (marks.format !== 'hermes' || id !== marks.close) segments.at(-1)!.push(id);
  }
  const [content, ...calls] = await Promise.all(segments.map((s) => tokenizer.decode(s)));
  const message: Message = { role: 'assistant', content: content!.trim() ? content! : null };
  if (calls.length > 0) {
    message.tool_calls = calls.map((text, i) => ({
      id: `call_${firstCallId + i}`,
      type: 'function' as const,
      function: marks.format === 'hermes' ? readHermesCall(text) : readLegacyCall(text),
    }));
  }
  return message;
}

/** "name arguments" of a legacy call. */
function readLegacyCall(text: string): ToolCall['function'] {
  const space = text.indexOf(' ');
  const name = (space < 0 ? text : text.slice(0, space)).trim();
  return { name, arguments: space < 0 ? '{}' : text.slice(space + 1).trim() };
}

/**
 * {"name": …, "arguments": …} of a Hermes call, the arguments' text as written; a call that is not that
 * (sampled without the constraint) keeps what can be read: the name where it is spelt, the rest as text.
 */
function readHermesCall(text: string): ToolCall['function'] {
  const m = /^\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*(?:,\s*"arguments"\s*:\s*([\s\S]*?)\s*\}?\s*)?$/.exec(text);
  if (m) return { name: unquote(m[1]!), arguments: m[2] || '{}' };
  try {
    const v = JSON.parse(text) as { name?: unknown; arguments?: unknown };
    if (v && typeof v === 'object' && typeof v.name === 'string')
      return { name: v.name, arguments: JSON.stringify(v.arguments ?? {}) };
  } catch {
    // not JSON: kept as text below
  }
  return { name: '', arguments: text.trim() };
}

function unquote(quoted: string): string {
  try {
    return JSON.parse(quoted) as string;
  } catch {
    return quoted.slice(1, -1);
  }
}
