// Token log-probs on the GPU (runtime/webgpu/logprobs.ts) against the trainer's (model/parameters.ts
// targetLogprobs on the WASM backend): log p(target) per row, and d/d logits from a d/d logp per row through
// tfjs's gradients, within 1e-5 relative, for vocabularies below, at and above a workgroup's 256 threads
// and logits large enough that a softmax without its max subtracted would overflow.
import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';
import { seeded } from '../../../core/random.ts';
import { targetLogprobs } from '../../../model/parameters.ts';
import { download, submit, upload } from '../../../runtime/webgpu/buffers.ts';
import { TargetLogprobs } from '../../../runtime/webgpu/logprobs.ts';
import { absent, gpu as here, kernels, relativeError } from '../../fixtures/webgpu.ts';

describe('token log-probs on the GPU', () => {
  it.skipIf(absent)('give the trainer’s log p(target) and its gradient with respect to the logits', async () => {
    const gpu = here!;
    const random = seeded('webgpu-logprobs');
    const kernel = new TargetLogprobs(kernels!);
    for (const [rows, vocab, scale] of [
      [4, 7, 1],
      [9, 256, 3],
      [6, 1029, 100],
    ] as const) {
      const z = Float32Array.from({ length: rows * vocab }, () => (random() * 2 - 1) * scale);
      const targets = Int32Array.from({ length: rows }, () => Math.floor(random() * vocab));
      const dlogp = Float32Array.from({ length: rows }, () => random() * 2 - 1);
      const zt = tf.tensor2d(z, [rows, vocab]);
      const want = await targetLogprobs(zt, targets, 1, rows).data();
      const [dzWant] = tf.grads((a: tf.Tensor) =>
        tf.sum(tf.mul(targetLogprobs(a as tf.Tensor2D, targets, 1, rows), tf.tensor2d(dlogp, [1, rows]))),
      )([zt]);

      const [gz, gt, gd] = [upload(gpu, z), upload(gpu, targets), upload(gpu, dlogp)];
      const [logp, lse, dz] = [
        upload(gpu, new Float32Array(rows)),
        upload(gpu, new Float32Array(rows)),
        upload(gpu, new Float32Array(rows * vocab)),
      ];
      const shape = { rows, vocab };
      submit(gpu, (pass) => {
        kernel.forward(pass, gz, gt, logp, lse, shape);
        kernel.backward(pass, gz, gt, lse, gd, dz, shape);
      });
      expect(relativeError(await download(gpu, logp, rows), want), `logp ${rows}×${vocab}`).toBeLessThan(1e-5);
      expect(
        relativeError(await download(gpu, dz, rows * vocab), await dzWant!.data()),
        `dz ${rows}×${vocab}`,
      ).toBeLessThan(1e-5);
      tf.dispose([zt, dzWant!]);
    }
  });
});
