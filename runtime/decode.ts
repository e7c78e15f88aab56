// Generation with a KV cache: one sequence (a policy in the simulator, `prefab model generate`), or many
// stepped together (the server: one pass through the model per decoding step for every request in flight).
// Shapes as in model/llama.ts: D hidden size, H query heads, K key/value heads, hd head_dim, F intermediate
// size, V vocabulary, B sequences stepped together.
import * as tf from '@tensorflow/tfjs-core';
import type { Random } from '../core/random.ts';
import type { TokenConstraint } from '../model/constrain.ts';
import type { Llama } from '../model/llama.ts';
import type { CpuKernels } from './cpu/kernels.ts';
import { drawArray, sampleToken, type Draw } from './sampling.ts';

export interface GenerateOptions {
  maxTokens: number;
  /** 0: greedy. */
  temperature: number;
  /** Nucleus sampling: keep the most likely tokens whose probabilities add up to topP. */
  topP?: number;
  /** Stop after any of these tokens. */
  stop?: number[];
  random?: Random;
  /** Which token may follow the ones generated so far (model/constrain.ts); absent: any. */
  constraint?: TokenConstraint;
}

/** Arrays end to end (one array: itself). */
function join(...ws: Float32Array[]): Float32Array {
  if (ws.length === 1) return ws[0]!;
  const out = new Float32Array(ws.reduce((n, w) => n + w.length, 0));
  ws.reduce((at, w) => (out.set(w, at), at + w.length), 0);
  return out;
}

/** Without the C kernels, below this many new tokens a read goes token by token; from it on, through one batched pass. */
const BATCHED_READ = 8;

/**
 * Up to this many rows a pass's products are the C kernels' panelTimes, on weights kept in panels; from there
 * on (a prompt's reading) OpenBLAS's sgemm on the weights as stored (docs/experiments.md, "A decoding step's
 * products").
 */
const PANEL_ROWS = 64;

/** The weights of each product, as stored: the fused ones' parts side by side in the output. */
type Product = 'qkv' | 'o' | 'gateUp' | 'down' | 'head';
const PARTS: Record<Exclude<Product, 'head'>, string[]> = {
  qkv: ['self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj'],
  o: ['self_attn.o_proj'],
  gateUp: ['mlp.gate_proj', 'mlp.up_proj'],
  down: ['mlp.down_proj'],
};

/**
 * The weights a decoder computes with, copied from the model when it is made (adapters folded in: W +
 * (α/r)·B·A), so training the model on does not change a decoder already made. Caches made from one
 * DecodeWeights can be stepped together.
 */
export class DecodeWeights {
  readonly w = new Map<string, Float32Array>();
  /** With them, each product's weights in panels (packPanels), made at its first few-row product. */
  private readonly panels = new Map<string, Float32Array>();
  private readonly biases: Float32Array[] = [];
  /** Without the C kernels: each product's weights transposed, (in, out), as TensorFlow.js tensors, made at first use. */
  private readonly tensors = new Map<string, tf.Tensor2D>();

  /**
   * `native`: the CPU path's C kernels (the products by OpenBLAS, a few rows' in C; the attention over the
   * caches in C); null: the reference's, TensorFlow.js's matMul for a batched pass and plain loops for the
   * rest, the same numbers within float rounding and several times slower.
   */
  constructor(
    readonly model: Llama,
    readonly native: CpuKernels | null,
  ) {
    for (const [name, v] of model.params) this.w.set(name, (v.dataSync() as Float32Array).slice());
    if (model.adaptersOn)
      for (const module of model.adapters.keys())
        this.w.set(
          `${module}.weight`,
          tf.tidy(() => model.adaptedWeight(module).dataSync() as Float32Array),
        );
  }

  get(name: string): Float32Array {
    return this.w.get(name)!;
  }

  /**
   * rows (R, inner) through layer l's `which` projection (the fused ones: qkv, o, gateUp, down; or the head,
   * l ignored) → (R, out), into `y` where given (added to it with `add`, the residual stream): with the C
   * kernels (panelTimes for a step's rows, OpenBLAS's sgemm for a prompt's), else by TensorFlow.js's matMul
   * on untransposed operands (WASM's matMul is far slower with a transpose flag).
   */
  times(
    rows: Float32Array,
    R: number,
    l: number,
    which: Product,
    into?: { y: Float32Array; add?: boolean },
  ): Float32Array {
    const c = this.model.config;
    const inner = rows.length / R;
    const parts =
      which === 'head'
        ? [this.get(c.tiedEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight')]
        : PARTS[which].map((n) => this.get(`model.layers.${l}.${n}.weight`));
    const out = parts.reduce((n, w) => n + w.length / inner, 0);
    const y = into?.y.subarray(0, R * out) ?? new Float32Array(R * out);
    const add = into?.add ?? false;
    if (this.native && R <= PANEL_ROWS) {
      const key = `${l}.${which}`;
      let panels = this.panels.get(key);
      if (!panels) {
        this.panels.set(key, (panels = new Float32Array(Math.ceil(out / 16) * 16 * inner)));
        this.native.packPanels(join(...parts), out, inner, panels);
      }
      this.native.panelTimes(rows, R, panels, out, inner, y, add);
      return y;
    }
    if (this.native) {
      // Each part into its columns of y (the output's rows `out` apart).
      let column = 0;
      for (const w of parts) {
        const n = w.length / inner;
        this.native.sgemm(0, 1, R, n, inner, 1, rows, inner, w, inner, add ? 1 : 0, y.subarray(column), out);
        column += n;
      }
      return y;
    }
    const key = `${l}.${which}`;
    let wt = this.tensors.get(key);
    if (!wt) this.tensors.set(key, (wt = tf.tidy(() => tf.transpose(tf.tensor2d(join(...parts), [out, inner])))));
    // Not in tf.tidy: it would walk the returned array element by element.
    const x = tf.tensor2d(rows, [R, inner]);
    const product = tf.matMul(x, wt);
    const values = product.dataSync() as Float32Array;
    tf.dispose([x, product]);
    if (into?.add) addInto(y, values);
    else y.set(values);
    return y;
  }

  /** Frees the tensors (the arrays go with the object). */
  dispose(): void {
    tf.dispose([...this.tensors.values()]);
    this.tensors.clear();
  }

  /** Layer l's q, k and v biases side by side (a row of the qkv product), or null without them. */
  qkvBias(l: number): Float32Array | null {
    if (!this.model.config.attentionBias) return null;
    this.biases[l] ??= join(...PARTS.qkv.map((n) => this.get(`model.layers.${l}.${n}.bias`)));
    return this.biases[l]!;
  }
}

/**
 * Generation with a KV cache: each layer keeps the rotated keys and the values of every token read so far
 * (K heads, not repeated), so a new token is one row through the model, within one reply and across the
 * turns of an episode, where each new prompt extends the last one.
 * A prompt's new tokens are read in one batched pass, and so is a step of many sequences (KVCache.readEach):
 * their rows go through each projection as one product, and each attends to its own cache. With the C kernels
 * (DecodeWeights.native) the products are panelTimes' for a step's rows and OpenBLAS's for a prompt's, and
 * placing each row's key and value and its attention C's (decodeAttentionRows); without, the reference's:
 * TensorFlow.js's matMul for a batched pass's products, plain loops for a token alone (step) and for the
 * attention.
 */
export class KVCache {
  /** The tokens read so far. */
  readonly tokens: number[] = [];
  private readonly w: Map<string, Float32Array>;
  readonly model: Llama;
  /**
   * Keys and values in one array of the cache's own, where the C kernels' attention reads them too. In floats:
   * [q (H·hp) | layers × (2, K, capacity, hp) | scores (H, capacity)]: a layer's rotated keys
   * head by head, each head's positions one after another, then its values alike; hp the head size rounded up
   * to a multiple of 4 (the padding stays 0). A head's attention reads one run of memory (with a position's
   * heads side by side it read hp floats of every 2·K·hp). The first tokens.length positions are in use; when
   * the capacity grows, the array is made anew and each head's positions copied to their new place.
   */
  private f32 = new Float32Array(0);
  private capacity = 0;
  private readonly layers: number;
  private readonly hp: number;
  /** Where q and the layers start, and the floats of one position of one layer (all its heads). */
  private readonly at: { q: number; positions: number; stride: number };

  /**
   * A cache over the model's weights as they are now; pass `weights` to share one copy among caches (and step
   * them together) and to say where it computes; without, the reference's own cache.
   */
  constructor(
    model: Llama,
    readonly weights: DecodeWeights = new DecodeWeights(model, null),
  ) {
    this.model = weights.model;
    this.w = weights.w;
    const { heads: H, kvHeads: K, headDim: hd, layers } = this.model.config;
    this.hp = Math.ceil(hd / 4) * 4;
    this.at = { q: 0, positions: H * this.hp, stride: 2 * K * this.hp };
    this.layers = layers;
  }

  /**
   * A new cache holding the first `n` tokens of `source`, their keys and values copied (the server's requests
   * that share a prompt's beginning, a system prompt, with one in flight read only the rest).
   */
  static forkOf(source: KVCache, n: number): KVCache {
    const fork = new KVCache(source.model, source.weights);
    const count = Math.min(n, source.tokens.length);
    fork.reserve(count);
    fork.copyHeads({ f32: source.f32, capacity: source.capacity }, count);
    fork.tokens.push(...source.tokens.slice(0, count));
    return fork;
  }

  /** Forgets all but the first n tokens. */
  truncate(n: number): void {
    if (n < this.tokens.length) this.tokens.length = n;
  }

  /** Room for `n` positions in every layer's keys and values. */
  private reserve(n: number): void {
    if (n <= this.capacity) return;
    const capacity = Math.max(n, 2 * this.capacity, 64);
    const floats = this.at.positions + this.layers * capacity * this.at.stride + this.model.config.heads * capacity;
    const old = { f32: this.f32, capacity: this.capacity };
    this.f32 = new Float32Array(floats);
    this.capacity = capacity;
    this.copyHeads(old, this.tokens.length);
  }

  /** The first `count` positions of every layer's key and value heads of `from` (a cache, or this one's old array) to their places here. */
  private copyHeads(from: { f32: Float32Array; capacity: number }, count: number): void {
    const { hp, at } = this;
    for (let l = 0; l < this.layers && count > 0; l++)
      for (let j = 0; j < at.stride / hp; j++) {
        // Head j of layer l: the K key heads, then the K value heads.
        const start = at.positions + l * from.capacity * at.stride + j * from.capacity * hp;
        this.f32.set(from.f32.subarray(start, start + count * hp), this.key(0, l) + j * this.capacity * hp);
      }
  }

  /** Room for one more token, or an error naming the model's limit. */
  private fits(n: number): void {
    const max = this.model.config.maxPositions;
    if (this.tokens.length + n > max)
      throw new Error(
        `${this.tokens.length + n} tokens do not fit in the model's ${max} positions (max_position_embeddings)`,
      );
  }

  /** Reads tokens after those already read; returns the next-token logits after the last, (V). */
  read(tokens: number[]): Float32Array {
    if (tokens.length === 0) throw new Error('KVCache.read: no tokens to read');
    // With the C kernels a few tokens go through readRows too (panelTimes takes one row as well as many).
    if (tokens.length >= BATCHED_READ || this.weights.native) return KVCache.readRows([this], [tokens])[0]!;
    this.fits(tokens.length);
    this.reserve(this.tokens.length + tokens.length);
    let x: Float32Array = new Float32Array(0);
    for (const token of tokens) {
      x = this.step(token, this.tokens.length);
      this.tokens.push(token);
    }
    const { vocabSize: V, hiddenSize: D, tiedEmbeddings } = this.model.config;
    return matVec(x, this.w.get(tiedEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight')!, V, D);
  }

  /**
   * Reads one token into each cache, all in one step. Returns each cache's next-token logits, the same (to
   * float rounding) as `read([token])` on each. The caches must share one DecodeWeights; a single cache is
   * read alone.
   */
  static readEach(caches: KVCache[], tokens: number[]): Float32Array[] {
    return KVCache.readMany(
      caches,
      tokens.map((token) => [token]),
    );
  }

  /**
   * Reads `reads[b]` into caches[b] (one token each while decoding, a prompt's new tokens for a request just
   * taken in), all in one pass; returns each cache's next-token logits, as `read` on each would. The caches
   * must share one DecodeWeights; a single cache is read alone.
   */
  static readMany(caches: KVCache[], reads: number[][]): Float32Array[] {
    if (caches.length === 1) return [caches[0]!.read(reads[0]!)];
    return KVCache.readRows(caches, reads);
  }

  /**
   * Reads `reads[b]` into caches[b], all of them in one pass: every token is a row, the rows go through each
   * projection together (one product each), and each row attends to its own cache up to its own position (a cache's rows in order, so each sees those before it). Only
   * each cache's last row goes through the head. Returns each cache's next-token logits.
   */
  private static readRows(caches: KVCache[], reads: number[][]): Float32Array[] {
    const weights = caches[0]!.weights;
    if (caches.some((c) => c.weights !== weights))
      throw new Error('KVCache.readEach: the caches do not share their weights');
    const c = weights.model.config;
    const {
      layers,
      hiddenSize: D,
      intermediateSize: F,
      heads: H,
      kvHeads: K,
      headDim: hd,
      rmsNormEps: eps,
      attentionBias,
      vocabSize: V,
    } = c;
    caches.forEach((cache, b) => {
      cache.fits(reads[b]!.length);
      cache.reserve(cache.tokens.length + reads[b]!.length);
    });
    // Row r: the token, its cache and its position.
    const rows = caches.flatMap((cache, b) =>
      reads[b]!.map((token, i) => ({ token, cache, at: cache.tokens.length + i })),
    );
    const R = rows.length;
    const w = (name: string) => weights.get(name);
    const { cos, sin } = weights.model.ropeTable(Math.max(...rows.map((r) => r.at)) + 1);
    const x = new Float32Array(R * D); // (R, D)
    rows.forEach(({ token }, r) => x.set(w('model.embed_tokens.weight').subarray(token * D, (token + 1) * D), r * D));
    const native = weights.native;
    // Each layer's products into the same arrays, made once a pass (fresh ones cost a page fault a page).
    const Q = H * hd;
    const width = (H + 2 * K) * hd;
    const h = new Float32Array(R * D); // (R, D), a norm's output
    const qkv = new Float32Array(R * width); // (R, (H+2K)·hd)
    const attended = new Float32Array(R * Q); // (R, H·hd)
    const gateUp = new Float32Array(R * 2 * F); // (R, 2F)
    const act = new Float32Array(R * F); // (R, F)
    const inverse = new Float32Array(R);
    const normed = (weight: Float32Array, which: number[]) => {
      const out = which.length === R ? h : new Float32Array(which.length * D);
      if (!native) which.forEach((r, i) => out.set(rms(x.subarray(r * D, (r + 1) * D), weight, eps), i * D));
      else {
        const from = which.length === R ? x : new Float32Array(which.length * D);
        if (from !== x) which.forEach((r, i) => from.set(x.subarray(r * D, (r + 1) * D), i * D));
        native.rmsnormForward(from, null, null, weight, out, inverse, which.length, D, eps);
      }
      return out;
    };
    const all = rows.map((_, r) => r);
    // With the C kernels: each row's memory, and where its keys and values are (KVCache.where).
    const mems = native ? rows.map(({ cache }) => cache.f32) : null;
    const meta = new Float64Array(4 * R);
    for (let l = 0; l < layers; l++) {
      const p = `model.layers.${l}.`;
      weights.times(normed(w(`${p}input_layernorm.weight`), all), R, l, 'qkv', { y: qkv });
      if (native) {
        // Every row placed in its cache and attending in one call, the rows shared among the cores.
        rows.forEach(({ cache, at }, r) => meta.set(cache.where(l, at), 4 * r));
        native.decodeAttentionRows(mems!, qkv, meta, cos, sin, weights.qkvBias(l), H, K, hd, caches[0]!.hp, attended);
      } else
        rows.forEach(({ cache, at }, r) => {
          const row = qkv.subarray(r * width, (r + 1) * width);
          const q = row.subarray(0, Q);
          const k = row.subarray(Q, Q + K * hd);
          const v = row.subarray(Q + K * hd);
          if (attentionBias) {
            addInto(q, w(`${p}self_attn.q_proj.bias`));
            addInto(k, w(`${p}self_attn.k_proj.bias`));
            addInto(v, w(`${p}self_attn.v_proj.bias`));
          }
          for (let j = 0; j < H; j++) rotateHalf(q, j * hd, hd, cos, sin, at);
          for (let j = 0; j < K; j++) rotateHalf(k, j * hd, hd, cos, sin, at);
          cache.attend(l, q, k, v, at, attended.subarray(r * Q, (r + 1) * Q));
        });
      weights.times(attended, R, l, 'o', { y: x, add: true });
      weights.times(normed(w(`${p}post_attention_layernorm.weight`), all), R, l, 'gateUp', { y: gateUp });
      if (native) native.swigluRows(gateUp, R, F, act);
      else
        for (let r = 0; r < R; r++) {
          const [gate, up] = [r * 2 * F, r * 2 * F + F];
          for (let i = 0; i < F; i++)
            act[r * F + i] = (gateUp[gate + i]! / (1 + Math.exp(-gateUp[gate + i]!))) * gateUp[up + i]!; // silu(gate) ⊙ up
        }
      weights.times(act, R, l, 'down', { y: x, add: true });
    }
    let last = -1;
    const lasts = reads.map((read) => (last += read.length));
    const logits = weights.times(normed(w('model.norm.weight'), lasts), caches.length, 0, 'head'); // (B, V)
    caches.forEach((cache, b) => cache.tokens.push(...reads[b]!));
    return caches.map((_, b) => logits.slice(b * V, (b + 1) * V));
  }

  /**
   * For the C kernels' decodeAttentionRows, a token at position `at` of layer l: where the layer's keys and
   * values start, the positions its attention reads, and the floats between two heads.
   */
  private where(l: number, at: number): [number, number, number, number] {
    return [this.key(0, l), this.value(0, l), at + 1, this.capacity * this.hp];
  }

  /** Where layer l's key (value: `value`) of head 0 at position t is, in floats; head j is j·capacity·hp on. */
  private key(t: number, l: number): number {
    return this.at.positions + l * this.capacity * this.at.stride + t * this.hp;
  }

  private value(t: number, l: number): number {
    return this.key(t, l) + this.model.config.kvHeads * this.capacity * this.hp;
  }

  /** Writes a row of `heads` heads of hd floats at float `to`, each head `apart` floats after the one before. */
  private put(to: number, row: Float32Array, heads: number, apart: number): void {
    const hd = this.model.config.headDim;
    for (let j = 0; j < heads; j++) this.f32.set(row.subarray(j * hd, (j + 1) * hd), to + j * apart);
  }

  /**
   * Layer l's attention for the token at position `at`: its rotated key and value k, v (K·hd) join the cache,
   * and its rotated query q (H·hd) attends to positions 0…at; the heads' outputs go to `out` (H·hd). The
   * reference's (the C kernels' is decodeAttentionRows).
   */
  private attend(l: number, q: Float32Array, k: Float32Array, v: Float32Array, at: number, out: Float32Array): void {
    const { heads: H, kvHeads: K, headDim: hd } = this.model.config;
    const hp = this.hp;
    const apart = this.capacity * hp; // from one key (value) head to the next
    this.put(this.key(at, l), k, K, apart);
    this.put(this.value(at, l), v, K, apart);
    const n = at + 1;
    const scores = this.at.positions + this.layers * this.capacity * this.at.stride; // (H, n)
    // Each query head's scores over the positions, their softmax, the values weighted by it. Head sizes are
    // padded to hp, a multiple of 4 (zeros): four lanes at a time, summed apart, keep V8's loops from waiting
    // on one running sum.
    const group = H / K;
    const scale = 1 / Math.sqrt(hd);
    const stride = hp; // from one position to the next
    const f = this.f32;
    this.put(this.at.q, q, H, hp);
    for (let j = 0; j < H; j++) {
      const kv = Math.floor(j / group) * apart; // the key/value head this query head shares
      const qj = this.at.q + j * hp;
      const from = scores + j * n;
      let top = -Infinity;
      for (let t = 0, key = this.key(0, l) + kv; t < n; t++, key += stride) {
        let d0 = 0;
        let d1 = 0;
        let d2 = 0;
        let d3 = 0;
        for (let i = 0; i < hp; i += 4) {
          d0 += f[qj + i]! * f[key + i]!;
          d1 += f[qj + i + 1]! * f[key + i + 1]!;
          d2 += f[qj + i + 2]! * f[key + i + 2]!;
          d3 += f[qj + i + 3]! * f[key + i + 3]!;
        }
        const score = (f[from + t] = (d0 + d1 + (d2 + d3)) * scale);
        if (score > top) top = score;
      }
      let total = 0;
      for (let t = from; t < from + n; t++) total += f[t] = Math.exp(f[t]! - top);
      for (let t = from; t < from + n; t++) f[t]! /= total;
      // Four lanes of the output at a time, summed over the positions in registers.
      const values = this.value(0, l) + kv;
      for (let i = 0; i < hd; i += 4) {
        let o0 = 0;
        let o1 = 0;
        let o2 = 0;
        let o3 = 0;
        for (let t = 0, v = values + i; t < n; t++, v += stride) {
          const p = f[from + t]!;
          o0 += p * f[v]!;
          o1 += p * f[v + 1]!;
          o2 += p * f[v + 2]!;
          o3 += p * f[v + 3]!;
        }
        const at = j * hd + i;
        out[at] = o0;
        if (i + 1 < hd) out[at + 1] = o1;
        if (i + 2 < hd) out[at + 2] = o2;
        if (i + 3 < hd) out[at + 3] = o3;
      }
    }
  }

  /** The final norm's output at position `at`, after reading `token` there: one row through the model. */
  private step(token: number, at: number): Float32Array {
    const {
      layers,
      hiddenSize: D,
      intermediateSize: F,
      heads: H,
      kvHeads: K,
      headDim: hd,
      rmsNormEps: eps,
      attentionBias,
    } = this.model.config;
    const w = (name: string) => this.w.get(name)!;
    const { cos, sin } = this.model.ropeTable(at + 1);
    const x = w('model.embed_tokens.weight').slice(token * D, (token + 1) * D); // (D)
    const attended = new Float32Array(H * hd);
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
      this.attend(l, q, k, v, at, attended);
      addInto(x, matVec(attended, w(`${p}self_attn.o_proj.weight`), D, H * hd));
      const m = rms(x, w(`${p}post_attention_layernorm.weight`), eps);
      const gate = matVec(m, w(`${p}mlp.gate_proj.weight`), F, D);
      const up = matVec(m, w(`${p}mlp.up_proj.weight`), F, D);
      for (let i = 0; i < F; i++) gate[i] = (gate[i]! / (1 + Math.exp(-gate[i]!))) * up[i]!; // silu(gate) ⊙ up
      addInto(x, matVec(gate, w(`${p}mlp.down_proj.weight`), D, F));
    }
    return rms(x, w('model.norm.weight'), eps);
  }

  /**
   * Samples a continuation of `prompt`, reusing the cache for the longest prefix it shares with what was read
   * before (a conversation's next turn reads only its new messages). The sampled tokens are read too, except
   * the last. Stops after any of `stop`, at `maxTokens`, or where the model's positions end.
   */
  generate(prompt: number[], options: GenerateOptions): number[] {
    const d = new Decoding(this, prompt, options);
    for (let next = d.next(); next !== null && !d.finished; next = d.next()) d.logits = this.read([next]);
    return d.out;
  }
}

/** What a Decoding draws from: a KVCache, or the GPU's (runtime/webgpu/decode.ts GpuCache), which reads asynchronously. */
export interface TokenCache {
  readonly model: Llama;
  /** The tokens read so far. */
  readonly tokens: number[];
  truncate(n: number): void;
  /** Reads tokens and returns the next-token logits after the last; absent where reading is asynchronous. */
  read?(tokens: number[]): Float32Array;
}

/**
 * The caches a server keeps for one model (loop/serve/batcher.ts): on the CPU (cpuCaches) or the GPU
 * (runtime/webgpu/decode.ts GpuDecoder), made, forked, read together and freed alike.
 */
export interface CachePool {
  readonly model: Llama;
  create(): TokenCache;
  /** A new cache holding the first n tokens of `source` (KVCache.forkOf). */
  fork(source: TokenCache, n: number): TokenCache;
  /** Reads reads[b] into caches[b] in one pass (KVCache.readMany); each cache's next-token logits. */
  readMany(caches: TokenCache[], reads: number[][]): Float32Array[] | Promise<Float32Array[]>;
  /**
   * Reads as readMany and draws each cache's next token where the logits are, with draws[b]: on the GPU (a
   * token a cache read back), or by the C kernels on the CPU (every row in one call, shared between the
   * cores); `logits(b)` gives cache b's logits (for a token the constraint refuses), before the next read.
   */
  readAndDraw?(caches: TokenCache[], reads: number[][], draws: Draw[]): Promise<Drawn>;
  /** Frees a cache the server lets go. */
  free(cache: TokenCache): void;
  dispose(): void;
}

/** What CachePool.readAndDraw gives: each cache's drawn token, and its logits on demand. */
export interface Drawn {
  tokens: number[];
  logits(b: number): Promise<Float32Array>;
}

/**
 * Reads reads[i] into decodings[i]'s cache, all in one pass of `pool`, and sets what each draws its next token
 * from: its logits, or the token the pool drew where they are (readAndDraw, with the decoding's Draw), with the
 * logits read back too where the decoding's constraint refuses that token (next() draws again from them).
 */
export async function readDecodings(
  pool: CachePool,
  decodings: Decoding<TokenCache>[],
  reads: number[][],
): Promise<void> {
  const caches = decodings.map((d) => d.cache);
  if (pool.readAndDraw) {
    const drawn = await pool.readAndDraw(
      caches,
      reads,
      decodings.map((d) => d.draw()),
    );
    for (const [i, d] of decodings.entries()) {
      d.drawn = drawn.tokens[i]!;
      d.logits = d.options.constraint?.allows(d.out, d.drawn) === false ? await drawn.logits(i) : new Float32Array(0);
    }
  } else {
    const logits = await pool.readMany(caches, reads);
    decodings.forEach((d, i) => (d.logits = logits[i]!));
  }
}

/**
 * KVCaches over one copy of the model's weights: with the C kernels (`native`), a step's tokens drawn by them
 * too (drawRows, sampleToken's draws in C), else the reference's loops and each token drawn by sampleToken.
 */
export function cpuCaches(model: Llama, native: CpuKernels | null): CachePool {
  const weights = new DecodeWeights(model, native);
  const readMany = (caches: TokenCache[], reads: number[][]) => KVCache.readMany(caches as KVCache[], reads);
  return {
    model,
    create: () => new KVCache(model, weights),
    fork: (source, n) => KVCache.forkOf(source as KVCache, n),
    readMany,
    ...(native && {
      readAndDraw: async (caches: TokenCache[], reads: number[][], draws: Draw[]): Promise<Drawn> => {
        const logits = readMany(caches, reads);
        const tokens = new Int32Array(caches.length);
        native.drawRows(logits, drawArray(draws), tokens);
        return { tokens: [...tokens], logits: async (b) => logits[b]! };
      },
    }),
    free: () => {},
    dispose: () => weights.dispose(),
  };
}

/**
 * One continuation being sampled: made from a prompt (read into the cache, its shared prefix reused), then
 * `next()` draws a token from `logits`, and the caller reads it into the cache (alone, or with other
 * decodings' tokens in one KVCache.readEach) and sets `logits`, until `finished`. KVCache.generate is this
 * loop for one sequence; the server runs it for every request in flight.
 */
export class Decoding<C extends TokenCache = KVCache> {
  /** The tokens drawn so far. */
  readonly out: number[] = [];
  /** The next-token logits after what the cache has read. */
  logits: Float32Array;
  /** Or the next token, drawn where the logits are with draw()'s Draw (readDecodings). */
  drawn: number | null = null;
  /** No token is to be read or drawn any more: a stop token, maxTokens, the model's positions, or the constraint allows nothing. */
  finished = false;
  /** The prompt's tokens the cache did not hold, when the caller reads them (`read` false); then it sets `logits`. */
  readonly unread: number[] = [];
  private readonly limit: number;
  private readonly rand: Random;

  /** `read` false: the prompt's new tokens are left in `unread`, for the caller to read with other caches' (KVCache.readMany). */
  constructor(
    readonly cache: C,
    prompt: number[],
    readonly options: GenerateOptions,
    read = true,
  ) {
    const room = cache.model.config.maxPositions - prompt.length;
    this.limit = Math.min(options.maxTokens, room);
    this.rand = options.random ?? Math.random;
    if (room <= 0 || prompt.length === 0 || this.limit <= 0) {
      this.finished = true;
      this.logits = new Float32Array(0);
      return;
    }
    let shared = 0;
    while (shared < Math.min(prompt.length - 1, cache.tokens.length) && cache.tokens[shared] === prompt[shared])
      shared++;
    cache.truncate(shared);
    this.unread = prompt.slice(shared);
    if (read && !cache.read)
      throw new Error('Decoding: this cache reads asynchronously; pass read false and read the prompt into it');
    this.logits = read ? cache.read!(this.unread.splice(0)) : new Float32Array(0);
  }

  /**
   * What the next token is drawn with where the logits are: sampleToken's arguments and its random number,
   * taken from this decoding's stream now (before the read whose logits it draws from), as sampleToken would.
   */
  draw(): Draw {
    const { temperature } = this.options;
    return { temperature, topP: this.options.topP ?? 1, u: temperature > 0 ? this.rand() : 0 };
  }

  /** Draws the next token (null when there is none to draw); after a stop token or the last one allowed, `finished` is set and the token is not to be read. */
  next(): number | null {
    if (this.finished) return null;
    const { temperature, constraint } = this.options;
    const topP = this.options.topP ?? 1;
    const logits = this.logits;
    let next = this.drawn ?? sampleToken(logits, temperature, topP, this.rand);
    this.drawn = null;
    if (constraint && !constraint.allows(this.out, next)) {
      // Drawn outside what may come next: draw again from the tokens that may (checking them all costs
      // more than one draw, so it is only done when the first draw is refused).
      let any = false;
      for (let id = 0; id < logits.length; id++) {
        if (constraint.allows(this.out, id)) any = true;
        else logits[id] = -Infinity;
      }
      if (!any) {
        this.finished = true;
        return null;
      }
      next = sampleToken(logits, temperature, topP, this.rand);
    }
    this.out.push(next);
    if (this.options.stop?.includes(next) || this.out.length === this.limit) this.finished = true;
    return next;
  }
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
function rotateHalf(
  x: Float32Array,
  offset: number,
  hd: number,
  cos: Float32Array,
  sin: Float32Array,
  at: number,
): void {
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
