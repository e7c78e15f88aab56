// AdamW on the GPU, element by element as train/optimizer.ts does it (decoupled weight decay as
// torch.optim.AdamW, bias-corrected moments; matrices decay, vectors do not): one dispatch a parameter,
// all of a step's in one command buffer.
/// <reference types="@webgpu/types" />
import type { AdamWOptions } from '../optimizer.ts';
import { grid, type Kernels } from './kernel.ts';

const SHADER = /* wgsl */ `
struct Step { lr: f32, beta1: f32, beta2: f32, eps: f32, c1: f32, c2: f32, decay: f32, n: u32 }

@group(0) @binding(0) var<storage, read_write> p: array<f32>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read_write> m: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<uniform> s: Step;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  // A 2-D grid of workgroups, for parameters of more than 65535 × 256 elements.
  let i = id.x + id.y * groups.x * 256u;
  if (i >= s.n) { return; }
  let gi = g[i];
  let mi = m[i] * s.beta1 + gi * (1.0 - s.beta1);
  let vi = v[i] * s.beta2 + gi * gi * (1.0 - s.beta2);
  m[i] = mi;
  v[i] = vi;
  let update = (mi / s.c1) / (sqrt(vi / s.c2) + s.eps);
  p[i] = p[i] * s.decay - update * s.lr;
}
`;

/** A parameter on the GPU with its gradient and AdamW's two moments (same length, f32). */
export interface GpuParameter {
  name: string;
  value: GPUBuffer;
  grad: GPUBuffer;
  m: GPUBuffer;
  v: GPUBuffer;
  length: number;
  /** Matrices decay, vectors (norm gains, biases) do not. */
  decays: boolean;
}

export class GpuAdamW {
  /** Steps taken: bias correction uses it. */
  step = 0;
  /** Each parameter's step constants, written again every step (so one step a submission). */
  private readonly uniforms = new WeakMap<GpuParameter, GPUBuffer>();

  constructor(private readonly k: Kernels, readonly options: AdamWOptions) {}

  /** Records one update of every parameter at learning rate `lr` into `pass`; submit it before the next step's. */
  encode(pass: GPUComputePassEncoder, params: GpuParameter[], lr: number): void {
    const { beta1, beta2, eps, weightDecay } = this.options;
    this.step++;
    const c1 = 1 - beta1 ** this.step;
    const c2 = 1 - beta2 ** this.step;
    const pipeline = this.k.pipeline(SHADER);
    for (const p of params) {
      const decay = p.decays && weightDecay > 0 ? 1 - lr * weightDecay : 1;
      const values = new ArrayBuffer(32);
      new Float32Array(values, 0, 7).set([lr, beta1, beta2, eps, c1, c2, decay]);
      new Uint32Array(values, 28, 1)[0] = p.length;
      let step = this.uniforms.get(p);
      if (!step) this.uniforms.set(p, (step = this.k.gpu.device.createBuffer({ size: 32, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST })));
      this.k.gpu.device.queue.writeBuffer(step, 0, values);
      this.k.dispatch(pass, pipeline, [p.value, p.grad, p.m, p.v, step], ...grid(p.length));
    }
  }
}
