// RMSNorm on the GPU, forward and backward, as train/model.ts defines it: y = x · rsqrt(mean(x²) + eps) · w
// over each row of x (rows × dim). The forward keeps each row's rsqrt for the backward:
//   dx = r · (dy·w − x̂ · mean(dy·w·x̂)),   dw = Σ_rows dy · x̂,   where x̂ = x · r.
// A workgroup of 256 threads takes a row (the sums reduced in workgroup memory); dw takes a column a thread.
/// <reference types="@webgpu/types" />
import { Kernels, WORKGROUP_REDUCE, fields } from './kernel.ts';

const DIMS = /* wgsl */ `struct Dims { rows: u32, dim: u32, eps: f32 }`;

const FORWARD = /* wgsl */ `${DIMS}
${WORKGROUP_REDUCE}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> rstd: array<f32>;
@group(0) @binding(4) var<uniform> d: Dims;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u) {
  let row = wg.x;
  let base = row * d.dim;
  var sq = 0.0;
  for (var j = lid.x; j < d.dim; j += 256u) { let v = x[base + j]; sq += v * v; }
  let r = inverseSqrt(reduce(lid.x, sq, false) / f32(d.dim) + d.eps);
  if (lid.x == 0u) { rstd[row] = r; }
  for (var j = lid.x; j < d.dim; j += 256u) { y[base + j] = x[base + j] * r * w[j]; }
}
`;

const BACKWARD_X = /* wgsl */ `${DIMS}
${WORKGROUP_REDUCE}
override ACCUMULATE: bool = false;
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> rstd: array<f32>;
@group(0) @binding(3) var<storage, read> dy: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx: array<f32>;
@group(0) @binding(5) var<uniform> d: Dims;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u) {
  let row = wg.x;
  let base = row * d.dim;
  let r = rstd[row];
  var dot = 0.0;
  for (var j = lid.x; j < d.dim; j += 256u) { dot += dy[base + j] * w[j] * x[base + j] * r; }
  let mean_dot = reduce(lid.x, dot, false) / f32(d.dim);
  for (var j = lid.x; j < d.dim; j += 256u) {
    let g = r * (dy[base + j] * w[j] - x[base + j] * r * mean_dot);
    if (ACCUMULATE) { dx[base + j] += g; } else { dx[base + j] = g; }
  }
}
`;

const BACKWARD_W = /* wgsl */ `${DIMS}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> rstd: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> dw: array<f32>;
@group(0) @binding(4) var<uniform> d: Dims;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3u) {
  let j = id.x;
  if (j >= d.dim) { return; }
  var sum = 0.0;
  for (var row = 0u; row < d.rows; row++) { sum += dy[row * d.dim + j] * x[row * d.dim + j] * rstd[row]; }
  dw[j] += sum;
}
`;

export interface RmsNormShape {
  rows: number;
  dim: number;
  eps: number;
  /** Backward: add to dx instead of writing it (the residual stream's gradient). dw is always added to. */
  accumulate?: boolean;
}

export class RmsNorm {
  constructor(private readonly k: Kernels) {}

  private dims(s: RmsNormShape): GPUBuffer {
    return this.k.uniform(fields({ u32: s.rows }, { u32: s.dim }, { f32: s.eps }));
  }

  /** y = RMSNorm(x)·w, and each row's rsqrt into `rstd` (rows f32s) for the backward. */
  forward(pass: GPUComputePassEncoder, x: GPUBuffer, w: GPUBuffer, y: GPUBuffer, rstd: GPUBuffer, s: RmsNormShape): void {
    this.k.dispatch(pass, this.k.pipeline(FORWARD), [x, w, y, rstd, this.dims(s)], s.rows);
  }

  /** dx (written, or added to) and dw (added to: a weight's gradient sums over micro-batches) from dy, with the forward's x, w and rstd. */
  backward(pass: GPUComputePassEncoder, x: GPUBuffer, w: GPUBuffer, rstd: GPUBuffer, dy: GPUBuffer, dx: GPUBuffer, dw: GPUBuffer, s: RmsNormShape): void {
    this.k.dispatch(pass, this.k.pipeline(BACKWARD_X, { ACCUMULATE: s.accumulate ? 1 : 0 }), [x, w, rstd, dy, dx, this.dims(s)], s.rows);
    this.k.dispatch(pass, this.k.pipeline(BACKWARD_W), [x, rstd, dy, dw, this.dims(s)], Math.ceil(s.dim / 64));
  }
}
