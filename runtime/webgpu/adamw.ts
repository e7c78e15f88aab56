// AdamW on the GPU, element by element as trainers/optimizer.ts does it (decoupled weight decay as
// torch.optim.AdamW, bias-corrected moments; matrices decay, vectors do not): one dispatch a parameter (a
// piece of one at a time where it is too large for one binding), all of a step's in one command buffer.
/// <reference types="@webgpu/types" />
import { elementwise, fields, grid, part, pieces, type Binding, type GpuKernels } from './kernel.ts';
import { F16_MOST, OVERFLOW } from './precision.ts';
import type { AdamWOptions } from '../held.ts';

const BODY = `
  let gi = g[i];
  let mi = m[i] * d.beta1 + gi * (1.0 - d.beta1);
  let vi = v[i] * d.beta2 + gi * gi * (1.0 - d.beta2);
  m[i] = mi;
  v[i] = vi;
  let update = (mi / d.c1) / (sqrt(vi / d.c2) + d.eps);
  p[i] = p[i] * d.decay - update * d.lr;`;
const DIMS = 'lr: f32, beta1: f32, beta2: f32, eps: f32, c1: f32, c2: f32, decay: f32';
const SHADER = elementwise({ buffers: ['mut p: f32', 'g: f32', 'mut m: f32', 'mut v: f32'], dims: DIMS, body: BODY });
// Mixed precision: the weight's f16 copy, which the GEMMs read, written with it (a weight beyond f16's range
// flags precision.ts's OVERFLOW.weights, which the next forward reports).
const WITH_HALF = `enable f16;\n${elementwise({
  buffers: ['mut p: f32', 'g: f32', 'mut m: f32', 'mut v: f32', 'mut h: f16', 'mut overflow: atomic<u32>'],
  dims: DIMS,
  body: `${BODY}
  if ((bitcast<u32>(p[i]) & 0x7fffffffu) > ${F16_MOST}u) { atomicOr(&overflow[${OVERFLOW.weights}], 1u); h[i] = 0.0h; }
  else { h[i] = f16(p[i]); }`,
})}`;

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
  /** Mixed precision: the weight's f16 copy (`length` f16s), written with every update, and the model's overflow flags. */
  half?: { copy: GPUBuffer; overflow: GPUBuffer };
}

export class GpuAdamW {
  /** Steps taken: bias correction uses it. */
  step = 0;
  /** Each parameter's pieces' step constants, written again every step (so one step a submission). */
  private readonly uniforms = new WeakMap<GpuParameter, GPUBuffer[]>();

  constructor(
    private readonly k: GpuKernels,
    readonly options: AdamWOptions,
  ) {}

  /** Records one update of every parameter at learning rate `lr` into `pass`; submit it before the next step's. */
  encode(pass: GPUComputePassEncoder, params: GpuParameter[], lr: number): void {
    const { beta1, beta2, eps, weightDecay } = this.options;
    this.step++;
    const c1 = 1 - beta1 ** this.step;
    const c2 = 1 - beta2 ** this.step;
    for (const p of params) {
      const pipeline = this.k.pipeline(p.half ? WITH_HALF : SHADER);
      const decay = p.decays && weightDecay > 0 ? 1 - lr * weightDecay : 1;
      const all = pieces(this.k.bindingBytes, p.length);
      let steps = this.uniforms.get(p);
      if (!steps)
        this.uniforms.set(
          p,
          (steps = all.map(() =>
            this.k.gpu.device.createBuffer({ size: 32, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST }),
          )),
        );
      all.forEach(([at, length], i) => {
        const values = fields({ u32: length }, ...[lr, beta1, beta2, eps, c1, c2, decay].map((f32) => ({ f32 })));
        this.k.gpu.device.queue.writeBuffer(steps[i]!, 0, values);
        const buffers: Binding[] = [p.value, p.grad, p.m, p.v].map((b) => part(b, at, length));
        if (p.half) buffers.push(part(p.half.copy, at, length, 2), p.half.overflow);
        this.k.dispatch(pass, pipeline, [...buffers, steps[i]!], ...grid(length));
      });
    }
  }
}
