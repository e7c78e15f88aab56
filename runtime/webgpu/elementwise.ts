// The model's elementwise steps on the GPU, forward and backward, as model/llama.ts defines them:
// SwiGLU's h = silu(g)·u (silu(g) = g·σ(g)), and RoPE's rotation of each head's vector by its position,
// y = x·cos + rotate_half(x)·sin with rotate_half(x) = (−x₂, x₁). A thread an element.
/// <reference types="@webgpu/types" />
import { ropeTable } from '../../model/llama.ts';
import { upload } from './buffers.ts';
import type { Gpu } from './device.ts';
import { GpuKernels, WORKGROUP_REDUCE, elementwise, fields, grid, part, pieces, span } from './kernel.ts';
import type { LlamaConfig } from '../../model/config.ts';

const SWIGLU_FORWARD = elementwise({
  buffers: ['g: f32', 'u: f32', 'mut h: f32'],
  body: '  h[i] = g[i] / (1.0 + exp(-g[i])) * u[i];',
});

const SWIGLU_BACKWARD = elementwise({
  buffers: ['g: f32', 'u: f32', 'dh: f32', 'mut dg: f32', 'mut du: f32'],
  body: `
  let s = 1.0 / (1.0 + exp(-g[i]));
  // silu'(g) = σ(g)·(1 + g·(1 − σ(g)))
  dg[i] = dh[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
  du[i] = dh[i] * g[i] * s;`,
});

const ROPE = elementwise({
  head: 'override BACKWARD: bool = false;',
  buffers: ['x: f32', 'cos_table: f32', 'sin_table: f32', 'mut y: f32'],
  dims: 'heads: u32, head_dim: u32, length: u32',
  body: `
  let f = i % d.head_dim;
  let half = d.head_dim / 2u;
  // Rows are positions 0…length−1 of each sequence in turn; the table has a row a position.
  let position = (i / (d.heads * d.head_dim)) % d.length;
  let at = position * d.head_dim + f;
  let first = f < half;
  let partner = select(i - half, i + half, first);
  let partner_at = select(at - half, at + half, first);
  if (!BACKWARD) {
    // rotate_half(x)_f: −x[f + half] in the first half, x[f − half] in the second.
    y[i] = x[i] * cos_table[at] + select(x[partner], -x[partner], first) * sin_table[at];
  } else {
    // The transpose: dx_f = dy_f·cos_f + (dy·sin)[f + half] in the first half, − (dy·sin)[f − half] in the second.
    y[i] = x[i] * cos_table[at] + select(-x[partner], x[partner], first) * sin_table[partner_at];
  }`,
});

// RoPE of rows at positions of their own (decoding: each row a sequence's next token), forward only.
const ROPE_AT = elementwise({
  buffers: ['x: f32', 'cos_table: f32', 'sin_table: f32', 'positions: u32', 'mut y: f32'],
  dims: 'heads: u32, head_dim: u32',
  body: `
  let f = i % d.head_dim;
  let half = d.head_dim / 2u;
  let at = positions[i / (d.heads * d.head_dim)] * d.head_dim + f;
  let first = f < half;
  let partner = select(i - half, i + half, first);
  y[i] = x[i] * cos_table[at] + select(x[partner], -x[partner], first) * sin_table[at];`,
});

const COPY = elementwise({
  buffers: ['src: f32', 'mut dst: f32'],
  dims: 'src_at: u32, dst_at: u32',
  body: '  dst[d.dst_at + i] = src[d.src_at + i];',
});

/** Copies n f32s from src at `from` to dst at `to` inside a pass (a decoding step's keys into their cache). */
export class Copy {
  constructor(private readonly k: GpuKernels) {}

  encode(pass: GPUComputePassEncoder, src: GPUBuffer, from: number, dst: GPUBuffer, to: number, n: number): void {
    this.k.dispatch(
      pass,
      this.k.pipeline(COPY),
      [src, dst, this.k.transient(fields({ u32: n }, { u32: from }, { u32: to }))],
      ...grid(n),
    );
  }
}

const MUL = elementwise({
  head: 'override ACCUMULATE: bool = false;',
  buffers: ['a: f32', 'b: f32', 'mut y: f32'],
  body: '  if (ACCUMULATE) { y[i] += a[i] * b[i]; } else { y[i] = a[i] * b[i]; }',
});

/** y = a ⊙ b, or y += a ⊙ b: n elements (LoRA's dropout mask, forward and backward). */
export class Mul {
  constructor(private readonly k: GpuKernels) {}

  encode(pass: GPUComputePassEncoder, a: GPUBuffer, b: GPUBuffer, y: GPUBuffer, n: number, accumulate = false): void {
    this.k.dispatch(
      pass,
      this.k.pipeline(MUL, { ACCUMULATE: accumulate ? 1 : 0 }),
      [a, b, y, this.k.uniform(fields({ u32: n }))],
      ...grid(n),
    );
  }
}

const ADD = elementwise({ buffers: ['a: f32', 'b: f32', 'mut y: f32'], body: '  y[i] = a[i] + b[i];' });

/** y = a + b, n elements (a residual connection). */
export class Add {
  constructor(private readonly k: GpuKernels) {}

  encode(pass: GPUComputePassEncoder, a: GPUBuffer, b: GPUBuffer, y: GPUBuffer, n: number): void {
    this.k.dispatch(pass, this.k.pipeline(ADD), [a, b, y, this.k.uniform(fields({ u32: n }))], ...grid(n));
  }
}

const BIAS_FORWARD = elementwise({
  buffers: ['b: f32', 'mut y: f32'],
  dims: 'cols: u32',
  body: '  y[i] += b[i % d.cols];',
});

// A thread a column (n = cols), summing dy over the rows.
const BIAS_BACKWARD = elementwise({
  buffers: ['dy: f32', 'mut db: f32'],
  dims: 'rows: u32',
  body: `
  var sum = 0.0;
  for (var row = 0u; row < d.rows; row++) { sum += dy[row * d.n + i]; }
  db[i] += sum;`,
});

/** A projection's bias (Qwen2's on q, k and v): added to each of its output rows, and its gradient. */
export class Bias {
  constructor(private readonly k: GpuKernels) {}

  /** y (rows × cols) += b (cols) on every row. */
  forward(pass: GPUComputePassEncoder, b: GPUBuffer, y: GPUBuffer, rows: number, cols: number): void {
    this.k.dispatch(
      pass,
      this.k.pipeline(BIAS_FORWARD),
      [b, y, this.k.uniform(fields({ u32: rows * cols }, { u32: cols }))],
      ...grid(rows * cols),
    );
  }

  /** db (cols) += the column sums of dy (rows × cols). */
  backward(pass: GPUComputePassEncoder, dy: GPUBuffer, db: GPUBuffer, rows: number, cols: number): void {
    this.k.dispatch(
      pass,
      this.k.pipeline(BIAS_BACKWARD),
      [dy, db, this.k.uniform(fields({ u32: cols }, { u32: rows }))],
      ...grid(cols),
    );
  }
}

// A table too large for one binding is read (and its gradient written) a span of rows [v0, v1) at a time,
// starting `skip` f32s into its binding.
const GATHER = elementwise({
  buffers: ['table: f32', 'ids: i32', 'mut y: f32'],
  dims: 'dim: u32, v0: u32, v1: u32, skip: u32',
  body: `
  let token = u32(ids[i / d.dim]);
  if (token >= d.v0 && token < d.v1) { y[i] = table[d.skip + (token - d.v0) * d.dim + i % d.dim]; }`,
});

// The embedding's gradient without atomics (WGSL has none for f32): the positions of each token, grouped by
// token (a counting sort on the CPU, which has the ids anyway: `byToken`), so that a thread a table entry
// sums exactly its token's rows of dy, in position order: the same sum every run, O(tokens·dim + rows·dim).
const SCATTER = elementwise({
  buffers: ['dy: f32', 'starts: u32', 'positions: u32', 'mut dtable: f32'],
  dims: 'dim: u32, v0: u32, skip: u32',
  body: `
  let row = d.v0 + i / d.dim;
  let col = i % d.dim;
  var sum = 0.0;
  for (var k = starts[row]; k < starts[row + 1u]; k++) { sum += dy[positions[k] * d.dim + col]; }
  dtable[d.skip + i] += sum;`,
});

/** Where each token's positions start in `positions` (rows + 1 entries), and the positions grouped by token, in order. */
export function byToken(ids: Int32Array, rows: number): { starts: Uint32Array; positions: Uint32Array } {
  const starts = new Uint32Array(rows + 1);
  for (const id of ids) starts[id + 1]!++;
  for (let r = 0; r < rows; r++) starts[r + 1]! += starts[r]!;
  const next = starts.slice(0, rows);
  const positions = new Uint32Array(ids.length);
  ids.forEach((id, t) => (positions[next[id]!++] = t));
  return { starts, positions };
}

/** Rows of an embedding table by token, and the table's gradient (added to what it holds). */
export class Embedding {
  constructor(private readonly k: GpuKernels) {}

  /** The table's rows a span at a time, [v0, v1), each within one binding. */
  private spans(table: GPUBuffer, dim: number): [number, number][] {
    const rows = table.size / 4 / dim;
    const room = Math.floor((Math.floor(this.k.bindingBytes / 4) - 64) / dim);
    if (room < 1) throw new Error(`webgpu: an embedding row of ${dim} is too long for one binding`);
    const out: [number, number][] = [];
    for (let v0 = 0; v0 < rows; v0 += room) out.push([v0, Math.min(rows, v0 + room)]);
    return out;
  }

  /** y (tokens × dim) = table[ids]. */
  forward(
    pass: GPUComputePassEncoder,
    table: GPUBuffer,
    ids: GPUBuffer,
    y: GPUBuffer,
    tokens: number,
    dim: number,
  ): void {
    for (const [v0, v1] of this.spans(table, dim)) {
      const { binding, skip } = span(table, v0 * dim, v1 * dim);
      const dims = this.k.uniform(fields(...[tokens * dim, dim, v0, v1, skip].map((u32) => ({ u32 }))));
      this.k.dispatch(pass, this.k.pipeline(GATHER), [binding, ids, y, dims], ...grid(tokens * dim));
    }
  }

  /** dtable (rows × dim) += the rows of dy (tokens × dim) by token; `starts` and `positions` from byToken(ids), uploaded. */
  backward(
    pass: GPUComputePassEncoder,
    dy: GPUBuffer,
    starts: GPUBuffer,
    positions: GPUBuffer,
    dtable: GPUBuffer,
    dim: number,
  ): void {
    for (const [v0, v1] of this.spans(dtable, dim)) {
      const { binding, skip } = span(dtable, v0 * dim, v1 * dim);
      const dims = this.k.uniform(fields(...[(v1 - v0) * dim, dim, v0, skip].map((u32) => ({ u32 }))));
      this.k.dispatch(pass, this.k.pipeline(SCATTER), [dy, starts, positions, binding, dims], ...grid((v1 - v0) * dim));
    }
  }
}

const SQUARES = /* wgsl */ `
struct Dims { n: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> partials: array<f32>;
@group(0) @binding(2) var<uniform> d: Dims;
${WORKGROUP_REDUCE}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u, @builtin(num_workgroups) groups: vec3u) {
  let group = wg.x + wg.y * groups.x;
  var sum = 0.0;
  // Each workgroup sums 16 · 256 elements.
  for (var j = 0u; j < 16u; j++) {
    let i = group * 4096u + j * 256u + lid.x;
    if (i < d.n) { sum += x[i] * x[i]; }
  }
  let total = reduce(lid.x, sum, false);
  if (lid.x == 0u && group * 4096u < d.n) { partials[group] = total; }
}
`;

const SCALE = elementwise({ buffers: ['mut x: f32'], dims: 'factor: f32', body: '  x[i] = x[i] * d.factor;' });

/**
 * Sums of squares (a partial a 4,096 elements, summed by the caller) and scaling in place: clipping by global
 * norm. A vector too large for one binding goes a piece at a time, each piece's partials from a multiple of 64.
 */
export class Norms {
  constructor(private readonly k: GpuKernels) {}

  /** Each piece's partials: where they start in `partials` (a multiple of 64, where a binding may) and how many. */
  private layout(n: number): { at: number; length: number; first: number; count: number }[] {
    const all = pieces(this.k.bindingBytes, n);
    const stride = Math.ceil(Math.ceil(all[0]![1] / 4096) / 64) * 64;
    return all.map(([at, length], i) => ({ at, length, first: i * stride, count: Math.ceil(length / 4096) }));
  }

  /** How many partial sums `squares` writes for `n` elements (with gaps between pieces' partials, which stay 0). */
  partials(n: number): number {
    const last = this.layout(n).at(-1)!;
    return last.first + last.count;
  }

  /** The squares of x's n elements, summed 4,096 at a time into `partials` (partials(n) f32s, made zero). */
  squares(pass: GPUComputePassEncoder, x: GPUBuffer, partials: GPUBuffer, n: number): void {
    for (const { at, length, first, count } of this.layout(n)) {
      const dims = this.k.uniform(fields({ u32: length }));
      const [gx, gy] = grid(count * 256);
      this.k.dispatch(
        pass,
        this.k.pipeline(SQUARES),
        [part(x, at, length), part(partials, first, count), dims],
        gx,
        gy,
      );
    }
  }

  scale(pass: GPUComputePassEncoder, x: GPUBuffer, n: number, factor: number): void {
    for (const [at, length] of pieces(this.k.bindingBytes, n)) {
      const dims = this.k.uniform(fields({ u32: length }, { f32: factor }));
      this.k.dispatch(pass, this.k.pipeline(SCALE), [part(x, at, length), dims], ...grid(length));
    }
  }
}

export class SwiGlu {
  constructor(private readonly k: GpuKernels) {}

  /** h = silu(g)·u, n elements. */
  forward(pass: GPUComputePassEncoder, g: GPUBuffer, u: GPUBuffer, h: GPUBuffer, n: number): void {
    this.k.dispatch(pass, this.k.pipeline(SWIGLU_FORWARD), [g, u, h, this.k.uniform(fields({ u32: n }))], ...grid(n));
  }

  /** dg and du from dh, with the forward's g and u. */
  backward(
    pass: GPUComputePassEncoder,
    g: GPUBuffer,
    u: GPUBuffer,
    dh: GPUBuffer,
    dg: GPUBuffer,
    du: GPUBuffer,
    n: number,
  ): void {
    this.k.dispatch(
      pass,
      this.k.pipeline(SWIGLU_BACKWARD),
      [g, u, dh, dg, du, this.k.uniform(fields({ u32: n }))],
      ...grid(n),
    );
  }
}

/**
 * RoPE's cos and sin tables (positions × headDim, model/llama.ts ropeTable) on the GPU, for at least the
 * positions asked for: made again, doubling, when a longer sequence comes.
 */
export class RopeTables {
  private held: { cos: GPUBuffer; sin: GPUBuffer; positions: number } | null = null;

  constructor(
    private readonly gpu: Gpu,
    private readonly config: Pick<LlamaConfig, 'headDim' | 'ropeTheta'>,
  ) {}

  get(positions: number): { cos: GPUBuffer; sin: GPUBuffer } {
    if (!this.held || this.held.positions < positions) {
      const n = Math.max(positions, 2 * (this.held?.positions ?? 0), 64);
      this.dispose();
      const table = ropeTable(n, this.config.headDim, this.config.ropeTheta);
      this.held = { cos: upload(this.gpu, table.cos), sin: upload(this.gpu, table.sin), positions: n };
    }
    return this.held;
  }

  dispose(): void {
    this.held?.cos.destroy();
    this.held?.sin.destroy();
  }
}

export interface RopeShape {
  /** Rows: sequences × length, each row `heads` vectors of `headDim`. */
  rows: number;
  heads: number;
  headDim: number;
  /** Positions a sequence: row r is position r mod length. */
  length: number;
}

export class Rope {
  constructor(private readonly k: GpuKernels) {}

  private run(
    pass: GPUComputePassEncoder,
    backward: boolean,
    x: GPUBuffer,
    cos: GPUBuffer,
    sin: GPUBuffer,
    y: GPUBuffer,
    s: RopeShape,
  ): void {
    const n = s.rows * s.heads * s.headDim;
    const dims = this.k.uniform(fields({ u32: n }, { u32: s.heads }, { u32: s.headDim }, { u32: s.length }));
    this.k.dispatch(pass, this.k.pipeline(ROPE, { BACKWARD: backward ? 1 : 0 }), [x, cos, sin, y, dims], ...grid(n));
  }

  /** y = rotate(x) with the tables' cos and sin (positions × headDim, as model/llama.ts ropeTable makes them). */
  forward(pass: GPUComputePassEncoder, x: GPUBuffer, cos: GPUBuffer, sin: GPUBuffer, y: GPUBuffer, s: RopeShape): void {
    this.run(pass, false, x, cos, sin, y, s);
  }

  /** y = rotate(x) for rows at their own positions (u32 a row), as a decoding step has them. */
  at(
    pass: GPUComputePassEncoder,
    x: GPUBuffer,
    cos: GPUBuffer,
    sin: GPUBuffer,
    positions: GPUBuffer,
    y: GPUBuffer,
    s: Omit<RopeShape, 'length'>,
  ): void {
    const n = s.rows * s.heads * s.headDim;
    this.k.dispatch(
      pass,
      this.k.pipeline(ROPE_AT),
      [x, cos, sin, positions, y, this.k.uniform(fields({ u32: n }, { u32: s.heads }, { u32: s.headDim }))],
      ...grid(n),
    );
  }

  /** dx from dy: the rotation's transpose. */
  backward(
    pass: GPUComputePassEncoder,
    dy: GPUBuffer,
    cos: GPUBuffer,
    sin: GPUBuffer,
    dx: GPUBuffer,
    s: RopeShape,
  ): void {
    this.run(pass, true, dy, cos, sin, dx, s);
  }
}
