// Hugging Face model folders, in and out: config.json (LlamaForCausalLM or Qwen2ForCausalLM) and the weights in
// model.safetensors or shards named by model.safetensors.index.json, in float32, bfloat16 or float16 (read as
// float32). What prefab writes is float32 in transformers' names and orientations, with format "pt", so
// `AutoModelForCausalLM.from_pretrained(folder)` loads it as it is.
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Llama } from './llama.ts';
import { readSafetensors, writeSafetensors } from './safetensors.ts';
import { llamaParameterShapes, type LlamaConfig } from './config.ts';

const ARCHITECTURES: Record<string, LlamaConfig['modelType']> = { llama: 'llama', qwen2: 'qwen2' };

/** The model's config from a config.json object; `source` names the file in errors. */
export function llamaConfigFromJson(j: Record<string, unknown>, source: string): LlamaConfig {
  const modelType = ARCHITECTURES[String(j.model_type)];
  if (!modelType)
    throw new Error(
      `${source}: model_type ${JSON.stringify(j.model_type)} is not one prefab runs; it runs the Llama family: ${Object.keys(ARCHITECTURES).join(', ')}`,
    );
  const int = (key: string, fallback?: number): number => {
    const v = j[key] ?? fallback;
    if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0)
      throw new Error(`${source}: ${key} must be a positive integer (got ${JSON.stringify(v)})`);
    return v;
  };
  const act = j.hidden_act ?? 'silu';
  if (act !== 'silu')
    throw new Error(`${source}: hidden_act ${JSON.stringify(act)}: the Llama family's MLP is SwiGLU with silu`);
  // transformers 5 writes rope_parameters; most published checkpoints have rope_theta at the top level.
  const rope = (j.rope_parameters ?? j.rope_scaling ?? null) as Record<string, unknown> | null;
  const ropeType = rope?.rope_type ?? rope?.type ?? 'default';
  if (ropeType !== 'default')
    throw new Error(
      `${source}: rope type ${JSON.stringify(ropeType)} is not supported yet (only the default rotary embedding)`,
    );
  const theta = Number(rope?.rope_theta ?? j.rope_theta ?? 10000);
  const heads = int('num_attention_heads');
  const hiddenSize = int('hidden_size');
  const config: LlamaConfig = {
    modelType,
    vocabSize: int('vocab_size'),
    hiddenSize,
    intermediateSize: int('intermediate_size'),
    layers: int('num_hidden_layers'),
    heads,
    kvHeads: int('num_key_value_heads', heads),
    headDim: int('head_dim', hiddenSize / heads),
    ropeTheta: theta,
    rmsNormEps: Number(j.rms_norm_eps ?? 1e-6),
    tiedEmbeddings: Boolean(j.tie_word_embeddings ?? false),
    attentionBias: modelType === 'qwen2' ? true : Boolean(j.attention_bias ?? false),
    maxPositions: int('max_position_embeddings', 2048),
    bosTokenId: typeof j.bos_token_id === 'number' ? j.bos_token_id : null,
    eosTokenId:
      typeof j.eos_token_id === 'number' ||
      (Array.isArray(j.eos_token_id) && j.eos_token_id.every((x) => typeof x === 'number'))
        ? (j.eos_token_id as number | number[])
        : null,
  };
  if (config.heads % config.kvHeads !== 0)
    throw new Error(
      `${source}: num_attention_heads (${config.heads}) must be a multiple of num_key_value_heads (${config.kvHeads})`,
    );
  if (config.headDim % 2 !== 0)
    throw new Error(`${source}: head_dim (${config.headDim}) must be even for rotary embeddings`);
  if (j.mlp_bias === true) throw new Error(`${source}: mlp_bias true is not supported`);
  return config;
}

/** config.json as transformers writes it for this model (both rope_theta and rope_parameters, for old and new readers). */
export function llamaConfigJson(c: LlamaConfig): Record<string, unknown> {
  return {
    architectures: [c.modelType === 'qwen2' ? 'Qwen2ForCausalLM' : 'LlamaForCausalLM'],
    model_type: c.modelType,
    vocab_size: c.vocabSize,
    hidden_size: c.hiddenSize,
    intermediate_size: c.intermediateSize,
    num_hidden_layers: c.layers,
    num_attention_heads: c.heads,
    num_key_value_heads: c.kvHeads,
    head_dim: c.headDim,
    hidden_act: 'silu',
    max_position_embeddings: c.maxPositions,
    rms_norm_eps: c.rmsNormEps,
    rope_theta: c.ropeTheta,
    rope_parameters: { rope_type: 'default', rope_theta: c.ropeTheta },
    tie_word_embeddings: c.tiedEmbeddings,
    ...(c.modelType === 'llama' ? { attention_bias: c.attentionBias, mlp_bias: false } : {}),
    bos_token_id: c.bosTokenId,
    eos_token_id: c.eosTokenId,
    torch_dtype: 'float32',
    dtype: 'float32',
  };
}

/** The weight files of a folder: model.safetensors, or the shards its index names. */
function weightFiles(dir: string): string[] {
  const single = join(dir, 'model.safetensors');
  if (existsSync(single)) return [single];
  const index = join(dir, 'model.safetensors.index.json');
  if (existsSync(index)) {
    const map = (JSON.parse(readFileSync(index, 'utf8')) as { weight_map?: Record<string, string> }).weight_map;
    if (!map) throw new Error(`${index}: no weight_map`);
    return [...new Set(Object.values(map))].sort().map((f) => join(dir, f));
  }
  throw new Error(
    `${dir}: no model.safetensors or model.safetensors.index.json (prefab reads safetensors weights, not PyTorch .bin files)`,
  );
}

/** The tokenizer's files a model folder carries, by name, as Hugging Face folders have them. */
const TOKENIZER_FILES = [
  'tokenizer.json',
  'tokenizer_config.json',
  'special_tokens_map.json',
  'chat_template.jinja',
] as const;

/** A model folder's tokenizer files: file name → content. tokenizer.json is the one every folder has. */
export type TokenizerFiles = Record<string, string>;

/** The tokenizer files of the folder `dir` (those of TOKENIZER_FILES it has); names the folder when it has no tokenizer.json. */
export function readTokenizerFiles(dir: string): TokenizerFiles {
  const files: TokenizerFiles = {};
  for (const name of TOKENIZER_FILES)
    if (existsSync(join(dir, name))) files[name] = readFileSync(join(dir, name), 'utf8');
  if (!files['tokenizer.json'])
    throw new Error(`${dir} has no tokenizer.json: prefab reads tokenizers in Hugging Face's tokenizer.json format`);
  return files;
}

/** The files a model folder's model and tokenizer are read from (what a stage that starts from it depends on). */
export function modelFiles(dir: string): string[] {
  if (!existsSync(join(dir, 'config.json'))) throw new Error(`${dir} is not a model folder: it has no config.json`);
  const tokenizer = TOKENIZER_FILES.map((f) => join(dir, f)).filter((f) => existsSync(f));
  const index = join(dir, 'model.safetensors.index.json');
  return [join(dir, 'config.json'), ...(existsSync(index) ? [index] : []), ...weightFiles(dir), ...tokenizer];
}

/** A folder's config.json, as the model's config and as written; names the folder when it has none. */
export function readHfConfig(dir: string): { config: LlamaConfig; json: Record<string, unknown> } {
  const configPath = join(dir, 'config.json');
  if (!existsSync(configPath)) throw new Error(`${dir} is not a model folder: it has no config.json`);
  const json = JSON.parse(readFileSync(configPath, 'utf8')) as Record<string, unknown>;
  return { config: llamaConfigFromJson(json, configPath), json };
}

export interface HfModel {
  config: LlamaConfig;
  /** config.json as it is written, for the keys beyond the architecture's (prefab_placeholders, ...). */
  json: Record<string, unknown>;
  weights: Map<string, Float32Array>;
  /** The weights' dtype as stored (F32, BF16, F16). */
  dtype: string;
}

/** Reads a Hugging Face folder: its config and every weight it needs, checked against the architecture's names and shapes. */
/** The first weight of a model folder that holds a value that is not a finite number (NaN, an infinity), or null. */
export function nonFiniteWeight(dir: string): string | null {
  for (const [name, data] of readHfModel(dir).weights) if (!data.every(Number.isFinite)) return name;
  return null;
}

export function readHfModel(dir: string): HfModel {
  const { config, json } = readHfConfig(dir);
  const found = new Map<string, { shape: number[]; data: Float32Array; file: string }>();
  const dtypes = new Set<string>();
  for (const file of weightFiles(dir)) {
    const { tensors, dtypes: d } = readSafetensors(file);
    d.forEach((x) => dtypes.add(x));
    for (const [name, t] of tensors) found.set(name, { ...t, file });
  }
  const weights = new Map<string, Float32Array>();
  for (const [name, shape] of llamaParameterShapes(config)) {
    const t = found.get(name);
    if (!t) throw new Error(`${dir}: weight ${name} is missing`);
    if (t.shape.join() !== shape.join())
      throw new Error(`${t.file}: ${name} has shape [${t.shape}], expected [${shape}] for this config`);
    weights.set(name, t.data);
  }
  return { config, json, weights, dtype: [...dtypes].join('+') || 'F32' };
}

/** Writes `model`'s config.json (with `extra` keys), generation_config.json and model.safetensors into the folder `dir`. */
export function writeModelFiles(dir: string, model: Llama, extra: Record<string, unknown> = {}): void {
  writeFileSync(
    join(dir, 'config.json'),
    JSON.stringify({ ...llamaConfigJson(model.config), ...extra }, null, 2) + '\n',
  );
  // What generate() stops at, for transformers and vLLM, which read it from here.
  writeFileSync(
    join(dir, 'generation_config.json'),
    JSON.stringify({ bos_token_id: model.config.bosTokenId, eos_token_id: model.config.eosTokenId }, null, 2) + '\n',
  );
  writeSafetensors(join(dir, 'model.safetensors'), model.weights(), { format: 'pt' });
}

/** Writes `model` as a Hugging Face folder (config.json, model.safetensors in float32), aside and then renamed. */
export function writeHfModel(dir: string, model: Llama, extra: Record<string, unknown> = {}): void {
  const tmp = `${dir}.tmp`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  writeModelFiles(tmp, model, extra);
  rmSync(dir, { recursive: true, force: true });
  renameSync(tmp, dir);
}
