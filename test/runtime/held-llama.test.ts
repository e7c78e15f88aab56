// One SFT step of the Llama held outside tfjs, on the GPU (runtime/webgpu/llama.ts) and on the CPU path's C
// kernels (runtime/cpu/llama.ts), against the reference model in tfjs on the WASM backend
// (model/llama.ts, trainers/losses/sft.ts): the loss, and the gradient of every weight, from the same weights,
// tokens and mask. Tolerance: each gradient's largest difference within 1e-4 of its largest entry (both
// sides compute in f32, summing in different orders through two layers), the loss within 1e-5.
import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';
import { seeded } from '../../core/random.ts';
import { sftLoss } from '../../trainers/losses/sft.ts';
import { Llama } from '../../model/llama.ts';
import { targetLogprobs } from '../../model/parameters.ts';
import { AdamW, ADAMW_DEFAULTS, clipByGlobalNorm } from '../../trainers/optimizer.ts';
import { sftStep } from '../../trainers/step.ts';
import { NEVER } from '../../pipeline/interrupt.ts';
import { HELD, type HeldDevice } from '../fixtures/held.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { kernels, relativeError } from '../fixtures/webgpu.ts';
import { GpuLlama } from '../../runtime/webgpu/llama.ts';
import { GpuKernels } from '../../runtime/webgpu/kernel.ts';
import type { LlamaConfig } from '../../model/config.ts';
import { scoreSequences } from '../../runtime/scoring.ts';

type Held = ReturnType<HeldDevice['model']>;

async function compare(device: HeldDevice, config: LlamaConfig, batch: number, length: number): Promise<void> {
  const random = seeded('webgpu-llama', JSON.stringify(config));
  const n = batch * length;
  const ids = Int32Array.from({ length: n }, () => Math.floor(random() * config.vocabSize));
  const targets = Int32Array.from({ length: n }, () => Math.floor(random() * config.vocabSize));
  const mask = Float32Array.from({ length: n }, () => (random() < 0.7 ? 1 : 0));

  const model = Llama.create(config, 'webgpu-llama');
  // Biases start at 0: drawn here, so that the forward's use of them is checked too.
  for (const [name, v] of model.params)
    if (name.endsWith('.bias'))
      v.assign(
        tf.tensor(
          Float32Array.from({ length: v.size }, () => random() - 0.5),
          v.shape,
        ),
      );
  const { value, grads } = tf.variableGrads(() =>
    sftLoss(
      targetLogprobs(model.forward(ids, batch, length), targets, batch, length),
      tf.tensor2d(mask, [batch, length]),
    ),
  );
  const weights = new Map([...model.weights()].map(([name, w]) => [name, w.data]));

  const held = device.model(config, weights);
  const loss = await sftStep(held, { ids, targets, mask, batch, length });
  expect(Math.abs(loss - (await value.data())[0]!)).toBeLessThan(1e-5);
  // tfjs names gradients by its variables' own names: the model's parameters map weight names to them.
  expect([...model.params.keys()].sort()).toEqual([...held.grads.keys()].sort());
  const want = new Map<string, Float32Array>();
  for (const [name, variable] of model.params) want.set(name, (await grads[variable.name]!.data()) as Float32Array);
  for (const [name, { largest, gap }] of await gradientGaps(held, want)) {
    expect(largest, `${name} has a gradient`).toBeGreaterThan(0);
    expect(gap, name).toBeLessThan(1e-4);
  }
  tf.dispose([value, ...Object.values(grads)]);
  model.dispose();
}

/** Per weight: its wanted gradient's largest entry, and the held model's largest difference from it over that. */
async function gradientGaps(
  held: Held,
  want: Map<string, Float32Array>,
): Promise<Map<string, { largest: number; gap: number }>> {
  const out = new Map<string, { largest: number; gap: number }>();
  for (const [name, w] of want) {
    const got = await held.gradient(name);
    let largest = 0;
    let diff = 0;
    for (let i = 0; i < w.length; i++) {
      largest = Math.max(largest, Math.abs(w[i]!));
      diff = Math.max(diff, Math.abs(got[i]! - w[i]!));
    }
    out.set(name, { largest, gap: diff / largest });
  }
  return out;
}

/** The largest of the gaps. */
const gradientGap = async (held: Held, want: Map<string, Float32Array>) =>
  Math.max(...[...(await gradientGaps(held, want)).values()].map((g) => g.gap));

describe.each(HELD)('the Llama held on $name', (device) => {
  const { absent } = device;
  it.skipIf(absent)(
    'adds micro-batches up to the whole batch’s gradient, and clips by global norm as the trainer does',
    async () => {
      const config = tinyLlama();
      const [batch, length] = [4, 9];
      const random = seeded('webgpu-llama-micro');
      const n = batch * length;
      const ids = Int32Array.from({ length: n }, () => Math.floor(random() * config.vocabSize));
      const targets = Int32Array.from({ length: n }, () => Math.floor(random() * config.vocabSize));
      const mask = Float32Array.from({ length: n }, () => (random() < 0.6 ? 1 : 0));
      const model = Llama.create(config, 'webgpu-llama-micro');
      const held = device.model(config, new Map([...model.weights()].map(([name, w]) => [name, w.data])));

      // The whole batch at once, then its two halves, each weighted by its share of the counted tokens.
      await sftStep(held, { ids, targets, mask, batch, length });
      const whole = new Map<string, Float32Array>();
      for (const name of held.grads.keys()) whole.set(name, await held.gradient(name));
      const half = (h: number) => ({
        ids: ids.slice((h * n) / 2, ((h + 1) * n) / 2),
        targets: targets.slice((h * n) / 2, ((h + 1) * n) / 2),
        mask: mask.slice((h * n) / 2, ((h + 1) * n) / 2),
        batch: 2,
        length,
      });
      const counted = (h: number) => half(h).mask.reduce((s, m) => s + m, 0);
      const total = counted(0) + counted(1);
      await sftStep(held, half(0), { scale: counted(0) / total });
      await sftStep(held, half(1), { accumulate: true, scale: counted(1) / total });
      expect(await gradientGap(held, whole)).toBeLessThan(1e-5);

      // Clipping: the norm, and the clipped gradients, of the tfjs model's.
      const { value, grads } = tf.variableGrads(() =>
        sftLoss(
          targetLogprobs(model.forward(ids, batch, length), targets, batch, length),
          tf.tensor2d(mask, [batch, length]),
        ),
      );
      const byName = Object.fromEntries([...model.params].map(([name, v]) => [name, grads[v.name]!]));
      const norm = clipByGlobalNorm(byName, Infinity).norm;
      const clipped = clipByGlobalNorm(byName, norm / 2);
      const heldNorm = await held.clipGradients(norm / 2);
      expect(Math.abs(heldNorm - norm) / norm).toBeLessThan(1e-5);
      const want = new Map<string, Float32Array>();
      for (const [name, g] of Object.entries(clipped.grads)) want.set(name, (await g.data()) as Float32Array);
      expect(await gradientGap(held, want)).toBeLessThan(1e-4);
      expect(await held.clipGradients(0)).toBeCloseTo(norm / 2, 4);
      tf.dispose([value, ...Object.values(grads), ...Object.values(clipped.grads)]);
      model.dispose();
    },
  );

  it.skipIf(absent)('trains as the tfjs model trains: three SFT steps with AdamW leave the same weights', async () => {
    const config = tinyLlama();
    const [batch, length] = [2, 9];
    const random = seeded('webgpu-llama-steps');
    const draw = (n: number, below: number) => Int32Array.from({ length: n }, () => Math.floor(random() * below));
    const model = Llama.create(config, 'webgpu-llama-steps');
    const held = device.model(config, new Map([...model.weights()].map(([name, w]) => [name, w.data])));
    const options = { ...ADAMW_DEFAULTS, weightDecay: 0.1 };
    const [cpuOptimizer, update] = [new AdamW(model.params, options), device.adamw(options)];
    const losses: [number, number][] = [];
    for (let step = 0; step < 3; step++) {
      const [ids, targets] = [draw(batch * length, config.vocabSize), draw(batch * length, config.vocabSize)];
      const mask = new Float32Array(batch * length).fill(1);
      const { value, grads } = tf.variableGrads(() =>
        sftLoss(
          targetLogprobs(model.forward(ids, batch, length), targets, batch, length),
          tf.tensor2d(mask, [batch, length]),
        ),
      );
      const lr = 0.01;
      cpuOptimizer.apply(Object.fromEntries([...model.params].map(([name, v]) => [name, grads[v.name]!])), lr);
      const loss = await sftStep(held, { ids, targets, mask, batch, length });
      update(held, lr);
      losses.push([loss, (await value.data())[0]!]);
      tf.dispose([value, ...Object.values(grads)]);
    }
    for (const [got, want] of losses) expect(Math.abs(got - want)).toBeLessThan(1e-4);
    expect(losses[2]![1]).not.toBe(losses[0]![1]); // the weights moved
    for (const [name, variable] of model.params) {
      const want = await variable.data();
      const got = await held.weight(name);
      let diff = 0;
      for (let i = 0; i < want.length; i++) diff = Math.max(diff, Math.abs(got[i]! - want[i]!));
      // AdamW's step is about lr a weight whatever the gradient's size: the weights agree to well under one.
      expect(diff, name).toBeLessThan(1e-4);
    }
    model.dispose();
  });

  it.skipIf(absent)(
    'takes the SFT step the tfjs model takes: its loss and every gradient, tied and grouped-query',
    async () => {
      await compare(device, tinyLlama(), 2, 9);
    },
  );

  it.skipIf(absent)(
    'and with an untied head, as many key/value heads as query heads, and longer sequences',
    async () => {
      await compare(
        device,
        tinyLlama({ tiedEmbeddings: false, heads: 4, kvHeads: 4, headDim: 4, vocabSize: 40, layers: 3 }),
        3,
        16,
      );
    },
  );

  it.skipIf(absent)(
    'scores sequences as the tfjs model does (eval’s and the reference’s log-probabilities), in micro-batches of mixed lengths',
    async () => {
      const model = Llama.create(tinyLlama({ vocabSize: 30 }), 'webgpu-score');
      const random = seeded('webgpu-score');
      const sequences = Array.from({ length: 7 }, () => {
        const n = 3 + Math.floor(random() * 12);
        return {
          ids: Array.from({ length: n }, () => Math.floor(random() * 30)),
          mask: Array.from({ length: n }, (_, t) => (t > 1 ? 1 : 0)),
        };
      });
      const scorer = device.scorer(model);
      const [want, got] = [
        await scoreSequences(model, sequences, { maxTokens: 30, pad: 0, signal: NEVER }),
        await scoreSequences(scorer.score, sequences, { maxTokens: 30, pad: 0, signal: NEVER }),
      ];
      scorer.dispose();
      expect(got.count).toEqual(want.count);
      expect(relativeError(got.sum, want.sum)).toBeLessThan(1e-5);
      expect(new Set(want.sum).size).toBe(7);
      model.dispose();
    },
  );

  it.skipIf(absent)(
    'scores each position’s entropy as the tfjs model does (DAPO’s rollouts, scored there)',
    async () => {
      const config = tinyLlama({ vocabSize: 30 });
      const model = Llama.create(config, 'held-entropy');
      const held = device.model(config, new Map([...model.weights()].map(([name, w]) => [name, w.data])));
      const random = seeded('held-entropy');
      const [batch, length] = [2, 7];
      const draw = () => Int32Array.from({ length: batch * length }, () => Math.floor(random() * 30));
      const [ids, targets] = [draw(), draw()];
      const entropy = new Float32Array(batch * length);
      await (held as Held & { forward(b: object, slot: number, entropy: Float32Array): Promise<Float32Array> }).forward(
        { ids, targets, batch, length },
        0,
        entropy,
      );
      const want = tf.tidy(() => {
        const logp = tf.logSoftmax(model.forward(ids, batch, length));
        return tf.neg(tf.sum(tf.mul(tf.exp(logp), logp), -1)).dataSync() as Float32Array;
      });
      expect(relativeError(entropy, want)).toBeLessThan(1e-5);
      expect(new Set(want).size).toBe(batch * length);
      model.dispose();
    },
  );

  it.skipIf(absent)('and with Qwen2’s biases on q, k and v', async () => {
    await compare(device, tinyLlama({ modelType: 'qwen2', attentionBias: true }), 2, 9);
  });
});

describe('the Llama held on the GPU, its head in chunks', () => {
  // A byte of logits a chunk: 64 rows at a time (the least), so that 150 rows make chunks of 64, 64 and 22.
  const chunked: HeldDevice = {
    ...HELD[0]!,
    model: (config, weights) => new GpuLlama(config, weights, kernels!, { logitBytes: 1 }),
  };
  it.skipIf(chunked.absent)(
    'takes the SFT step the tfjs model takes with the N×V logits never whole, tied and untied',
    async () => {
      await compare(chunked, tinyLlama(), 3, 50);
      await compare(chunked, tinyLlama({ tiedEmbeddings: false, vocabSize: 40 }), 2, 75);
    },
  );
});

describe('the Llama held on the GPU, its tensors split across bindings', () => {
  // 12 KiB a binding: the 40×96 table (15 KiB, in spans of 31 rows, the second not where a binding may start),
  // every projection and their gradients are cut into spans and pieces (AdamW's pieces:
  // test/runtime/webgpu/adamw.test.ts); activations (18×128 at most) and a chunk of 64 rows of logits still fit.
  const split: HeldDevice = {
    ...HELD[0]!,
    model: (config, weights) => new GpuLlama(config, weights, splitKernels!),
  };
  const splitKernels = kernels ? new GpuKernels(kernels.gpu, { bindingBytes: 12 * 1024 }) : null;
  const wide = (tiedEmbeddings: boolean) =>
    tinyLlama({
      hiddenSize: 96,
      intermediateSize: 128,
      vocabSize: 40,
      heads: 4,
      kvHeads: 2,
      headDim: 24,
      tiedEmbeddings,
    });
  it.skipIf(split.absent)(
    'takes tfjs’s SFT step, tied and untied, clips by the same norm, and says which activation is too large',
    async () => {
      await compare(split, wide(true), 2, 9);
      await compare(split, wide(false), 2, 9);

      // Clipping sums squares a piece at a time: the norm of the gradients read back whole, and half of them.
      const model = Llama.create(wide(true), 'split-clip');
      const held = split.model(wide(true), new Map([...model.weights()].map(([n, w]) => [n, w.data])));
      const random = seeded('split-clip');
      const draw = () => Int32Array.from({ length: 18 }, () => Math.floor(random() * 40));
      await sftStep(held, { ids: draw(), targets: draw(), mask: new Float32Array(18).fill(1), batch: 2, length: 9 });
      const before = new Map<string, Float32Array>();
      for (const name of held.grads.keys()) before.set(name, await held.gradient(name));
      const norm = Math.sqrt([...before.values()].reduce((sum, g) => sum + g.reduce((s, x) => s + x * x, 0), 0));
      expect(Math.abs((await held.clipGradients(norm / 2)) - norm) / norm).toBeLessThan(1e-5);
      const halved = new Map([...before].map(([name, g]) => [name, g.map((x) => x / 2)]));
      expect(await gradientGap(held, halved)).toBeLessThan(1e-5);

      const long = { ids: new Int32Array(2 * 64), targets: new Int32Array(2 * 64), batch: 2, length: 64 };
      await expect(held.forward(long, 0)).rejects.toThrow(
        /activation \S+ needs \d+ KiB in one binding, more than this GPU's largest \(12 KiB\)/,
      );
      model.dispose();
    },
  );
});

describe('the Llama held on the GPU, its memory', () => {
  it.skipIf(HELD[0]!.absent)(
    'grows with the tokens, not their square: no T×T attention, no N×V logits kept',
    async () => {
      const config = tinyLlama({ vocabSize: 2000, maxPositions: 512 });
      const model = Llama.create(config, 'memory');
      const weights = new Map([...model.weights()].map(([name, w]) => [name, w.data]));
      const gpu = kernels!.gpu;
      // Bytes an SFT step of one sequence of `length` tokens adds to the model's weights and gradients.
      const activations = async (length: number) => {
        const held = new GpuLlama(config, weights, kernels!, { logitBytes: 1 });
        const before = gpu.memory.now;
        const draw = () => Int32Array.from({ length }, (_, t) => (t * 7919) % config.vocabSize);
        await sftStep(held, { ids: draw(), targets: draw(), mask: new Float32Array(length).fill(1), batch: 1, length });
        const bytes = gpu.memory.now - before;
        held.dispose();
        return bytes;
      };
      const [short, long] = [await activations(256), await activations(512)];
      expect(long / short).toBeLessThanOrEqual(2);
      expect(long).toBeLessThan(512 * config.vocabSize * 4);
      model.dispose();
    },
  );
});
