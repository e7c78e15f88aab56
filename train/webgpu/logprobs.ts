// log p(target) at every position from the logits, and its backward, on the GPU: a fused log-softmax and
// gather (train/parameters.ts targetLogprobs does it in tfjs ops). Every loss of the trainer starts from
// these token log-probs, so its gradient arrives here as d/d logp per position and leaves as d/d logits:
//   logp_t = z_t[y_t] − logsumexp(z_t),   dz_t = dlogp_t · (onehot(y_t) − softmax(z_t)).
// A workgroup takes a row of V logits; the forward keeps each row's logsumexp for the backward.
/// <reference types="@webgpu/types" />
import type { Gpu } from './device.ts';

const COMMON = /* wgsl */ `
struct Dims { rows: u32, vocab: u32 }
var<workgroup> partial: array<f32, 256>;

fn reduce(t: u32, value: f32, is_max: bool) -> f32 {
  partial[t] = value;
  workgroupBarrier();
  for (var stride = 128u; stride > 0u; stride >>= 1u) {
    if (t < stride) {
      if (is_max) { partial[t] = max(partial[t], partial[t + stride]); } else { partial[t] += partial[t + stride]; }
    }
    workgroupBarrier();
  }
  let total = partial[0];
  workgroupBarrier();
  return total;
}
`;

const FORWARD = /* wgsl */ `${COMMON}
@group(0) @binding(0) var<storage, read> z: array<f32>;
@group(0) @binding(1) var<storage, read> targets: array<i32>;
@group(0) @binding(2) var<storage, read_write> logp: array<f32>;
@group(0) @binding(3) var<storage, read_write> lse: array<f32>;
@group(0) @binding(4) var<uniform> d: Dims;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u) {
  let row = wg.x;
  let base = row * d.vocab;
  var top = -3.4e38;
  for (var j = lid.x; j < d.vocab; j += 256u) { top = max(top, z[base + j]); }
  top = reduce(lid.x, top, true);
  var sum = 0.0;
  for (var j = lid.x; j < d.vocab; j += 256u) { sum += exp(z[base + j] - top); }
  let l = top + log(reduce(lid.x, sum, false));
  if (lid.x == 0u) {
    lse[row] = l;
    logp[row] = z[base + u32(targets[row])] - l;
  }
}
`;

const BACKWARD = /* wgsl */ `
override ACCUMULATE: bool = false;
struct Dims { rows: u32, vocab: u32 }
@group(0) @binding(0) var<storage, read> z: array<f32>;
@group(0) @binding(1) var<storage, read> targets: array<i32>;
@group(0) @binding(2) var<storage, read> lse: array<f32>;
@group(0) @binding(3) var<storage, read> dlogp: array<f32>;
@group(0) @binding(4) var<storage, read_write> dz: array<f32>;
@group(0) @binding(5) var<uniform> d: Dims;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u) {
  let row = wg.x;
  let base = row * d.vocab;
  let g = dlogp[row];
  let wanted = u32(targets[row]);
  for (var j = lid.x; j < d.vocab; j += 256u) {
    let hit = select(0.0, 1.0, j == wanted);
    let v = g * (hit - exp(z[base + j] - lse[row]));
    if (ACCUMULATE) { dz[base + j] += v; } else { dz[base + j] = v; }
  }
}
`;

export interface LogprobShape {
  rows: number;
  vocab: number;
  /** Backward: add to dz instead of writing it. */
  accumulate?: boolean;
}

export class TargetLogprobs {
  private readonly pipelines = new Map<string, GPUComputePipeline>();
  private readonly dims = new Map<string, GPUBuffer>();

  constructor(private readonly gpu: Gpu) {}

  private pipeline(kernel: 'forward' | 'backward', accumulate: boolean): GPUComputePipeline {
    const key = `${kernel}:${accumulate}`;
    let pipeline = this.pipelines.get(key);
    if (!pipeline) {
      const constants: Record<string, number> = kernel === 'forward' ? {} : { ACCUMULATE: accumulate ? 1 : 0 };
      const code = kernel === 'forward' ? FORWARD : BACKWARD;
      pipeline = this.gpu.device.createComputePipeline({ layout: 'auto', compute: { module: this.gpu.device.createShaderModule({ code }), entryPoint: 'main', constants } });
      this.pipelines.set(key, pipeline);
    }
    return pipeline;
  }

  private dispatch(pass: GPUComputePassEncoder, pipeline: GPUComputePipeline, buffers: GPUBuffer[], s: LogprobShape): void {
    const key = `${s.rows}:${s.vocab}`;
    let dims = this.dims.get(key);
    if (!dims) {
      dims = this.gpu.device.createBuffer({ size: 8, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      this.gpu.device.queue.writeBuffer(dims, 0, new Uint32Array([s.rows, s.vocab]));
      this.dims.set(key, dims);
    }
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, this.gpu.device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries: [...buffers, dims].map((buffer, binding) => ({ binding, resource: { buffer } })) }));
    pass.dispatchWorkgroups(s.rows);
  }

  /** logp (rows) and lse (rows) from the logits z (rows × vocab) and the targets (rows, i32). */
  forward(pass: GPUComputePassEncoder, z: GPUBuffer, targets: GPUBuffer, logp: GPUBuffer, lse: GPUBuffer, s: LogprobShape): void {
    this.dispatch(pass, this.pipeline('forward', false), [z, targets, logp, lse], s);
  }

  /** dz (rows × vocab) from dlogp (rows), with the forward's z, targets and lse. */
  backward(pass: GPUComputePassEncoder, z: GPUBuffer, targets: GPUBuffer, lse: GPUBuffer, dlogp: GPUBuffer, dz: GPUBuffer, s: LogprobShape): void {
    this.dispatch(pass, this.pipeline('backward', s.accumulate ?? false), [z, targets, lse, dlogp, dz], s);
  }
}
