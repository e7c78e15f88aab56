// What every model of the trainer does with its weights alike: trainable variables made from named arrays
// of the expected shapes, the initialisation's normal draws, and the log-probability of each target.
import * as tf from '@tensorflow/tfjs-core';
import type { Random } from '../core/random.ts';
import { oneHot } from './kernels.ts';

/** A trainable variable per (name, shape), from `weights`; names the first that is missing or misshapen. */
export function variablesOf(shapes: [string, number[]][], weights: Map<string, Float32Array>): Map<string, tf.Variable> {
  return new Map(
    shapes.map(([name, shape]) => {
      const w = weights.get(name);
      if (!w || w.length !== shape.reduce((a, b) => a * b, 1)) throw new Error(`weights: "${name}" is missing or is not of shape [${shape}]`);
      return [name, tf.variable(tf.tensor(w, shape), true)];
    }),
  );
}

/** `size` draws from N(0, std²), Box–Muller from `rand`. */
export function normal(rand: Random, size: number, std: number): Float32Array {
  const out = new Float32Array(size);
  for (let i = 0; i < size; i += 2) {
    const r = Math.sqrt(-2 * Math.log(1 - rand())) * std;
    const a = 2 * Math.PI * rand();
    out[i] = r * Math.cos(a);
    if (i + 1 < size) out[i + 1] = r * Math.sin(a);
  }
  return out;
}

/** log p(target) at every position from logits (B·T, V): (B, T). */
export function targetLogprobs(logits: tf.Tensor2D, targets: Int32Array, batch: number, length: number): tf.Tensor2D {
  const logp = tf.logSoftmax(logits);
  const picked = tf.sum(tf.mul(logp, oneHot(tf.tensor1d(targets, 'int32'), logits.shape[1])), -1);
  return tf.reshape(picked, [batch, length]);
}
