// Causal self-attention on the GPU, forward and backward, as model/ops.ts causalAttention computes it
// for the model (with grouped-query attention: key/value head h·K/H serves query head h, transformers'
// repeat_kv). q, dq: (B·T, H, hd); k, v, dk, dv: (B·T, K, hd); out, dout: (B·T, H·hd).
//
// FlashAttention-2's way: the T×T scores never exist. The forward walks the keys a tile at a time with an
// online softmax (a running max m and sum l, the output rescaled when m grows) and keeps only each row's
// logsumexp L = m + log l (B, H, T); the backward recomputes P = exp(q·kᵀ·scale − L) tile by tile:
//   δ_t = dout_t · out_t                      (the row sums of dP ⊙ P, from the output: DELTA)
//   dS = P ⊙ (dout·vᵀ − δ) · scale,  dq = dS·k (DQ, a thread a query row over its keys)
//   dk = dSᵀ·q,  dv = Pᵀ·dout                (DKV, a thread a key row over the queries and heads that see it)
// dq and dk/dv are separate passes so that every sum runs in one thread in a fixed order: no atomics, the
// same bits every run. A workgroup takes 64 rows of one head; the other side's rows go through workgroup
// memory a tile of TILE at a time; a thread keeps its row and its sums in registers (hd f32s each), so the
// shaders are written out for each head size.
/// <reference types="@webgpu/types" />
import { GpuKernels, elementwise, fields, grid, kernel } from './kernel.ts';

const DIMS = 'batch: u32, length: u32, heads: u32, kv_heads: u32, head_dim: u32, scale: f32';

/** Rows of a workgroup (a thread each). */
const ROWS = 64;

/** The other side's rows a tile holds: its tiles of TILE × hd f32s (and a row's L and δ) within WebGPU's default 16 KiB of workgroup memory. */
const tileOf = (hd: number) => (hd <= 64 ? 16 : hd <= 128 ? 8 : 4);

// Where a row's q (or dout, out, dq) and a key's k (or v, dk, dv) start, and a row's L or δ.
const HELPERS = /* wgsl */ `
struct Dims { ${DIMS} }
@group(0) @binding(0) var<uniform> d: Dims;
fn q_at(b: u32, t: u32, h: u32) -> u32 { return ((b * d.length + t) * d.heads + h) * HD; }
fn kv_at(b: u32, s: u32, g: u32) -> u32 { return ((b * d.length + s) * d.kv_heads + g) * HD; }
fn row_at(b: u32, h: u32, t: u32) -> u32 { return (b * d.heads + h) * d.length + t; }
const NONE: f32 = -3.4e38;
`;

/** The head of a flash shader for head size `hd`: constants, Dims at binding 0, the index helpers, and `buffers` from binding 1. */
function flashHead(hd: number, buffers: string[]): string {
  const tile = tileOf(hd);
  const bindings = buffers.map((b, i) => {
    const [, mut, name] = /^(mut )?(\w+)$/.exec(b)!;
    return `@group(0) @binding(${i + 1}) var<storage, ${mut ? 'read_write' : 'read'}> ${name}: array<f32>;`;
  });
  return `const HD: u32 = ${hd}u;\nconst TILE: u32 = ${tile}u;\nconst ROWS: u32 = ${ROWS}u;\n${HELPERS}\n${bindings.join('\n')}\n`;
}

/**
 * WGSL opening a query-row shader (forward, dq): the key and value tiles in workgroup memory, and the row's
 * block t0, position t (live: within the sequence), head h, batch b, key/value head g and q's offset qi.
 */
const queryRows = (hd: number) => /* wgsl */ `var<workgroup> kt: array<f32, ${tileOf(hd) * hd}>;
var<workgroup> vt: array<f32, ${tileOf(hd) * hd}>;

@compute @workgroup_size(${ROWS})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u) {
  let t0 = wg.x * ROWS;
  let t = t0 + lid.x;
  let h = wg.y;
  let b = wg.z;
  let g = h / (d.heads / d.kv_heads);
  let live = t < d.length;
  let qi = q_at(b, min(t, d.length - 1u), h);`;

/** WGSL: keys and values s0 … s0 + TILE − 1 (0 past the sequence) into kt and vt, for all the workgroup's rows. */
const KEY_TILE = /* wgsl */ `    for (var i = lid.x; i < TILE * HD; i += ROWS) {
      let s = s0 + i / HD;
      var kv = vec2f(0.0);
      if (s < d.length) { let at = kv_at(b, s, g) + i % HD; kv = vec2f(k[at], v[at]); }
      kt[i] = kv.x;
      vt[i] = kv.y;
    }
    workgroupBarrier();
`;

// The forward: a thread a query row t of head h; tiles of keys and values 0 … (the block's last row).
const forward = (hd: number) => /* wgsl */ `${flashHead(hd, ['q', 'k', 'v', 'mut out', 'mut lse'])}
${queryRows(hd)}
  var qr: array<f32, HD>;
  var acc: array<f32, HD>;
  for (var e = 0u; e < HD; e++) { qr[e] = q[qi + e] * d.scale; acc[e] = 0.0; }
  var m = NONE;
  var l = 0.0;
  let last = min(d.length, t0 + ROWS);
  for (var s0 = 0u; s0 < last; s0 += TILE) {
${KEY_TILE}    var scores: array<f32, TILE>;
    var top = NONE;
    for (var c = 0u; c < TILE; c++) {
      var score = NONE;
      if (s0 + c <= t) {
        score = 0.0;
        for (var e = 0u; e < HD; e++) { score += qr[e] * kt[c * HD + e]; }
      }
      scores[c] = score;
      top = max(top, score);
    }
    if (live && top > NONE) {
      let grown = max(m, top);
      let rescale = exp(m - grown);
      l *= rescale;
      for (var e = 0u; e < HD; e++) { acc[e] *= rescale; }
      for (var c = 0u; c < TILE; c++) {
        if (scores[c] > NONE) {
          let p = exp(scores[c] - grown);
          l += p;
          for (var e = 0u; e < HD; e++) { acc[e] += p * vt[c * HD + e]; }
        }
      }
      m = grown;
    }
    workgroupBarrier();
  }
  if (live) {
    for (var e = 0u; e < HD; e++) { out[qi + e] = acc[e] / l; }
    lse[row_at(b, h, t)] = m + log(l);
  }
}
`;

// δ = rowsum(dout ⊙ out) for every (b, t, h), into (B, H, T) as L is.
const DELTA = elementwise({
  buffers: ['out: f32', 'dout: f32', 'mut delta: f32'],
  dims: 'length: u32, heads: u32, head_dim: u32',
  body: `
  let h = i % d.heads;
  let bt = i / d.heads;
  var sum = 0.0;
  for (var e = 0u; e < d.head_dim; e++) { sum += dout[i * d.head_dim + e] * out[i * d.head_dim + e]; }
  delta[((bt / d.length) * d.heads + h) * d.length + bt % d.length] = sum;`,
});

// dq: a thread a query row, over tiles of its keys and values as in the forward.
const backwardQ = (hd: number) => /* wgsl */ `${flashHead(hd, ['q', 'k', 'v', 'dout', 'lse', 'delta', 'mut dq'])}
${queryRows(hd)}
  let ri = row_at(b, h, min(t, d.length - 1u));
  let big_l = lse[ri];
  let dl = delta[ri];
  var qr: array<f32, HD>;
  var dor: array<f32, HD>;
  var acc: array<f32, HD>;
  for (var e = 0u; e < HD; e++) { qr[e] = q[qi + e] * d.scale; dor[e] = dout[qi + e]; acc[e] = 0.0; }
  let last = min(d.length, t0 + ROWS);
  for (var s0 = 0u; s0 < last; s0 += TILE) {
${KEY_TILE}    if (live) {
      for (var c = 0u; c < TILE; c++) {
        if (s0 + c <= t) {
          var score = 0.0;
          var dp = 0.0;
          for (var e = 0u; e < HD; e++) { score += qr[e] * kt[c * HD + e]; dp += dor[e] * vt[c * HD + e]; }
          let ds = exp(score - big_l) * (dp - dl);
          for (var e = 0u; e < HD; e++) { acc[e] += ds * kt[c * HD + e]; }
        }
      }
    }
    workgroupBarrier();
  }
  if (live) {
    for (var e = 0u; e < HD; e++) { dq[qi + e] = acc[e] * d.scale; }
  }
}
`;

// dk and dv: a thread a key row s of kv head g, over the query heads g serves and their rows t ≥ s, a tile of
// q, dout, L and δ at a time.
const backwardKv = (
  hd: number,
) => /* wgsl */ `${flashHead(hd, ['q', 'k', 'v', 'dout', 'lse', 'delta', 'mut dk', 'mut dv'])}
var<workgroup> qt: array<f32, ${tileOf(hd) * hd}>;
var<workgroup> dt: array<f32, ${tileOf(hd) * hd}>;
var<workgroup> lt: array<f32, ${tileOf(hd)}>;
var<workgroup> deltas: array<f32, ${tileOf(hd)}>;

@compute @workgroup_size(${ROWS})
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u) {
  let s_first = wg.x * ROWS;
  let s = s_first + lid.x;
  let g = wg.y;
  let b = wg.z;
  let group = d.heads / d.kv_heads;
  let live = s < d.length;
  let ki = kv_at(b, min(s, d.length - 1u), g);
  var kr: array<f32, HD>;
  var vr: array<f32, HD>;
  var dk_acc: array<f32, HD>;
  var dv_acc: array<f32, HD>;
  for (var e = 0u; e < HD; e++) { kr[e] = k[ki + e] * d.scale; vr[e] = v[ki + e]; dk_acc[e] = 0.0; dv_acc[e] = 0.0; }
  for (var h = g * group; h < (g + 1u) * group; h++) {
    for (var t0 = s_first; t0 < d.length; t0 += TILE) {
      for (var i = lid.x; i < TILE * HD; i += ROWS) {
        let t = t0 + i / HD;
        var qd = vec2f(0.0);
        if (t < d.length) { let at = q_at(b, t, h) + i % HD; qd = vec2f(q[at], dout[at]); }
        qt[i] = qd.x;
        dt[i] = qd.y;
      }
      for (var i = lid.x; i < TILE; i += ROWS) {
        var ld = vec2f(0.0);
        if (t0 + i < d.length) { let at = row_at(b, h, t0 + i); ld = vec2f(lse[at], delta[at]); }
        lt[i] = ld.x;
        deltas[i] = ld.y;
      }
      workgroupBarrier();
      if (live) {
        for (var c = 0u; c < TILE; c++) {
          let t = t0 + c;
          if (t >= s && t < d.length) {
            var score = 0.0;
            var dp = 0.0;
            for (var e = 0u; e < HD; e++) { score += kr[e] * qt[c * HD + e]; dp += vr[e] * dt[c * HD + e]; }
            let p = exp(score - lt[c]);
            let ds = p * (dp - deltas[c]);
            for (var e = 0u; e < HD; e++) {
              dv_acc[e] += p * dt[c * HD + e];
              dk_acc[e] += ds * qt[c * HD + e];
            }
          }
        }
      }
      workgroupBarrier();
    }
  }
  if (live) {
    for (var e = 0u; e < HD; e++) { dk[ki + e] = dk_acc[e] * d.scale; dv[ki + e] = dv_acc[e]; }
  }
}
`;

// Decoding, every sequence of a step at once. A layer's keys and values live in pages of PAGE positions of
// one pool buffer (runtime/webgpu/decode.ts): page p holds keys at p·2·PAGE·K·hd and the values PAGE·K·hd on,
// each position's K·hd in a row. A sequence's pages are listed in `pages` from its row's `list` on; row r
// of the step (a token of some sequence) is at position positions[r] and attends to positions 0…positions[r].

// The step's new keys (rotated) and values into their sequences' pages: a thread a float.
const STORE = elementwise({
  buffers: ['k: f32', 'v: f32', 'positions: u32', 'list: u32', 'pages: u32', 'mut pool: f32'],
  dims: 'width: u32, page: u32',
  body: `
  let r = i / d.width;
  let e = i % d.width;
  let at = positions[r];
  let slot = (pages[list[r] + at / d.page] * 2u * d.page + at % d.page) * d.width + e;
  pool[slot] = k[i];
  pool[slot + d.page * d.width] = v[i];`,
});

// A workgroup a (row, head) attends to its sequence's pages up to its row's position. The scores go through
// `scores` (rows · H · longest f32s), each workgroup its own row.
const DECODE = kernel({
  threads: 'block',
  buffers: ['q: f32', 'pool: f32', 'positions: u32', 'list: u32', 'pages: u32', 'mut scores: f32', 'mut out: f32'],
  dims: 'heads: u32, kv_heads: u32, head_dim: u32, page: u32, longest: u32, scale: f32',
  body: `
  let r = wg.x;
  let h = wg.y;
  let g = h / (d.heads / d.kv_heads);
  let width = d.kv_heads * d.head_dim;
  let qi = (r * d.heads + h) * d.head_dim;
  let row = (r * d.heads + h) * d.longest;
  let n = positions[r] + 1u;
  let first = list[r];
  var top = -3.4e38;
  for (var s = lid.x; s < n; s += 256u) {
    let ki = (pages[first + s / d.page] * 2u * d.page + s % d.page) * width + g * d.head_dim;
    var dot = 0.0;
    for (var e = 0u; e < d.head_dim; e++) { dot += q[qi + e] * pool[ki + e]; }
    let score = dot * d.scale;
    scores[row + s] = score;
    top = max(top, score);
  }
  top = reduce(lid.x, top, true);
  var sum = 0.0;
  for (var s = lid.x; s < n; s += 256u) {
    let e = exp(scores[row + s] - top);
    scores[row + s] = e;
    sum += e;
  }
  let total = reduce(lid.x, sum, false);
  storageBarrier();
  for (var e = lid.x; e < d.head_dim; e += 256u) {
    var acc = 0.0;
    for (var s = 0u; s < n; s++) {
      let vi = (pages[first + s / d.page] * 2u * d.page + d.page + s % d.page) * width + g * d.head_dim;
      acc += scores[row + s] * pool[vi + e];
    }
    out[qi + e] = acc / total;
  }`,
});

/** A decoding step's rows against their sequences' pages (DECODE, STORE). */
export interface DecodeShape {
  rows: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  /** Positions a page holds, and the most positions a row of this step attends to. */
  page: number;
  longest: number;
}

/** A step's rows: their positions, where each one's sequence's pages start in `pages`, and the sequences' pages. */
export interface DecodeRows {
  positions: GPUBuffer;
  list: GPUBuffer;
  pages: GPUBuffer;
}

export interface AttentionShape {
  batch: number;
  length: number;
  heads: number;
  kvHeads: number;
  headDim: number;
}

export class Attention {
  constructor(private readonly k: GpuKernels) {}

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

  /** Dispatches a flash shader over blocks of ROWS rows, `heads` of them, and the batch; Dims is binding 0. */
  private flash(pass: GPUComputePassEncoder, code: string, buffers: GPUBuffer[], s: AttentionShape, heads: number) {
    this.k.dispatch(
      pass,
      this.k.pipeline(code),
      [this.dims(s), ...buffers],
      Math.ceil(s.length / ROWS),
      heads,
      s.batch,
    );
  }

  /** out from q, k, v; each row's logsumexp into lse (B·H·T f32s), for the backward. */
  forward(
    pass: GPUComputePassEncoder,
    q: GPUBuffer,
    k: GPUBuffer,
    v: GPUBuffer,
    out: GPUBuffer,
    lse: GPUBuffer,
    s: AttentionShape,
  ): void {
    this.flash(pass, forward(s.headDim), [q, k, v, out, lse], s, s.heads);
  }

  /** The step's rotated keys k and values v (rows × K·hd) into `pool`, each row at its position in its sequence's pages. */
  store(
    pass: GPUComputePassEncoder,
    k: GPUBuffer,
    v: GPUBuffer,
    pool: GPUBuffer,
    rows: DecodeRows,
    s: DecodeShape,
  ): void {
    const width = s.kvHeads * s.headDim;
    const dims = this.k.uniform(fields({ u32: s.rows * width }, { u32: width }, { u32: s.page }));
    this.k.dispatch(
      pass,
      this.k.pipeline(STORE),
      [k, v, rows.positions, rows.list, rows.pages, pool, dims],
      ...grid(s.rows * width),
    );
  }

  /** out (rows × H·hd) from q (rows × H·hd) and the pages of `pool`; scores (rows · H · longest f32s) is scratch. */
  decode(
    pass: GPUComputePassEncoder,
    q: GPUBuffer,
    pool: GPUBuffer,
    rows: DecodeRows,
    scores: GPUBuffer,
    out: GPUBuffer,
    s: DecodeShape,
  ): void {
    const dims = fields(
      { u32: s.heads },
      { u32: s.kvHeads },
      { u32: s.headDim },
      { u32: s.page },
      { u32: s.longest },
      { f32: 1 / Math.sqrt(s.headDim) },
    );
    this.k.dispatch(
      pass,
      this.k.pipeline(DECODE),
      [q, pool, rows.positions, rows.list, rows.pages, scores, out, this.k.transient(dims)],
      s.rows,
      s.heads,
    );
  }

  /** dq, dk, dv from dout, with the forward's q, k, v, out and lse; delta (B·H·T f32s) is scratch. */
  backward(
    pass: GPUComputePassEncoder,
    saved: { q: GPUBuffer; k: GPUBuffer; v: GPUBuffer; out: GPUBuffer; lse: GPUBuffer },
    dout: GPUBuffer,
    delta: GPUBuffer,
    grads: { dq: GPUBuffer; dk: GPUBuffer; dv: GPUBuffer },
    s: AttentionShape,
  ): void {
    const rows = s.batch * s.length * s.heads;
    const [x, y] = grid(rows);
    const dims = this.k.uniform(fields({ u32: rows }, { u32: s.length }, { u32: s.heads }, { u32: s.headDim }));
    this.k.dispatch(pass, this.k.pipeline(DELTA), [saved.out, dout, delta, dims], x, y);
    const { q, k, v, lse } = saved;
    this.flash(pass, backwardQ(s.headDim), [q, k, v, dout, lse, delta, grads.dq], s, s.heads);
    this.flash(pass, backwardKv(s.headDim), [q, k, v, dout, lse, delta, grads.dk, grads.dv], s, s.kvHeads);
  }
}
