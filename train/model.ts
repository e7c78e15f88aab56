// LlamaForCausalLM's math, on TensorFlow.js: RMSNorm, a SwiGLU MLP, rotary embeddings (rotate-half, rope_theta),
// grouped-query attention, head_dim, tied or untied embeddings; and Qwen2's biases on q, k and v. Weights
// carry transformers' names and orientations (`model.layers.N.self_attn.q_proj.weight`, (out, in)), so a
// folder prefab writes is what `AutoModelForCausalLM.from_pretrained` reads, and the other way round
// (train/hf.ts reads and writes the folders).
// This is the trainer's one model: what sft trains from scratch (a tiny Llama) or from a pretrained folder,
// what dpo tunes, eval scores and the simulator's policy runs.
// Read top to bottom: config, parameters, the forward pass, generation with a KV cache.
// Shapes: B batch, T length, D hidden size, H query heads, K key/value heads, hd head_dim, F intermediate
// size, V vocabulary; N = B·T rows.
import * as tf from '@tensorflow/tfjs-core';
import { seeded, type Random } from '../core/random.ts';
import { causalAttention, embed, linear } from './kernels.ts';
import { ModelWeights, normal } from './parameters.ts';
import { sampleToken } from './sampling.ts';

export interface LlamaConfig {
  /** `llama` or `qwen2`: the same math, Qwen2 with biases on q, k and v. */
  modelType: 'llama' | 'qwen2';
  vocabSize: number;
  /** D */
  hiddenSize: number;
  /** F, the SwiGLU MLP's width. */
  intermediateSize: number;
  layers: number;
  /** H */
  heads: number;
  /** K: query heads share key/value heads in groups of H / K (grouped-query attention). */
  kvHeads: number;
  /** hd: often D / H, but not always. */
  headDim: number;
  ropeTheta: number;
  rmsNormEps: number;
  /** The output head is the embedding table (tie_word_embeddings). */
  tiedEmbeddings: boolean;
  /** Biases on the q, k and v projections (Qwen2; Llama's attention_bias). */
  attentionBias: boolean;
  /** Longest sequence the model is meant for (max_position_embeddings). */
  maxPositions: number;
  bosTokenId: number | null;
  /** One id, or several (Llama 3 stops at any of three). */
  eosTokenId: number | number[] | null;
}

/** Parameter name → shape, in transformers' names and (out, in) orientation, in a fixed order. */
export function llamaParameterShapes(c: LlamaConfig): [string, number[]][] {
  const { hiddenSize: D, intermediateSize: F, heads: H, kvHeads: K, headDim: hd } = c;
  const shapes: [string, number[]][] = [['model.embed_tokens.weight', [c.vocabSize, D]]];
  for (let i = 0; i < c.layers; i++) {
    const l = `model.layers.${i}.`;
    shapes.push(
      [`${l}input_layernorm.weight`, [D]],
      [`${l}self_attn.q_proj.weight`, [H * hd, D]],
      [`${l}self_attn.k_proj.weight`, [K * hd, D]],
      [`${l}self_attn.v_proj.weight`, [K * hd, D]],
      ...(c.attentionBias
        ? ([
            [`${l}self_attn.q_proj.bias`, [H * hd]],
            [`${l}self_attn.k_proj.bias`, [K * hd]],
            [`${l}self_attn.v_proj.bias`, [K * hd]],
          ] as [string, number[]][])
        : []),
      [`${l}self_attn.o_proj.weight`, [D, H * hd]],
      [`${l}post_attention_layernorm.weight`, [D]],
      [`${l}mlp.gate_proj.weight`, [F, D]],
      [`${l}mlp.up_proj.weight`, [F, D]],
      [`${l}mlp.down_proj.weight`, [D, F]],
    );
  }
  shapes.push(['model.norm.weight', [D]]);
  if (!c.tiedEmbeddings) shapes.push(['lm_head.weight', [c.vocabSize, D]]);
  return shapes;
}

/** Llama's initialisation: N(0, 0.02) for matrices, norms at 1, biases at 0. */
function initialWeights(c: LlamaConfig, seed: string): Map<string, Float32Array> {
  const weights = new Map<string, Float32Array>();
  for (const [name, shape] of llamaParameterShapes(c)) {
    const size = shape.reduce((a, b) => a * b, 1);
    if (name.endsWith('.bias')) weights.set(name, new Float32Array(size));
    else if (name.endsWith('norm.weight')) weights.set(name, new Float32Array(size).fill(1));
    else weights.set(name, normal(seeded(seed, 'init', name), size, 0.02));
  }
  return weights;
}


/** RMSNorm: x / √(mean(x²) + ε) · weight. x: (N, D). */
function rmsNorm(x: tf.Tensor2D, weight: tf.Tensor, eps: number): tf.Tensor2D {
  return tf.mul(tf.mul(x, tf.rsqrt(tf.add(tf.mean(tf.square(x), -1, true), eps))), weight) as tf.Tensor2D;
}

/** SiLU (x·σ(x)), the gate of the SwiGLU MLP. */
const silu = (x: tf.Tensor2D) => tf.mul(x, tf.sigmoid(x)) as tf.Tensor2D;

/** x · Wᵀ (+ b) for a weight stored (out, in) as transformers stores it. x: (N, in) → (N, out). */
function project(x: tf.Tensor2D, w: tf.Tensor2D, b?: tf.Tensor): tf.Tensor2D {
  const y = linear(x, tf.transpose(w));
  return b ? (tf.add(y, b) as tf.Tensor2D) : y;
}

/**
 * RoPE's cos and sin for positions 0…n−1, (n, hd): angle p · θ^(−2f/hd) for f < hd/2, the same angle on both
 * halves, as transformers' default rope computes it (inverse frequencies and their products in float32).
 */
function ropeTable(positions: number, headDim: number, theta: number): { cos: Float32Array; sin: Float32Array } {
  const half = headDim / 2;
  const inv = new Float32Array(half);
  for (let f = 0; f < half; f++) inv[f] = 1 / Math.pow(theta, (2 * f) / headDim);
  const cos = new Float32Array(positions * headDim);
  const sin = new Float32Array(positions * headDim);
  for (let p = 0; p < positions; p++) {
    for (let f = 0; f < half; f++) {
      const angle = Math.fround(p * inv[f]!);
      for (const at of [p * headDim + f, p * headDim + f + half]) {
        cos[at] = Math.cos(angle);
        sin[at] = Math.sin(angle);
      }
    }
  }
  return { cos, sin };
}

/** RoPE's cos and sin for each row of a pass, (N, 1, hd). */
interface Rotation {
  cos: tf.Tensor3D;
  sin: tf.Tensor3D;
}

/** rotate_half applied with the table's rows: x·cos + rotate_half(x)·sin, rotate_half(x) = (−x₂, x₁). x: (N, heads, hd). */
function rotate(x: tf.Tensor3D, cos: tf.Tensor3D, sin: tf.Tensor3D): tf.Tensor3D {
  const half = x.shape[2] / 2;
  const [x1, x2] = tf.split(x, [half, half], 2);
  return tf.add(tf.mul(x, cos), tf.mul(tf.concat([tf.neg(x2), x1], 2), sin)) as tf.Tensor3D;
}

/** K key/value heads repeated to H, each serving H / K query heads in a row (transformers' repeat_kv). (N, K, hd) → (N, H·hd). */
function repeatKv(x: tf.Tensor3D, heads: number): tf.Tensor2D {
  const [n, k, hd] = x.shape;
  if (k === heads) return tf.reshape(x, [n, heads * hd]);
  return tf.reshape(tf.tile(tf.reshape(x, [n, k, 1, hd]), [1, 1, heads / k, 1]), [n, heads * hd]);
}

export class Llama extends ModelWeights {
  private rope: { cos: Float32Array; sin: Float32Array; positions: number } | null = null;

  constructor(
    readonly config: LlamaConfig,
    weights: Map<string, Float32Array>,
  ) {
    super(llamaParameterShapes(config), weights);
  }

  static create(config: LlamaConfig, seed: string): Llama {
    return new Llama(config, initialWeights(config, seed));
  }

  /**
   * LoRA adapters by module (`model.layers.0.self_attn.q_proj`), when some are attached (train/lora.ts): each
   * adds (α/r)·(x·Aᵀ)·Bᵀ to its projection while `adaptersOn` is true.
   */
  adapters = new Map<string, { a: tf.Variable; b: tf.Variable; scale: number; dropout: number; /** Its place among the adapters. */ index: number }>();
  adaptersOn = true;
  /**
   * Set by a trainer while it trains (from the run's seed and step): adapters' dropout applies then only, its
   * masks drawn from this seed and the module, so a resumed run drops what the uninterrupted one did.
   */
  dropoutSeed: number | null = null;

  /** The weight of projection `module` with its adapter folded in, W + (α/r)·B·A (out, in); W itself without one. */
  adaptedWeight(module: string): tf.Tensor2D {
    const w = this.p(`${module}.weight`);
    const ad = this.adapters.get(module);
    return ad ? (tf.add(w, tf.mul(tf.matMul(ad.b, ad.a), ad.scale)) as tf.Tensor2D) : w;
  }

  /** The projection `module` (its weight stored (out, in)) of rows x, with its bias and adapter if any. (N, in) → (N, out) */
  linear(x: tf.Tensor2D, module: string, bias?: tf.Tensor): tf.Tensor2D {
    const y = project(x, this.p(`${module}.weight`), bias);
    const adapter = this.adaptersOn ? this.adapters.get(module) : undefined;
    if (!adapter) return y;
    const input = this.dropoutSeed !== null && adapter.dropout > 0 ? (tf.dropout(x, adapter.dropout, undefined, this.dropoutSeed + adapter.index) as tf.Tensor2D) : x;
    const low = linear(input, tf.transpose(adapter.a as tf.Tensor as tf.Tensor2D)); // (N, r)
    return tf.add(y, tf.mul(linear(low, tf.transpose(adapter.b as tf.Tensor as tf.Tensor2D)), adapter.scale)) as tf.Tensor2D;
  }

  /**
   * RoPE's cos and sin, (positions, hd), for at least `needed` positions. The table grows (doubling) to the
   * longest position asked for, never to max_position_embeddings up front (131,072 positions for Llama 3.1).
   */
  ropeTable(needed: number): { cos: Float32Array; sin: Float32Array; positions: number } {
    if (!this.rope || this.rope.positions < needed) {
      const positions = Math.max(needed, 2 * (this.rope?.positions ?? 64));
      this.rope = { ...ropeTable(positions, this.config.headDim, this.config.ropeTheta), positions };
    }
    return this.rope;
  }

  /** cos and sin of positions start…start+T−1 for every row (B·T, 1, hd), the batch's rows in order: made once a forward pass, for all its layers. */
  angles(batch: number, length: number, start: number): Rotation {
    const hd = this.config.headDim;
    const needed = start + length;
    const table = this.ropeTable(needed);
    const rows = (table: Float32Array) => {
      const one = table.subarray(start * hd, needed * hd);
      const all = new Float32Array(batch * length * hd);
      for (let b = 0; b < batch; b++) all.set(one, b * length * hd);
      return tf.tensor3d(all, [batch * length, 1, hd]);
    };
    return { cos: rows(table.cos), sin: rows(table.sin) };
  }

  /** One layer's q, k, v of rows x (N, D) at positions start…: q (N, H, hd) and k, v (N, K, hd), q and k turned. */
  qkv(i: number, x: tf.Tensor2D, { cos, sin }: Rotation) {
    const { heads: H, kvHeads: K, headDim: hd } = this.config;
    const a = (n: string) => `model.layers.${i}.self_attn.${n}`;
    const bias = (n: string) => (this.config.attentionBias ? this.p(a(`${n}.bias`)) : undefined);
    const n = x.shape[0];
    const q = rotate(tf.reshape(this.linear(x, a('q_proj'), bias('q_proj')), [n, H, hd]), cos, sin);
    const k = rotate(tf.reshape(this.linear(x, a('k_proj'), bias('k_proj')), [n, K, hd]), cos, sin);
    const v = tf.reshape(this.linear(x, a('v_proj'), bias('v_proj')), [n, K, hd]) as tf.Tensor3D;
    return { q, k, v };
  }

  /** The MLP of layer i: down(silu(gate(x)) ⊙ up(x)). x: (N, D). */
  mlp(i: number, x: tf.Tensor2D): tf.Tensor2D {
    const m = (n: string) => `model.layers.${i}.mlp.${n}`;
    return this.linear(tf.mul(silu(this.linear(x, m('gate_proj'))), this.linear(x, m('up_proj'))) as tf.Tensor2D, m('down_proj')); // (N, F) → (N, D)
  }

  /** Final norm and output head: (N, D) → logits (N, V). */
  head(x: tf.Tensor2D): tf.Tensor2D {
    const h = rmsNorm(x, this.p('model.norm.weight'), this.config.rmsNormEps);
    return project(h, this.p(this.config.tiedEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight'));
  }

  /** Logits for every position. ids: B rows of T tokens, row-major. Returns (B·T, V). */
  override forward(ids: Int32Array, batch: number, length: number): tf.Tensor2D {
    const { heads: H, rmsNormEps: eps } = this.config;
    let x = embed(this.p('model.embed_tokens.weight'), tf.tensor1d(ids, 'int32')); // (N, D)
    const rotation = this.angles(batch, length, 0);
    for (let i = 0; i < this.config.layers; i++) {
      const l = (n: string) => this.p(`model.layers.${i}.${n}`);
      const { q, k, v } = this.qkv(i, rmsNorm(x, l('input_layernorm.weight'), eps), rotation);
      const n = batch * length;
      const packed = tf.concat([tf.reshape(q, [n, H * this.config.headDim]), repeatKv(k, H), repeatKv(v, H)], 1) as tf.Tensor2D; // (N, 3·H·hd)
      const attended = causalAttention(packed, { batch, length, heads: H }, this.mask(length)); // (N, H·hd)
      x = tf.add(x, this.linear(attended, `model.layers.${i}.self_attn.o_proj`));
      x = tf.add(x, this.mlp(i, rmsNorm(x, l('post_attention_layernorm.weight'), eps)));
    }
    return this.head(x);
  }

  /**
   * Floating-point operations to train on one token in a sequence of `length` (forward and backward), as
   * nanoGPT's estimate_mfu counts them: 6 per weight used in a matMul (the embedding table is a lookup unless
   * it is also the head), and attention's 6·2·layers·(H·hd)·T.
   */
  flopsPerToken(length: number): number {
    const c = this.config;
    const lookup = c.tiedEmbeddings ? 0 : c.vocabSize * c.hiddenSize;
    return 6 * (this.size() - lookup) + 12 * c.layers * c.heads * c.headDim * length;
  }

  /** Samples up to `maxTokens` tokens after `prompt` with a fresh KV cache (KVCache.generate). */
  generate(prompt: number[], options: GenerateOptions): number[] {
    return new KVCache(this).generate(prompt, options);
  }

  override dispose(): void {
    super.dispose();
    for (const ad of this.adapters.values()) tf.dispose([ad.a, ad.b]);
  }

  /** Weights as plain arrays, by name: what a checkpoint writes. */
  weights(): Map<string, { shape: number[]; data: Float32Array }> {
    return new Map([...this.params].map(([name, v]) => [name, { shape: v.shape, data: v.dataSync() as Float32Array }]));
  }
}

export interface GenerateOptions {
  maxTokens: number;
  /** 0: greedy. */
  temperature: number;
  /** Nucleus sampling: keep the most likely tokens whose probabilities add up to topP. */
  topP?: number;
  /** Stop after any of these tokens. */
  stop?: number[];
  random?: Random;
  /** Which token may follow the ones generated so far (train/constrain.ts); absent: any. */
  constraint?: { allows(generated: readonly number[], candidate: number): boolean };
}

/** Below this many new tokens a read goes token by token in plain TypeScript; from it on, through one batched pass. */
const BATCHED_READ = 8;

/**
 * Generation with a KV cache: each layer keeps the rotated keys and the values of every token read so far
 * (K heads, not repeated), so a new token is one row through the model, within one reply and across the
 * turns of an episode, where each new prompt extends the last one.
 * A generated token is computed in plain TypeScript on the CPU from a copy of the weights (adapters folded
 * in) taken when the cache is made: a step of a model this small is a few hundred tiny operations, which cost
 * more to dispatch to a TensorFlow.js backend than to compute (measured for 4 layers, width 128: 2.3 ms a
 * token against 4.8 ms through WASM ops). A prompt of many new tokens is read in one batched pass through the
 * backend instead (0.34 ms a token against 1.6 token by token).
 */
export class KVCache {
  /** The tokens read so far. */
  readonly tokens: number[] = [];
  private readonly w = new Map<string, Float32Array>();
  /** Per layer: (capacity, K·hd), the first tokens.length rows in use; grown by doubling. */
  private keys: Float32Array[];
  private values: Float32Array[];
  private capacity = 0;

  constructor(readonly model: Llama) {
    for (const [name, v] of model.params) this.w.set(name, (v.dataSync() as Float32Array).slice());
    // The weight each adapted projection computes with: W + (α/r)·B·A.
    if (model.adaptersOn) for (const module of model.adapters.keys()) this.w.set(`${module}.weight`, tf.tidy(() => model.adaptedWeight(module).dataSync() as Float32Array));
    this.keys = Array.from({ length: model.config.layers }, () => new Float32Array(0));
    this.values = Array.from({ length: model.config.layers }, () => new Float32Array(0));
  }

  /** Forgets all but the first n tokens. */
  truncate(n: number): void {
    if (n < this.tokens.length) this.tokens.length = n;
  }

  /** Room for `n` positions in every layer's keys and values. */
  private reserve(n: number): void {
    if (n <= this.capacity) return;
    const { kvHeads: K, headDim: hd } = this.model.config;
    const capacity = Math.max(n, 2 * this.capacity, 64);
    const grow = (old: Float32Array) => {
      const next = new Float32Array(capacity * K * hd);
      next.set(old.subarray(0, this.tokens.length * K * hd));
      return next;
    };
    this.keys = this.keys.map(grow);
    this.values = this.values.map(grow);
    this.capacity = capacity;
  }

  /** Reads tokens after those already read; returns the next-token logits after the last, (V). */
  read(tokens: number[]): Float32Array {
    const max = this.model.config.maxPositions;
    if (this.tokens.length + tokens.length > max) throw new Error(`${this.tokens.length + tokens.length} tokens do not fit in the model's ${max} positions (max_position_embeddings)`);
    if (tokens.length === 0) throw new Error('KVCache.read: no tokens to read');
    this.reserve(this.tokens.length + tokens.length);
    if (tokens.length >= BATCHED_READ) return this.readBatched(tokens);
    let x: Float32Array = new Float32Array(0);
    for (const token of tokens) {
      x = this.step(token, this.tokens.length);
      this.tokens.push(token);
    }
    const { vocabSize: V, hiddenSize: D, tiedEmbeddings } = this.model.config;
    return matVec(x, this.w.get(tiedEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight')!, V, D);
  }

  /** The final norm's output at position `at`, after reading `token` there: one row through the model. */
  private step(token: number, at: number): Float32Array {
    const { layers, hiddenSize: D, intermediateSize: F, heads: H, kvHeads: K, headDim: hd, rmsNormEps: eps, attentionBias } = this.model.config;
    const w = (name: string) => this.w.get(name)!;
    const { cos, sin } = this.model.ropeTable(at + 1);
    const x = w('model.embed_tokens.weight').slice(token * D, (token + 1) * D); // (D)
    const scores = new Float32Array(at + 1);
    const attended = new Float32Array(H * hd);
    const group = H / K;
    const scale = 1 / Math.sqrt(hd);
    for (let l = 0; l < layers; l++) {
      const p = `model.layers.${l}.`;
      const h = rms(x, w(`${p}input_layernorm.weight`), eps);
      const proj = (n: string, out: number) => {
        const y = matVec(h, w(`${p}self_attn.${n}.weight`), out, D);
        if (attentionBias) addInto(y, w(`${p}self_attn.${n}.bias`));
        return y;
      };
      const q = proj('q_proj', H * hd); // (H·hd)
      const k = proj('k_proj', K * hd); // (K·hd)
      const v = proj('v_proj', K * hd);
      for (let j = 0; j < H; j++) rotateHalf(q, j * hd, hd, cos, sin, at);
      for (let j = 0; j < K; j++) rotateHalf(k, j * hd, hd, cos, sin, at);
      const keys = this.keys[l]!;
      const values = this.values[l]!;
      keys.set(k, at * K * hd);
      values.set(v, at * K * hd);
      for (let j = 0; j < H; j++) {
        const qo = j * hd;
        const ko = Math.floor(j / group) * hd; // the key/value head this query head shares
        let top = -Infinity;
        for (let t = 0; t <= at; t++) {
          let s = 0;
          for (let d = 0, o = t * K * hd + ko; d < hd; d++) s += q[qo + d]! * keys[o + d]!;
          scores[t] = s * scale;
          if (scores[t]! > top) top = scores[t]!;
        }
        let total = 0;
        for (let t = 0; t <= at; t++) total += scores[t] = Math.exp(scores[t]! - top);
        attended.fill(0, qo, qo + hd);
        for (let t = 0; t <= at; t++) {
          const pt = scores[t]! / total;
          for (let d = 0, o = t * K * hd + ko; d < hd; d++) attended[qo + d]! += pt * values[o + d]!;
        }
      }
      addInto(x, matVec(attended, w(`${p}self_attn.o_proj.weight`), D, H * hd));
      const m = rms(x, w(`${p}post_attention_layernorm.weight`), eps);
      const gate = matVec(m, w(`${p}mlp.gate_proj.weight`), F, D);
      const up = matVec(m, w(`${p}mlp.up_proj.weight`), F, D);
      for (let i = 0; i < F; i++) gate[i] = (gate[i]! / (1 + Math.exp(-gate[i]!))) * up[i]!; // silu(gate) ⊙ up
      addInto(x, matVec(gate, w(`${p}mlp.down_proj.weight`), D, F));
    }
    return rms(x, w('model.norm.weight'), eps);
  }

  /** Reads many tokens in one pass through the backend, attending to the cached ones; their keys and values join the cache. */
  private readBatched(ids: number[]): Float32Array {
    const m = this.model;
    const c = m.config;
    const start = this.tokens.length;
    const T = ids.length;
    const width = c.kvHeads * c.headDim;
    const logits = tf.tidy(() => {
      let x = embed(m.p('model.embed_tokens.weight'), tf.tensor1d(Int32Array.from(ids), 'int32')); // (T, D)
      const rotation = m.angles(1, T, start);
      for (let i = 0; i < c.layers; i++) {
        const l = (n: string) => m.p(`model.layers.${i}.${n}`);
        const { q, k, v } = m.qkv(i, rmsNorm(x, l('input_layernorm.weight'), c.rmsNormEps), rotation);
        this.keys[i]!.set(k.dataSync(), start * width);
        this.values[i]!.set(v.dataSync(), start * width);
        const cached = (a: Float32Array) => tf.tensor3d(a.subarray(0, (start + T) * width), [start + T, c.kvHeads, c.headDim]); // (P, K, hd)
        x = tf.add(x, m.linear(attendCached(q, cached(this.keys[i]!), cached(this.values[i]!), start, c.heads), `model.layers.${i}.self_attn.o_proj`));
        x = tf.add(x, m.mlp(i, rmsNorm(x, l('post_attention_layernorm.weight'), c.rmsNormEps)));
      }
      return tf.slice(m.head(x), [T - 1, 0], [1, c.vocabSize]);
    });
    this.tokens.push(...ids);
    const out = logits.dataSync() as Float32Array;
    logits.dispose();
    return out;
  }

  /**
   * Samples a continuation of `prompt`, reusing the cache for the longest prefix it shares with what was read
   * before (a conversation's next turn reads only its new messages). The sampled tokens are read too, except
   * the last. Stops after any of `stop`, at `maxTokens`, or where the model's positions end.
   */
  generate(prompt: number[], options: GenerateOptions): number[] {
    const room = this.model.config.maxPositions - prompt.length;
    if (room <= 0 || prompt.length === 0) return [];
    let shared = 0;
    while (shared < Math.min(prompt.length - 1, this.tokens.length) && this.tokens[shared] === prompt[shared]) shared++;
    this.truncate(shared);
    let logits = this.read(prompt.slice(shared));
    const rand = options.random ?? Math.random;
    const topP = options.topP ?? 1;
    const out: number[] = [];
    const limit = Math.min(options.maxTokens, room);
    const constraint = options.constraint;
    while (out.length < limit) {
      let next = sampleToken(logits, options.temperature, topP, rand);
      if (constraint && !constraint.allows(out, next)) {
        // Drawn outside what may come next: draw again from the tokens that may (checking them all costs
        // more than one draw, so it is only done when the first draw is refused).
        let any = false;
        for (let id = 0; id < logits.length; id++) {
          if (constraint.allows(out, id)) any = true;
          else logits[id] = -Infinity;
        }
        if (!any) break;
        next = sampleToken(logits, options.temperature, topP, rand);
      }
      out.push(next);
      if (options.stop?.includes(next) || out.length === limit) break;
      logits = this.read([next]);
    }
    return out;
  }
}

/** Attention of new queries q (T, H, hd) at positions start… over cached keys and values (P, K, hd), causal. → (T, H·hd) */
function attendCached(q: tf.Tensor3D, keys: tf.Tensor3D, values: tf.Tensor3D, start: number, heads: number): tf.Tensor2D {
  const [T, , hd] = q.shape;
  const P = keys.shape[0];
  const k = tf.reshape(repeatKv(keys, heads), [P, heads, hd]);
  const v = tf.reshape(repeatKv(values, heads), [P, heads, hd]);
  const scores = tf.mul(tf.matMul(tf.transpose(q, [1, 0, 2]), tf.transpose(k, [1, 2, 0])), 1 / Math.sqrt(hd)); // (H, T, P)
  const allowed = new Float32Array(T * P);
  for (let t = 0; t < T; t++) for (let p = 0; p < P; p++) allowed[t * P + p] = p <= start + t ? 0 : -1e9;
  const weights = tf.softmax(tf.add(scores, tf.tensor2d(allowed, [T, P])));
  const out = tf.matMul(weights, tf.transpose(v, [1, 0, 2])); // (H, T, hd)
  return tf.reshape(tf.transpose(out, [1, 0, 2]), [T, heads * hd]);
}

/** W·x for W stored (out, in): each output is a row's dot product with x. */
function matVec(x: Float32Array, W: Float32Array, out: number, inner: number): Float32Array {
  const y = new Float32Array(out);
  for (let o = 0; o < out; o++) {
    let s = 0;
    for (let i = 0, r = o * inner; i < inner; i++) s += W[r + i]! * x[i]!;
    y[o] = s;
  }
  return y;
}

/** RMSNorm of one row, as rmsNorm computes it. */
function rms(x: Float32Array, weight: Float32Array, eps: number): Float32Array {
  let sq = 0;
  for (const v of x) sq += v * v;
  const scale = 1 / Math.sqrt(sq / x.length + eps);
  return x.map((v, i) => v * scale * weight[i]!);
}

/** rotate_half on one head at `offset` of a row, as `rotate` does: x·cos + (−x₂, x₁)·sin with the table's row `at`. */
function rotateHalf(x: Float32Array, offset: number, hd: number, cos: Float32Array, sin: Float32Array, at: number): void {
  const half = hd / 2;
  for (let f = 0; f < half; f++) {
    const a = x[offset + f]!;
    const b = x[offset + half + f]!;
    const c = cos[at * hd + f]!;
    const s = sin[at * hd + f]!;
    x[offset + f] = a * c - b * s;
    x[offset + half + f] = b * c + a * s;
  }
}

function addInto(x: Float32Array, y: Float32Array): void {
  for (let i = 0; i < x.length; i++) x[i]! += y[i]!;
}
