// Mixed precision on the GPU (runtime/webgpu/precision.ts): the cast to f16 and its overflow flag; 50 steps of
// SFT and of DPO in f16 against the same runs in f32, every logged loss and margin within 1e-3·(1 + |f32's|)
// and gradient norms within 1e-2 (f16 operands carry 11 bits, their products are summed in f32), at lr 3e-3
// (at 1e-2 these tiny runs part ways whatever the arithmetic: docs/experiments.md); dynamic loss scaling
// skipping steps whose gradients overflow, halving and growing the scale as torch.amp's GradScaler does; an
// activation too large for f16 named; the tensor cores' GEMM refused where its check fails.
import { describe, expect, it } from 'vitest';
import { NEVER } from '../../../pipeline/interrupt.ts';
import { seeded } from '../../../core/random.ts';
import { dpoTrainer, lossOf, type Example, type PreferenceSettings } from '../../../trainers/dpo.ts';
import { Llama } from '../../../model/llama.ts';
import { ADAMW_DEFAULTS } from '../../../trainers/optimizer.ts';
import { trainingRun, type RunResult, type RunSettings, type Trainer } from '../../../trainers/run.ts';
import { sftTrainer } from '../../../trainers/sft.ts';
import { sftStep } from '../../../trainers/step.ts';
import type { Sequence } from '../../../model/windows.ts';
import { GpuAdamW } from '../../../runtime/webgpu/adamw.ts';
import { allocate, download, submit, upload } from '../../../runtime/webgpu/buffers.ts';
import { GpuKernels } from '../../../runtime/webgpu/kernel.ts';
import { GpuLlama } from '../../../runtime/webgpu/llama.ts';
import { Cast, OVERFLOW, useTensorCores } from '../../../runtime/webgpu/precision.ts';
import { tinyLlama } from '../../fixtures/llama.ts';
import { absent, f16Values, kernels, relativeError } from '../../fixtures/webgpu.ts';
import { runSettings } from '../../fixtures/held.ts';
import { scoreSequences } from '../../../runtime/scoring.ts';
import { deviceOn } from '../../../runtime/device.ts';

const half = kernels && new GpuKernels(kernels.gpu, { precision: 'f16' });
const config = tinyLlama({ vocabSize: 30 });
const start = () => Llama.create(config, 'webgpu-f16');
/** The starting model's weights as arrays, for a GpuLlama. */
function startWeights(): Map<string, Float32Array> {
  const model = start();
  const weights = new Map([...model.weights()].map(([n, w]) => [n, w.data]));
  model.dispose();
  return weights;
}
const random = seeded('webgpu-f16');
const draw = (n: number) => Array.from({ length: n }, () => 1 + Math.floor(random() * 29));
const completion = (prompt: number[]): Sequence => {
  const reply = draw(2 + Math.floor(random() * 5));
  return { ids: [...prompt, ...reply], mask: [...prompt.map(() => 0), ...reply.map(() => 1)] };
};
const pairs: Example[] = Array.from({ length: 10 }, () => draw(3 + Math.floor(random() * 4))).map((p) => ({
  sequences: [completion(p), completion(p)],
}));
const cfg = {
  seed: 'webgpu-f16',
  batch_size: 4,
  epochs: 20,
  max_steps: 50,
  lr: 0.003,
  warmup: 1,
  min_lr_ratio: 0.1,
  weight_decay: 0.1,
  max_grad_norm: 1,
  checkpoint_every: 100,
  micro_batch_tokens: 24,
  label_smoothing: 0,
} as unknown as PreferenceSettings;
const settings = (k: GpuKernels): RunSettings => runSettings(cfg, { device: deviceOn({ kind: 'gpu', kernels: k }) });

/** The run in f32 and in f16: every step's figures within their tolerance·(1 + |f32's|), and not the same run. */
async function sameRun(trainer: () => Trainer, figures: Record<string, number>): Promise<void> {
  const [f32, f16]: RunResult[] = [
    await trainingRun(settings(kernels!), trainer()),
    await trainingRun(settings(half!), trainer()),
  ];
  expect(f16.metrics).toHaveLength(50);
  for (const [i, row] of f16.metrics.entries()) {
    expect(row.loss_scale, `loss scale at step ${i + 1}`).toBe(2 ** 16);
    expect(row.skipped).toBe(0);
    for (const [key, tolerance] of Object.entries(figures))
      expect(relativeError([row[key]!], [f32.metrics[i]![key]!]), `${key} at step ${i + 1}`).toBeLessThan(tolerance);
  }
  expect(f16.metrics.map((m) => m.loss)).not.toEqual(f32.metrics.map((m) => m.loss));
  expect(f16.metrics.at(-1)!.loss!).toBeLessThan(f16.metrics[0]!.loss! - 0.1); // it learned
  f32.model.dispose();
  f16.model.dispose();
}

describe('mixed precision on the GPU', () => {
  it.skipIf(absent)('casts to f16, flagging what f16 cannot hold and writing 0 for it', async () => {
    const gpu = kernels!.gpu;
    const values = Float32Array.from([0.1, -1, 1 / 3, 65504, 1e-9, 65536, -1e9, NaN, Infinity]);
    const [x, y, flags] = [upload(gpu, values), allocate(gpu, values.length * 2), upload(gpu, new Uint32Array(2))];
    const cast = new Cast(half!);
    submit(gpu, (pass) => cast.encode(pass, x, y, 5, flags, OVERFLOW.backward));
    expect([...new Uint32Array((await download(gpu, flags, 2)).buffer)]).toEqual([0, 0]);
    submit(gpu, (pass) => cast.encode(pass, x, y, values.length, flags, OVERFLOW.backward));
    expect([...new Uint32Array((await download(gpu, flags, 2)).buffer)]).toEqual([0, 1]);
    const got = f16Values(new Uint16Array((await download(gpu, y, Math.ceil(values.length / 2))).buffer));
    // Within f16's rounding (an ulp of 2^-10 relative), the subnormal to 0 or its nearest, the rest 0.
    for (const i of [0, 1, 2, 3]) expect(Math.abs(got[i]! - values[i]!) / Math.abs(values[i]!)).toBeLessThan(2 ** -10);
    expect(Math.abs(got[4]!)).toBeLessThan(1e-7);
    expect(got.slice(5, 9)).toEqual([0, 0, 0, 0]);
  });

  it.skipIf(absent)('runs 50 steps of SFT and of DPO as f32 runs them: losses and margins within 1e-3', async () => {
    await sameRun(
      () =>
        sftTrainer(
          pairs.map((p) => p.sequences[0]!),
          start,
          cfg,
          0,
        ),
      { loss: 1e-3, grad_norm: 1e-2 },
    );
    const model = start();
    const score = (side: number) =>
      scoreSequences(
        model,
        pairs.map((p) => p.sequences[side]!),
        { maxTokens: 64, pad: 0, signal: NEVER },
      );
    const scores = [await score(0), await score(1)];
    model.dispose();
    await sameRun(
      () => dpoTrainer({ examples: pairs, reference: scores, loss: lossOf('dpo', 0.1), cfg, pad: 0, start: start }),
      {
        loss: 1e-3,
        'rewards/margins': 1e-3,
        'logps/chosen': 1e-3,
      },
    );
  });

  it.skipIf(absent)(
    'skips a step whose scaled gradients overflow f16 and halves the scale; doubles it after good steps',
    async () => {
      const weights = startWeights();
      const held = new GpuLlama(config, weights, half!, { lossScale: { initial: 2 ** 40, interval: 3 } });
      const plain = new GpuLlama(config, weights, kernels!);
      const adamw = new GpuAdamW(half!, ADAMW_DEFAULTS);
      const ids = Int32Array.from(draw(18));
      const batch = {
        ids,
        targets: ids.map((t) => (t * 7) % 30),
        mask: new Float32Array(18).fill(1),
        batch: 2,
        length: 9,
      };
      const log: { scale: number; skipped: boolean }[] = [];
      let norm = 0;
      for (let step = 0; log.filter((l) => !l.skipped).length < 4; step++) {
        const [scale, before] = [held.lossScale!, await held.weight('model.layers.0.mlp.up_proj.weight')];
        await sftStep(held, batch);
        norm = await held.clipGradients(0);
        log.push({ scale, skipped: held.skipped });
        if (!held.skipped) {
          submit(half!.gpu, (pass) => adamw.encode(pass, held.parameters(), 0.001));
          continue;
        }
        expect(norm).toBe(Infinity);
        expect(await held.weight('model.layers.0.mlp.up_proj.weight')).toEqual(before);
        expect(step).toBeLessThan(40);
      }
      const first = log.findIndex((l) => !l.skipped);
      expect(first).toBeGreaterThan(0);
      // Halved at every skipped step; after 3 good ones in a row, doubled.
      log.forEach((l, i) => i > 0 && i <= first && expect(l.scale).toBe(log[i - 1]!.scale / 2));
      expect(log.slice(first, first + 3).every((l) => !l.skipped && l.scale === log[first]!.scale)).toBe(true);
      expect(log[first + 3]!.scale).toBe(log[first]!.scale * 2);
      // The gradients unscaled: the same batch's norm as in f32, from the same weights.
      const fresh = new GpuLlama(config, weights, half!);
      await sftStep(fresh, batch);
      await sftStep(plain, batch);
      const [f16Norm, f32Norm] = [await fresh.clipGradients(0), await plain.clipGradients(0)];
      expect(Math.abs(f16Norm - f32Norm) / f32Norm).toBeLessThan(1e-2);
      fresh.dispose();
      held.dispose();
      plain.dispose();
    },
  );

  it.skipIf(absent)(
    'names an activation or a weight too large for f16, and refuses f16 where the adapter has none',
    async () => {
      const plain = startWeights();
      const block = { ids: Int32Array.from(draw(9)), targets: Int32Array.from(draw(9)), batch: 1, length: 9 };
      const refuses = async (weights: Map<string, Float32Array>, error: RegExp) => {
        const held = new GpuLlama(config, weights, half!);
        await expect(held.forward(block, 0)).rejects.toThrow(error);
        held.dispose();
      };
      // Norms' gains of 1e5 make the projections' inputs too large; one weight of 1e5 is itself too large.
      const loud = new Map([...plain].map(([n, w]) => [n, n.endsWith('norm.weight') ? w.map(() => 1e5) : w]));
      await refuses(loud, /an activation of this block overflows f16 .*--precision f32/);
      const up = 'model.layers.0.mlp.up_proj.weight';
      await refuses(
        new Map([...plain, [up, plain.get(up)!.map((x, i) => (i ? x : 1e5))]]),
        /a weight is beyond f16 .*--precision f32/,
      );
      expect(() => new GpuKernels({ ...kernels!.gpu, f16: false }, { precision: 'f16' })).toThrow(
        /offers no shader-f16; use f32/,
      );
    },
  );

  it.skipIf(absent)(
    'keeps the ordinary cores where the tensor cores’ GEMM fails its check, the GPU still usable',
    async () => {
      expect(await useTensorCores(new GpuKernels(kernels!.gpu, { precision: 'f16' }))).toMatch(
        kernels!.gpu.subgroupMatrix ? /^the tensor cores \(/ : /^no subgroup matrices/,
      );
      // Tiles the adapter does not have (lavapipe has none): the shader is refused, and said so.
      const pretend = { ...kernels!.gpu, subgroupMatrix: { m: 16, n: 16, k: 16, subgroup: 8 } };
      const k = new GpuKernels(pretend, { precision: 'f16' });
      expect(await useTensorCores(k)).toMatch(
        /^the ordinary cores \(the tensor cores' GEMM, subgroup matrices of 16×16×16, failed: /,
      );
      expect(k.tensorCores).toBeNull();
      expect(kernels!.gpu.failure).toBeNull();
      const x = upload(kernels!.gpu, Float32Array.from([1, 2, 3]));
      expect([...(await download(kernels!.gpu, x, 3))]).toEqual([1, 2, 3]);
    },
  );
});
