// sft: supervised fine-tuning of a tiny Llama on the successful training sessions, assistant
// tokens only. Writes the model in Hugging Face's layout, and a metrics line per step.
import { resolve } from 'node:path';
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import { loraSettings, trainingConfig } from '../../trainers/settings.ts';

const modelConfig = z.strictObject({
  from: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "A pretrained Hugging Face folder of the Llama family (config.json, model.safetensors or shards, tokenizer.json, a chat template) to fine-tune, relative to the config file; its tokenizer and chat template are used, and the shape keys below are ignored. null: a new tiny Llama with the tokenizer stage's tokenizer.",
    ),
  layers: z.number().int().min(1).default(4).describe('Transformer blocks (num_hidden_layers).'),
  hidden_size: z
    .number()
    .int()
    .min(8)
    .default(256)
    .describe('Size of the embeddings and of every layer (hidden_size).'),
  intermediate_size: z
    .number()
    .int()
    .min(1)
    .nullable()
    .default(null)
    .describe("Width of the SwiGLU MLP (null: 8/3 · hidden_size rounded up to a multiple of 32, Llama's ratio)."),
  heads: z
    .number()
    .int()
    .min(1)
    .default(4)
    .describe(
      'Query heads per layer (num_attention_heads); each is head_dim = hidden_size / heads wide, which must be even.',
    ),
  kv_heads: z
    .number()
    .int()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      'Key/value heads (num_key_value_heads): query heads share them in groups, grouped-query attention (null: as many as heads).',
    ),
  rope_theta: z
    .number()
    .positive()
    .default(10000)
    .describe("Rotary embeddings' base: position p turns dimension pair f by p · rope_theta^(−2f/head_dim)."),
  tie_word_embeddings: z.boolean().default(true).describe('The output head is the embedding table.'),
  context: z
    .number()
    .int()
    .min(16)
    .default(1024)
    .describe("Tokens the model sees at once; longer sessions are cut into windows that keep the user's request."),
});

const config = z
  .strictObject({
    model: modelConfig
      .prefault({})
      .describe(
        "The model trained from scratch: a tiny Llama (LlamaForCausalLM's architecture), written as a Hugging Face folder; the preference stage and eval take it from the SFT model.",
      ),
    max_sessions: z
      .number()
      .int()
      .min(1)
      .nullable()
      .default(null)
      .describe('Train on at most this many sessions (null: all), drawn by a seeded shuffle.'),
    resample_copies: z
      .number()
      .min(0)
      .max(1)
      .default(0)
      .describe(
        'Share of sessions whose copied values (what the assistant copies from the conversation into its calls: names, phone and account numbers) are replaced by random ones of the same shape, so the model learns to copy them rather than learn them by heart (trainers/augment.ts).',
      ),
    lora: loraSettings,
    ...trainingConfig(1e-3),
  })
  .refine((c) => c.model.hidden_size % c.model.heads === 0 && (c.model.hidden_size / c.model.heads) % 2 === 0, {
    message:
      'model.hidden_size / model.heads (head_dim) must be a whole, even number: rotary embeddings turn pairs of dimensions',
  })
  .refine((c) => c.model.heads % (c.model.kv_heads ?? c.model.heads) === 0, {
    message: 'model.heads must be a multiple of model.kv_heads',
  })
  .refine((c) => c.lora === null || c.model.from !== null, {
    message: "lora needs model.from: adapters learn on a pretrained model's weights, not on a new model's random ones",
  });

/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;
export type ModelSettings = z.infer<typeof modelConfig>;

export const sft = defineStage({
  name: 'sft',
  description: 'supervised fine-tuning on successful training sessions (assistant tokens only)',
  version: 5,
  inputs: ['tokenizer', 'export'],
  outputs: ['model', 'metrics.jsonl'],
  config,

  external: async (cfg, configDir) =>
    cfg.model.from ? (await import('../../model/hf.ts')).modelFiles(resolve(configDir, cfg.model.from)) : [],

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
});
