// GGUF, llama.cpp's one-file format (what llama.cpp, Ollama and LM Studio load): a header of typed key-values
// (the architecture's shapes, the tokenizer, the chat template), then each tensor's name, dims, type and
// offset, then the data, 32-byte aligned. Written as llama.cpp's convert_hf_to_gguf.py writes a Llama or
// Qwen2 folder: ggml's dims are the safetensors shape reversed, and Llama's q/k rows are permuted from
// transformers' halves-rotation order to the interleaved pairs llama.cpp's Llama rotates (Qwen2 is rotated by
// halves there too, so its rows stay). LoRA adapters alone as convert_lora_to_gguf.py writes them.
import { closeSync, openSync, renameSync, rmSync, writeSync } from 'node:fs';
import { llamaParameterShapes, type LlamaConfig } from './config.ts';
import type { TokenizerFiles } from './hf.ts';
import { readChatTemplate } from './hf-chat.ts';

/** The weights' type in the file: float32, float16, or 8-bit blocks of 32 with a float16 scale (Q8_0). */
export type GgufType = 'f32' | 'f16' | 'q8_0';

// ggml_type ids, and general.file_type's (llama_ftype) for a file mostly of that type.
const GGML = { f32: 0, f16: 1, q8_0: 8 } as const;
const FILE_TYPE = { f32: 0, f16: 1, q8_0: 7 } as const;
const ALIGNMENT = 32;
const Q8_BLOCK = 32;

// GGUF's value types.
const enum V {
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
}

// llama.cpp's token types.
const TOKEN = { normal: 1, control: 3, userDefined: 4, unused: 5 } as const;

type Value =
  | { type: V.U32 | V.I32 | V.F32; value: number }
  | { type: V.BOOL; value: boolean }
  | { type: V.STRING; value: string }
  | { type: V.ARRAY; of: V.STRING; value: string[] }
  | { type: V.ARRAY; of: V.I32; value: number[] };

const u32 = (value: number): Value => ({ type: V.U32, value });
const f32 = (value: number): Value => ({ type: V.F32, value });
const str = (value: string): Value => ({ type: V.STRING, value });

/** A byte sink that grows: the header is built in memory, the tensors are streamed after it. */
class Bytes {
  private chunks: Buffer[] = [];
  length = 0;
  push(b: Buffer): void {
    this.chunks.push(b);
    this.length += b.length;
  }
  u32(n: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(n);
    this.push(b);
  }
  u64(n: number): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(n));
    this.push(b);
  }
  string(s: string): void {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.push(b);
  }
  value(v: Value): void {
    this.u32(v.type);
    switch (v.type) {
      case V.U32:
        return this.u32(v.value);
      case V.I32: {
        const b = Buffer.alloc(4);
        b.writeInt32LE(v.value);
        return this.push(b);
      }
      case V.F32: {
        const b = Buffer.alloc(4);
        b.writeFloatLE(v.value);
        return this.push(b);
      }
      case V.BOOL:
        return this.push(Buffer.from([v.value ? 1 : 0]));
      case V.STRING:
        return this.string(v.value);
      case V.ARRAY: {
        this.u32(v.of);
        this.u64(v.value.length);
        if (v.of === V.STRING) for (const s of v.value as string[]) this.string(s);
        else {
          const b = Buffer.alloc(4 * v.value.length);
          (v.value as number[]).forEach((n, i) => b.writeInt32LE(n, 4 * i));
          this.push(b);
        }
      }
    }
  }
  pad(to: number): void {
    const rest = (to - (this.length % to)) % to;
    if (rest) this.push(Buffer.alloc(rest));
  }
  take(): Buffer {
    return Buffer.concat(this.chunks);
  }
}

// ---- numbers ----

const scratch = new DataView(new ArrayBuffer(4));

/** float32 → IEEE half, rounded to nearest even (as F16C's _cvtss_sh, which ggml uses on x86). */
export function toHalf(f: number): number {
  scratch.setFloat32(0, f);
  const x = scratch.getUint32(0);
  const sign = (x >>> 16) & 0x8000;
  const exponent = (x >>> 23) & 0xff;
  let mantissa = x & 0x7fffff;
  if (exponent === 0xff) return sign | 0x7c00 | (mantissa ? 0x200 : 0);
  const e = exponent - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mantissa |= 0x800000;
    const shift = 14 - e;
    let h = mantissa >>> shift;
    const rest = mantissa & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rest > half || (rest === half && h & 1)) h++;
    return sign | h;
  }
  let h = (e << 10) | (mantissa >>> 13);
  const rest = mantissa & 0x1fff;
  // A carry out of the mantissa steps the exponent, up to infinity: the bits are laid out for it.
  if (rest > 0x1000 || (rest === 0x1000 && h & 1)) h++;
  return sign | h;
}

function f16Bytes(data: Float32Array): Buffer {
  const out = Buffer.alloc(2 * data.length);
  for (let i = 0; i < data.length; i++) out.writeUInt16LE(toHalf(data[i]!), 2 * i);
  return out;
}

/** Q8_0 as ggml's quantize_row_q8_0_ref: per block of 32, d = max|x| / 127 (as f16), q = round(x / d). */
export function q8Bytes(data: Float32Array): Buffer {
  if (data.length % Q8_BLOCK) throw new Error(`Q8_0 needs rows of a multiple of ${Q8_BLOCK} values`);
  const blocks = data.length / Q8_BLOCK;
  const out = Buffer.alloc(blocks * (2 + Q8_BLOCK));
  for (let b = 0; b < blocks; b++) {
    let amax = 0;
    for (let j = 0; j < Q8_BLOCK; j++) amax = Math.max(amax, Math.abs(data[b * Q8_BLOCK + j]!));
    const d = Math.fround(amax / 127);
    const id = d ? Math.fround(1 / d) : 0;
    const at = b * (2 + Q8_BLOCK);
    out.writeUInt16LE(toHalf(d), at);
    for (let j = 0; j < Q8_BLOCK; j++) {
      const x = Math.fround(data[b * Q8_BLOCK + j]! * id);
      out.writeInt8(x < 0 ? -Math.round(-x) : Math.round(x), at + 2 + j); // roundf: halves away from zero
    }
  }
  return out;
}

// ---- the model ----

/** transformers' name → GGUF's, for the Llama family. */
function ggufName(name: string): string {
  const fixed: Record<string, string> = {
    'model.embed_tokens.weight': 'token_embd.weight',
    'model.norm.weight': 'output_norm.weight',
    'lm_head.weight': 'output.weight',
  };
  if (fixed[name]) return fixed[name];
  const m = /^model\.layers\.(\d+)\.(.+)\.(weight|bias)$/.exec(name);
  const parts: Record<string, string> = {
    input_layernorm: 'attn_norm',
    'self_attn.q_proj': 'attn_q',
    'self_attn.k_proj': 'attn_k',
    'self_attn.v_proj': 'attn_v',
    'self_attn.o_proj': 'attn_output',
    post_attention_layernorm: 'ffn_norm',
    'mlp.gate_proj': 'ffn_gate',
    'mlp.up_proj': 'ffn_up',
    'mlp.down_proj': 'ffn_down',
  };
  if (!m || !parts[m[2]!]) throw new Error(`no GGUF name for the weight ${name}`);
  return `blk.${m[1]}.${parts[m[2]!]}.${m[3]}`;
}

/**
 * Rows of a q or k projection (weight [heads·hd, D] or bias [heads·hd]) from transformers' order (each head's
 * first halves, then second halves) to interleaved pairs: convert_hf_to_gguf.py's LlamaModel.permute.
 */
function permuteRows(data: Float32Array, heads: number, headDim: number): Float32Array {
  const cols = data.length / (heads * headDim);
  const half = headDim / 2;
  const out = new Float32Array(data.length);
  for (let h = 0; h < heads; h++)
    for (let part = 0; part < 2; part++)
      for (let j = 0; j < half; j++) {
        const from = (h * headDim + part * half + j) * cols;
        const to = (h * headDim + 2 * j + part) * cols;
        out.set(data.subarray(from, from + cols), to);
      }
  return out;
}

// ---- the tokenizer ----

interface TokenizerJson {
  added_tokens?: { id: number; content: string; special: boolean }[];
  pre_tokenizer?: unknown;
  model?: { type?: string; vocab?: Record<string, number>; merges?: (string | [string, string])[] };
}

// Qwen2's and Llama 3's splitting expressions as their tokenizer.json spells them (a Split pre-tokenizer).
const QWEN2_SPLIT =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const LLAMA3_SPLIT =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/**
 * llama.cpp's name for how a tokenizer.json splits text before BPE (tokenizer.ggml.pre): byte-level with
 * GPT-2's expression is `gpt-2`; digits one by one first, then that, is SmolLM's (`smollm`); Qwen2's and
 * Llama 3's expressions by their text. Anything else is refused: llama.cpp would split differently.
 */
function preTokenizer(pre: unknown, source: string): string {
  const p = pre as { type?: string; use_regex?: boolean; pretokenizers?: unknown[] } | null;
  const byteLevel = (x: unknown, regex: boolean) => {
    const b = x as { type?: string; use_regex?: boolean; add_prefix_space?: boolean };
    return b?.type === 'ByteLevel' && (b.use_regex ?? true) === regex && !b.add_prefix_space;
  };
  if (byteLevel(p, true)) return 'gpt-2';
  const [first, second, ...rest] = p?.type === 'Sequence' ? (p.pretokenizers ?? []) : [];
  const digits = first as { type?: string; individual_digits?: boolean } | undefined;
  if (rest.length === 0 && digits?.type === 'Digits' && digits.individual_digits && byteLevel(second, true))
    return 'smollm';
  const split = first as { type?: string; pattern?: { Regex?: string } } | undefined;
  if (rest.length === 0 && split?.type === 'Split' && byteLevel(second, false)) {
    if (split.pattern?.Regex === QWEN2_SPLIT) return 'qwen2';
    if (split.pattern?.Regex === LLAMA3_SPLIT) return 'llama-bpe';
  }
  throw new Error(
    `${source}: its tokenizer's pre-tokenizer (${JSON.stringify(pre).slice(0, 200)}) is not one prefab knows llama.cpp's name for; GGUF export supports byte-level BPE as prefab, SmolLM2, Qwen2 and Llama 3 write it`,
  );
}

/** The tokenizer's keys: every token by id with its type, the merges, the special ids, the chat template. */
function tokenizerValues(
  files: TokenizerFiles,
  config: LlamaConfig,
  source: string,
): { values: Record<string, Value>; template: string | null } {
  const json = JSON.parse(files['tokenizer.json'] ?? 'null') as TokenizerJson | null;
  if (!json) throw new Error(`${source} has no tokenizer.json: GGUF carries the tokenizer`);
  if (json.model?.type !== 'BPE' || !json.model.vocab)
    throw new Error(
      `${source}: tokenizer model ${JSON.stringify(json.model?.type)} is not supported: GGUF export writes byte-level BPE tokenizers`,
    );
  const tokens: string[] = Array.from({ length: config.vocabSize }, (_, i) => `[PAD${i}]`);
  const types: number[] = Array.from({ length: config.vocabSize }, () => TOKEN.unused);
  const place = (id: number, content: string, type: number) => {
    if (id >= config.vocabSize)
      throw new Error(
        `${source}: token ${JSON.stringify(content)} has id ${id}, beyond the model's ${config.vocabSize}`,
      );
    tokens[id] = content;
    types[id] = type;
  };
  for (const [content, id] of Object.entries(json.model.vocab)) place(id, content, TOKEN.normal);
  for (const a of json.added_tokens ?? []) place(a.id, a.content, a.special ? TOKEN.control : TOKEN.userDefined);
  const merges = (json.model.merges ?? []).map((m) => (typeof m === 'string' ? m : m.join(' ')));
  const idOf = (text: string | undefined) => (text === undefined ? undefined : tokens.indexOf(text));
  const tokConfig = JSON.parse(files['tokenizer_config.json'] ?? '{}') as Record<string, unknown>;
  const textOf = (v: unknown) => (typeof v === 'string' ? v : (v as { content?: string } | null)?.content);
  const eos = [config.eosTokenId].flat()[0] ?? idOf(textOf(tokConfig.eos_token));
  const pad = idOf(textOf(tokConfig.pad_token));
  const bos = config.bosTokenId ?? idOf(textOf(tokConfig.bos_token));
  const template = readChatTemplate(files, source)?.source ?? null;
  const values: Record<string, Value> = {
    'tokenizer.ggml.model': str('gpt2'),
    'tokenizer.ggml.pre': str(preTokenizer(json.pre_tokenizer, source)),
    'tokenizer.ggml.tokens': { type: V.ARRAY, of: V.STRING, value: tokens },
    'tokenizer.ggml.token_type': { type: V.ARRAY, of: V.I32, value: types },
    'tokenizer.ggml.merges': { type: V.ARRAY, of: V.STRING, value: merges },
    // A BOS only where the folder's tokenizer adds one (prefab's, Qwen2's and SmolLM2's do not).
    'tokenizer.ggml.add_bos_token': { type: V.BOOL, value: tokConfig.add_bos_token === true },
    ...(bos !== undefined && bos >= 0 ? { 'tokenizer.ggml.bos_token_id': u32(bos) } : {}),
    ...(eos !== undefined && eos >= 0 ? { 'tokenizer.ggml.eos_token_id': u32(eos) } : {}),
    ...(pad !== undefined && pad >= 0 ? { 'tokenizer.ggml.padding_token_id': u32(pad) } : {}),
  };
  return { values, template };
}

/**
 * The chat template as llama.cpp's Jinja reads it: transformers' `{% generation %}` markers (which only mark
 * the assistant's tokens for training) are taken out.
 */
export const servingTemplate = (template: string): string =>
  template.replace(/\{%-?\s*(?:end)?generation\s*-?%\}/g, '');

export interface GgufModel {
  config: LlamaConfig;
  weights: Map<string, Float32Array>;
  tokenizer: TokenizerFiles;
  /** general.name */
  name: string;
  /** The folder it came from, for errors. */
  source: string;
}

/** Writes `model` as a GGUF file at `path` (aside, then renamed), its matrices in `type`; returns the bytes written. */
export function writeGguf(path: string, model: GgufModel, type: GgufType): number {
  const { config: c, source } = model;
  const arch = c.modelType;
  const { values: tokenizer, template } = tokenizerValues(model.tokenizer, c, source);
  const metadata: Record<string, Value> = {
    'general.architecture': str(arch),
    'general.name': str(model.name),
    'general.file_type': u32(FILE_TYPE[type]),
    ...(type === 'q8_0' ? { 'general.quantization_version': u32(2) } : {}),
    'general.alignment': u32(ALIGNMENT),
    [`${arch}.vocab_size`]: u32(c.vocabSize),
    [`${arch}.context_length`]: u32(c.maxPositions),
    [`${arch}.embedding_length`]: u32(c.hiddenSize),
    [`${arch}.block_count`]: u32(c.layers),
    [`${arch}.feed_forward_length`]: u32(c.intermediateSize),
    [`${arch}.attention.head_count`]: u32(c.heads),
    [`${arch}.attention.head_count_kv`]: u32(c.kvHeads),
    [`${arch}.attention.key_length`]: u32(c.headDim),
    [`${arch}.attention.value_length`]: u32(c.headDim),
    [`${arch}.rope.dimension_count`]: u32(c.headDim),
    [`${arch}.rope.freq_base`]: f32(c.ropeTheta),
    [`${arch}.attention.layer_norm_rms_epsilon`]: f32(c.rmsNormEps),
    ...tokenizer,
    ...(template ? { 'tokenizer.chat_template': str(servingTemplate(template)) } : {}),
  };
  // Each tensor: its GGUF name, ggml dims (innermost first), type and data, in the weights' order.
  const shapes = new Map(llamaParameterShapes(c));
  const tensors = [...model.weights].map(([name, data]): Tensor => {
    const shape = shapes.get(name);
    if (!shape) throw new Error(`${source}: ${name} is not a weight of this architecture`);
    const values = ggufRows(name, data, c, source);
    return {
      name: ggufName(name),
      dims: [...shape].reverse(),
      type: shape.length === 1 ? 'f32' : matrixType(shape[1]!, type),
      values,
    };
  });
  return writeTensors(path, metadata, tensors);
}

/** Rows as llama.cpp reads them: a Llama's q and k projections' (weights, biases, LoRA's B) permuted; the rest as they are. */
function ggufRows(name: string, data: Float32Array, c: LlamaConfig, source: string): Float32Array {
  if (c.modelType !== 'llama' || !/self_attn\.[qk]_proj\./.test(name)) return data;
  if (c.headDim % 2) throw new Error(`${source}: a head dimension of ${c.headDim} is odd`);
  return permuteRows(data, name.includes('q_proj') ? c.heads : c.kvHeads, c.headDim);
}

/**
 * A matrix's type in the file: the one asked for, but float16 where Q8_0 was asked and its rows do not split
 * into blocks of 32 (vectors stay float32, as llama.cpp's converter keeps them).
 */
const matrixType = (cols: number, type: GgufType): GgufType => (type === 'q8_0' && cols % Q8_BLOCK ? 'f16' : type);

export interface GgufAdapter {
  config: LlamaConfig;
  /** Each adapted projection by module (model.layers.0.self_attn.q_proj): A (r, in) and B (out, r), as PEFT stores them. */
  adapters: Map<string, { a: Float32Array; b: Float32Array; r: number }>;
  /** LoRA's α: llama.cpp scales B·A by α/r, as PEFT does. */
  alpha: number;
  name: string;
  source: string;
}

/**
 * Writes LoRA adapters as llama.cpp's adapter GGUF (what convert_lora_to_gguf.py writes, `llama-server
 * --lora`, Ollama's ADAPTER): general.type adapter, the base's architecture, and each projection's A and B as
 * `<weight>.lora_a` / `.lora_b`, ggml dims reversed as for the weights; B's rows permuted as the base's rows.
 */
export function writeGgufAdapter(path: string, adapter: GgufAdapter, type: GgufType): number {
  const { config: c, source } = adapter;
  const metadata: Record<string, Value> = {
    'general.architecture': str(c.modelType),
    'general.type': str('adapter'),
    'general.name': str(adapter.name),
    'general.file_type': u32(FILE_TYPE[type]),
    ...(type === 'q8_0' ? { 'general.quantization_version': u32(2) } : {}),
    'general.alignment': u32(ALIGNMENT),
    'adapter.type': str('lora'),
    'adapter.lora.alpha': f32(adapter.alpha),
  };
  const shapes = new Map(llamaParameterShapes(c));
  const tensors = [...adapter.adapters].flatMap(([module, { a, b, r }]): Tensor[] => {
    const weight = `${module}.weight`;
    const shape = shapes.get(weight);
    if (!shape) throw new Error(`${source}: ${module} is not a projection of this architecture`);
    const [out, inner] = shape as [number, number];
    if (a.length !== r * inner || b.length !== out * r)
      throw new Error(`${source}: ${module}'s adapter is not A [${r}, ${inner}] and B [${out}, ${r}]`);
    return [
      { name: `${ggufName(weight)}.lora_a`, dims: [inner, r], type: matrixType(inner, type), values: a },
      {
        name: `${ggufName(weight)}.lora_b`,
        dims: [r, out],
        type: matrixType(r, type),
        values: ggufRows(weight, b, c, source),
      },
    ];
  });
  if (!tensors.length) throw new Error(`${source}: no LoRA adapters to write`);
  return writeTensors(path, metadata, tensors);
}

interface Tensor {
  name: string;
  /** ggml's dims, innermost first. */
  dims: number[];
  type: GgufType;
  values: Float32Array;
}

/** The file: header, key-values, tensor infos, then each tensor's data 32-byte aligned (aside, then renamed); returns the bytes written. */
function writeTensors(path: string, metadata: Record<string, Value>, tensors: Tensor[]): number {
  const head = new Bytes();
  head.u32(0x46554747); // "GGUF"
  head.u32(3);
  head.u64(tensors.length);
  head.u64(Object.keys(metadata).length);
  for (const [key, v] of Object.entries(metadata)) {
    head.string(key);
    head.value(v);
  }
  const sizes = tensors.map(({ values, type: t }) =>
    t === 'f32' ? 4 * values.length : t === 'f16' ? 2 * values.length : (values.length / Q8_BLOCK) * (2 + Q8_BLOCK),
  );
  let offset = 0;
  tensors.forEach((t, i) => {
    head.string(t.name);
    head.u32(t.dims.length);
    for (const d of t.dims) head.u64(d);
    head.u32(GGML[t.type]);
    head.u64(offset);
    offset += sizes[i]! + ((ALIGNMENT - (sizes[i]! % ALIGNMENT)) % ALIGNMENT);
  });
  head.pad(ALIGNMENT);

  const tmp = `${path}.tmp`;
  const fd = openSync(tmp, 'w');
  let written = 0;
  const write = (b: Buffer) => {
    writeSync(fd, b);
    written += b.length;
  };
  try {
    write(head.take());
    tensors.forEach((t, i) => {
      const bytes =
        t.type === 'f32'
          ? Buffer.from(t.values.buffer, t.values.byteOffset, t.values.byteLength)
          : t.type === 'f16'
            ? f16Bytes(t.values)
            : q8Bytes(t.values);
      write(bytes);
      const rest = (ALIGNMENT - (sizes[i]! % ALIGNMENT)) % ALIGNMENT;
      if (rest) write(Buffer.alloc(rest));
    });
    closeSync(fd);
  } catch (error) {
    closeSync(fd);
    rmSync(tmp, { force: true });
    throw error;
  }
  renameSync(tmp, path);
  return written;
}
