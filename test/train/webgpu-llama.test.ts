// One SFT step of the Llama on the GPU (train/webgpu/llama.ts) against the same model in tfjs on the WASM
// backend (train/model.ts, train/losses/sft.ts): the loss, and the gradient of every weight, from the same
// weights, tokens and mask. Tolerance: each gradient's largest difference within 1e-4 of its largest entry
// (both sides compute in f32, summing in different orders through two layers), the loss within 1e-5.
import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';
import { seeded } from '../../core/random.ts';
import { useBackend } from '../../train/backend.ts';
import { sftLoss } from '../../train/losses/sft.ts';
import { Llama, type LlamaConfig } from '../../train/model.ts';
import { targetLogprobs } from '../../train/parameters.ts';
import { GpuLlama } from '../../train/webgpu/llama.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { absent, adapterLine, kernels } from '../fixtures/webgpu.ts';

console.log(adapterLine());

beforeAll(async () => {
  await useBackend('wasm');
});

async function compare(config: LlamaConfig, batch: number, length: number): Promise<void> {
  const random = seeded('webgpu-llama', JSON.stringify(config));
  const n = batch * length;
  const ids = Int32Array.from({ length: n }, () => Math.floor(random() * config.vocabSize));
  const targets = Int32Array.from({ length: n }, () => Math.floor(random() * config.vocabSize));
  const mask = Float32Array.from({ length: n }, () => (random() < 0.7 ? 1 : 0));

  const model = Llama.create(config, 'webgpu-llama');
  const { value, grads } = tf.variableGrads(() => sftLoss(targetLogprobs(model.forward(ids, batch, length), targets, batch, length), tf.tensor2d(mask, [batch, length])));
  const weights = new Map([...model.weights()].map(([name, w]) => [name, w.data]));

  const gpu = new GpuLlama(config, weights, kernels!);
  const loss = await gpu.sftStep({ ids, targets, mask, batch, length });
  expect(Math.abs(loss - (await value.data())[0]!)).toBeLessThan(1e-5);
  // tfjs names gradients by its variables' own names: the model's parameters map weight names to them.
  expect([...model.params.keys()].sort()).toEqual([...gpu.grads.keys()].sort());
  for (const [name, variable] of model.params) {
    const w = await grads[variable.name]!.data();
    const got = await gpu.gradient(name);
    let largest = 0;
    let diff = 0;
    for (let i = 0; i < w.length; i++) {
      largest = Math.max(largest, Math.abs(w[i]!));
      diff = Math.max(diff, Math.abs(got[i]! - w[i]!));
    }
    expect(largest, `${name} has a gradient`).toBeGreaterThan(0);
    expect(diff / largest, name).toBeLessThan(1e-4);
  }
  tf.dispose([value, ...Object.values(grads)]);
  model.dispose();
}

describe('the Llama on the GPU', () => {
  it.skipIf(absent)('takes the SFT step the tfjs model takes: its loss and every gradient, tied and grouped-query', async () => {
    await compare(tinyLlama(), 2, 9);
  });

  it.skipIf(absent)('and with an untied head, as many key/value heads as query heads, and longer sequences', async () => {
    await compare(tinyLlama({ tiedEmbeddings: false, heads: 4, kvHeads: 4, headDim: 4, vocabSize: 40, layers: 3 }), 3, 16);
  });
});
