// What every model of the trainer does with its weights alike: trainable variables made from named arrays
// of the expected shapes, the initialisation's normal draws, cached causal masks, and the log-probability of
// each target (the models, GPT and Llama, extend ModelWeights).
import * as tf from '@tensorflow/tfjs-core';
import type { Random } from '../core/random.ts';
import { causalMask, oneHot } from './ops.ts';

/** A trainable variable per (name, shape), from `weights`; names the first that is missing or misshapen. */
function variablesOf(shapes: [string, number[]][], weights: Map<string, Float32Array>): Map<string, tf.Variable> {
  return new Map(
    shapes.map(([name, shape]) => {
      const w = weights.get(name);
      if (!w || w.length !== shape.reduce((a, b) => a * b, 1))
        throw new Error(`weights: "${name}" is missing or is not of shape [${shape}]`);
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

/** log p(target) at every position, from logits (B·T, V): (B, T). */
export function targetLogprobs(logits: tf.Tensor2D, targets: Int32Array, batch: number, length: number): tf.Tensor2D {
  const logp = tf.logSoftmax(logits);
  const picked = tf.sum(tf.mul(logp, oneHot(tf.tensor1d(targets, 'int32'), logits.shape[1])), -1);
  return tf.reshape(picked, [batch, length]);
}

/** A model's weights as named trainable variables; the model brings its forward pass. */
export abstract class ModelWeights {
  readonly params: Map<string, tf.Variable>;
  private readonly masks = new Map<number, tf.Tensor2D>();

  constructor(shapes: [string, number[]][], weights: Map<string, Float32Array>) {
    this.params = variablesOf(shapes, weights);
  }

  /** Logits for every position. ids: B rows of T tokens, row-major. Returns (B·T, V). */
  abstract forward(ids: Int32Array, batch: number, length: number): tf.Tensor2D;

  /** A parameter, typed as the 2-D tensor most of them are. */
  p(name: string): tf.Tensor2D {
    return this.params.get(name)! as tf.Tensor as tf.Tensor2D;
  }

  /** The (T, T) causal mask, made once per length. */
  protected mask(length: number): tf.Tensor2D {
    let m = this.masks.get(length);
    if (!m) this.masks.set(length, (m = tf.keep(causalMask(length))));
    return m;
  }

  /** log p(target_t | tokens ≤ t) for every position: (B, T). */
  tokenLogprobs(ids: Int32Array, targets: Int32Array, batch: number, length: number): tf.Tensor2D {
    return targetLogprobs(this.forward(ids, batch, length), targets, batch, length);
  }

  /** Number of parameters (a tied embedding counted once). */
  size(): number {
    let n = 0;
    for (const v of this.params.values()) n += v.size;
    return n;
  }

  dispose(): void {
    for (const v of this.params.values()) v.dispose();
    for (const m of this.masks.values()) m.dispose();
  }
}
