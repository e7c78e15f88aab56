// Causal attention on the GPU (train/webgpu/attention.ts) against the model's (train/kernels.ts
// causalAttention over q and the repeated k and v, as train/model.ts packs them, on the WASM backend): the
// output and tfjs's gradients with respect to q, k and v, within 1e-5 relative; plain multi-head and
// grouped-query attention, sequences shorter and longer than a workgroup's 256 threads.
import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';
import { seeded } from '../../core/random.ts';
import { causalAttention, causalMask } from '../../train/kernels.ts';
import { repeatKv } from '../../train/model.ts';
import { Attention } from '../../train/webgpu/attention.ts';
import { download, submit, upload } from '../../train/webgpu/buffers.ts';
import { absent, gpu as here, kernels, relativeError } from '../fixtures/webgpu.ts';

describe('causal attention on the GPU', () => {
  it.skipIf(absent)(
    'gives the model’s attention and its gradients, with one key/value head a query head or shared',
    async () => {
      const gpu = here!;
      const random = seeded('webgpu-attention');
      const values = (n: number) => Float32Array.from({ length: n }, () => random() * 2 - 1);
      const attention = new Attention(kernels!);
      for (const [batch, length, heads, kvHeads, headDim] of [
        [2, 7, 2, 2, 4],
        [1, 300, 4, 2, 16],
        [2, 19, 6, 1, 8],
      ] as const) {
        const n = batch * length;
        const [q, k, v, dout] = [
          values(n * heads * headDim),
          values(n * kvHeads * headDim),
          values(n * kvHeads * headDim),
          values(n * heads * headDim),
        ];
        const mask = causalMask(length);
        const f = (qt: tf.Tensor, kt: tf.Tensor, vt: tf.Tensor) =>
          causalAttention(
            tf.concat(
              [
                tf.reshape(qt, [n, heads * headDim]),
                repeatKv(kt as tf.Tensor3D, heads),
                repeatKv(vt as tf.Tensor3D, heads),
              ],
              1,
            ) as tf.Tensor2D,
            { batch, length, heads },
            mask,
          );
        const [qt, kt, vt] = [
          tf.tensor3d(q, [n, heads, headDim]),
          tf.tensor3d(k, [n, kvHeads, headDim]),
          tf.tensor3d(v, [n, kvHeads, headDim]),
        ];
        const want = await f(qt, kt, vt).data();
        const grads = tf.grads((a: tf.Tensor, b: tf.Tensor, c: tf.Tensor) =>
          tf.sum(tf.mul(f(a, b, c), tf.tensor2d(dout, [n, heads * headDim]))),
        )([qt, kt, vt]);

        const size = batch * heads * length * length;
        const [bq, bk, bv, bdout] = [upload(gpu, q), upload(gpu, k), upload(gpu, v), upload(gpu, dout)];
        const [p, ds, out, dq, dk, dv] = [size, size, q.length, q.length, k.length, v.length].map((len) =>
          upload(gpu, new Float32Array(len)),
        );
        const shape = { batch, length, heads, kvHeads, headDim };
        submit(gpu, (pass) => {
          attention.forward(pass, bq, bk, bv, p!, out!, shape);
          attention.backward(pass, bq, bk, bv, p!, bdout, ds!, dq!, dk!, dv!, shape);
        });
        const what = `${batch}×${length}, ${heads} heads, ${kvHeads} kv heads of ${headDim}`;
        expect(relativeError(await download(gpu, out!, q.length), want), `out ${what}`).toBeLessThan(1e-5);
        for (const [name, buffer, grad] of [
          ['dq', dq!, grads[0]!],
          ['dk', dk!, grads[1]!],
          ['dv', dv!, grads[2]!],
        ] as const) {
          expect(
            relativeError(await download(gpu, buffer, grad.size), await grad.data()),
            `${name} ${what}`,
          ).toBeLessThan(1e-5);
        }
        tf.dispose([mask, qt, kt, vt, ...grads]);
      }
    },
  );
});
