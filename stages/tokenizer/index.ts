// tokenizer: a byte-level BPE trained on the training split's sessions, saved as tokenizer.json.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import type { Message } from '../records.ts';
import { conversationTexts } from '../train/chat-template.ts';
import { fromParquet, readParquet } from '../train/data.ts';
import { TextTokenizer, trainTokenizer } from '../train/tokenizer.ts';

const config = z.strictObject({
  /** Bytes (256), merges and the chat template's 7 special tokens. */
  vocab_size: z.number().int().min(263).default(1024),
  /** Every digit a token of its own: a model then copies a phone or account number digit by digit, instead of learning each number's merges. */
  split_digits: z.boolean().default(true),
});

export const tokenizer = defineStage({
  name: 'tokenizer',
  description: 'train a byte-level BPE tokenizer on the training sessions',
  version: 2,
  inputs: ['export'],
  outputs: ['tokenizer.json'],
  config,

  async run({ config: cfg, out, input, log }) {
    const sessions = await readParquet<{ messages: Message[] }>(join(input('export'), 'sessions', 'train.parquet'));
    if (sessions.length === 0) throw new Error(`${join(input('export'), 'sessions', 'train.parquet')} has no sessions to train a tokenizer on`);
    const texts = sessions.flatMap((s) => conversationTexts(fromParquet(s.messages)));
    log.info('training BPE', { sessions: sessions.length, texts: texts.length, vocab_size: cfg.vocab_size, split_digits: cfg.split_digits });
    const json = trainTokenizer(texts, cfg.vocab_size, cfg.split_digits);
    await writeFile(join(out, 'tokenizer.json'), json);
    // Tokens per session on what it was trained on: how much a vocabulary of this size compresses.
    const t = new TextTokenizer(json);
    const sample = texts.slice(0, 2000);
    const ids = await t.encodeBatch(sample);
    const chars = sample.reduce((s, x) => s + x.length, 0);
    const tokens = ids.reduce((s, x) => s + x.length, 0);
    return {
      counts: { vocab_size: t.vocabSize, sessions: sessions.length },
      summary: `${t.vocabSize} tokens from ${sessions.length} sessions; ${(chars / Math.max(1, tokens)).toFixed(2)} characters a token`,
    };
  },
});
