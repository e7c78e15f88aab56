// AdamW (decoupled weight decay, as torch.optim.AdamW), a warmup + cosine learning rate, and clipping by
// global norm. The state is plain tensors by parameter name, so a checkpoint can save and restore it exactly.
import * as tf from '@tensorflow/tfjs-core';
import type { AdamWOptions } from '../runtime/held.ts';

export const ADAMW_DEFAULTS: AdamWOptions = { beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 };

export class AdamW {
  /** Steps taken: bias correction uses it. */
  step = 0;
  readonly m = new Map<string, tf.Variable>();
  readonly v = new Map<string, tf.Variable>();

  constructor(
    private readonly params: Map<string, tf.Variable>,
    readonly options: AdamWOptions,
  ) {
    for (const [name, p] of params) {
      this.m.set(name, tf.variable(tf.zerosLike(p), false));
      this.v.set(name, tf.variable(tf.zerosLike(p), false));
    }
  }

  /** One update at learning rate `lr`. Matrices decay; LayerNorm gains and biases (1-D) do not, as in nanoGPT. */
  apply(grads: Record<string, tf.Tensor>, lr: number): void {
    const { beta1, beta2, eps, weightDecay } = this.options;
    this.step++;
    const c1 = 1 - beta1 ** this.step;
    const c2 = 1 - beta2 ** this.step;
    tf.tidy(() => {
      for (const [name, p] of this.params) {
        const g = grads[name];
        if (!g) continue;
        const m = this.m.get(name)!;
        const v = this.v.get(name)!;
        m.assign(tf.add(tf.mul(m, beta1), tf.mul(g, 1 - beta1)));
        v.assign(tf.add(tf.mul(v, beta2), tf.mul(tf.square(g), 1 - beta2)));
        const update = tf.div(tf.div(m, c1), tf.add(tf.sqrt(tf.div(v, c2)), eps));
        const decayed = p.rank >= 2 && weightDecay > 0 ? tf.mul(p, 1 - lr * weightDecay) : p;
        p.assign(tf.sub(decayed, tf.mul(update, lr)));
      }
    });
  }

  dispose(): void {
    for (const t of [...this.m.values(), ...this.v.values()]) t.dispose();
  }
}

/** Linear warmup to `peak`, then cosine decay to `peak · minRatio` at `total` steps (nanoGPT's get_lr). */
export function learningRate(
  step: number,
  schedule: { peak: number; warmup: number; total: number; minRatio: number },
): number {
  const { peak, warmup, total, minRatio } = schedule;
  if (step < warmup) return (peak * (step + 1)) / warmup;
  if (step >= total) return peak * minRatio;
  const progress = (step - warmup) / Math.max(1, total - warmup);
  return peak * (minRatio + (1 - minRatio) * 0.5 * (1 + Math.cos(Math.PI * progress)));
}

/** Scales gradients so their global L2 norm is at most `maxNorm`; returns the norm before clipping. */
export function clipByGlobalNorm(
  grads: Record<string, tf.Tensor>,
  maxNorm: number,
): { grads: Record<string, tf.Tensor>; norm: number } {
  const norm = tf.tidy(() => tf.sqrt(tf.addN(Object.values(grads).map((g) => tf.sum(tf.square(g))))).dataSync()[0]!);
  if (!(maxNorm > 0) || norm <= maxNorm) return { grads, norm };
  const scale = maxNorm / (norm + 1e-6);
  const clipped = Object.fromEntries(Object.entries(grads).map(([k, g]) => [k, tf.mul(g, scale)]));
  for (const g of Object.values(grads)) g.dispose();
  return { grads: clipped, norm };
}
