// sft: supervised fine-tuning of a small transformer on the successful training sessions, assistant
// tokens only. Writes the model in Hugging Face's layout, and a metrics line per step.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import type { Message } from '../../core/records.ts';
import { stageBackend } from '../../train/backend.ts';
import { resampledSessions } from '../../train/augment.ts';
import { readParquet, sftSequences, subset } from '../../train/data.ts';
import { trainingConfig, trainingRun } from '../../train/run.ts';
import { sftTrainer } from '../../train/sft.ts';
import { readPlaceholdersFile } from '../../train/placeholders.ts';
import { TextTokenizer } from '../../train/tokenizer.ts';

const modelConfig = z.strictObject({
  layers: z.number().int().min(1).default(4).describe('Transformer blocks.'),
  width: z.number().int().min(8).default(256).describe('Size of the embeddings and of every layer (the MLP is 4 × width); a multiple of heads.'),
  heads: z.number().int().min(1).default(4).describe('Attention heads per layer; each is width / heads wide, which must be even with rope.'),
  context: z.number().int().min(16).default(1024).describe("Tokens the model sees at once; longer sessions are cut into windows that keep the user's request."),
  positions: z.enum(['rope', 'learned']).default('rope').describe("rope: rotary embeddings (attention sees how far apart tokens are); learned: GPT-2's table of positions."),
});

const config = z
  .strictObject({
    model: modelConfig.prefault({}).describe("The transformer's shape (GPT-2's architecture); the preference stage and eval take it from the SFT model."),
    max_sessions: z.number().int().min(1).nullable().default(null).describe('Train on at most this many sessions (null: all), drawn by a seeded shuffle.'),
    resample_copies: z.number().min(0).max(1).default(0).describe('Share of sessions whose copied values (what the assistant copies from the conversation into its calls: names, phone and account numbers) are replaced by random ones of the same shape, so the model learns to copy them rather than learn them by heart (train/augment.ts).'),
    ...trainingConfig(1e-3),
  })
  .refine((c) => c.model.width % c.model.heads === 0, { message: 'model.width must be a multiple of model.heads' })
  .refine((c) => c.model.positions !== 'rope' || (c.model.width / c.model.heads) % 2 === 0, { message: 'model.positions rope turns pairs of dimensions: model.width / model.heads must be even' });


export const sft = defineStage({
  name: 'sft',
  description: 'supervised fine-tuning on successful training sessions (assistant tokens only)',
  version: 3,
  inputs: ['tokenizer', 'export'],
  outputs: ['model', 'metrics.jsonl'],
  config,

  async run({ config: cfg, out, input, cache, key, log, options, signal }) {
    const backend = await stageBackend(options, log);
    const tokenizerJson = await readFile(join(input('tokenizer'), 'tokenizer.json'), 'utf8');
    const tokenizer = new TextTokenizer(tokenizerJson);
    const placeholders = await readPlaceholdersFile(input('tokenizer'));
    const path = join(input('export'), 'sft', 'train.parquet');
    const sessions = subset(await readParquet<{ messages: Message[] }>(path), cfg.max_sessions, cfg.seed);
    if (sessions.length === 0) throw new Error(`${path} has no sessions: nothing to fine-tune on (export.sft_min_reward may be too high)`);
    const { conversations, resampled } = resampledSessions(sessions.map((s) => s.messages), cfg.resample_copies, cfg.seed);
    const sequences = await sftSequences(tokenizer, conversations, cfg.model.context + 1, path, placeholders);
    const m = cfg.model;
    const shape = { vocabSize: tokenizer.vocabSize, contextLength: m.context, layers: m.layers, width: m.width, heads: m.heads, positions: m.positions };
    const trainer = sftTrainer(sequences, shape, cfg, tokenizer.special['<|pad|>']);
    log.info('training', { sessions: sessions.length, resampled, windows: sequences.length, tokens: sequences.reduce((n, s) => n + s.ids.length, 0), steps: trainer.steps, backend: backend.name });

    const result = await trainingRun({ config: cfg, cache, key, tokenizerJson, placeholders, signal, log }, trainer);
    const parameters = result.model.size();
    const last = await result.save(out, { stage: 'sft', sessions: sessions.length, windows: sequences.length });
    return {
      counts: { sessions: sessions.length, resampled, windows: sequences.length, steps: trainer.steps, resumed_from: result.resumedFrom, parameters },
      summary: `${trainer.steps} steps on ${sessions.length} sessions (${sequences.length} windows); loss ${last.loss?.toFixed(3)}, ${Math.round(last['tokens/s'] ?? 0)} tokens/s on ${backend.name}`,
    };
  },
});
