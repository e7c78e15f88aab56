// SwiGLU and RoPE on the GPU (runtime/webgpu/elementwise.ts) against the model's own (model/llama.ts on the
// WASM backend): outputs, and tfjs's gradients through them, within 1e-5 relative; RoPE with the model's
// table at θ = 10,000 and 500,000, heads of 8 and 64, two sequences a pass.
import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';
import { seeded } from '../../../core/random.ts';
import { ropeTable, rotate, silu } from '../../../model/llama.ts';
import { download, submit, upload } from '../../../runtime/webgpu/buffers.ts';
import { Rope, SwiGlu } from '../../../runtime/webgpu/elementwise.ts';
import { absent, gpu as here, kernels, relativeError } from '../../fixtures/webgpu.ts';

const random = seeded('webgpu-elementwise');
const values = (n: number, scale = 1) => Float32Array.from({ length: n }, () => (random() * 2 - 1) * scale);

describe('the elementwise steps on the GPU', () => {
  it.skipIf(absent)('SwiGLU gives silu(g)·u and its gradients', async () => {
    const gpu = here!;
    const n = 1000;
    const [g, u, dh] = [values(n, 6), values(n), values(n)];
    const [gt, ut] = [tf.tensor2d(g, [10, 100]), tf.tensor2d(u, [10, 100])];
    const f = (a: tf.Tensor, b: tf.Tensor) => tf.mul(silu(a as tf.Tensor2D), b);
    const want = await f(gt, ut).data();
    const [dgWant, duWant] = tf.grads((a: tf.Tensor, b: tf.Tensor) =>
      tf.sum(tf.mul(f(a, b), tf.tensor2d(dh, [10, 100]))),
    )([gt, ut]);
    const [bg, bu, bdh] = [upload(gpu, g), upload(gpu, u), upload(gpu, dh)];
    const [bh, bdg, bdu] = [
      upload(gpu, new Float32Array(n)),
      upload(gpu, new Float32Array(n)),
      upload(gpu, new Float32Array(n)),
    ];
    const swiglu = new SwiGlu(kernels!);
    submit(gpu, (pass) => {
      swiglu.forward(pass, bg, bu, bh, n);
      swiglu.backward(pass, bg, bu, bdh, bdg, bdu, n);
    });
    expect(relativeError(await download(gpu, bh, n), want)).toBeLessThan(1e-5);
    expect(relativeError(await download(gpu, bdg, n), await dgWant!.data())).toBeLessThan(1e-5);
    expect(relativeError(await download(gpu, bdu, n), await duWant!.data())).toBeLessThan(1e-5);
  });

  it.skipIf(absent)(
    'RoPE rotates each head by its position as the model does, and its backward is the rotation’s transpose',
    async () => {
      const gpu = here!;
      const rope = new Rope(kernels!);
      for (const [heads, headDim, theta] of [
        [3, 8, 10_000],
        [2, 64, 500_000],
      ] as const) {
        const [sequences, length] = [2, 13];
        const rows = sequences * length;
        const n = rows * heads * headDim;
        const table = ropeTable(length, headDim, theta);
        const [x, dy] = [values(n), values(n)];
        // The model's rows: each row's cos and sin, (rows, 1, hd).
        const perRow = (t: Float32Array) =>
          tf.tensor3d(
            Float32Array.from(
              { length: rows * headDim },
              (_, i) => t[(Math.floor(i / headDim) % length) * headDim + (i % headDim)]!,
            ),
            [rows, 1, headDim],
          );
        const [cos, sin] = [perRow(table.cos), perRow(table.sin)];
        const xt = tf.tensor3d(x, [rows, heads, headDim]);
        const want = await rotate(xt, cos, sin).data();
        const [dxWant] = tf.grads((a: tf.Tensor) =>
          tf.sum(tf.mul(rotate(a as tf.Tensor3D, cos, sin), tf.tensor3d(dy, [rows, heads, headDim]))),
        )([xt]);
        const [bx, bdy, bcos, bsin] = [upload(gpu, x), upload(gpu, dy), upload(gpu, table.cos), upload(gpu, table.sin)];
        const [by, bdx] = [upload(gpu, new Float32Array(n)), upload(gpu, new Float32Array(n))];
        const shape = { rows, heads, headDim, length };
        submit(gpu, (pass) => {
          rope.forward(pass, bx, bcos, bsin, by, shape);
          rope.backward(pass, bdy, bcos, bsin, bdx, shape);
        });
        expect(relativeError(await download(gpu, by, n), want), `y ${heads}×${headDim}`).toBeLessThan(1e-5);
        expect(relativeError(await download(gpu, bdx, n), await dxWant!.data()), `dx ${heads}×${headDim}`).toBeLessThan(
          1e-5,
        );
      }
    },
  );
});
