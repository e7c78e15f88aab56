// RMSNorm on the GPU, forward and backward, as model/llama.ts defines it: y = x · rsqrt(mean(x²) + eps) · w
// over each row of x (rows × dim). The forward keeps each row's rsqrt for the backward:
//   dx = r · (dy·w − x̂ · mean(dy·w·x̂)),   dw = Σ_rows dy · x̂,   where x̂ = x · r.
// A workgroup of 256 threads takes a row (the sums reduced in workgroup memory); dw takes a column a thread.
/// <reference types="@webgpu/types" />
import { GpuKernels, elementwise, fields, grid, kernel } from './kernel.ts';

const DIMS = 'rows: u32, dim: u32, eps: f32';

const FORWARD = kernel({
  threads: 'row',
  buffers: ['x: f32', 'w: f32', 'mut y: f32', 'mut rstd: f32'],
  dims: DIMS,
  body: `
  let base = row * d.dim;
  var sq = 0.0;
  for (var j = lid.x; j < d.dim; j += 256u) { let v = x[base + j]; sq += v * v; }
  let r = inverseSqrt(reduce(lid.x, sq, false) / f32(d.dim) + d.eps);
  if (lid.x == 0u) { rstd[row] = r; }
  for (var j = lid.x; j < d.dim; j += 256u) { y[base + j] = x[base + j] * r * w[j]; }`,
});

const BACKWARD_X = kernel({
  threads: 'row',
  head: 'override ACCUMULATE: bool = false;',
  buffers: ['x: f32', 'w: f32', 'rstd: f32', 'dy: f32', 'mut dx: f32'],
  dims: DIMS,
  body: `
  let base = row * d.dim;
  let r = rstd[row];
  var dot = 0.0;
  for (var j = lid.x; j < d.dim; j += 256u) { dot += dy[base + j] * w[j] * x[base + j] * r; }
  let mean_dot = reduce(lid.x, dot, false) / f32(d.dim);
  for (var j = lid.x; j < d.dim; j += 256u) {
    let g = r * (dy[base + j] * w[j] - x[base + j] * r * mean_dot);
    if (ACCUMULATE) { dx[base + j] += g; } else { dx[base + j] = g; }
  }`,
});

// A thread a column of the weight (n = dim), summing over the rows.
const BACKWARD_W = elementwise({
  buffers: ['x: f32', 'rstd: f32', 'dy: f32', 'mut dw: f32'],
  dims: 'rows: u32',
  body: `
  var sum = 0.0;
  for (var row = 0u; row < d.rows; row++) { sum += dy[row * d.n + i] * x[row * d.n + i] * rstd[row]; }
  dw[i] += sum;`,
});

export interface RmsNormShape {
  rows: number;
  dim: number;
  eps: number;
  /** Backward: add to dx instead of writing it (the residual stream's gradient). dw is always added to. */
  accumulate?: boolean;
}

export class RmsNorm {
  constructor(private readonly k: GpuKernels) {}

  private dims(s: RmsNormShape): GPUBuffer {
    return this.k.uniform(fields({ u32: s.rows }, { u32: s.dim }, { f32: s.eps }));
  }

  /** y = RMSNorm(x)·w, and each row's rsqrt into `rstd` (rows f32s) for the backward. */
  forward(
    pass: GPUComputePassEncoder,
    x: GPUBuffer,
    w: GPUBuffer,
    y: GPUBuffer,
    rstd: GPUBuffer,
    s: RmsNormShape,
  ): void {
    this.k.dispatch(pass, this.k.pipeline(FORWARD), [x, w, y, rstd, this.dims(s)], s.rows);
  }

  /** dx (written, or added to) and dw (added to: a weight's gradient sums over micro-batches) from dy, with the forward's x, w and rstd. */
  backward(
    pass: GPUComputePassEncoder,
    x: GPUBuffer,
    w: GPUBuffer,
    rstd: GPUBuffer,
    dy: GPUBuffer,
    dx: GPUBuffer,
    dw: GPUBuffer,
    s: RmsNormShape,
  ): void {
    this.k.dispatch(
      pass,
      this.k.pipeline(BACKWARD_X, { ACCUMULATE: s.accumulate ? 1 : 0 }),
      [x, w, rstd, dy, dx, this.dims(s)],
      s.rows,
    );
    this.k.dispatch(
      pass,
      this.k.pipeline(BACKWARD_W),
      [x, rstd, dy, dw, this.k.uniform(fields({ u32: s.dim }, { u32: s.rows }))],
      ...grid(s.dim),
    );
  }
}
