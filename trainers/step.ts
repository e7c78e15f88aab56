// One optimiser step: gradients of a loss, clipped by global norm, applied by AdamW. Shared by SFT and the
// preference stages; the loss is whatever the caller builds from the model. A batch too large for memory
// comes as micro-batches whose losses add up to the batch's: their gradients are summed before the step.
import * as tf from '@tensorflow/tfjs-core';
import type { Llama } from '../model/llama.ts';
import { clipByGlobalNorm, type AdamW } from './optimizer.ts';
import type { TokenBlock } from '../model/windows.ts';
import type { HeldModel } from '../runtime/held.ts';

export interface StepResult {
  loss: number;
  gradNorm: number;
  /** Extra scalars the loss reported (rewards/chosen, ...), summed over micro-batches, read after the step. */
  metrics: Record<string, number>;
}

export type MicroBatchLoss = () => { loss: tf.Scalar; metrics?: Record<string, tf.Scalar> };

/**
 * A micro-batch as every trainer gives it: the token blocks its loss reads, and the loss (its share of the
 * batch's, and of each metric) as a pure function of their per-target log-probabilities, (batch, length)
 * each. The model scores the blocks — tfjs's forward here, the GPU's on `--backend webgpu` (trainers/run.ts) —
 * and the loss is the same tfjs code on either.
 */
export interface MicroBatch {
  blocks: TokenBlock[];
  loss(logps: tf.Tensor2D[]): { loss: tf.Scalar; metrics?: Record<string, tf.Scalar> };
}

/** The micro-batch's loss on `model`, scoring its blocks there. */
export const onModel =
  (part: MicroBatch, model: Pick<Llama, 'tokenLogprobs'>): MicroBatchLoss =>
  () =>
    part.loss(part.blocks.map((b) => model.tokenLogprobs(b.ids, b.targets, b.batch, b.length)));

/**
 * The micro-batch's loss and metrics from its blocks' log-probabilities scored elsewhere (the GPU), and the
 * loss's gradient with respect to each of them: what that scorer's backward starts from.
 */
export function logpGradients(
  part: MicroBatch,
  logps: Float32Array[],
): { loss: number; metrics: Record<string, number>; grads: Float32Array[] } {
  const metrics: Record<string, number> = {};
  const inputs = part.blocks.map((b, j) => tf.tensor2d(logps[j]!, [b.batch, b.length]));
  const { value, grads } = tf.valueAndGrads((...xs: tf.Tensor[]) => {
    const out = part.loss(xs as tf.Tensor2D[]);
    for (const [k, v] of Object.entries(out.metrics ?? {})) metrics[k] = v.dataSync()[0]!;
    return out.loss;
  })(inputs);
  const out = { loss: value.dataSync()[0]!, metrics, grads: grads.map((g) => g.dataSync() as Float32Array) };
  tf.dispose([value, ...grads, ...inputs]);
  return out;
}

/** A block and which of its targets an SFT loss counts. */
export type SftBatch = TokenBlock & { mask: Float32Array };

/**
 * SFT on one block of a held model: the loss −Σ mask·log p(target) / max(Σ mask, 1) of trainers/losses/sft.ts,
 * weighted by `scale`, and its gradient, replacing what the gradients held or, with `accumulate`, added to
 * them. The trainer's runs take any loss through forward and backward (trainers/run.ts); this is that for SFT,
 * for tests and the benches.
 */
export async function sftStep(
  held: HeldModel,
  b: SftBatch,
  o: { accumulate?: boolean; scale?: number } = {},
): Promise<number> {
  const logp = await held.forward(b, 0);
  const count = Math.max(
    b.mask.reduce((s, m) => s + m, 0),
    1,
  );
  const loss = -b.mask.reduce((s, m, t) => s + m * logp[t]!, 0) / count;
  if (!o.accumulate) held.zeroGradients();
  await held.backward(
    0,
    b.mask.map((m) => (-m / count) * (o.scale ?? 1)),
  );
  return loss;
}

/** Each of `parts` returns its share of the loss (and of each metric): the batch's are their sums. */
export function optimizerStep(
  model: { params: Map<string, tf.Variable> },
  optimizer: AdamW,
  parts: MicroBatchLoss[],
  lr: number,
  maxGradNorm: number,
): StepResult {
  const names = [...model.params.keys()];
  const sums: Record<string, tf.Tensor> = {};
  const metrics: Record<string, number> = {};
  let loss = 0;
  for (const part of parts) {
    const reported: Record<string, tf.Scalar> = {};
    const { value, grads } = tf.variableGrads(() => {
      const out = part();
      for (const [k, v] of Object.entries(out.metrics ?? {})) reported[k] = tf.keep(v);
      return out.loss;
    }, [...model.params.values()]);
    for (const name of names) {
      const g = grads[model.params.get(name)!.name]!;
      if (sums[name]) {
        const total = tf.add(sums[name]!, g);
        sums[name]!.dispose();
        g.dispose();
        sums[name] = total;
      } else sums[name] = g;
    }
    loss += value.dataSync()[0]!;
    value.dispose();
    for (const [k, v] of Object.entries(reported)) {
      metrics[k] = (metrics[k] ?? 0) + v.dataSync()[0]!;
      v.dispose();
    }
  }
  const { grads: clipped, norm } = clipByGlobalNorm(sums, maxGradNorm);
  optimizer.apply(clipped, lr);
  for (const g of new Set([...Object.values(clipped), ...Object.values(sums)])) g.dispose();
  return { loss, gradNorm: norm, metrics };
}
