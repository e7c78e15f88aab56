// How a model reads conversations and writes replies: its tokenizer and chat template, behind one interface
// the trainer, the scorers and the simulator's policy use alike. Two kinds:
//   prefab's own (chat-template.ts, the tokenizer stage's tokenizer.json): what from-scratch models read;
//   a Hugging Face folder's (hf-chat.ts: tokenizer.json and the Jinja chat template of tokenizer_config.json
//   or chat_template.jinja): what a pretrained model (sft.model.from) was trained to read.
import type { Message } from '../core/records.ts';
import {
  PREFAB_CHAT_TEMPLATE,
  PREFAB_LEGACY_CHAT_TEMPLATE,
  encodeConversations,
  parseAssistant,
  type Encoded,
} from './chat-template.ts';
import { ToolCallConstraint, type ToolChoice, type ToolSchema } from './constrain.ts';
import { HfChat, readChatTemplate } from './hf-chat.ts';
import { TextTokenizer } from './tokenizer.ts';

export interface Chat {
  /** Which kind: "prefab" or the template's source. */
  readonly name: string;
  readonly vocabSize: number;
  /** The id padding is written with (never trained on or attended to). */
  readonly pad: number;
  /** Tokens that end an assistant turn: generation stops after any of them. */
  readonly stop: number[];
  /** Conversations as ids with the assistant mask and where each message starts; `openAssistant` ends each with the header of a reply to write. */
  encode(conversations: Message[][], openAssistant?: boolean): Promise<Encoded[]>;
  /** The assistant message that generated ids spell (tool calls parsed); calls get ids call_{firstCallId}, …. */
  parseAssistant(ids: number[], firstCallId: number): Promise<Message>;
  /** A constraint that keeps generated tool calls calls of `tools` as `choice` asks (model/constrain.ts), or null where the format has none. */
  toolConstraint(tools: readonly ToolSchema[], choice?: ToolChoice): Promise<ToolCallConstraint | null>;
}

/** prefab's template over a tokenizer the tokenizer stage trained. */
class PrefabChat implements Chat {
  readonly name = 'prefab';
  readonly vocabSize: number;
  readonly pad: number;
  readonly stop: number[];

  constructor(private readonly tokenizer: TextTokenizer) {
    this.vocabSize = tokenizer.vocabSize;
    this.pad = tokenizer.special['<|pad|>'];
    this.stop = [tokenizer.special['<|end|>']];
  }

  encode(conversations: Message[][], openAssistant = false): Promise<Encoded[]> {
    return encodeConversations(this.tokenizer, conversations, openAssistant);
  }

  parseAssistant(ids: number[], firstCallId: number): Promise<Message> {
    return parseAssistant(this.tokenizer, ids, firstCallId);
  }

  async toolConstraint(tools: readonly ToolSchema[], choice: ToolChoice = 'auto'): Promise<ToolCallConstraint> {
    // Every constraint reads the same texts of the vocabulary: decoded once.
    this.texts ??= Promise.all(Array.from({ length: this.vocabSize }, (_, id) => this.tokenizer.decode([id])));
    const { calls, control, special } = this.tokenizer;
    return new ToolCallConstraint(tools, await this.texts, { calls, control, end: special['<|end|>'] }, choice);
  }

  private texts: Promise<string[]> | null = null;
}

/** prefab's chat over a tokenizer.json the tokenizer stage trained. */
export const prefabChat = (tokenizerJson: string): Chat => new PrefabChat(new TextTokenizer(tokenizerJson));

/**
 * The chat of a model folder's tokenizer files: prefab's own when tokenizer.json has prefab's special tokens
 * and the chat template is prefab's (either format's) or there is none, else the folder's template. `eos` is
 * the model config's eos_token_id, which ends a reply too. Names the folder when it has neither.
 */
export function openChat(files: Record<string, string>, eos: number | number[] | null, source: string): Chat {
  const json = files['tokenizer.json'];
  if (json === undefined) throw new Error(`${source} has no tokenizer.json`);
  const template = readChatTemplate(files, source);
  // prefab's own template, as the folders it writes carry it for other tools, is read by prefab's own code.
  if (!template || template.source === PREFAB_CHAT_TEMPLATE || template.source === PREFAB_LEGACY_CHAT_TEMPLATE) {
    let tokenizer: TextTokenizer;
    try {
      tokenizer = new TextTokenizer(json);
    } catch {
      throw new Error(
        `${source} has no chat template (tokenizer_config.json's chat_template or chat_template.jinja), so how it reads a conversation is unknown`,
      );
    }
    const format = template?.source === PREFAB_LEGACY_CHAT_TEMPLATE ? 'legacy' : 'hermes';
    if (template && tokenizer.calls.format !== format)
      throw new Error(
        `${source}: its chat template writes calls in prefab's ${format} format, its tokenizer.json has the ${tokenizer.calls.format} format's tokens`,
      );
    return new PrefabChat(tokenizer);
  }
  return new HfChat(json, template, eos);
}
