// RMSNorm on the GPU (runtime/webgpu/rmsnorm.ts) against the model's own (model/llama.ts on the WASM backend):
// the output and, through tfjs's gradients of sum(RMSNorm(x)·dy), both gradients, within 1e-5 relative;
// then accumulation adds to what the gradients held. Where no WebGPU adapter is, CI fails and elsewhere
// the test is skipped, saying why (test/runtime/webgpu/matmul.test.ts).
import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';
import { absent, gpu as here, kernels, relativeError } from '../../fixtures/webgpu.ts';
import { seeded } from '../../../core/random.ts';
import { rmsNorm } from '../../../model/llama.ts';
import { download, submit, upload } from '../../../runtime/webgpu/buffers.ts';
import { RmsNorm } from '../../../runtime/webgpu/rmsnorm.ts';

describe('RMSNorm on the GPU', () => {
  it.skipIf(absent)(
    'gives the model’s output and tfjs’s gradients, and adds to gradients when accumulating',
    async () => {
      const gpu = here!;
      const random = seeded('webgpu-rmsnorm');
      const values = (n: number, scale = 1) => Float32Array.from({ length: n }, () => (random() * 2 - 1) * scale);
      const norm = new RmsNorm(kernels!);
      for (const [rows, dim] of [
        [3, 5],
        [17, 300],
        [2, 1000],
      ] as const) {
        const [x, w, dy] = [values(rows * dim, 3), values(dim), values(rows * dim)];
        const eps = 1e-5;
        const xt = tf.tensor2d(x, [rows, dim]);
        const wt = tf.tensor1d(w);
        const dyt = tf.tensor2d(dy, [rows, dim]);
        const want = await rmsNorm(xt, wt, eps).data();
        const [dxWant, dwWant] = tf.grads((a: tf.Tensor, b: tf.Tensor) =>
          tf.sum(tf.mul(rmsNorm(a as tf.Tensor2D, b, eps), dyt)),
        )([xt, wt]);

        const [gx, gw, gdy] = [upload(gpu, x), upload(gpu, w), upload(gpu, dy)];
        const [gy, rstd, gdx, gdw] = [
          upload(gpu, new Float32Array(rows * dim)),
          upload(gpu, new Float32Array(rows)),
          upload(gpu, new Float32Array(rows * dim)),
          upload(gpu, new Float32Array(dim)),
        ];
        const shape = { rows, dim, eps };
        submit(gpu, (pass) => {
          norm.forward(pass, gx, gw, gy, rstd, shape);
          norm.backward(pass, gx, gw, rstd, gdy, gdx, gdw, shape);
        });
        expect(relativeError(await download(gpu, gy, rows * dim), want), `y ${rows}×${dim}`).toBeLessThan(1e-5);
        const [dx, dw] = [await dxWant!.data(), await dwWant!.data()];
        expect(relativeError(await download(gpu, gdx, rows * dim), dx), `dx ${rows}×${dim}`).toBeLessThan(1e-5);
        expect(relativeError(await download(gpu, gdw, dim), dw), `dw ${rows}×${dim}`).toBeLessThan(1e-5);

        // A second backward that accumulates: each gradient twice what it was.
        submit(gpu, (pass) => norm.backward(pass, gx, gw, rstd, gdy, gdx, gdw, { ...shape, accumulate: true }));
        expect(
          relativeError(
            await download(gpu, gdw, dim),
            dw.map((v) => 2 * v),
          ),
          `dw accumulated ${rows}×${dim}`,
        ).toBeLessThan(1e-5);
        expect(
          relativeError(
            await download(gpu, gdx, rows * dim),
            dx.map((v) => 2 * v),
          ),
          `dx accumulated ${rows}×${dim}`,
        ).toBeLessThan(1e-5);
        tf.dispose([xt, wt, dyt, dxWant!, dwWant!]);
      }
    },
  );
});
