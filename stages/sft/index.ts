// sft: supervised fine-tuning of a tiny Llama on the successful training sessions, assistant
// tokens only. Writes the model in Hugging Face's layout, and a metrics line per step.
import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import type { Message } from '../../core/records.ts';
import { stageBackend } from '../../train/backend.ts';
import { resampledSessions } from '../../train/augment.ts';
import { readParquet, sftSequences, subset } from '../../train/data.ts';
import { trainingConfig, trainingRun } from '../../train/run.ts';
import { openChat } from '../../train/chat.ts';
import { modelFiles, readHfConfig, readHfModel, readTokenizerFiles } from '../../train/hf.ts';
import { attachLora, loraOf, loraSettings } from '../../train/lora.ts';
import { Llama, type LlamaConfig } from '../../train/model.ts';
import { sftTrainer } from '../../train/sft.ts';
import { readPlaceholdersFile } from '../../train/placeholders.ts';

const modelConfig = z.strictObject({
  from: z.string().min(1).nullable().default(null).describe("A pretrained Hugging Face folder of the Llama family (config.json, model.safetensors or shards, tokenizer.json, a chat template) to fine-tune, relative to the config file; its tokenizer and chat template are used, and the shape keys below are ignored. null: a new tiny Llama with the tokenizer stage's tokenizer."),
  layers: z.number().int().min(1).default(4).describe('Transformer blocks (num_hidden_layers).'),
  hidden_size: z.number().int().min(8).default(256).describe('Size of the embeddings and of every layer (hidden_size).'),
  intermediate_size: z.number().int().min(1).nullable().default(null).describe("Width of the SwiGLU MLP (null: 8/3 · hidden_size rounded up to a multiple of 32, Llama's ratio)."),
  heads: z.number().int().min(1).default(4).describe('Query heads per layer (num_attention_heads); each is head_dim = hidden_size / heads wide, which must be even.'),
  kv_heads: z.number().int().min(1).nullable().default(null).describe('Key/value heads (num_key_value_heads): query heads share them in groups, grouped-query attention (null: as many as heads).'),
  rope_theta: z.number().positive().default(10000).describe("Rotary embeddings' base: position p turns dimension pair f by p · rope_theta^(−2f/head_dim)."),
  tie_word_embeddings: z.boolean().default(true).describe('The output head is the embedding table.'),
  context: z.number().int().min(16).default(1024).describe("Tokens the model sees at once; longer sessions are cut into windows that keep the user's request."),
});

/** A from-scratch Llama of the configured shape for a tokenizer of `vocabSize` whose end of message is `eos`. */
function newModel(m: z.infer<typeof modelConfig>, vocabSize: number, eos: number, seed: string): Llama {
  const config: LlamaConfig = {
    modelType: 'llama',
    vocabSize,
    hiddenSize: m.hidden_size,
    intermediateSize: m.intermediate_size ?? Math.ceil((8 / 3) * m.hidden_size / 32) * 32,
    layers: m.layers,
    heads: m.heads,
    kvHeads: m.kv_heads ?? m.heads,
    headDim: m.hidden_size / m.heads,
    ropeTheta: m.rope_theta,
    rmsNormEps: 1e-6,
    tiedEmbeddings: m.tie_word_embeddings,
    attentionBias: false,
    maxPositions: m.context,
    bosTokenId: null,
    eosTokenId: eos,
  };
  return Llama.create(config, seed);
}

const config = z
  .strictObject({
    model: modelConfig.prefault({}).describe("The model trained from scratch: a tiny Llama (LlamaForCausalLM's architecture), written as a Hugging Face folder; the preference stage and eval take it from the SFT model."),
    max_sessions: z.number().int().min(1).nullable().default(null).describe('Train on at most this many sessions (null: all), drawn by a seeded shuffle.'),
    resample_copies: z.number().min(0).max(1).default(0).describe('Share of sessions whose copied values (what the assistant copies from the conversation into its calls: names, phone and account numbers) are replaced by random ones of the same shape, so the model learns to copy them rather than learn them by heart (train/augment.ts).'),
    lora: loraSettings,
    ...trainingConfig(1e-3),
  })
  .refine((c) => c.model.hidden_size % c.model.heads === 0 && (c.model.hidden_size / c.model.heads) % 2 === 0, { message: 'model.hidden_size / model.heads (head_dim) must be a whole, even number: rotary embeddings turn pairs of dimensions' })
  .refine((c) => c.model.heads % (c.model.kv_heads ?? c.model.heads) === 0, { message: 'model.heads must be a multiple of model.kv_heads' })
  .refine((c) => c.lora === null || c.model.from !== null, { message: "lora needs model.from: adapters learn on a pretrained model's weights, not on a new model's random ones" });

export const sft = defineStage({
  name: 'sft',
  description: 'supervised fine-tuning on successful training sessions (assistant tokens only)',
  version: 4,
  inputs: ['tokenizer', 'export'],
  outputs: ['model', 'metrics.jsonl'],
  config,

  external: (cfg, configDir) => Promise.resolve(cfg.model.from ? modelFiles(resolve(configDir, cfg.model.from)) : []),

  async run({ config: cfg, configDir, out, input, cache, key, log, options, signal }) {
    const backend = await stageBackend(options, log);
    const placeholders = await readPlaceholdersFile(input('tokenizer'));
    const from = cfg.model.from ? resolve(configDir, cfg.model.from) : null;
    // A pretrained model brings its tokenizer and template; a new one reads the tokenizer stage's.
    const tokenizer = from ? readTokenizerFiles(from) : { 'tokenizer.json': await readFile(join(input('tokenizer'), 'tokenizer.json'), 'utf8') };
    // The pretrained weights are read when the run starts from them, not when it resumes from a checkpoint.
    const pretrained = from ? readHfConfig(from) : null;
    const chat = openChat(tokenizer, pretrained?.config.eosTokenId ?? null, from ?? input('tokenizer'));
    const context = Math.min(cfg.model.context, pretrained?.config.maxPositions ?? Infinity);
    const path = join(input('export'), 'sft', 'train.parquet');
    const sessions = subset(await readParquet<{ messages: Message[] }>(path), cfg.max_sessions, cfg.seed);
    if (sessions.length === 0) throw new Error(`${path} has no sessions: nothing to fine-tune on (export.sft_min_reward may be too high)`);
    const { conversations, resampled } = resampledSessions(sessions.map((s) => s.messages), cfg.resample_copies, cfg.seed);
    const sequences = await sftSequences(chat, conversations, context + 1, path, placeholders);
    const lora = cfg.lora ? loraOf(cfg.lora) : undefined;
    const start = () => {
      const weights = from ? readHfModel(from) : null;
      const model = weights ? new Llama(weights.config, weights.weights) : newModel(cfg.model, chat.vocabSize, chat.stop[0]!, cfg.seed);
      if (lora) attachLora(model, lora, cfg.seed);
      return model;
    };
    const trainer = sftTrainer(sequences, start, cfg, chat.pad);
    log.info('training', { from, chat: chat.name, sessions: sessions.length, resampled, windows: sequences.length, tokens: sequences.reduce((n, s) => n + s.ids.length, 0), steps: trainer.steps, lora: lora ? `r ${lora.r} on ${lora.targetModules.join(', ')}` : null, backend: backend.name });

    const result = await trainingRun({ config: cfg, cache, key, tokenizer, context, placeholders, lora, base: from ?? undefined, signal, log }, trainer);
    const parameters = result.model.size();
    const last = await result.save(out, { stage: 'sft', from, sessions: sessions.length, windows: sequences.length });
    return {
      counts: { sessions: sessions.length, resampled, windows: sequences.length, steps: trainer.steps, resumed_from: result.resumedFrom, parameters },
      summary: `${trainer.steps} steps on ${sessions.length} sessions (${sequences.length} windows)${from ? ` from ${from}` : ''}${lora ? ` (LoRA r ${lora.r})` : ''}; loss ${last.loss?.toFixed(3)}, ${Math.round(last['tokens/s'] ?? 0)} tokens/s on ${backend.name}`,
    };
  },
});
