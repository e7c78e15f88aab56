// Byte-level BPE trained with Hugging Face `tokenizers`, saved as a standard tokenizer.json.
//
// The Node binding trains with BpeTrainer's defaults and does not take a vocabulary size, so we train to its
// default size and keep the first merges: BPE learns merges greedily, most frequent pair first, so the first
// k merges are exactly what training to 256 + k tokens would have learnt. The file is then assembled with the
// full byte alphabet (any text can be encoded) and the chat template's special tokens, and loaded back.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  BPE,
  Tokenizer,
  byteLevelAlphabet,
  byteLevelPreTokenizer,
  digitsPreTokenizer,
  sequencePreTokenizer,
} from 'tokenizers';

/** Role headers, the end of a message, and padding: every prefab tokenizer has them. */
const ROLE_TOKENS = ['<|system|>', '<|user|>', '<|assistant|>', '<|tool|>', '<|end|>', '<|pad|>'] as const;
export type SpecialToken = (typeof ROLE_TOKENS)[number];

/**
 * The tokens a call is written between: Hermes's (Qwen2.5's), so that vLLM's `hermes` parser, llama.cpp's
 * `--jinja` and Ollama read prefab's models' calls. llama.cpp ends generation on some special tokens by
 * their text (`<|call|>` among them), so none of these may be one.
 */
const HERMES_CALL = ['<tool_call>', '</tool_call>'] as const;

/** The one marker that began each call ("name {arguments}") in tokenizers made before: their models still load. */
const LEGACY_CALL = '<|call|>';

/** The special tokens a tokenizer the tokenizer stage trains has. */
export const SPECIAL_TOKENS = [...ROLE_TOKENS, ...HERMES_CALL] as const;

/** How a tokenizer's model writes tool calls: between Hermes's tokens, or after prefab's earlier `<|call|>`. */
export type CallTokens = { format: 'hermes'; open: number; close: number } | { format: 'legacy'; open: number };

const BYTE_LEVEL = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true };

/**
 * Trains a byte-level BPE of `vocabSize` tokens (bytes, merges, whole words and special tokens) on the texts;
 * returns tokenizer.json's content. With `splitDigits`, every digit is a token of its own (no merges across
 * digits). `words` become tokens of their own wherever they appear ("[PHONE_3]" one token, not five pieces),
 * and BPE learns its merges from the rest of the text.
 */
export function trainTokenizer(
  texts: string[],
  vocabSize: number,
  splitDigits = false,
  words: readonly string[] = [],
): string {
  const alphabet = [...byteLevelAlphabet()].sort();
  const whole = [...new Set(words)];
  const room = vocabSize - alphabet.length - whole.length - SPECIAL_TOKENS.length;
  if (room < 0)
    throw new Error(
      `a vocabulary of ${vocabSize} cannot hold the 256 bytes, ${whole.length} whole words and ${SPECIAL_TOKENS.length} special tokens: use at least ${alphabet.length + whole.length + SPECIAL_TOKENS.length}`,
    );
  const dir = mkdtempSync(join(tmpdir(), 'prefab-bpe-'));
  try {
    const cut = whole.length
      ? new RegExp(whole.map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|'), 'g')
      : null;
    writeFileSync(join(dir, 'corpus.txt'), (cut ? texts.map((t) => t.replace(cut, '\n')) : texts).join('\n'));
    const trainer = new Tokenizer(BPE.empty());
    trainer.setPreTokenizer(
      splitDigits
        ? sequencePreTokenizer([digitsPreTokenizer(true), byteLevelPreTokenizer(false, true)])
        : byteLevelPreTokenizer(false, true),
    );
    trainer.train([join(dir, 'corpus.txt')]);
    trainer.save(join(dir, 'trained.json'));
    const trained = JSON.parse(readFileSync(join(dir, 'trained.json'), 'utf8')) as {
      model: { merges: ([string, string] | string)[] };
    };
    const vocab: Record<string, number> = {};
    let size = 0;
    for (const ch of alphabet) vocab[ch] = size++;
    const merges: [string, string][] = [];
    for (const m of trained.model.merges) {
      if (merges.length >= room) break;
      const [a, b] = typeof m === 'string' ? (m.split(' ') as [string, string]) : m;
      if (vocab[a + b] !== undefined) continue;
      merges.push([a, b]);
      vocab[a + b] = size++;
    }
    // The call tokens are not `special`, as in Qwen2.5's tokenizer: decoding that skips special tokens
    // (vLLM's, transformers' by default) keeps them, and a parser finds the call in the text.
    const added = [
      ...whole.map((content) => ({ content, special: false })),
      ...ROLE_TOKENS.map((content) => ({ content, special: true })),
      ...HERMES_CALL.map((content) => ({ content, special: false })),
    ].map((t, i) => ({
      id: size + i,
      content: t.content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: t.special,
    }));
    return JSON.stringify({
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: added,
      normalizer: null,
      pre_tokenizer: splitDigits
        ? { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true }, BYTE_LEVEL] }
        : BYTE_LEVEL,
      post_processor: null,
      decoder: BYTE_LEVEL,
      model: {
        type: 'BPE',
        dropout: null,
        unk_token: null,
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: false,
        byte_fallback: false,
        ignore_merges: false,
        vocab,
        merges,
      },
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** A loaded tokenizer.json: text ↔ ids, and the special tokens' ids. */
export class TextTokenizer {
  private readonly tokenizer: Tokenizer;
  readonly special: Record<SpecialToken, number>;
  readonly calls: CallTokens;
  /** Every id of a token that is never text: roles, end, padding and the call tokens. */
  readonly control: number[];
  readonly vocabSize: number;
  private readonly pattern: RegExp;

  constructor(readonly json: string) {
    this.tokenizer = Tokenizer.fromString(json);
    this.vocabSize = this.tokenizer.getVocabSize(true);
    const id = (t: string) => this.tokenizer.tokenToId(t) ?? null;
    const missing = (t: string) =>
      new Error(`tokenizer.json has no special token ${t}: it was not made by prefab's tokenizer stage`);
    this.special = Object.fromEntries(
      ROLE_TOKENS.map((t) => {
        const found = id(t);
        if (found === null) throw missing(t);
        return [t, found];
      }),
    ) as Record<SpecialToken, number>;
    const [open, close, legacy] = [id(HERMES_CALL[0]), id(HERMES_CALL[1]), id(LEGACY_CALL)];
    if (open !== null && close !== null) this.calls = { format: 'hermes', open, close };
    else if (legacy !== null) this.calls = { format: 'legacy', open: legacy };
    else throw missing(HERMES_CALL[open === null ? 0 : 1]);
    const spelt = [...ROLE_TOKENS, ...(this.calls.format === 'hermes' ? HERMES_CALL : [LEGACY_CALL])];
    this.control = spelt.map((t) => id(t)!);
    this.pattern = new RegExp(`(${spelt.map((t) => t.replace(/[|/]/g, '\\$&')).join('|')})`);
  }

  /**
   * Ids of plain text. Text that spells a special token ("<|end|>" typed by a user) is encoded as ordinary
   * bytes, never as the control token.
   */
  async encodeBatch(texts: string[]): Promise<number[][]> {
    const pieces = texts.map((t) => splitSpecial(t, this.pattern));
    const flat = pieces.flat();
    const encoded = flat.length ? await this.tokenizer.encodeBatch(flat, { addSpecialTokens: false }) : [];
    let k = 0;
    return pieces.map((p) => p.flatMap(() => encoded[k++]!.getIds()));
  }

  async encode(text: string): Promise<number[]> {
    return (await this.encodeBatch([text]))[0]!;
  }

  /** Text of ids, special tokens included as they are spelt. */
  async decode(ids: number[]): Promise<string> {
    return this.tokenizer.decode(ids, false);
  }

  idToToken(id: number): string | null {
    return this.tokenizer.idToToken(id);
  }
}

/** Splits text so that no piece contains a whole special token (`pattern`): "<" is cut from the rest of each spelling. */
function splitSpecial(text: string, pattern: RegExp): string[] {
  if (!pattern.test(text)) return [text];
  const out: string[] = [];
  text.split(pattern).forEach((part, i) => {
    // split() with a capturing group puts the matches at the odd places.
    if (i % 2 === 1) out.push('<', part.slice(1));
    else if (part) out.push(part);
  });
  return out;
}
