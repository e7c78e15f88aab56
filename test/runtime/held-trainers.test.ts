// Every trainer's run with its model held outside tfjs, on the GPU and on the CPU path's C kernels, against
// the same run on the reference (tfjs on WASM): DPO (sigmoid, against the reference's scores), SimPO (length-normalised, no
// reference), KTO (whose batches score mismatched completions with the current weights) and DAPO (several
// updates a step on rollouts whose old log-probabilities the current weights give, with a KL term). Their
// losses are the same tfjs code on every backend, fed the held model's token log-probs (trainers/step.ts
// logpGradients); its backward takes their gradient from there. Tolerance: every logged figure within
// 1e-4·(1 + |WASM's|), every weight within 1e-4 (f32 on both sides, summed in other orders).
import { describe, expect, it, vi } from 'vitest';
import { NEVER } from '../../pipeline/interrupt.ts';
import { seeded } from '../../core/random.ts';
import { dapoTrainer, type Rollout } from '../../rl/trainer.ts';
import { dpoTrainer, lossOf, type Example, type PreferenceSettings } from '../../trainers/dpo.ts';
import { ktoTrainer } from '../../trainers/kto.ts';
import { DAPO_CLIP } from '../../trainers/losses/index.ts';
import { attachLora, trainableParameters } from '../../model/lora.ts';
import { Llama } from '../../model/llama.ts';
import { sftTrainer } from '../../trainers/sft.ts';
import { trainingRun, type RunResult, type RunSettings, type Trainer } from '../../trainers/run.ts';
import type { Sequence } from '../../model/windows.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { HELD, runSettings, type HeldDevice } from '../fixtures/held.ts';
import { kernels, relativeError } from '../fixtures/webgpu.ts';
import { GpuDecoder } from '../../runtime/webgpu/decode.ts';
import { KVCache } from '../../runtime/decode.ts';
import { GpuLlama } from '../../runtime/webgpu/llama.ts';
import type { LoraConfig } from '../../model/config.ts';
import { scoreSequences } from '../../runtime/scoring.ts';

const config = tinyLlama({ vocabSize: 30 });
const start = () => Llama.create(config, 'webgpu-trainers');
const random = seeded('webgpu-trainers');
const draw = (n: number) => Array.from({ length: n }, () => 1 + Math.floor(random() * 29));
/** A prompt of 3 to 6 tokens and a completion of 2 to 6 after it, the completion's tokens counted. */
const completion = (prompt: number[]): Sequence => {
  const reply = draw(2 + Math.floor(random() * 5));
  return { ids: [...prompt, ...reply], mask: [...prompt.map(() => 0), ...reply.map(() => 1)] };
};
const prompts = Array.from({ length: 10 }, () => draw(3 + Math.floor(random() * 4)));
const pairs: Example[] = prompts.map((p) => ({ sequences: [completion(p), completion(p)] }));
const rows: Example[] = prompts.map((p, i) => ({
  sequences: [completion(p), completion(prompts[(i + 1) % prompts.length]!)],
  label: i % 3 !== 0,
}));

const cfg = {
  seed: 'webgpu-trainers',
  batch_size: 4,
  epochs: 2,
  max_steps: 4,
  lr: 0.01,
  warmup: 1,
  min_lr_ratio: 0.1,
  weight_decay: 0.1,
  max_grad_norm: 1,
  checkpoint_every: 100,
  micro_batch_tokens: 24,
  label_smoothing: 0,
  gamma_beta_ratio: 0.5,
  desirable_weight: 1,
  undesirable_weight: 1,
} as unknown as PreferenceSettings;
const settings = (device: HeldDevice | null, lora?: LoraConfig): RunSettings =>
  runSettings(cfg, { lora, ...device?.settings });

/** The starting model's scores of each side of `examples`: the reference of the losses that have one. */
async function reference(examples: Example[]) {
  const model = start();
  const scores = [
    await scoreSequences(
      model,
      examples.map((e) => e.sequences[0]!),
      { maxTokens: 64, pad: 0, signal: NEVER },
    ),
    await scoreSequences(
      model,
      examples.map((e) => e.sequences[1]!),
      { maxTokens: 64, pad: 0, signal: NEVER },
    ),
  ];
  model.dispose();
  return scores;
}

/** Runs `trainer()` on WASM and on `device` and checks that they logged the same figures and ended with the same weights. */
async function sameRun(
  device: HeldDevice,
  trainer: () => Trainer,
  figures: string[],
  lora?: LoraConfig,
): Promise<RunResult[]> {
  const [onWasm, held] = [
    await trainingRun(settings(null, lora), trainer()),
    await trainingRun(settings(device, lora), trainer()),
  ];
  expect(held.device).toBe(device.device);
  expect(held.metrics).toHaveLength(onWasm.metrics.length);
  expect(new Set(onWasm.metrics.map((m) => m.loss)).size).toBe(onWasm.metrics.length); // it learns: every step's loss differs
  for (const key of figures) expect(Object.keys(onWasm.metrics[0]!)).toContain(key);
  held.metrics.forEach((row, i) => {
    // At step 1 a policy is its reference: every margin is 0 on WASM and within rounding of 0 when held, so
    // the share of margins above 0 is a tie that rounding breaks; from step 2 the margins are apart.
    const tie = (k: string) =>
      k === 'rewards/accuracies' && i === 0 && Math.abs(onWasm.metrics[0]!['rewards/margins']!) < 1e-6;
    for (const key of Object.keys(onWasm.metrics[i]!).filter((k) => k !== 'tokens/s' && !tie(k))) {
      const want = onWasm.metrics[i]![key]!;
      expect(relativeError([row[key]!], [want]), `${key} at step ${i + 1}`).toBeLessThan(1e-4);
    }
  });
  const weights = (m: Llama) => new Map([...m.params, ...trainableParameters(m)]);
  for (const [name, variable] of weights(onWasm.model)) {
    const [want, got] = [variable.dataSync(), weights(held.model).get(name)!.dataSync()];
    let diff = 0;
    for (let i = 0; i < want.length; i++) diff = Math.max(diff, Math.abs(got[i]! - want[i]!));
    expect(diff, name).toBeLessThan(1e-4);
  }
  return [onWasm, held];
}

const dispose = (runs: RunResult[]) => runs.forEach((r) => r.model.dispose());

describe.each(HELD)('every trainer on $name', (device) => {
  const { absent } = device;
  it.skipIf(absent)(
    'DPO against its reference (with and without RPO’s NLL), and SimPO without one, take the steps they take on WASM',
    async () => {
      const scores = await reference(pairs);
      dispose(
        await sameRun(
          device,
          () => dpoTrainer({ examples: pairs, reference: scores, loss: lossOf('dpo', 0.1), cfg, pad: 0, start: start }),
          ['rewards/margins', 'rewards/accuracies', 'logps/chosen'],
        ),
      );
      dispose(
        await sameRun(
          device,
          () =>
            dpoTrainer({ examples: pairs, reference: null, loss: lossOf('simpo', null), cfg, pad: 0, start: start }),
          ['rewards/margins', 'logps/rejected'],
        ),
      );
      // With RPO's NLL anchor: its term's gradient reaches the engine through the same log-probs.
      const anchored = { ...cfg, rpo_alpha: 0.5 };
      dispose(
        await sameRun(
          device,
          () =>
            dpoTrainer({ examples: pairs, reference: scores, loss: lossOf('dpo', 0.1), cfg: anchored, pad: 0, start }),
          ['nll_loss', 'rewards/margins'],
        ),
      );
    },
  );

  it.skipIf(absent)('LoRA: SFT and DPO train only the adapters, their dropout masks the ones WASM draws', async () => {
    const lora: LoraConfig = {
      r: 4,
      alpha: 8,
      dropout: 0.25,
      targetModules: ['q_proj', 'v_proj', 'o_proj', 'down_proj'],
    };
    const withAdapters = () => {
      const m = start();
      attachLora(m, lora, 'webgpu-lora');
      return m;
    };
    const sequences = pairs.map((p) => p.sequences[0]!);
    const [onWasm, held] = await sameRun(
      device,
      () => sftTrainer(sequences, withAdapters, cfg, 0),
      ['loss', 'grad_norm'],
      lora,
    );
    const base = start();
    // The base weights did not move; the adapters did.
    for (const [name, v] of base.params) expect(held!.model.params.get(name)!.dataSync(), name).toEqual(v.dataSync());
    expect([...trainableParameters(held!.model).values()].some((v) => v.dataSync().some((x) => x !== 0))).toBe(true);
    dispose([onWasm!, held!]);
    const noDropout = { ...lora, dropout: 0 };
    const plain = () => {
      const m = start();
      attachLora(m, noDropout, 'webgpu-lora');
      return m;
    };
    dispose(
      await sameRun(
        device,
        () => dpoTrainer({ examples: pairs, reference: null, loss: lossOf('simpo', null), cfg, pad: 0, start: plain }),
        ['rewards/margins'],
        noDropout,
      ),
    );
    base.dispose();
  });

  it.skipIf(absent)('KTO, whose batches score mismatched completions with the weights just updated there', async () => {
    const scores = await reference(rows);
    dispose(
      await sameRun(
        device,
        () => ktoTrainer({ examples: rows, reference: scores, loss: lossOf('kto', null), cfg, pad: 0, start: start }),
        ['kl', 'rewards/chosen'],
      ),
    );
  });

  it.skipIf(absent)(
    'DAPO: updates within a step there, each step’s old log-probabilities from its weights, a KL term to the start',
    async () => {
      const rollouts: Rollout[] = [
        {
          group: 't',
          reward: 1,
          turns: [
            { prompt: [1, 2, 3], generated: [5, 6] },
            { prompt: [1, 2, 3, 5, 6, 4], generated: [9] },
          ],
        },
        { group: 't', reward: 0, turns: [{ prompt: [1, 2, 3], generated: [7, 8] }] },
        { group: 'u', reward: 0, turns: [{ prompt: [4, 4], generated: [11, 12, 13] }] },
        { group: 'u', reward: 1, turns: [{ prompt: [4, 4], generated: [14] }] },
      ];
      const referenceModel = start();
      const trainer = () =>
        dapoTrainer({
          steps: 3,
          start,
          rollouts: async () => ({ rollouts, metrics: { kept_groups: 2 } }),
          pad: 0,
          microBatchTokens: 12,
          clip: { ...DAPO_CLIP, klCoef: 0.1 },
          ppoEpochs: 2,
          miniBatches: 2,
          seed: 'webgpu-dapo',
          reference: referenceModel,
          signal: NEVER,
        });
      const [onWasm] = await sameRun(device, trainer, ['clip_low', 'clip_high', 'kl', 'entropy']);
      expect(onWasm!.metrics.at(-1)!.kl).toBeGreaterThan(0); // the policy moved away from the reference
      referenceModel.dispose();
    },
  );
});

describe('DAPO on the GPU, its readers of the weights', () => {
  /**
   * A 3-step DAPO run on the GPU whose rollouts read a prompt with `read` (the model as it is at that step:
   * its next-token logits, kept in order), and how many weights were copied back from the GPU.
   */
  async function readingRun(
    read: (model: Llama, trained?: Map<string, GPUBuffer>) => Float32Array | Promise<Float32Array>,
    o: { seed: string; decodesOnCpu?: boolean },
  ) {
    const rollouts: Rollout[] = [
      { group: 't', reward: 1, turns: [{ prompt: [1, 2, 3], generated: [5, 6] }] },
      { group: 't', reward: 0, turns: [{ prompt: [1, 2, 3], generated: [7, 8] }] },
    ];
    const seen: Float32Array[] = [];
    const trainer = dapoTrainer({
      steps: 3,
      start,
      rollouts: async (_, model, trained) => {
        seen.push(await read(model, trained));
        return { rollouts, metrics: {} };
      },
      pad: 0,
      microBatchTokens: 12,
      clip: DAPO_CLIP,
      ppoEpochs: 1,
      miniBatches: 1,
      after: async () => ({}),
      signal: NEVER,
      ...o,
    });
    const copied = vi.spyOn(GpuLlama.prototype, 'weight');
    const run = await trainingRun(settings(HELD[0]!), trainer);
    const copies = copied.mock.calls.length;
    copied.mockRestore();
    return { seen, copies, weights: run.model.params.size, dispose: () => run.model.dispose() };
  }

  it.skipIf(HELD[0]!.absent)(
    'decode and score with the weights being trained: nothing copied back between steps, only at the end',
    async () => {
      const run = await readingRun(
        async (model, trained) => {
          // The run hands the buffers it trains in to the trainer's decoders.
          expect(trained).toBeDefined();
          const decoder = new GpuDecoder(model, kernels!, trained);
          const logits = (await decoder.readMany([decoder.create()], [[1, 2, 3]]))[0]!;
          decoder.dispose();
          return logits;
        },
        { seed: 'webgpu-dapo-in-place' },
      );
      // Two copies back of every weight: the last step's checkpoint and the run's end; none a step.
      expect(run.copies).toBe(2 * run.weights);
      // With nothing copied back, each step's decoder saw the weights of that step: the first the start's,
      // then weights that moved.
      const { seen } = run;
      expect(seen).toHaveLength(3);
      const first = new KVCache(start()).read([1, 2, 3]);
      expect(Math.max(...seen[0]!.map((x, i) => Math.abs(x - first[i]!)))).toBeLessThan(1e-4);
      expect(seen[1]).not.toEqual(seen[0]);
      expect(seen[2]).not.toEqual(seen[1]);
      run.dispose();
    },
  );

  it.skipIf(HELD[0]!.absent)(
    'where auto placed the rollouts on the CPU: the weights copied back after every update, for its decoders',
    async () => {
      // A CPU decoder of the tfjs model.
      const run = await readingRun((model) => new KVCache(model).read([1, 2, 3]), {
        seed: 'webgpu-dapo-on-cpu',
        decodesOnCpu: true,
      });
      expect(run.copies).toBeGreaterThanOrEqual(3 * run.weights);
      // Each step's CPU decoder saw that step's weights: they moved from step to step.
      const { seen } = run;
      expect(seen).toHaveLength(3);
      expect(seen[1]).not.toEqual(seen[0]);
      expect(seen[2]).not.toEqual(seen[1]);
      run.dispose();
    },
  );
});
