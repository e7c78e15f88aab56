// Drawing tokens on the GPU (runtime/webgpu/sampling.ts) against sampleToken on the CPU (runtime/sampling.ts), the
// draws every decoder makes: the same token for the same logits, temperature, top-p and u, at temperature 0
// (argmax, the lowest id among equals) and sampled, over vocabularies of 24 to 5,000, peaked and flat logits,
// and logits with many equal values (ties taken in id order). The GPU sums in f32 where the CPU sums in f64, so
// a draw whose u or top-p lies within 1e-5 of a boundary may differ: those are found by moving u and top-p by
// that much on the CPU, and left out (a few of each thousand).
import { describe, expect, it } from 'vitest';
import { seeded, type Random } from '../../../core/random.ts';
import { sampleToken } from '../../../runtime/sampling.ts';
import { download, submit, upload } from '../../../runtime/webgpu/buffers.ts';
import { GpuKernels } from '../../../runtime/webgpu/kernel.ts';
import type { Draw } from '../../../runtime/sampling.ts';
import { Sampler, drawParams } from '../../../runtime/webgpu/sampling.ts';
import { absent, gpu, kernels } from '../../fixtures/webgpu.ts';

/** Rows of logits of one kind. */
function logitsOf(kind: 'normal' | 'peaked' | 'ties', rows: number, vocab: number, random: Random): Float32Array {
  const normal = () => Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
  return Float32Array.from({ length: rows * vocab }, (_, i) => {
    if (kind === 'peaked') return i % vocab === (Math.floor(i / vocab) * 7) % vocab ? 12 : normal() * 2; // one likeliest a row
    if (kind === 'ties') return Math.round(normal() * 2) / 2; // a few values, each many times
    return normal() * 3;
  });
}

/** The tokens the GPU draws for each row of `logits` with `draws`, on `k`'s kernels. */
async function onGpu(k: GpuKernels, logits: Float32Array, draws: Draw[], vocab: number): Promise<number[]> {
  const rows = draws.length;
  const [z, p, tokens] = [
    upload(k.gpu, logits),
    upload(k.gpu, drawParams(draws)),
    upload(k.gpu, new Uint32Array(rows)),
  ];
  submit(k.gpu, (pass) => new Sampler(k).encode(pass, z, p, tokens, rows, vocab));
  const got = [...new Uint32Array((await download(k.gpu, tokens, rows)).buffer)];
  for (const buffer of [z, p, tokens]) buffer.destroy();
  return got;
}

/**
 * Every row's GPU draw against sampleToken's, and how many rows were left out as too near a boundary (u or
 * top-p moved by 1e-5 draws another token on the CPU).
 */
async function compare(k: GpuKernels, logits: Float32Array, draws: Draw[], vocab: number): Promise<number> {
  const got = await onGpu(k, logits, draws, vocab);
  let near = 0;
  draws.forEach((d, r) => {
    const row = logits.subarray(r * vocab, (r + 1) * vocab);
    const cpu = (u: number, topP: number) => sampleToken(row, d.temperature, topP, () => u);
    const want = cpu(d.u, d.topP);
    const nudged = [cpu(d.u * (1 - 1e-5), d.topP), cpu(Math.min(d.u * (1 + 1e-5), 0.999999), d.topP)];
    if (d.topP < 1) nudged.push(cpu(d.u, d.topP * (1 - 1e-5)), cpu(d.u, Math.min(1, d.topP * (1 + 1e-5))));
    if (nudged.some((t) => t !== want)) near++;
    else expect(got[r], `row ${r}: ${JSON.stringify(d)}`).toBe(want);
  });
  return near;
}

/** Draws for `rows` rows: each temperature and top-p in turn, u from `random` as f32 (as the GPU holds it). */
const drawsOf = (rows: number, random: Random, temperatures = [0, 0.7, 1, 1.3], topPs = [1, 0.95, 0.9, 0.5]) =>
  Array.from({ length: rows }, (_, r) => ({
    temperature: temperatures[r % temperatures.length]!,
    topP: topPs[Math.floor(r / temperatures.length) % topPs.length]!,
    u: Math.fround(random()),
  }));

describe('drawing tokens on the GPU', () => {
  it.skipIf(absent)('draws sampleToken’s token for the same logits and u, greedy and sampled, with ties', async () => {
    const random = seeded('webgpu-sampling');
    let [near, rows] = [0, 0];
    for (const [kind, vocab, n] of [
      ['normal', 24, 64],
      ['normal', 1000, 64],
      ['peaked', 1000, 32],
      ['ties', 300, 64],
      ['normal', 5000, 16],
    ] as const) {
      near += await compare(kernels!, logitsOf(kind, n, vocab, random), drawsOf(n, random), vocab);
      rows += n;
    }
    expect(near).toBeLessThan(rows / 50);
  });

  it.skipIf(absent)(
    'takes the lowest id among equal logits at temperature 0, and the k-th of equals by u',
    async () => {
      const vocab = 40;
      const logits = new Float32Array(3 * vocab).fill(-5);
      for (const r of [0, 1, 2]) for (const id of [7, 19, 31]) logits[r * vocab + id] = 3; // three equal likeliest
      const draws = [
        { temperature: 0, topP: 1, u: 0.5 },
        // Top-p 0.5 of a mass of about 3: the nucleus is two of the three equals, u picks the second of them.
        { temperature: 1, topP: 0.5, u: 0.75 },
        { temperature: 1, topP: 1, u: 0 },
      ];
      expect(await onGpu(kernels!, logits, draws, vocab)).toEqual([7, 19, 7]);
      expect(await compare(kernels!, logits, draws, vocab)).toBe(0);
    },
  );

  it.skipIf(absent)('draws in groups of rows where their logits do not fit one binding together', async () => {
    const random = seeded('webgpu-sampling-groups');
    const vocab = 1000; // 4,000 bytes a row: one row a binding of 8 KiB, so 24 dispatches
    const small = new GpuKernels(gpu!, { bindingBytes: 8192 });
    const near = await compare(small, logitsOf('normal', 24, vocab, random), drawsOf(24, random), vocab);
    expect(near).toBeLessThan(2);
  });
});
