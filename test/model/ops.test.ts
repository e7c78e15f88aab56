import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';
import { useTf } from '../fixtures/tf.ts';
import { causalAttention, causalMask, embed, linear } from '../../model/ops.ts';
import { seeded } from '../../core/random.ts';

// The reference: the same operations written the obvious way (batched matMul with transpose flags, tf.gather),
// differentiated by tfjs's own gradients on the CPU backend.
function naiveAttention(qkv: tf.Tensor2D, B: number, T: number, H: number): tf.Tensor2D {
  const C = qkv.shape[1] / 3;
  const hs = C / H;
  const split = (i: number) =>
    tf.transpose(tf.reshape(tf.slice(qkv, [0, i * C], [B * T, C]), [B, T, H, hs]), [0, 2, 1, 3]); // (B, H, T, hs)
  const [q, k, v] = [split(0), split(1), split(2)];
  const scores = tf.add(tf.mul(tf.matMul(q, k, false, true), 1 / Math.sqrt(hs)), causalMask(T));
  const y = tf.matMul(tf.softmax(scores), v); // (B, H, T, hs)
  return tf.reshape(tf.transpose(y, [0, 2, 1, 3]), [B * T, C]);
}

function randomTensor(seed: string, shape: number[]): tf.Tensor {
  const rand = seeded(seed);
  return tf.tensor(
    Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, () => rand() * 2 - 1),
    shape,
  );
}

/** Value and gradients of sum(f(inputs) ⊙ probe), as plain arrays. */
function valueAndGrads(
  f: (...xs: tf.Tensor[]) => tf.Tensor,
  inputs: tf.Tensor[],
  probe: tf.Tensor,
): { value: Float32Array; grads: Float32Array[] } {
  return {
    value: f(...inputs).dataSync() as Float32Array,
    grads: tf
      .grads((...xs: tf.Tensor[]) => tf.sum(tf.mul(f(...xs), probe)))(inputs)
      .map((g) => g.dataSync() as Float32Array),
  };
}

function expectClose(actual: Float32Array, expected: Float32Array, tolerance = 1e-4): void {
  expect(actual.length).toBe(expected.length);
  let worst = 0;
  for (let i = 0; i < actual.length; i++)
    worst = Math.max(worst, Math.abs(actual[i]! - expected[i]!) / (1 + Math.abs(expected[i]!)));
  expect(worst).toBeLessThan(tolerance);
}

beforeAll(async () => {
  await useTf('cpu');
});

describe.each(['cpu', 'wasm'] as const)(
  'kernels on the %s backend, against tfjs gradients of the obvious implementation',
  (backend) => {
    const B = 2;
    const T = 8;
    const H = 2;
    const C = 8;

    async function compare(
      ours: (...xs: tf.Tensor[]) => tf.Tensor,
      reference: (...xs: tf.Tensor[]) => tf.Tensor,
      shapes: number[][],
      outShape: number[],
    ) {
      await useTf('cpu');
      const make = () => shapes.map((s, i) => randomTensor(`input ${i}`, s));
      const expected = valueAndGrads(reference, make(), randomTensor('probe', outShape));
      await useTf(backend);
      const actual = valueAndGrads(ours, make(), randomTensor('probe', outShape));
      expectClose(actual.value, expected.value);
      actual.grads.forEach((g, i) => expectClose(g, expected.grads[i]!));
    }

    it('linear: x·w and both gradients', async () => {
      await compare(
        (x, w) => linear(x as tf.Tensor2D, w as tf.Tensor2D),
        (x, w) => tf.matMul(x as tf.Tensor2D, w as tf.Tensor2D),
        [
          [B * T, C],
          [C, 3 * C],
        ],
        [B * T, 3 * C],
      );
    });

    it('causal attention: the output and the gradient of the packed q, k, v', async () => {
      await compare(
        (qkv) => causalAttention(qkv as tf.Tensor2D, { batch: B, length: T, heads: H }, causalMask(T)),
        (qkv) => naiveAttention(qkv as tf.Tensor2D, B, T, H),
        [[B * T, 3 * C]],
        [B * T, C],
      );
    });

    it('causal attention: a position never sees a later one', async () => {
      await useTf(backend);
      const qkv = randomTensor('qkv', [T, 3 * C]) as tf.Tensor2D;
      const changed = tf.concat(
        [tf.slice(qkv, [0, 0], [T - 1, 3 * C]), tf.mul(tf.slice(qkv, [T - 1, 0], [1, 3 * C]), 5)],
        0,
      ) as tf.Tensor2D;
      const a = causalAttention(qkv, { batch: 1, length: T, heads: H }, causalMask(T)).arraySync();
      const b = causalAttention(changed, { batch: 1, length: T, heads: H }, causalMask(T)).arraySync();
      expect(a.slice(0, T - 1)).toEqual(b.slice(0, T - 1));
      expect(a[T - 1]).not.toEqual(b[T - 1]);
    });

    it('embedding: rows by id, and a gradient that adds up repeated ids (without UnsortedSegmentSum)', async () => {
      const ids = tf.tensor1d([3, 1, 3, 0, 5, 3], 'int32');
      await compare(
        (table) => embed(table as tf.Tensor2D, ids),
        (table) => tf.gather(table!, ids),
        [[6, C]],
        [6, C],
      );
    });
  },
);
