// Generation with a KV cache on the GPU (runtime/webgpu/decode.ts) against KVCache on the CPU (runtime/decode.ts):
// the same next-token logits for sequences read together (prompts of different lengths, then a token each
// per step), with grouped-query heads, an untied head and Qwen2's biases, past the cache's first capacity;
// and the same greedy continuation, reusing a conversation's shared prefix; sequences side by side drawing
// their tokens on the GPU as the CPU draws them, and drawing again from logits read back where a constraint
// refuses. Tolerance: logits within 1e-4 of the largest (f32, summed in other orders). The sampled
// sequences are compared token for token: on lavapipe no draw of these few dozen lands within rounding of a
// boundary; another adapter's sums could put one there (webgpu-sampling.test.ts leaves such draws out).
import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';
import { seeded } from '../../../core/random.ts';
import { DecodeWeights, KVCache } from '../../../runtime/decode.ts';
import { Llama } from '../../../model/llama.ts';
import { GpuDecoder } from '../../../runtime/webgpu/decode.ts';
import { SharedDecoder } from '../../../runtime/shared-decoder.ts';
import { tinyLlama } from '../../fixtures/llama.ts';
import { absent, kernels } from '../../fixtures/webgpu.ts';
import type { LlamaConfig } from '../../../model/config.ts';

/** The largest |got − want| over the largest |want|. */
function gap(got: Float32Array, want: Float32Array): number {
  let [diff, largest] = [0, 0];
  for (let i = 0; i < want.length; i++) {
    diff = Math.max(diff, Math.abs(got[i]! - want[i]!));
    largest = Math.max(largest, Math.abs(want[i]!));
  }
  return diff / largest;
}

async function sameSteps(config: LlamaConfig): Promise<void> {
  const random = seeded('webgpu-decode', JSON.stringify(config));
  const model = Llama.create(config, 'webgpu-decode');
  for (const [name, v] of model.params)
    if (name.endsWith('.bias'))
      v.assign(
        tf.tensor(
          Float32Array.from({ length: v.size }, () => random() - 0.5),
          v.shape,
        ),
      );
  const draw = (n: number) => Array.from({ length: n }, () => Math.floor(random() * config.vocabSize));
  const shared = new DecodeWeights(model, null);
  const decoder = new GpuDecoder(model, kernels!);
  const onCpu = [new KVCache(model, shared), new KVCache(model, shared), new KVCache(model, shared)];
  const onGpu = onCpu.map(() => decoder.create());
  // Prompts of 3, 11 and 1 tokens (the CPU reads the long one through its batched pass), then 70 steps of a
  // token each: past 64 positions, where a GPU cache grows and copies what it holds.
  let reads = [draw(3), draw(11), draw(1)];
  for (let step = 0; step < 71; step++) {
    const [want, got] = [KVCache.readMany(onCpu, reads), await decoder.readMany(onGpu, reads)];
    for (let b = 0; b < 3; b++) expect(gap(got[b]!, want[b]!), `sequence ${b}, step ${step}`).toBeLessThan(1e-4);
    reads = [draw(1), draw(1), draw(1)];
  }
  expect(onGpu.map((c) => c.tokens.length)).toEqual([73, 81, 71]);
  expect(onGpu[0]!.capacity).toBeGreaterThan(64);
  onGpu.forEach((c) => c.dispose());
  decoder.dispose();
  shared.dispose();
  model.dispose();
}

/** A tiny model of `positions` with its CPU weights and a GPU decoder, and random tokens drawn from `seed`. */
function decoding(positions: number, seed: string) {
  const config = tinyLlama({ maxPositions: positions });
  const model = Llama.create(config, seed);
  const random = seeded(seed);
  const draw = (n: number) => Array.from({ length: n }, () => Math.floor(random() * config.vocabSize));
  return { model, draw, shared: new DecodeWeights(model, null), decoder: new GpuDecoder(model, kernels!) };
}

describe('generation on the GPU', () => {
  it.skipIf(absent)(
    'reads sequences together to the logits the CPU’s cache gives, step after step and past its first capacity',
    async () => {
      await sameSteps(tinyLlama({ maxPositions: 128 }));
    },
  );

  it.skipIf(absent)('and with an untied head, more key/value heads and Qwen2’s biases', async () => {
    await sameSteps(
      tinyLlama({
        maxPositions: 128,
        tiedEmbeddings: false,
        heads: 4,
        kvHeads: 2,
        headDim: 4,
        attentionBias: true,
        modelType: 'qwen2',
      }),
    );
  });

  it.skipIf(absent)('generates the CPU’s greedy continuation, and the next turn reads only what is new', async () => {
    const model = Llama.create(tinyLlama({ maxPositions: 64 }), 'webgpu-generate');
    const decoder = new GpuDecoder(model, kernels!);
    const [cpu, gpu] = [new KVCache(model), decoder.create()];
    const options = { maxTokens: 12, temperature: 0 };
    const first = [1, 2, 3, 4, 5];
    const want = cpu.generate(first, options);
    expect(await gpu.generate(first, options)).toEqual(want);
    expect(gpu.tokens).toEqual(cpu.tokens);
    const next = [...first, ...want, 7, 8];
    const before = gpu.tokens.length;
    expect(await gpu.generate(next, options)).toEqual(cpu.generate(next, options));
    expect(before).toBeGreaterThan(first.length); // the first turn's tokens were kept, not read again
    expect(gpu.tokens).toEqual(cpu.tokens);
    gpu.dispose();
    decoder.dispose();
    model.dispose();
  });

  it.skipIf(absent)(
    'keeps what its pages hold when the pools grow, forks a cache’s pages, and gives freed pages to new caches',
    async () => {
      const { model, draw, shared, decoder } = decoding(128, 'webgpu-pages');
      // Five prompts of 20 tokens take 10 of the first 16 pages; by 60 tokens each they need 20: the pools
      // grow (and copy the pages held) in the middle of the run.
      const onCpu = Array.from({ length: 5 }, () => new KVCache(model, shared));
      const onGpu = onCpu.map(() => decoder.create());
      let reads = onCpu.map(() => draw(20));
      for (let step = 0; step < 40; step++) {
        const [want, got] = [KVCache.readMany(onCpu, reads), await decoder.readMany(onGpu, reads)];
        for (let b = 0; b < 5; b++) expect(gap(got[b]!, want[b]!), `sequence ${b}, step ${step}`).toBeLessThan(1e-4);
        reads = onCpu.map(() => draw(1));
      }
      const grown = decoder.pooled;
      expect(grown).toBeGreaterThan(16);
      // A fork of 30 of sequence 0's tokens reads on as the CPU's fork does.
      const [cpuFork, gpuFork] = [KVCache.forkOf(onCpu[0]!, 30), decoder.fork(onGpu[0]!, 30)];
      const token = draw(1);
      const [want, got] = [KVCache.readMany([cpuFork], [token]), await decoder.readMany([gpuFork], [token])];
      expect(gap(got[0]!, want[0]!)).toBeLessThan(1e-4);
      // Freed pages go to the next caches: as many again need no more pages.
      [...onGpu, gpuFork].forEach((c) => c.dispose());
      const again = onCpu.map(() => decoder.create());
      const prompts = again.map(() => draw(59));
      const fresh = onCpu.map(() => new KVCache(model, shared));
      const [wantAgain, gotAgain] = [KVCache.readMany(fresh, prompts), await decoder.readMany(again, prompts)];
      for (let b = 0; b < 5; b++) expect(gap(gotAgain[b]!, wantAgain[b]!), `reused, sequence ${b}`).toBeLessThan(1e-4);
      expect(decoder.pooled).toBe(grown);
      again.forEach((c) => c.dispose());
      decoder.dispose();
      shared.dispose();
      model.dispose();
    },
  );

  it.skipIf(absent)(
    'decodes episodes side by side in one step a token (SharedDecoder over the GPU), each as the CPU decodes it alone',
    async () => {
      const config = tinyLlama({ maxPositions: 64 });
      const model = Llama.create(config, 'webgpu-shared');
      const decoder = new GpuDecoder(model, kernels!);
      const steps: number[] = [];
      // Each step reads back the tokens drawn on the GPU (readAndDraw), not the logits (readMany).
      const [read, draw] = [decoder.readMany.bind(decoder), decoder.readAndDraw.bind(decoder)];
      decoder.readMany = (caches, reads) => (steps.push(-1), read(caches, reads));
      decoder.readAndDraw = (caches, reads, draws) => (steps.push(caches.length), draw(caches, reads, draws));
      const shared = new SharedDecoder(model, decoder);
      const prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12], [13]];
      const options = (i: number) => ({
        maxTokens: 10 + i,
        temperature: i ? 1 : 0,
        topP: 0.9,
        random: seeded('shared', i),
      });
      const together = await Promise.all(prompts.map((p, i) => shared.generate(shared.cache(), p, options(i))));
      together.forEach((ids, i) =>
        expect(ids, `sequence ${i}`).toEqual(new KVCache(model).generate(prompts[i]!, options(i))),
      );
      expect(Math.max(...steps)).toBe(3);
      expect(Math.min(...steps)).toBeGreaterThan(0);
      expect(steps.length).toBeLessThan(together.reduce((n, ids) => n + ids.length, 0));
      shared.dispose();
      model.dispose();
    },
  );

  it.skipIf(absent)(
    'draws again on the CPU, from logits read back, where the constraint refuses the token drawn on the GPU',
    async () => {
      const config = tinyLlama({ maxPositions: 64 });
      const model = Llama.create(config, 'webgpu-constrained');
      const decoder = new GpuDecoder(model, kernels!);
      const readBack: number[] = [];
      const draw = decoder.readAndDraw.bind(decoder);
      decoder.readAndDraw = async (caches, reads, draws) => {
        const drawn = await draw(caches, reads, draws);
        return { ...drawn, logits: (b) => (readBack.push(b), drawn.logits(b)) };
      };
      const shared = new SharedDecoder(model, decoder);
      // Odd tokens only, after the first two: the unconstrained draws are refused about half the time.
      const constraint = { allows: (out: readonly number[], id: number) => out.length < 2 || id % 2 === 1 };
      const options = (i: number) => ({ maxTokens: 16, temperature: 1, random: seeded('constrained', i), constraint });
      const prompts = [
        [1, 2, 3],
        [4, 5],
        [6, 7, 8, 9],
      ];
      const together = await Promise.all(prompts.map((p, i) => shared.generate(shared.cache(), p, options(i))));
      together.forEach((ids, i) => {
        expect(ids, `sequence ${i}`).toEqual(new KVCache(model).generate(prompts[i]!, options(i)));
        expect(ids.slice(2).every((id) => id % 2 === 1)).toBe(true);
      });
      expect(readBack.length).toBeGreaterThan(3);
      // A row's logits are there until the next read, and not after.
      const cache = decoder.create();
      const first = await decoder.readAndDraw([cache], [[1, 2]], [{ temperature: 0, topP: 1, u: 0 }]);
      const logits = await first.logits(0);
      expect(first.tokens[0]).toBe(logits.indexOf(Math.max(...logits)));
      await decoder.readAndDraw([cache], [[3]], [{ temperature: 0, topP: 1, u: 0 }]);
      expect(() => first.logits(0)).toThrow(/after the next read/);
      shared.dispose();
      model.dispose();
    },
  );

  it.skipIf(absent)(
    'reads prompts of more tokens than a pass takes in several passes, to the same logits',
    async () => {
      const { model, draw, shared, decoder } = decoding(256, 'webgpu-passes');
      // 600 tokens: more than a pass's 512, so the second prompt is split between two passes.
      const reads = [draw(250), draw(250), draw(100)];
      const onCpu = reads.map(() => new KVCache(model, shared));
      const onGpu = reads.map(() => decoder.create());
      const [want, got] = [KVCache.readMany(onCpu, reads), await decoder.readMany(onGpu, reads)];
      for (let b = 0; b < 3; b++) expect(gap(got[b]!, want[b]!), `sequence ${b}`).toBeLessThan(1e-4);
      expect(onGpu.map((c) => c.tokens.length)).toEqual([250, 250, 100]);
      // Drawn in those passes too: each sequence's greedy token, and its logits read back from its own pass's.
      const again = reads.map(() => decoder.create());
      const greedy = reads.map(() => ({ temperature: 0, topP: 1, u: 0 }));
      const drawn = await decoder.readAndDraw(again, reads, greedy);
      for (let b = 0; b < 3; b++) {
        expect(gap(await drawn.logits(b), want[b]!), `sequence ${b}, read back`).toBeLessThan(1e-4);
        expect(drawn.tokens[b], `sequence ${b}`).toBe(want[b]!.indexOf(Math.max(...want[b]!)));
      }
      decoder.dispose();
      shared.dispose();
      model.dispose();
    },
  );
});
