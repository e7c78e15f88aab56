// Causal self-attention on the GPU, forward and backward, as train/kernels.ts causalAttention computes it
// for the model (with grouped-query attention: key/value head h·K/H serves query head h, transformers'
// repeat_kv). q, dq: (B·T, H, hd); k, v, dk, dv: (B·T, K, hd); out, dout: (B·T, H·hd). The probabilities P and
// the score gradients dS are kept, (B, H, T, T): this is not FlashAttention, and costs T² memory a head.
//   forward:  P = softmax(q·kᵀ·scale, causal),  out = P·v
//   backward: dS = P ⊙ (dout·vᵀ − rowsum(dout·vᵀ ⊙ P)) · scale,  dq = dS·k,  dk = dSᵀ·q,  dv = Pᵀ·dout
// A workgroup of 256 threads takes a query row (b, h, t) for the forward and dq; another takes a key row
// (b, kv head, s) for dk and dv, summing over the query heads it serves and the rows that see it.
/// <reference types="@webgpu/types" />
import { Kernels, fields, kernel } from './kernel.ts';

const DIMS = 'batch: u32, length: u32, heads: u32, kv_heads: u32, head_dim: u32, scale: f32';

// Where a query row's q and a key row's k and v start, and a row of P.
const HELPERS = /* wgsl */ `
fn q_at(d: Dims, b: u32, t: u32, h: u32) -> u32 { return ((b * d.length + t) * d.heads + h) * d.head_dim; }
fn kv_at(d: Dims, b: u32, s: u32, g: u32) -> u32 { return ((b * d.length + s) * d.kv_heads + g) * d.head_dim; }
fn p_at(d: Dims, b: u32, h: u32, t: u32) -> u32 { return ((b * d.heads + h) * d.length + t) * d.length; }
`;

/**
 * WGSL: the scores of the query at q[qi…] against keys 0…count−1 (key s at keys[key(s)…]), scaled, then
 * exponentiated from their max into scores[row + s] by the workgroup's threads; their sum is left in `total`.
 */
const expScores = (o: { scores: string; keys: string; count: string; key: string }) => `
  var top = -3.4e38;
  for (var s = lid.x; s < ${o.count}; s += 256u) {
    let ki = ${o.key};
    var dot = 0.0;
    for (var e = 0u; e < d.head_dim; e++) { dot += q[qi + e] * ${o.keys}[ki + e]; }
    let score = dot * d.scale;
    ${o.scores}[row + s] = score;
    top = max(top, score);
  }
  top = reduce(lid.x, top, true);
  var sum = 0.0;
  for (var s = lid.x; s < ${o.count}; s += 256u) {
    let e = exp(${o.scores}[row + s] - top);
    ${o.scores}[row + s] = e;
    sum += e;
  }
  let total = reduce(lid.x, sum, false);`;

// A query row's workgroup: (t, h, b) from its id, its kv head g, where its q and its row of P start.
const QUERY_ROW = `
  let t = wg.x;
  let h = wg.y;
  let b = wg.z;
  let g = h / (d.heads / d.kv_heads);
  let qi = q_at(d, b, t, h);
  let row = p_at(d, b, h, t);`;

const FORWARD = kernel({
  threads: 'block',
  head: HELPERS,
  buffers: ['q: f32', 'k: f32', 'v: f32', 'mut p: f32', 'mut out: f32'],
  dims: DIMS,
  body: `${QUERY_ROW}
${expScores({ scores: 'p', keys: 'k', count: 't + 1u', key: 'kv_at(d, b, s, g)' })}
  for (var s = lid.x; s < d.length; s += 256u) {
    if (s <= t) { p[row + s] = p[row + s] / total; } else { p[row + s] = 0.0; }
  }
  storageBarrier();
  for (var e = lid.x; e < d.head_dim; e += 256u) {
    var acc = 0.0;
    for (var s = 0u; s <= t; s++) { acc += p[row + s] * v[kv_at(d, b, s, g) + e]; }
    out[qi + e] = acc;
  }`,
});

const BACKWARD_Q = kernel({
  threads: 'block',
  head: HELPERS,
  buffers: ['k: f32', 'v: f32', 'p: f32', 'dout: f32', 'mut ds: f32', 'mut dq: f32'],
  dims: DIMS,
  body: `${QUERY_ROW}
  var weighted = 0.0;
  for (var s = lid.x; s < d.length; s += 256u) {
    var dp = 0.0;
    if (s <= t) {
      let vi = kv_at(d, b, s, g);
      for (var e = 0u; e < d.head_dim; e++) { dp += dout[qi + e] * v[vi + e]; }
    }
    ds[row + s] = dp;
    weighted += dp * p[row + s];
  }
  let rowsum = reduce(lid.x, weighted, false);
  for (var s = lid.x; s < d.length; s += 256u) { ds[row + s] = p[row + s] * (ds[row + s] - rowsum) * d.scale; }
  storageBarrier();
  for (var e = lid.x; e < d.head_dim; e += 256u) {
    var acc = 0.0;
    for (var s = 0u; s <= t; s++) { acc += ds[row + s] * k[kv_at(d, b, s, g) + e]; }
    dq[qi + e] = acc;
  }`,
});

const BACKWARD_KV = kernel({
  threads: 'block',
  head: HELPERS,
  buffers: ['q: f32', 'p: f32', 'ds: f32', 'dout: f32', 'mut dk: f32', 'mut dv: f32'],
  dims: DIMS,
  body: `
  let s = wg.x;
  let g = wg.y;
  let b = wg.z;
  let group = d.heads / d.kv_heads;
  let ki = kv_at(d, b, s, g);
  for (var e = lid.x; e < d.head_dim; e += 256u) {
    var dk_acc = 0.0;
    var dv_acc = 0.0;
    for (var h = g * group; h < (g + 1u) * group; h++) {
      for (var t = s; t < d.length; t++) {
        let at = p_at(d, b, h, t) + s;
        let qi = q_at(d, b, t, h);
        dk_acc += ds[at] * q[qi + e];
        dv_acc += p[at] * dout[qi + e];
      }
    }
    dk[ki + e] = dk_acc;
    dv[ki + e] = dv_acc;
  }`,
});

// Decoding: rows r0… of q (n of them, H·hd each) are a sequence's new tokens at positions at0…, whose keys
// and values are already in its cache (positions × K × hd, keys and values of a layer at k_off and v_off); a
// workgroup a (row, head) attends to the cache up to its row's position. The scores go through `scores`
// (n · H · capacity f32s), each workgroup its own row.
const DECODE = kernel({
  threads: 'block',
  buffers: ['q: f32', 'cache: f32', 'mut scores: f32', 'mut out: f32'],
  dims: 'r0: u32, at0: u32, heads: u32, kv_heads: u32, head_dim: u32, capacity: u32, k_off: u32, v_off: u32, scale: f32',
  body: `
  let h = wg.y;
  let g = h / (d.heads / d.kv_heads);
  let qi = ((d.r0 + wg.x) * d.heads + h) * d.head_dim;
  let row = (wg.x * d.heads + h) * d.capacity;
  let n = d.at0 + wg.x + 1u;
  let stride = d.kv_heads * d.head_dim;
${expScores({ scores: 'scores', keys: 'cache', count: 'n', key: 'd.k_off + s * stride + g * d.head_dim' })}
  storageBarrier();
  for (var e = lid.x; e < d.head_dim; e += 256u) {
    var acc = 0.0;
    for (var s = 0u; s < n; s++) { acc += scores[row + s] * cache[d.v_off + s * stride + g * d.head_dim + e]; }
    out[qi + e] = acc / total;
  }`,
});

/** A decoding step's rows of one sequence against its cache (DECODE). */
export interface DecodeShape {
  /** The sequence's first row among the step's, how many it has, and the position of the first. */
  r0: number;
  rows: number;
  at0: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  /** Positions the cache has room for, and where this layer's keys and values start in it (f32s). */
  capacity: number;
  keys: number;
  values: number;
}

export interface AttentionShape {
  batch: number;
  length: number;
  heads: number;
  kvHeads: number;
  headDim: number;
}

export class Attention {
  constructor(private readonly k: Kernels) {}

  private dims(s: AttentionShape): GPUBuffer {
    return this.k.uniform(
      fields(
        { u32: s.batch },
        { u32: s.length },
        { u32: s.heads },
        { u32: s.kvHeads },
        { u32: s.headDim },
        { f32: 1 / Math.sqrt(s.headDim) },
      ),
    );
  }

  /** out from q, k, v; the probabilities into p (B·H·T·T f32s), for the backward. */
  forward(
    pass: GPUComputePassEncoder,
    q: GPUBuffer,
    k: GPUBuffer,
    v: GPUBuffer,
    p: GPUBuffer,
    out: GPUBuffer,
    s: AttentionShape,
  ): void {
    this.k.dispatch(pass, this.k.pipeline(FORWARD), [q, k, v, p, out, this.dims(s)], s.length, s.heads, s.batch);
  }

  /** out's rows of one sequence from q and its cache; scores (rows · H · capacity f32s) is scratch. Its dims change every step: transient. */
  decode(
    pass: GPUComputePassEncoder,
    q: GPUBuffer,
    cache: GPUBuffer,
    scores: GPUBuffer,
    out: GPUBuffer,
    s: DecodeShape,
  ): void {
    const dims = fields(
      { u32: s.r0 },
      { u32: s.at0 },
      { u32: s.heads },
      { u32: s.kvHeads },
      { u32: s.headDim },
      { u32: s.capacity },
      { u32: s.keys },
      { u32: s.values },
      { f32: 1 / Math.sqrt(s.headDim) },
    );
    this.k.dispatch(pass, this.k.pipeline(DECODE), [q, cache, scores, out, this.k.transient(dims)], s.rows, s.heads);
  }

  /** dq, dk, dv from dout, with the forward's q, k, v and p; ds (B·H·T·T f32s) is scratch. */
  backward(
    pass: GPUComputePassEncoder,
    q: GPUBuffer,
    k: GPUBuffer,
    v: GPUBuffer,
    p: GPUBuffer,
    dout: GPUBuffer,
    ds: GPUBuffer,
    dq: GPUBuffer,
    dk: GPUBuffer,
    dv: GPUBuffer,
    s: AttentionShape,
  ): void {
    this.k.dispatch(
      pass,
      this.k.pipeline(BACKWARD_Q),
      [k, v, p, dout, ds, dq, this.dims(s)],
      s.length,
      s.heads,
      s.batch,
    );
    this.k.dispatch(
      pass,
      this.k.pipeline(BACKWARD_KV),
      [q, p, ds, dout, dk, dv, this.dims(s)],
      s.length,
      s.kvHeads,
      s.batch,
    );
  }
}
