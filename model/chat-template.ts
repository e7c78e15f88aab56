// The chat template: messages (tool calls included) → token ids, with the mask of tokens the model is trained
// on (the assistant's), and back from generated ids to an assistant message.
//
//   <|system|>…<|end|><|user|>…<|end|><|assistant|>text<|call|>name {"arg":…}<|end|><|tool|>result<|end|>
//
// The assistant's content, its calls and its closing <|end|> are trained on; its header is not, since it is
// the cue the prompt ends with at generation time. Tool-call ids are not rendered: they are bookkeeping, and
// a generated message gets fresh ones.
import type { Message } from '../core/records.ts';
import type { SpecialToken, TextTokenizer } from './tokenizer.ts';

const HEADER: Record<Message['role'], SpecialToken> = {
  system: '<|system|>',
  user: '<|user|>',
  assistant: '<|assistant|>',
  tool: '<|tool|>',
};

/**
 * The same template in Jinja, for the model folders prefab writes (tokenizer_config.json's chat_template), so
 * that transformers' apply_chat_template, TRL and vLLM render what prefab trains on, token for token. Tool-call
 * arguments are written as given (OpenAI's JSON string), or as compact JSON where a caller passes an object;
 * `{% generation %}` marks the assistant's tokens (transformers' return_assistant_tokens_mask, TRL's
 * assistant_only_loss). `tools` is not rendered: prefab's models learn their tools from the conversation.
 * One difference stays: text that spells a special token (`<|end|>` in a user's message) is text to prefab,
 * and that special token to a tokenizer reading the rendered string whole.
 */
export const PREFAB_CHAT_TEMPLATE = [
  '{%- macro body(message) -%}',
  "{%- if message['content'] -%}{{- message['content'] -}}{%- endif -%}",
  "{%- for call in message['tool_calls'] or [] -%}",
  "{{- '<|call|>' + call['function']['name'] + ' ' -}}",
  "{%- if call['function']['arguments'] is string -%}{{- call['function']['arguments'] -}}",
  "{%- else -%}{{- call['function']['arguments'] | tojson(separators=(',', ':')) -}}{%- endif -%}",
  '{%- endfor -%}',
  "{{- '<|end|>' -}}",
  '{%- endmacro -%}',
  '{%- for message in messages -%}',
  "{{- '<|' + message['role'] + '|>' -}}",
  "{%- if message['role'] == 'assistant' -%}{%- generation -%}{{- body(message) -}}{%- endgeneration -%}",
  '{%- else -%}{{- body(message) -}}{%- endif -%}',
  '{%- endfor -%}',
  "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}",
].join('\n');

/** tokenizer_config.json of a folder whose model reads prefab's template: the template, and its special tokens. */
export function prefabTokenizerConfig(context: number): string {
  const config = {
    tokenizer_class: 'PreTrainedTokenizerFast',
    chat_template: PREFAB_CHAT_TEMPLATE,
    eos_token: '<|end|>',
    pad_token: '<|pad|>',
    bos_token: null,
    unk_token: null,
    model_max_length: context,
    clean_up_tokenization_spaces: false,
  };
  return JSON.stringify(config, null, 2) + '\n';
}

/** A piece of a rendered conversation: a special token or text, whether it is trained on, and its message. */
type Piece = ({ special: SpecialToken } | { text: string }) & { train: boolean; message: number };

function pieces(messages: Message[], openAssistant: boolean): Piece[] {
  const out: Piece[] = [];
  messages.forEach((m, message) => {
    const train = m.role === 'assistant';
    out.push({ special: HEADER[m.role], train: false, message });
    if (m.content) out.push({ text: m.content, train, message });
    for (const call of m.tool_calls ?? [])
      out.push(
        { special: '<|call|>', train, message },
        { text: `${call.function.name} ${call.function.arguments}`, train, message },
      );
    out.push({ special: '<|end|>', train, message });
  });
  if (openAssistant) out.push({ special: '<|assistant|>', train: false, message: messages.length });
  return out;
}

/** The plain text of a conversation, piece by piece (contents and calls, no special tokens): what the tokenizer learns from. */
export function conversationTexts(messages: Message[]): string[] {
  return pieces(messages, false).flatMap((p) => ('text' in p ? [p.text] : []));
}

/** The rendered text, special tokens spelt out: what the ids decode to. */
export function renderText(messages: Message[], openAssistant = false): string {
  return pieces(messages, openAssistant)
    .map((p) => ('special' in p ? p.special : p.text))
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
  const all = conversations.map((c) => pieces(c, openAssistant));
  const texts = conversations.flatMap(conversationTexts);
  const encoded = await tokenizer.encodeBatch(texts);
  let k = 0;
  return all.map((ps, c) => {
    const ids: number[] = [];
    const mask: number[] = [];
    const starts: number[] = [];
    for (const p of ps) {
      while (starts.length <= p.message) starts.push(ids.length);
      const piece = 'special' in p ? [tokenizer.special[p.special]] : encoded[k++]!;
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
 * The assistant message in generated ids (up to and without <|end|>): text before the first <|call|> is its
 * content, each <|call|> starts a call "name arguments". Calls get ids call_{start}, call_{start+1}, ….
 */
export async function parseAssistant(tokenizer: TextTokenizer, ids: number[], firstCallId = 1): Promise<Message> {
  const end = ids.indexOf(tokenizer.special['<|end|>']);
  const body = end >= 0 ? ids.slice(0, end) : ids;
  const segments: number[][] = [[]];
  for (const id of body) {
    if (id === tokenizer.special['<|call|>']) segments.push([]);
    else segments.at(-1)!.push(id);
  }
  const [content, ...calls] = await Promise.all(segments.map((s) => tokenizer.decode(s)));
  const message: Message = { role: 'assistant', content: content!.trim() ? content! : null };
  if (calls.length > 0) {
    message.tool_calls = calls.map((text, i) => {
      const space = text.indexOf(' ');
      const name = (space < 0 ? text : text.slice(0, space)).trim();
      return {
        id: `call_${firstCallId + i}`,
        type: 'function' as const,
        function: { name, arguments: space < 0 ? '{}' : text.slice(space + 1).trim() },
      };
    });
  }
  return message;
}
