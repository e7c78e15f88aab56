// AdamW on the GPU (runtime/webgpu/adamw.ts) against the trainer's own (trainers/optimizer.ts on the WASM
// backend): a matrix that decays and a vector that does not, five steps with a changing learning rate and
// new gradients each step, compared element by element within 1e-6 (both compute in f32); and again with
// every parameter too large for one binding of 512 bytes, so updated a piece at a time. Where no WebGPU
// adapter is, CI fails and elsewhere the test is skipped, saying why (test/runtime/webgpu/matmul.test.ts).
import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';
import { absent, gpu as here, kernels } from '../../fixtures/webgpu.ts';
import { seeded } from '../../../core/random.ts';
import { AdamW, ADAMW_DEFAULTS } from '../../../trainers/optimizer.ts';
import { GpuAdamW, type GpuParameter } from '../../../runtime/webgpu/adamw.ts';
import { download, submit, upload } from '../../../runtime/webgpu/buffers.ts';
import { GpuKernels } from '../../../runtime/webgpu/kernel.ts';

describe('AdamW on the GPU', () => {
  const ways = [
    ['in one binding', kernels],
    ['in pieces of 128', kernels && new GpuKernels(kernels.gpu, { bindingBytes: 512 })],
  ] as const;
  it.skipIf(absent).each(ways)(
    'takes the same five steps as the trainer’s AdamW, decaying the matrix and not the vector, each parameter %s',
    async (_, k) => {
      const gpu = here!;
      const random = seeded('webgpu-adamw');
      const values = (n: number) => Float32Array.from({ length: n }, () => random() * 2 - 1);
      const shapes = { weight: [37, 11], gain: [300] } as const;
      const start = { weight: values(37 * 11), gain: values(300) };
      const options = { ...ADAMW_DEFAULTS, weightDecay: 0.1 };

      const params = new Map(
        Object.entries(shapes).map(([name, shape]) => [
          name,
          tf.variable(tf.tensor(start[name as keyof typeof start], [...shape])),
        ]),
      );
      const cpu = new AdamW(params, options);
      const onGpu: Record<string, GpuParameter> = {};
      for (const [name, data] of Object.entries(start)) {
        const zeros = new Float32Array(data.length);
        onGpu[name] = {
          name,
          value: upload(gpu, data),
          grad: upload(gpu, zeros),
          m: upload(gpu, zeros),
          v: upload(gpu, zeros),
          length: data.length,
          decays: name === 'weight',
        };
      }
      const adamw = new GpuAdamW(k!, options);

      for (let step = 0; step < 5; step++) {
        const lr = 0.01 * (step + 1);
        const grads: Record<string, tf.Tensor> = {};
        for (const [name, shape] of Object.entries(shapes)) {
          const g = values(start[name as keyof typeof start].length);
          grads[name] = tf.tensor(g, [...shape]);
          gpu.device.queue.writeBuffer(onGpu[name]!.grad, 0, g);
        }
        cpu.apply(grads, lr);
        submit(gpu, (pass) => adamw.encode(pass, Object.values(onGpu), lr));
        for (const g of Object.values(grads)) g.dispose();
      }

      for (const [name, p] of params) {
        const want = await p.data();
        const got = await download(gpu, onGpu[name]!.value, want.length);
        let worst = 0;
        for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(got[i]! - want[i]!));
        expect(worst, name).toBeLessThan(1e-6);
        // The step moved them: a test of an update that did nothing would pass too.
        expect(Math.abs(want[0]! - start[name as keyof typeof start][0]!)).toBeGreaterThan(1e-3);
      }
    },
  );
});
