// Generation with a KV cache: one sequence (a policy in the simulator, `prefab model generate`), or many
// stepped together (the server: one pass through the model per decoding step for every request in flight).
// Shapes as in train/model.ts: D hidden size, H query heads, K key/value heads, hd head_dim, F intermediate
// size, V vocabulary, B sequences stepped together.
import * as tf from '@tensorflow/tfjs-core';
import type { Random } from '../core/random.ts';
import { embed } from './kernels.ts';
import { repeatKv, rmsNorm, type Llama } from './model.ts';
import { sampleToken } from './sampling.ts';

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
 * The weights a decoder computes with, copied from the model when it is made (adapters folded in: W +
 * (α/r)·B·A), so training the model on does not change a decoder already made. Plain arrays for one
 * sequence's steps; for many sequences' steps, the projections of a layer fused and transposed into tensors
 * on the backend (q|k|v and gate|up, (in, out): WASM's matMul is 8–30× slower with a transpose flag), made on
 * first use. Caches made from one DecodeWeights can be stepped together.
 */
export class DecodeWeights {
  readonly w = new Map<string, Float32Array>();
  private fused: { qkv: tf.Tensor2D; o: tf.Tensor2D; gateUp: tf.Tensor2D; down: tf.Tensor2D }[] | null = null;
  private lmHead: tf.Tensor2D | null = null;

  constructor(readonly model: Llama) {
    for (const [name, v] of model.params) this.w.set(name, (v.dataSync() as Float32Array).slice());
    if (model.adaptersOn) for (const module of model.adapters.keys()) this.w.set(`${module}.weight`, tf.tidy(() => model.adaptedWeight(module).dataSync() as Float32Array));
  }

  get(name: string): Float32Array {
    return this.w.get(name)!;
  }

  /** Per layer the fused, transposed projections, and the head (D, V). */
  tensors() {
    if (!this.fused) {
      const c = this.model.config;
      const t = (name: string, out: number, inner: number) => tf.tensor2d(this.get(name), [out, inner]);
      this.fused = Array.from({ length: c.layers }, (_, l) =>
        tf.tidy(() => {
          const p = (n: string) => `model.layers.${l}.${n}.weight`;
          const { heads: H, kvHeads: K, headDim: hd, hiddenSize: D, intermediateSize: F } = c;
          return {
            qkv: tf.transpose(tf.concat([t(p('self_attn.q_proj'), H * hd, D), t(p('self_attn.k_proj'), K * hd, D), t(p('self_attn.v_proj'), K * hd, D)], 0)) as tf.Tensor2D, // (D, (H+2K)·hd)
            o: tf.transpose(t(p('self_attn.o_proj'), D, H * hd)) as tf.Tensor2D, // (H·hd, D)
            gateUp: tf.transpose(tf.concat([t(p('mlp.gate_proj'), F, D), t(p('mlp.up_proj'), F, D)], 0)) as tf.Tensor2D, // (D, 2F)
            down: tf.transpose(t(p('mlp.down_proj'), D, F)) as tf.Tensor2D, // (F, D)
          };
        }),
      );
      this.lmHead = tf.tidy(() => tf.transpose(t(c.tiedEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight', c.vocabSize, c.hiddenSize)) as tf.Tensor2D); // (D, V)
    }
    return { layers: this.fused, head: this.lmHead! };
  }

  /** Frees the tensors (the arrays go with the object). */
  dispose(): void {
    if (this.fused) tf.dispose([...this.fused.flatMap((f) => [f.qkv, f.o, f.gateUp, f.down]), this.lmHead!]);
    this.fused = null;
    this.lmHead = null;
  }
}

/** rows (B, inner) · W (inner, out) through the backend. → (B, out) */
function rowsTimes(rows: Float32Array, B: number, W: tf.Tensor2D): Float32Array {
  // Not in tf.tidy: it would walk the returned array element by element.
  const x = tf.tensor2d(rows, [B, W.shape[0]]);
  const y = tf.matMul(x, W);
  const out = y.dataSync() as Float32Array;
  tf.dispose([x, y]);
  return out;
}

/**
 * Generation with a KV cache: each layer keeps the rotated keys and the values of every token read so far
 * (K heads, not repeated), so a new token is one row through the model, within one reply and across the
 * turns of an episode, where each new prompt extends the last one.
 * A generated token of one sequence is computed in plain TypeScript on the CPU: a step of a model this small
 * is a few hundred tiny operations, which cost more to dispatch to a TensorFlow.js backend than to compute
 * (measured for 4 layers, width 128: 2.3 ms a token against 4.8 ms through WASM ops). A prompt of many new
 * tokens is read in one batched pass through the backend instead (0.34 ms a token against 1.6 token by
 * token), and so is a step of many sequences (KVCache.readEach): their rows go through each projection as one
 * matMul, and each attends to its own cache.
 */
export class KVCache {
  /** The tokens read so far. */
  readonly tokens: number[] = [];
  private readonly w: Map<string, Float32Array>;
  /** Per layer: (capacity, K·hd), the first tokens.length rows in use; grown by doubling. */
  private keys: Float32Array[];
  private values: Float32Array[];
  private capacity = 0;
  /** Attention's scores, (H, positions), reused from step to step. */
  private scores = new Float32Array(0);
  readonly model: Llama;

  /** A cache over the model's weights as they are now; pass `weights` to share one copy among caches (and step them together). */
  constructor(
    model: Llama,
    readonly weights: DecodeWeights = new DecodeWeights(model),
  ) {
    this.model = weights.model;
    this.w = weights.w;
    this.keys = Array.from({ length: this.model.config.layers }, () => new Float32Array(0));
    this.values = Array.from({ length: this.model.config.layers }, () => new Float32Array(0));
  }

  /**
   * A new cache holding the first `n` tokens of `source`, their keys and values copied (the server's requests
   * that share a prompt's beginning, a system prompt, with one in flight read only the rest).
   */
  static forkOf(source: KVCache, n: number): KVCache {
    const fork = new KVCache(source.model, source.weights);
    const width = source.model.config.kvHeads * source.model.config.headDim;
    const count = Math.min(n, source.tokens.length);
    fork.reserve(count);
    for (let l = 0; l < fork.keys.length; l++) {
      fork.keys[l]!.set(source.keys[l]!.subarray(0, count * width));
      fork.values[l]!.set(source.values[l]!.subarray(0, count * width));
    }
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

  /** Room for one more token, or an error naming the model's limit. */
  private fits(n: number): void {
    const max = this.model.config.maxPositions;
    if (this.tokens.length + n > max) throw new Error(`${this.tokens.length + n} tokens do not fit in the model's ${max} positions (max_position_embeddings)`);
  }

  /** Reads tokens after those already read; returns the next-token logits after the last, (V). */
  read(tokens: number[]): Float32Array {
    this.fits(tokens.length);
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

  /**
   * Reads one token into each cache, all in one step: the caches' rows go through every projection together
   * (one matMul each through the backend), and each row attends to its own cache. Returns each cache's
   * next-token logits, the same (to float rounding) as `read([token])` on each. The caches must share one
   * DecodeWeights; a single cache is read alone.
   */
  static readEach(caches: KVCache[], tokens: number[]): Float32Array[] {
    if (caches.length === 1) return [caches[0]!.read(tokens)];
    const weights = caches[0]!.weights;
    if (caches.some((c) => c.weights !== weights)) throw new Error('KVCache.readEach: the caches do not share their weights');
    const c = weights.model.config;
    const { layers, hiddenSize: D, intermediateSize: F, heads: H, kvHeads: K, headDim: hd, rmsNormEps: eps, attentionBias, vocabSize: V } = c;
    const B = caches.length;
    for (const cache of caches) {
      cache.fits(1);
      cache.reserve(cache.tokens.length + 1);
    }
    const { layers: fused, head } = weights.tensors();
    const w = (name: string) => weights.get(name);
    const at = caches.map((cache) => cache.tokens.length);
    const { cos, sin } = weights.model.ropeTable(Math.max(...at) + 1);
    const x = new Float32Array(B * D); // (B, D)
    tokens.forEach((token, b) => x.set(w('model.embed_tokens.weight').subarray(token * D, (token + 1) * D), b * D));
    const normed = (weight: Float32Array) => {
      const out = new Float32Array(B * D);
      for (let b = 0; b < B; b++) out.set(rms(x.subarray(b * D, (b + 1) * D), weight, eps), b * D);
      return out;
    };
    const Q = H * hd;
    const width = (H + 2 * K) * hd;
    const attended = new Float32Array(B * Q); // (B, H·hd)
    for (let l = 0; l < layers; l++) {
      const p = `model.layers.${l}.`;
      const qkv = rowsTimes(normed(w(`${p}input_layernorm.weight`)), B, fused[l]!.qkv); // (B, (H+2K)·hd)
      for (let b = 0; b < B; b++) {
        const row = qkv.subarray(b * width, (b + 1) * width);
        const q = row.subarray(0, Q);
        const k = row.subarray(Q, Q + K * hd);
        const v = row.subarray(Q + K * hd);
        if (attentionBias) {
          addInto(q, w(`${p}self_attn.q_proj.bias`));
          addInto(k, w(`${p}self_attn.k_proj.bias`));
          addInto(v, w(`${p}self_attn.v_proj.bias`));
        }
        for (let j = 0; j < H; j++) rotateHalf(q, j * hd, hd, cos, sin, at[b]!);
        for (let j = 0; j < K; j++) rotateHalf(k, j * hd, hd, cos, sin, at[b]!);
        caches[b]!.attend(l, q, k, v, at[b]!, attended.subarray(b * Q, (b + 1) * Q));
      }
      addInto(x, rowsTimes(attended, B, fused[l]!.o));
      const gateUp = rowsTimes(normed(w(`${p}post_attention_layernorm.weight`)), B, fused[l]!.gateUp); // (B, 2F)
      const act = new Float32Array(B * F);
      for (let b = 0; b < B; b++) for (let i = 0; i < F; i++) {
        const g = gateUp[b * 2 * F + i]!;
        act[b * F + i] = (g / (1 + Math.exp(-g))) * gateUp[b * 2 * F + F + i]!; // silu(gate) ⊙ up
      }
      addInto(x, rowsTimes(act, B, fused[l]!.down));
    }
    const logits = rowsTimes(normed(w('model.norm.weight')), B, head); // (B, V)
    caches.forEach((cache, b) => cache.tokens.push(tokens[b]!));
    return caches.map((_, b) => logits.slice(b * V, (b + 1) * V));
  }

  /**
   * Layer l's attention for the token at position `at`: its rotated key and value k, v (K·hd) join the cache,
   * and its rotated query q (H·hd) attends to positions 0…at; the heads' outputs go to `out` (H·hd).
   */
  private attend(l: number, q: Float32Array, k: Float32Array, v: Float32Array, at: number, out: Float32Array): void {
    const { heads: H, kvHeads: K, headDim: hd } = this.model.config;
    const keys = this.keys[l]!;
    const values = this.values[l]!;
    const row = K * hd;
    keys.set(k, at * row);
    values.set(v, at * row);
    const n = at + 1;
    const scores = (this.scores = this.scores.length >= H * n ? this.scores : new Float32Array(2 * H * n)); // (H, n)
    const group = H / K;
    const scale = 1 / Math.sqrt(hd);
    // The loops keep each sum's additions in the order of the plain definition (the same bits as before),
    // and run several sums side by side, which a CPU overlaps: four positions' scores at once, eight outputs.
    for (let j = 0; j < H; j++) {
      const qo = j * hd;
      const kv = Math.floor(j / group) * hd; // the key/value head this query head shares
      const so = j * n;
      let t = 0;
      for (; t + 4 <= n; t += 4) {
        const k0 = t * row + kv;
        const [k1, k2, k3] = [k0 + row, k0 + 2 * row, k0 + 3 * row];
        let [s0, s1, s2, s3] = [0, 0, 0, 0];
        for (let d = 0; d < hd; d++) {
          const x = q[qo + d]!;
          s0 += x * keys[k0 + d]!;
          s1 += x * keys[k1 + d]!;
          s2 += x * keys[k2 + d]!;
          s3 += x * keys[k3 + d]!;
        }
        scores[so + t] = s0 * scale;
        scores[so + t + 1] = s1 * scale;
        scores[so + t + 2] = s2 * scale;
        scores[so + t + 3] = s3 * scale;
      }
      for (; t < n; t++) {
        let s = 0;
        for (let d = 0, k0 = t * row + kv; d < hd; d++) s += q[qo + d]! * keys[k0 + d]!;
        scores[so + t] = s * scale;
      }
    }
    for (let j = 0; j < H; j++) {
      let top = -Infinity;
      for (let t = j * n; t < (j + 1) * n; t++) if (scores[t]! > top) top = scores[t]!;
      let total = 0;
      for (let t = j * n; t < (j + 1) * n; t++) total += scores[t] = Math.exp(scores[t]! - top);
      for (let t = j * n; t < (j + 1) * n; t++) scores[t]! /= total;
    }
    // out[j, d] = Σ_t p[j, t]·v[t, d], summed in float32 over t in order (Math.fround: as when it was added
    // into a Float32Array); eight outputs d…d+7 at once.
    const f = Math.fround;
    for (let j = 0; j < H; j++) {
      const qo = j * hd;
      const kv = Math.floor(j / group) * hd;
      const so = j * n;
      let d = 0;
      for (; d + 8 <= hd; d += 8) {
        let [a0, a1, a2, a3, a4, a5, a6, a7] = [0, 0, 0, 0, 0, 0, 0, 0];
        for (let t = 0, vo = kv + d; t < n; t++, vo += row) {
          const p = scores[so + t]!;
          a0 = f(a0 + p * values[vo]!);
          a1 = f(a1 + p * values[vo + 1]!);
          a2 = f(a2 + p * values[vo + 2]!);
          a3 = f(a3 + p * values[vo + 3]!);
          a4 = f(a4 + p * values[vo + 4]!);
          a5 = f(a5 + p * values[vo + 5]!);
          a6 = f(a6 + p * values[vo + 6]!);
          a7 = f(a7 + p * values[vo + 7]!);
        }
        out.set([a0, a1, a2, a3, a4, a5, a6, a7], qo + d);
      }
      for (; d < hd; d++) {
        let a = 0;
        for (let t = 0, vo = kv + d; t < n; t++, vo += row) a = f(a + scores[so + t]! * values[vo]!);
        out[qo + d] = a;
      }
    }
  }

  /** The final norm's output at position `at`, after reading `token` there: one row through the model. */
  private step(token: number, at: number): Float32Array {
    const { layers, hiddenSize: D, intermediateSize: F, heads: H, kvHeads: K, headDim: hd, rmsNormEps: eps, attentionBias } = this.model.config;
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
    const d = new Decoding(this, prompt, options);
    for (let next = d.next(); next !== null && !d.finished; next = d.next()) d.logits = this.read([next]);
    return d.out;
  }
}

/**
 * One continuation being sampled: made from a prompt (read into the cache, its shared prefix reused), then
 * `next()` draws a token from `logits`, and the caller reads it into the cache (alone, or with other
 * decodings' tokens in one KVCache.readEach) and sets `logits`, until `finished`. KVCache.generate is this
 * loop for one sequence; the server runs it for every request in flight.
 */
export class Decoding {
  /** The tokens drawn so far. */
  readonly out: number[] = [];
  /** The next-token logits after what the cache has read. */
  logits: Float32Array;
  /** No token is to be read or drawn any more: a stop token, maxTokens, the model's positions, or the constraint allows nothing. */
  finished = false;
  private readonly limit: number;
  private readonly rand: Random;

  constructor(
    readonly cache: KVCache,
    prompt: number[],
    readonly options: GenerateOptions,
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
    while (shared < Math.min(prompt.length - 1, cache.tokens.length) && cache.tokens[shared] === prompt[shared]) shared++;
    cache.truncate(shared);
    this.logits = cache.read(prompt.slice(shared));
  }

  /** Draws the next token (null when there is none to draw); after a stop token or the last one allowed, `finished` is set and the token is not to be read. */
  next(): number | null {
    if (this.finished) return null;
    const { temperature, constraint } = this.options;
    const topP = this.options.topP ?? 1;
    const logits = this.logits;
    let next = sampleToken(logits, temperature, topP, this.rand);
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
