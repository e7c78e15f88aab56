// AdamW on the CPU path, element by element as trainers/optimizer.ts does it (decoupled weight decay as
// torch.optim.AdamW, bias-corrected moments; matrices decay, vectors do not) and runtime/webgpu/adamw.ts on the
// GPU: the C kernels' loop, in doubles with fused multiply-adds (so not to the bit the reference's tfjs ops).
import type { CpuKernels } from './kernels.ts';
import type { AdamWOptions } from '../held.ts';

/** A trained weight with its gradient and AdamW's two moments (same length, f32). */
export interface CpuParameter {
  name: string;
  value: Float32Array;
  grad: Float32Array;
  m: Float32Array;
  v: Float32Array;
  /** Matrices decay, vectors (norm gains, biases) do not. */
  decays: boolean;
}

export class CpuAdamW {
  /** Steps taken: bias correction uses it. */
  step = 0;

  constructor(
    readonly options: AdamWOptions,
    private readonly k: CpuKernels,
  ) {}

  /** One update of every parameter at learning rate `lr`. */
  apply(params: CpuParameter[], lr: number): void {
    const { beta1, beta2, eps, weightDecay } = this.options;
    this.step++;
    const c1 = 1 - beta1 ** this.step;
    const c2 = 1 - beta2 ** this.step;
    for (const { value: p, grad: g, m, v, decays } of params) {
      const decay = decays && weightDecay > 0 ? 1 - lr * weightDecay : 1;
      this.k.adamw(p, g, m, v, p.length, lr, beta1, beta2, eps, decay, c1, c2);
    }
  }
}
