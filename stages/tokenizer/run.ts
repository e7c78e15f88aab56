// The tokenizer stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { safePoint } from '../../pipeline/interrupt.ts';
import type { Message } from '../../core/records.ts';
import { conversationTexts } from '../../model/chat-template.ts';
import { fromParquet, readParquet } from '../../trainers/data.ts';
import { PLACEHOLDERS_FILE, viewAll } from '../../model/placeholders.ts';
import { TextTokenizer, trainTokenizer } from '../../model/tokenizer.ts';
import { PLACEHOLDERS } from '../../core/redact.ts';

import type { StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';
import { placeholdersOf } from './placeholders.ts';

/**
 * Placeholders made tokens of their own: for each label, every number from 1 to one past the highest the
 * training sessions reach, so a value a completion makes up (it gets the next number) is one token as a
 * copied value is, and length or spelling does not tell them apart. Labels seen most often come first; at
 * most `budget` tokens.
 */
function placeholderWords(texts: string[], budget: number): string[] {
  const seen = new Map<string, { count: number; highest: number }>();
  for (const t of texts) {
    for (const [p] of t.matchAll(PLACEHOLDERS)) {
      const cut = p.lastIndexOf('_');
      const label = p.slice(1, cut);
      const s = seen.get(label) ?? { count: 0, highest: 0 };
      s.count++;
      s.highest = Math.max(s.highest, Number(p.slice(cut + 1, -1)));
      seen.set(label, s);
    }
  }
  const labels = [...seen].sort((a, b) => b[1].count - a[1].count || (a[0] < b[0] ? -1 : 1));
  return labels
    .flatMap(([label, s]) => Array.from({ length: s.highest + 1 }, (_, i) => `[${label}_${i + 1}]`))
    .slice(0, budget);
}

export async function run({ config: cfg, out, input, log, signal }: StageContext<Config>): Promise<StageReport> {
  const sessions = await readParquet<{ messages: Message[] }>(join(input('export'), 'sessions', 'train.parquet'));
  if (sessions.length === 0)
    throw new Error(`${join(input('export'), 'sessions', 'train.parquet')} has no sessions to train a tokenizer on`);
  const placeholders = placeholdersOf(cfg.placeholders);
  // BPE's training is one synchronous call (about a second on the sample): a signal is seen between the steps.
  const stopped = () => 'tokenizer: stopped before it wrote tokenizer.json; the next run trains it again';
  await safePoint(signal, stopped);
  const texts = viewAll(
    sessions.map((s) => fromParquet(s.messages)),
    placeholders,
  ).flatMap((messages) => conversationTexts(messages));
  await safePoint(signal, stopped);
  const words = placeholders ? placeholderWords(texts, cfg.placeholder_tokens) : [];
  log.info('training BPE', {
    sessions: sessions.length,
    texts: texts.length,
    vocab_size: cfg.vocab_size,
    split_digits: cfg.split_digits,
    placeholders: placeholders !== null,
    placeholder_tokens: words.length,
  });
  const json = trainTokenizer(texts, cfg.vocab_size, cfg.split_digits, words);
  await safePoint(signal, stopped);
  await writeFile(join(out, 'tokenizer.json'), json);
  await writeFile(join(out, PLACEHOLDERS_FILE), `${JSON.stringify(placeholders, null, 2)}\n`);
  // Tokens per session on what it was trained on: how much a vocabulary of this size compresses.
  const t = new TextTokenizer(json);
  const sample = texts.slice(0, 2000);
  const ids = await t.encodeBatch(sample);
  const chars = sample.reduce((s, x) => s + x.length, 0);
  const tokens = ids.reduce((s, x) => s + x.length, 0);
  return {
    counts: { vocab_size: t.vocabSize, sessions: sessions.length, placeholder_tokens: words.length },
    summary: `${t.vocabSize} tokens (${words.length} of them placeholders) from ${sessions.length} sessions; ${(chars / Math.max(1, tokens)).toFixed(2)} characters a token`,
  };
}
