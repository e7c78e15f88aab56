// LlamaForCausalLM's math, on TensorFlow.js: RMSNorm, a SwiGLU MLP, rotary embeddings (rotate-half, rope_theta),
// grouped-query attention, head_dim, tied or untied embeddings; and Qwen2's biases on q, k and v. Weights
// carry transformers' names and orientations (`model.layers.N.self_attn.q_proj.weight`, (out, in)), so a
// folder prefab writes is what `AutoModelForCausalLM.from_pretrained` reads, and the other way round
// (model/hf.ts reads and writes the folders).
// This is the trainer's one model: what sft trains from scratch (a tiny Llama) or from a pretrained folder,
// what dpo tunes, eval scores and the simulator's policy runs.
// Read top to bottom: parameters, the forward pass (its config, one typed object, is model/config.ts). Generation with a KV cache is runtime/decode.ts.
// Shapes: B batch, T length, D hidden size, H query heads, K key/value heads, hd head_dim, F intermediate
// size, V vocabulary; N = B·T rows.
import * as tf from '@tensorflow/tfjs-core';
import { seeded } from '../core/random.ts';
import { flopsPerToken, llamaParameterShapes, type LlamaConfig } from './config.ts';
import { causalAttention, embed, linear } from './ops.ts';
import { ModelWeights, normal } from './parameters.ts';

/** Llama's initialisation: N(0, 0.02) for matrices, norms at 1, biases at 0. */
export function initialWeights(c: LlamaConfig, seed: string): Map<string, Float32Array> {
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
export function rmsNorm(x: tf.Tensor2D, weight: tf.Tensor, eps: number): tf.Tensor2D {
  return tf.mul(tf.mul(x, tf.rsqrt(tf.add(tf.mean(tf.square(x), -1, true), eps))), weight) as tf.Tensor2D;
}

/** SiLU (x·σ(x)), the gate of the SwiGLU MLP. */
export const silu = (x: tf.Tensor2D) => tf.mul(x, tf.sigmoid(x)) as tf.Tensor2D;

/** x · Wᵀ (+ b) for a weight stored (out, in) as transformers stores it. x: (N, in) → (N, out). */
function project(x: tf.Tensor2D, w: tf.Tensor2D, b?: tf.Tensor): tf.Tensor2D {
  const y = linear(x, tf.transpose(w));
  return b ? (tf.add(y, b) as tf.Tensor2D) : y;
}

/**
 * RoPE's cos and sin for positions 0…n−1, (n, hd): angle p · θ^(−2f/hd) for f < hd/2, the same angle on both
 * halves, as transformers' default rope computes it (inverse frequencies and their products in float32).
 */
export function ropeTable(positions: number, headDim: number, theta: number): { cos: Float32Array; sin: Float32Array } {
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
export function rotate(x: tf.Tensor3D, cos: tf.Tensor3D, sin: tf.Tensor3D): tf.Tensor3D {
  const half = x.shape[2] / 2;
  const [x1, x2] = tf.split(x, [half, half], 2);
  return tf.add(tf.mul(x, cos), tf.mul(tf.concat([tf.neg(x2), x1], 2), sin)) as tf.Tensor3D;
}

/** K key/value heads repeated to H, each serving H / K query heads in a row (transformers' repeat_kv). (N, K, hd) → (N, H·hd). */
export function repeatKv(x: tf.Tensor3D, heads: number): tf.Tensor2D {
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
   * LoRA adapters by module (`model.layers.0.self_attn.q_proj`), when some are attached (model/lora.ts): each
   * adds (α/r)·(x·Aᵀ)·Bᵀ to its projection while `adaptersOn` is true.
   */
  adapters = new Map<
    string,
    {
      a: tf.Variable;
      b: tf.Variable;
      scale: number;
      dropout: number;
      /** Its place among the adapters. */ index: number;
    }
  >();
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
    const input =
      this.dropoutSeed !== null && adapter.dropout > 0
        ? (tf.dropout(x, adapter.dropout, undefined, this.dropoutSeed + adapter.index) as tf.Tensor2D)
        : x;
    const low = linear(input, tf.transpose(adapter.a as tf.Tensor as tf.Tensor2D)); // (N, r)
    return tf.add(
      y,
      tf.mul(linear(low, tf.transpose(adapter.b as tf.Tensor as tf.Tensor2D)), adapter.scale),
    ) as tf.Tensor2D;
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
    return this.linear(
      tf.mul(silu(this.linear(x, m('gate_proj'))), this.linear(x, m('up_proj'))) as tf.Tensor2D,
      m('down_proj'),
    ); // (N, F) → (N, D)
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
      const packed = tf.concat(
        [tf.reshape(q, [n, H * this.config.headDim]), repeatKv(k, H), repeatKv(v, H)],
        1,
      ) as tf.Tensor2D; // (N, 3·H·hd)
      const attended = causalAttention(packed, { batch, length, heads: H }, this.mask(length)); // (N, H·hd)
      x = tf.add(x, this.linear(attended, `model.layers.${i}.self_attn.o_proj`));
      x = tf.add(x, this.mlp(i, rmsNorm(x, l('post_attention_layernorm.weight'), eps)));
    }
    return this.head(x);
  }

  /** flopsPerToken of this model's config, with its own parameter count (adapters included). */
  flopsPerToken(length: number): number {
    return flopsPerToken(this.config, length, this.size());
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
