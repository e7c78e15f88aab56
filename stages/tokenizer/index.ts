// tokenizer: a byte-level BPE trained on the training split's sessions as the model will read them (values it
// copies as placeholders: train/placeholders.ts), saved as tokenizer.json beside placeholders.json.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { safePoint } from '../../pipeline/interrupt.ts';
import { defineStage } from '../../pipeline/stage.ts';
import type { Message } from '../../core/records.ts';
import { conversationTexts } from '../../train/chat-template.ts';
import { fromParquet, readParquet } from '../../train/data.ts';
import { PLACEHOLDERS_FILE, savedPlaceholders, viewAll, type Placeholders } from '../../train/placeholders.ts';
import { TextTokenizer, trainTokenizer } from '../../train/tokenizer.ts';
import { PLACEHOLDERS, Redactor, type RedactionOptions } from '../../core/redact.ts';
import { DEFAULT_WORLD, generateWorld } from '../../env/world.ts';

/** The `placeholders` section: what the model reads as placeholders. */
export const placeholdersConfig = savedPlaceholders.extend({
  enabled: z.boolean().default(true).describe('false: the model reads and writes every value as it is, with no placeholders.'),
  directory: z.strictObject({ world_seed: z.number().int().default(DEFAULT_WORLD.seed), companies: z.number().int().min(1).default(DEFAULT_WORLD.companies) }).nullable().default(null).describe(`The simulator's company directory (the world the sessions came from) as \`terms.COMPANY\`: the model reads "call Globex Insurance" as "call [COMPANY_1]", so looking a company up is one copied token, as in task-oriented dialogue's delexicalisation. null: company names are read as text.`),
});

/** The masking the section describes, with the directory's company names as terms; null when off. */
export function placeholdersOf(cfg: z.infer<typeof placeholdersConfig>): Placeholders {
  if (!cfg.enabled) return null;
  const terms = { ...cfg.terms };
  if (cfg.directory) {
    const world = generateWorld({ ...DEFAULT_WORLD, seed: cfg.directory.world_seed, companies: cfg.directory.companies });
    terms.COMPANY = [...(terms.COMPANY ?? []), ...world.companies.map((c) => c.name)];
  }
  const options: RedactionOptions = { kinds: cfg.kinds, keys: cfg.keys, terms, patterns: cfg.patterns };
  new Redactor(options); // bad labels and expressions fail here, naming the setting, not at the first conversation
  return options;
}

const config = z.strictObject({
  vocab_size: z.number().int().min(263).default(1024).describe("The whole vocabulary: bytes (256), the placeholder tokens, the chat template's 7 special tokens, and BPE's merges in the rest."),
  split_digits: z.boolean().default(true).describe("Every digit a token of its own: a model then copies a phone or account number digit by digit, instead of learning each number's merges."),
  placeholders: placeholdersConfig.prefault({}).describe('Values the agent copies (phone numbers, form values) shown to the model as placeholders: [PHONE_3].'),
  placeholder_tokens: z.number().int().min(0).default(64).describe('At most this many placeholders made tokens of their own (taken from the vocabulary): for each label, [PHONE_1] up to one past the highest number a training session reaches, so copying [PHONE_3] is picking one token, not spelling "[", "PHONE", "_", "3", "]", and a made-up value (the next number) is one token too.'),
});

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
  return labels.flatMap(([label, s]) => Array.from({ length: s.highest + 1 }, (_, i) => `[${label}_${i + 1}]`)).slice(0, budget);
}

export const tokenizer = defineStage({
  name: 'tokenizer',
  description: 'train a byte-level BPE tokenizer on the training sessions',
  version: 5,
  inputs: ['export'],
  outputs: ['tokenizer.json', PLACEHOLDERS_FILE],
  config,

  async run({ config: cfg, out, input, log, signal }) {
    const sessions = await readParquet<{ messages: Message[] }>(join(input('export'), 'sessions', 'train.parquet'));
    if (sessions.length === 0) throw new Error(`${join(input('export'), 'sessions', 'train.parquet')} has no sessions to train a tokenizer on`);
    const placeholders = placeholdersOf(cfg.placeholders);
    // BPE's training is one synchronous call (about a second on the sample): a signal is seen between the steps.
    const stopped = () => 'tokenizer: stopped before it wrote tokenizer.json; the next run trains it again';
    await safePoint(signal, stopped);
    const texts = viewAll(sessions.map((s) => fromParquet(s.messages)), placeholders).flatMap(conversationTexts);
    await safePoint(signal, stopped);
    const words = placeholders ? placeholderWords(texts, cfg.placeholder_tokens) : [];
    log.info('training BPE', { sessions: sessions.length, texts: texts.length, vocab_size: cfg.vocab_size, split_digits: cfg.split_digits, placeholders: placeholders !== null, placeholder_tokens: words.length });
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
  },
});
