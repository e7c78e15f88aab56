// One optimiser step: gradients of a loss, clipped by global norm, applied by AdamW. Shared by SFT and the
// preference stages; the loss is whatever the caller builds from the model. A batch too large for memory
// comes as micro-batches whose losses add up to the batch's: their gradients are summed before the step.
import * as tf from '@tensorflow/tfjs-core';
import { llamaParameterShapes, type Llama, type LlamaConfig } from './model.ts';
import { clipByGlobalNorm, type AdamW } from './optimizer.ts';
import type { TokenBlock } from './windows.ts';

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
 * each. The model scores the blocks — tfjs's forward here, the GPU's on `--backend webgpu` (train/run.ts) —
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
 * A model held outside TensorFlow.js (GpuLlama on the GPU, OrtLlama on the CPU path): its forward to token
 * log-probs and its backward from their gradient, gradients cleared and clipped, and LoRA's dropout for the
 * forward passes (the run's seed and TensorFlow.js's masks, so it drops what WASM drops; null: none).
 */
export interface HeldModel {
  dropout: { seed: number; mask: (rows: number, cols: number, rate: number, seed: number) => Float32Array } | null;
  zeroGradients(): void;
  forward(block: TokenBlock, slot: number): Promise<Float32Array>;
  backward(slot: number, dlogp: Float32Array): void | Promise<void>;
  /** Scales the gradients to a global L2 norm of at most `maxNorm`; returns the norm before. */
  clipGradients(maxNorm: number): number | Promise<number>;
  /** Mixed precision: whether the last clipGradients found the gradients overflowed f16, so that no step is taken. */
  readonly skipped?: boolean;
  /** Mixed precision: the loss scale the backward multiplies the gradients by (train/webgpu/precision.ts). */
  readonly lossScale?: number;
}

/** A LoRA adapter as a held model takes it: A (r × in) and B (out × r), its scale α/r, dropout and index (train/lora.ts). */
export interface LoraWeights {
  a: Float32Array;
  b: Float32Array;
  r: number;
  scale: number;
  dropout: number;
  index: number;
}

/** A weight as a held model keeps it: its values, whether it gets a gradient, and whether AdamW decays it. */
export interface HeldWeight {
  name: string;
  data: Float32Array;
  trained: boolean;
  decays: boolean;
}

/**
 * The weights a held model keeps, checked against the config's shapes (`where` names the place in the error):
 * every weight of the model, trained unless `trainable` is false or adapters are given (LoRA: the base is
 * frozen), then each adapter's A and B under PEFT's names, trained; and the adapters by module with those names.
 */
export function heldWeights(
  config: LlamaConfig,
  weights: Map<string, Float32Array>,
  where: string,
  o: { trainable?: boolean; adapters?: Map<string, LoraWeights> } = {},
): { weights: HeldWeight[]; adapters: Map<string, Omit<LoraWeights, 'a' | 'b'> & { a: string; b: string }> } {
  const trainable = o.trainable ?? true;
  const frozen = !!o.adapters?.size;
  const held: HeldWeight[] = [];
  for (const [name, shape] of llamaParameterShapes(config)) {
    const data = weights.get(name);
    if (!data || data.length !== shape.reduce((a, b) => a * b, 1))
      throw new Error(`${where}: weight ${name} is missing or not of shape ${shape.join('×')}`);
    held.push({ name, data, trained: trainable && !frozen, decays: shape.length >= 2 });
  }
  const adapters = new Map<string, Omit<LoraWeights, 'a' | 'b'> & { a: string; b: string }>();
  for (const [module, ad] of o.adapters ?? []) {
    const [a, b] = [`base_model.model.${module}.lora_A.weight`, `base_model.model.${module}.lora_B.weight`];
    held.push({ name: a, data: ad.a, trained: trainable, decays: true });
    held.push({ name: b, data: ad.b, trained: trainable, decays: true });
    adapters.set(module, { a, b, r: ad.r, scale: ad.scale, dropout: ad.dropout, index: ad.index });
  }
  return { weights: held, adapters };
}

/**
 * SFT on one block of a held model: the loss −Σ mask·log p(target) / max(Σ mask, 1) of train/losses/sft.ts,
 * weighted by `scale`, and its gradient, replacing what the gradients held or, with `accumulate`, added to
 * them. The trainer's runs take any loss through forward and backward (train/run.ts); this is that for SFT,
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
