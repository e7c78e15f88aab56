// SFT through the trainer's run (trainers/run.ts) with `--backend webgpu`'s kernels: its steps on the GPU give
// the metrics and the weights of the same run on WASM (loss and gradient norm within 1e-4 relative, weights
// within 1e-4), with micro-batches, clipping, warmup and decay; and a GPU run stopped halfway resumes from its
// checkpoint to the weights of a straight GPU run, exactly.
import { describe, expect, it } from 'vitest';
import { NEVER } from '../../../pipeline/interrupt.ts';
import { seeded } from '../../../core/random.ts';
import { Llama } from '../../../model/llama.ts';
import { trainingRun, type RunSettings } from '../../../trainers/run.ts';
import type { TrainingSettings } from '../../../trainers/settings.ts';
import { sftTrainer } from '../../../trainers/sft.ts';
import type { Sequence } from '../../../model/windows.ts';
import { tinyLlama } from '../../fixtures/llama.ts';
import { tempDir } from '../../fixtures/pipeline.ts';
import { quietLogger } from '../../fixtures/toy-stages.ts';
import { absent, kernels } from '../../fixtures/webgpu.ts';
import { deviceOn } from '../../../runtime/device.ts';

const config = tinyLlama({ vocabSize: 30 });
const random = seeded('webgpu-sft');
// Sequences of 5 to 14 tokens, the loss on their second half: micro-batches of ≤ 24 padded tokens.
const sequences: Sequence[] = Array.from({ length: 12 }, () => {
  const n = 5 + Math.floor(random() * 10);
  return {
    ids: Array.from({ length: n }, () => 1 + Math.floor(random() * 29)),
    mask: Array.from({ length: n }, (_, i) => (i >= n / 2 ? 1 : 0)),
  };
});
const cfg = {
  seed: 'webgpu-sft',
  batch_size: 4,
  epochs: 2,
  max_steps: 5,
  lr: 0.01,
  warmup: 2,
  min_lr_ratio: 0.1,
  weight_decay: 0.1,
  max_grad_norm: 0.5,
  checkpoint_every: 100,
  micro_batch_tokens: 24,
} as unknown as TrainingSettings;
const trainer = (steps?: number) => ({
  ...sftTrainer(sequences, () => Llama.create(config, 'webgpu-sft'), cfg, 0),
  ...(steps ? { steps } : {}),
});
const settings = (cache: string, gpu: boolean, signal = NEVER): RunSettings => ({
  config: cfg,
  cache,
  key: 'k',
  tokenizer: { 'tokenizer.json': '{}' },
  context: 16,
  placeholders: null,
  signal,
  log: quietLogger(),
  device: deviceOn(gpu ? { kind: 'gpu', kernels: kernels! } : { kind: 'reference' }),
});
const weightsOf = (m: Llama) => new Map([...m.params].map(([name, v]) => [name, v.dataSync() as Float32Array]));

describe('SFT on the GPU', () => {
  it.skipIf(absent)('takes the steps the WASM run takes: the same losses, gradient norms and weights', async () => {
    const [onCpu, onGpu] = [
      await trainingRun(settings(tempDir(), false), trainer()),
      await trainingRun(settings(tempDir(), true), trainer()),
    ];
    expect(onGpu.metrics).toHaveLength(5);
    expect(new Set(onGpu.metrics.map((m) => m.loss)).size).toBe(5); // it learns: every step's loss differs
    onGpu.metrics.forEach((row, i) => {
      for (const key of ['loss', 'grad_norm', 'learning_rate'])
        expect(
          Math.abs(row[key]! - onCpu.metrics[i]![key]!) / Math.abs(onCpu.metrics[i]![key]!),
          `${key} at step ${i + 1}`,
        ).toBeLessThan(1e-4);
    });
    expect(onCpu.metrics.some((m) => m.grad_norm! > 0.5)).toBe(true); // clipping was in play
    const [a, b] = [weightsOf(onCpu.model), weightsOf(onGpu.model)];
    for (const [name, w] of a) {
      let diff = 0;
      for (let i = 0; i < w.length; i++) diff = Math.max(diff, Math.abs(w[i]! - b.get(name)![i]!));
      expect(diff, name).toBeLessThan(1e-4);
    }
    onCpu.model.dispose();
    onGpu.model.dispose();
  });

  it.skipIf(absent)('resumes a stopped GPU run from its checkpoint to the straight run’s weights', async () => {
    const straight = await trainingRun(settings(tempDir(), true), trainer());
    const cache = tempDir();
    (
      await trainingRun({ ...settings(cache, true), config: { ...cfg, checkpoint_every: 2 } }, trainer(3))
    ).model.dispose();
    const resumed = await trainingRun({ ...settings(cache, true), config: { ...cfg, checkpoint_every: 2 } }, trainer());
    expect(resumed.resumedFrom).toBe(3);
    expect(weightsOf(resumed.model)).toEqual(weightsOf(straight.model));
    straight.model.dispose();
    resumed.model.dispose();
  });
});
