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

/** Role headers, the tool-call marker, the end of a message, and padding. */
export const SPECIAL_TOKENS = [
  '<|system|>',
  '<|user|>',
  '<|assistant|>',
  '<|tool|>',
  '<|call|>',
  '<|end|>',
  '<|pad|>',
] as const;
export type SpecialToken = (typeof SPECIAL_TOKENS)[number];

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
    const added = [
      ...whole.map((content) => ({ content, special: false })),
      ...SPECIAL_TOKENS.map((content) => ({ content, special: true })),
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
  readonly vocabSize: number;

  constructor(readonly json: string) {
    this.tokenizer = Tokenizer.fromString(json);
    this.vocabSize = this.tokenizer.getVocabSize(true);
    this.special = Object.fromEntries(
      SPECIAL_TOKENS.map((t) => {
        const id = this.tokenizer.tokenToId(t);
        if (id === null)
          throw new Error(`tokenizer.json has no special token ${t}: it was not made by prefab's tokenizer stage`);
        return [t, id];
      }),
    ) as Record<SpecialToken, number>;
  }

  /**
   * Ids of plain text. Text that spells a special token ("<|end|>" typed by a user) is encoded as ordinary
   * bytes, never as the control token.
   */
  async encodeBatch(texts: string[]): Promise<number[][]> {
    const pieces = texts.map((t) => splitSpecial(t));
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

const SPECIAL_PATTERN = new RegExp(`(${SPECIAL_TOKENS.map((t) => t.replace(/[|]/g, '\\|')).join('|')})`);

/** Splits text so that no piece contains a whole special token: "<" is cut from the rest of each spelling. */
function splitSpecial(text: string): string[] {
  if (!SPECIAL_PATTERN.test(text)) return [text];
  const out: string[] = [];
  for (const part of text.split(SPECIAL_PATTERN)) {
    if (SPECIAL_TOKENS.includes(part as SpecialToken)) out.push('<', part.slice(1));
    else if (part) out.push(part);
  }
  return out;
}
