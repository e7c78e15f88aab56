// One optimiser step: gradients of a loss, clipped by global norm, applied by AdamW. Shared by SFT and the
// preference stages; the loss is whatever the caller builds from the model.
import * as tf from '@tensorflow/tfjs-core';
import type { GPT } from './model.ts';
import { clipByGlobalNorm, type AdamW } from './optimizer.ts';

export interface StepResult {
  loss: number;
  gradNorm: number;
  /** Extra scalars the loss reported (rewards/chosen, ...), read after the step. */
  metrics: Record<string, number>;
}

/** `loss` returns the scalar to minimise and, optionally, named scalars to report. */
export function optimizerStep(
  model: GPT,
  optimizer: AdamW,
  loss: () => { loss: tf.Scalar; metrics?: Record<string, tf.Scalar> },
  lr: number,
  maxGradNorm: number,
): StepResult {
  const reported: Record<string, tf.Scalar> = {};
  const { value, grads } = tf.variableGrads(() => {
    const out = loss();
    for (const [k, v] of Object.entries(out.metrics ?? {})) reported[k] = tf.keep(v);
    return out.loss;
  }, [...model.params.values()]);
  const byName = Object.fromEntries([...model.params].map(([name, v]) => [name, grads[v.name]!]));
  const { grads: clipped, norm } = clipByGlobalNorm(byName, maxGradNorm);
  optimizer.apply(clipped, lr);
  for (const g of Object.values(clipped)) g.dispose();
  const result = { loss: value.dataSync()[0]!, gradNorm: norm, metrics: Object.fromEntries(Object.entries(reported).map(([k, v]) => [k, v.dataSync()[0]!])) };
  value.dispose();
  for (const v of Object.values(reported)) v.dispose();
  return result;
}
