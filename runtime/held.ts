// A model held by an engine outside TensorFlow.js (runtime/cpu/llama.ts on the CPU path, runtime/webgpu/llama.ts
// on the GPU): what a training run asks of it (forward to token log-probs, backward from their gradient,
// gradients cleared and clipped, AdamW's constants), and the weights it keeps, checked against the config.
import type { Variable } from '@tensorflow/tfjs-core';
import { llamaParameterShapes, type LlamaConfig } from '../model/config.ts';
import type { TokenBlock } from '../model/windows.ts';

/** AdamW's constants; the learning rate is each step's (`apply`), from the schedule. */
export interface AdamWOptions {
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
}

/**
 * A model held outside TensorFlow.js (GpuLlama on the GPU, CpuLlama on the CPU path): its forward to token
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
  /** Mixed precision: the loss scale the backward multiplies the gradients by (runtime/webgpu/precision.ts). */
  readonly lossScale?: number;
}

/** A LoRA adapter as a held model takes it: A (r × in) and B (out × r), its scale α/r, dropout and index (model/lora.ts). */
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

/** Variables (the reference model's weights, AdamW's moments) as f32 arrays by name: TensorFlow.js's own data, not copied. */
export const arraysOf = (vars: Map<string, Variable>): Map<string, Float32Array> =>
  new Map([...vars].map(([name, v]) => [name, v.dataSync() as Float32Array]));
