// RMSNorm on the GPU, forward and backward, as train/model.ts defines it: y = x · rsqrt(mean(x²) + eps) · w
// over each row of x (rows × dim). The forward keeps each row's rsqrt for the backward:
//   dx = r · (dy·w − x̂ · mean(dy·w·x̂)),   dw = Σ_rows dy · x̂,   where x̂ = x · r.
// A workgroup of 256 threads takes a row (the sums reduced in workgroup memory); dw takes a column a thread.
/// <reference types="@webgpu/types" />
import type { Gpu } from './device.ts';

const COMMON = /* wgsl */ `
struct Dims { rows: u32, dim: u32, eps: f32, pad: u32 }
var<workgroup> partial: array<f32, 256>;

fn reduce_sum(t: u32, value: f32) -> f32 {
  partial[t] = value;
  workgroupBarrier();
  for (var stride = 128u; stride > 0u; stride >>= 1u) {
    if (t < stride) { partial[t] += partial[t + stride]; }
    workgroupBarrier();
  }
  let total = partial[0];
  workgroupBarrier();
  return total;
}
`;

const FORWARD = /* wgsl */ `${COMMON}
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
  let r = inverseSqrt(reduce_sum(lid.x, sq) / f32(d.dim) + d.eps);
  if (lid.x == 0u) { rstd[row] = r; }
  for (var j = lid.x; j < d.dim; j += 256u) { y[base + j] = x[base + j] * r * w[j]; }
}
`;

const BACKWARD_X = /* wgsl */ `${COMMON}
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
  let mean_dot = reduce_sum(lid.x, dot) / f32(d.dim);
  for (var j = lid.x; j < d.dim; j += 256u) {
    let g = r * (dy[base + j] * w[j] - x[base + j] * r * mean_dot);
    if (ACCUMULATE) { dx[base + j] += g; } else { dx[base + j] = g; }
  }
}
`;

const BACKWARD_W = /* wgsl */ `
override ACCUMULATE: bool = false;
struct Dims { rows: u32, dim: u32, eps: f32, pad: u32 }
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
  if (ACCUMULATE) { dw[j] += sum; } else { dw[j] = sum; }
}
`;

const KERNELS = { forward: FORWARD, dx: BACKWARD_X, dw: BACKWARD_W };

export interface RmsNormShape {
  rows: number;
  dim: number;
  eps: number;
  /** Backward: add to dx and dw instead of writing them (gradient accumulation, a residual stream's sum). */
  accumulate?: boolean;
}

export class RmsNorm {
  private readonly pipelines = new Map<string, GPUComputePipeline>();
  private readonly dims = new Map<string, GPUBuffer>();

  constructor(private readonly gpu: Gpu) {}

  private pipeline(kernel: keyof typeof KERNELS, accumulate: boolean): GPUComputePipeline {
    const key = `${kernel}:${accumulate}`;
    let pipeline = this.pipelines.get(key);
    if (!pipeline) {
      const code = KERNELS[kernel];
      const constants: Record<string, number> = kernel === 'forward' ? {} : { ACCUMULATE: accumulate ? 1 : 0 };
      pipeline = this.gpu.device.createComputePipeline({ layout: 'auto', compute: { module: this.gpu.device.createShaderModule({ code }), entryPoint: 'main', constants } });
      this.pipelines.set(key, pipeline);
    }
    return pipeline;
  }

  private uniform(s: RmsNormShape): GPUBuffer {
    const key = `${s.rows}:${s.dim}:${s.eps}`;
    let buffer = this.dims.get(key);
    if (!buffer) {
      const values = new ArrayBuffer(16);
      new Uint32Array(values).set([s.rows, s.dim]);
      new Float32Array(values, 8, 1)[0] = s.eps;
      buffer = this.gpu.device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      this.gpu.device.queue.writeBuffer(buffer, 0, values);
      this.dims.set(key, buffer);
    }
    return buffer;
  }

  private dispatch(pass: GPUComputePassEncoder, pipeline: GPUComputePipeline, buffers: GPUBuffer[], groups: number): void {
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, this.gpu.device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries: buffers.map((buffer, binding) => ({ binding, resource: { buffer } })) }));
    pass.dispatchWorkgroups(groups);
  }

  /** y = RMSNorm(x)·w, and each row's rsqrt into `rstd` (rows f32s) for the backward. */
  forward(pass: GPUComputePassEncoder, x: GPUBuffer, w: GPUBuffer, y: GPUBuffer, rstd: GPUBuffer, s: RmsNormShape): void {
    this.dispatch(pass, this.pipeline('forward', false), [x, w, y, rstd, this.uniform(s)], s.rows);
  }

  /** dx and dw from dy, with the forward's x, w and rstd. */
  backward(pass: GPUComputePassEncoder, x: GPUBuffer, w: GPUBuffer, rstd: GPUBuffer, dy: GPUBuffer, dx: GPUBuffer, dw: GPUBuffer, s: RmsNormShape): void {
    const accumulate = s.accumulate ?? false;
    this.dispatch(pass, this.pipeline('dx', accumulate), [x, w, rstd, dy, dx, this.uniform(s)], s.rows);
    this.dispatch(pass, this.pipeline('dw', accumulate), [x, rstd, dy, dw, this.uniform(s)], Math.ceil(s.dim / 64));
  }
}
