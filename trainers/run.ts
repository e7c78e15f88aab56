// The one training run every trainer shares (sft.ts, dpo.ts, kto.ts, dapo.ts each only say what a step's batch and loss
// are): AdamW with warmup and cosine decay, gradient clipping, a metrics line per step, and checkpoints every
// N steps in a folder that outlives the run, so a run killed at any point resumes from its last checkpoint and
// ends where an uninterrupted run ends.
import * as tf from '@tensorflow/tfjs-core';
import { appendFileSync, existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { copyFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Interrupted, interrupted } from '../pipeline/interrupt.ts';
import type { Logger } from '../pipeline/log.ts';
import { loadCheckpoint, saveCheckpoint } from '../model/checkpoint.ts';
import type { TokenizerFiles } from '../model/hf.ts';
import { dropoutMask, mergeLora, saveAdapter, trainableParameters } from '../model/lora.ts';
import type { TrainingSettings } from './settings.ts';
import { hashJson } from '../pipeline/hash.ts';
import type { Llama } from '../model/llama.ts';
import type { Placeholders } from '../model/placeholders.ts';
import type { CpuKernels } from '../runtime/cpu/kernels.ts';
import { engineName, type Device } from '../runtime/device.ts';
import { trainingEngine } from '../runtime/placement.ts';
import { ADAMW_DEFAULTS, AdamW, learningRate } from './optimizer.ts';
import { logpGradients, onModel, optimizerStep, type MicroBatch, type StepResult } from './step.ts';
import type { GpuKernels } from '../runtime/webgpu/kernel.ts';
import type { TokenBlock } from '../model/windows.ts';
import type { LoraConfig } from '../model/config.ts';
import { arraysOf, type HeldModel } from '../runtime/held.ts';
import type { EntropyScorer } from '../runtime/scoring.ts';

/**
 * This run's folder in the stage's cache, named by `key` (its config and data): a rerun after a kill resumes
 * there; folders of runs with other settings or data are removed.
 */
function runFolder(cache: string, key: string): string {
  const name = `run-${key.slice(0, 16)}`;
  for (const f of existsSync(cache) ? readdirSync(cache) : [])
    if (f.startsWith('run-') && f !== name) rmSync(join(cache, f), { recursive: true, force: true });
  mkdirSync(join(cache, name), { recursive: true });
  return join(cache, name);
}

/** A run whose loss stopped being a number: its weights are no model (a refresh night rejects the candidate). */
export class Diverged extends Error {
  override name = 'Diverged';
}

export interface StepBatch {
  /** The loss to minimise on this step's batch, and scalars to report beside it, in micro-batches that add up to the batch's; none: the step makes no update. */
  parts: MicroBatch[];
  /** Tokens in the batch that are not padding. */
  tokens: number;
  /**
   * More optimiser updates on the same batch after the first (reinforcement learning: several epochs and
   * mini-batches over one batch of rollouts), each built when it is reached; their metrics are averaged
   * with the first's. A checkpoint falls between steps, never inside one.
   */
  more?: (() => MicroBatch[])[];
  /** Figures of the batch itself (rewards of the rollouts, ...), logged beside the loss's. */
  metrics?: Record<string, number>;
}

/**
 * The weights being trained as a trainer may read them between steps, where the run holds them on an engine
 * (on the reference, the tfjs model is them, and this is empty).
 */
export interface Held {
  /** Scores with the weights as they are now: log-probs and entropy (DAPO's old policy). */
  score?: EntropyScorer;
  /** The GPU buffers the weights are trained in (without LoRA): a GPU decoder reads them in place. */
  trained?: Map<string, GPUBuffer>;
}

/** What a trainer (sft.ts, dpo.ts, kto.ts, dapo.ts) brings to a run: its length, its start, and each step's batch. */
export interface Trainer {
  steps: number;
  /** The model to start from when there is no checkpoint. */
  start(): Llama;
  /**
   * The batch of step `step` (0-based), a function of the step alone so a resumed run sees the same data, and
   * its loss on `model`. `held`: the weights as the run holds them, for a batch that reads the current weights
   * (DAPO's rollouts and their old log-probs).
   */
  batch(step: number, model: Llama, held: Held): StepBatch | Promise<StepBatch>;
  /** The progress bar's label. */
  label: string;
  /**
   * After step `step`'s update (0-based), figures of the model as it now is, logged with the step
   * (reinforcement learning's validation). Where `held.trained` is given, `model`'s tfjs weights are the last
   * checkpoint's: read the model through decoders of those buffers (as validation's episodes do).
   */
  after?(step: number, model: Llama, held: Held): Promise<Record<string, number>>;
  /**
   * batch() reads `model`'s weights beyond its loss (DAPO's rollouts, through decoders of it): a held run
   * copies them back to `model` after every update, as after() needs too, unless its decoders read them where
   * they train (`held.trained`: the GPU without LoRA). Scoring goes through `held.score`, and needs no copy.
   */
  readsWeights?: boolean;
  /**
   * batch()'s decoders run on the CPU though the run holds the model on the GPU (auto placed decoding there:
   * runtime/placement.ts): they read `model`'s tfjs weights, copied back after every update.
   */
  decodesOnCpu?: boolean;
}

/** What a stage brings to a run: its settings, where runs are kept, and what the run is keyed by. */
export interface RunSettings {
  config: TrainingSettings;
  /** The stage's cache folder: the run's checkpoints and metrics live in a folder of it. */
  cache: string;
  /** Everything the run's result depends on (the stage's key: config, data, code version): a new key starts afresh. */
  key: string;
  /** The tokenizer's files, saved with every checkpoint. */
  tokenizer: TokenizerFiles;
  /** The sequence length the run trains at, saved with every checkpoint (prefab_context). */
  context: number;
  /** The masking its data was read with, saved with every checkpoint. */
  placeholders: Placeholders;
  /** LoRA's settings when the trainer's model has adapters (only they are trained); absent: every weight is. */
  lora?: LoraConfig;
  /** The model the adapters sit on, as adapter_config.json's base_model_name_or_path names it. */
  base?: string;
  /** The stage's signal: aborted, the run stops at the next step boundary. */
  signal: AbortSignal;
  log: Logger;
  /** Where the run trains: its engine for this model and micro-batch (runtime/placement.ts trainingEngine). */
  device: Device;
}

export interface RunResult {
  model: Llama;
  /** Where the steps ran: webgpu, cpu (the C kernels) or wasm (the reference). */
  device: string;
  metrics: MetricsRow[];
  /** The step the run resumed from (0: it started afresh). */
  resumedFrom: number;
  /**
   * Writes the finished run into the stage's folder: the model in Hugging Face's layout (`model/`, without the
   * optimiser; `info` goes into its trainer_state.json; a LoRA run's adapters merged into it, and saved as
   * they are in `adapter/`, PEFT's layout) and every step's metrics. Frees the model; returns the means of
   * the last steps' metrics.
   */
  save(out: string, info: Record<string, unknown>): Promise<MetricsRow>;
}

type MetricsRow = Record<string, number>;

const STEP_DIR = /^step-(\d+)$/;

/** The latest complete checkpoint in `dir`: folders appear whole (written aside, then renamed). */
function latestCheckpoint(dir: string): string | null {
  if (!existsSync(dir)) return null;
  const steps = readdirSync(dir)
    .flatMap((f) => (STEP_DIR.test(f) ? [Number(STEP_DIR.exec(f)![1])] : []))
    .sort((a, b) => b - a);
  return steps.length ? join(dir, checkpointName(steps[0]!)) : null;
}

const checkpointName = (step: number) => `step-${String(step).padStart(6, '0')}`;

/** The metrics of steps up to `upTo`; a line torn by a kill mid-write is past the checkpoint and is dropped. */
function readMetrics(path: string, upTo: number): MetricsRow[] {
  if (!existsSync(path)) return [];
  const rows: MetricsRow[] = [];
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    try {
      const row = JSON.parse(line) as MetricsRow;
      if (row.step! <= upTo) rows.push(row);
    } catch {
      // empty or torn
    }
  }
  return rows;
}

/**
 * Trains to `trainer.steps`, resuming from the latest checkpoint of the run keyed by `settings.key`. Every step
 * boundary is a safe point: when `settings.signal` is aborted, the run saves a checkpoint there and throws
 * Interrupted, so the next run resumes from that step.
 */
export async function trainingRun(settings: RunSettings, trainer: Trainer): Promise<RunResult> {
  const dir = runFolder(settings.cache, settings.key);
  const run = {
    ...trainer,
    dir,
    seed: settings.config.seed,
    log: settings.log,
    files: {
      tokenizer: settings.tokenizer,
      context: settings.context,
      placeholders: settings.placeholders,
      lora: settings.lora,
    },
  };
  const metricsPath = join(run.dir, 'metrics.jsonl');
  const last = latestCheckpoint(run.dir);
  let model: Llama;
  let optimizer: AdamW;
  let done = 0;
  const s = settings.config;
  const adamw = { ...ADAMW_DEFAULTS, weightDecay: s.weight_decay };
  if (last) {
    const loaded = loadCheckpoint(last);
    model = loaded.model;
    optimizer = new AdamW(trainableParameters(model), adamw);
    loaded.restoreOptimizer(optimizer);
    done = loaded.state?.step ?? 0;
    run.log.info('resuming from checkpoint', { checkpoint: last, step: done, of: run.steps });
  } else {
    model = run.start();
    optimizer = new AdamW(trainableParameters(model), adamw);
  }
  const metrics = readMetrics(metricsPath, done);
  writeFileSync(metricsPath, metrics.map((m) => JSON.stringify(m) + '\n').join(''));
  // Under auto, the GPU or the CPU, whichever runs a micro-batch's forward faster (runtime/placement.ts).
  const block = { rows: Math.floor(s.micro_batch_tokens / settings.context), length: settings.context };
  const engine = await trainingEngine(settings.device, model, block, run.log);
  const held =
    engine.kind === 'gpu'
      ? await gpuRun(engine.kernels, model, optimizer, !trainer.decodesOnCpu)
      : engine.kind === 'cpu'
        ? await cpuRun(engine.kernels, model, optimizer)
        : null;
  const view: Held = { score: held?.score, trained: held?.trained };
  let saved = done;
  const save = async (step: number) => {
    await held?.sync();
    saved = step;
    saveCheckpoint(join(run.dir, checkpointName(step)), {
      model,
      ...run.files,
      optimizer,
      state: { step, totalSteps: run.steps, seed: run.seed },
    });
    // Keep the newest two: the one just written, and the one before in case this one is found damaged.
    for (const f of readdirSync(run.dir)
      .filter((f) => STEP_DIR.test(f))
      .sort()
      .slice(0, -2))
      rmSync(join(run.dir, f), { recursive: true, force: true });
  };
  const progress = run.log.progress(run.label, run.steps, done);
  const schedule = { peak: s.lr, warmup: s.warmup, total: run.steps, minRatio: s.min_lr_ratio };
  for (let step = done; step < run.steps; step++) {
    if (await interrupted(settings.signal)) {
      if (step > saved) await save(step);
      progress.done();
      throw new Interrupted(
        `${run.label}: stopped at step ${step} of ${run.steps}; checkpoint kept, the next run resumes from step ${step}`,
      );
    }
    const started = performance.now();
    const lr = learningRate(step, schedule);
    const batch = await run.batch(step, model, view);
    // Adapters' dropout, drawn anew each step and the same on a resumed run.
    const dropoutSeed = settings.lora ? parseInt(hashJson({ seed: run.seed, step }).slice(0, 8), 16) : null;
    let result: StepResult;
    if (held) {
      result = await updates(batch, (parts) => held.step(parts, lr, s.max_grad_norm, dropoutSeed));
      if ((trainer.readsWeights || trainer.after) && !held.trained) await held.sync('weights');
    } else {
      model.dropoutSeed = dropoutSeed;
      result = await updates(batch, (parts) =>
        optimizerStep(
          { params: trainableParameters(model) },
          optimizer,
          parts.map((p) => onModel(p, model)),
          lr,
          s.max_grad_norm,
        ),
      );
      model.dropoutSeed = null;
    }
    const seconds = (performance.now() - started) / 1000;
    const after = run.after ? await run.after(step, model, view) : {};
    const row: MetricsRow = {
      step: step + 1,
      loss: result.loss,
      ...result.metrics,
      ...batch.metrics,
      grad_norm: result.gradNorm,
      learning_rate: lr,
      'tokens/s': Math.round(batch.tokens / seconds),
      ...after,
    };
    if (!Number.isFinite(result.loss))
      throw new Diverged(
        `${run.label}: the loss is ${result.loss} at step ${step + 1}; lower lr (now ${s.lr}) or max_grad_norm`,
      );
    metrics.push(row);
    appendFileSync(metricsPath, JSON.stringify(row) + '\n');
    if ((step + 1) % s.checkpoint_every === 0 || step + 1 === run.steps) await save(step + 1);
    progress.tick();
  }
  progress.done();
  if (run.steps === 0 && !last) await save(0);
  await held?.sync();
  return {
    model,
    device: engineName(engine),
    metrics,
    resumedFrom: done,
    async save(out, info) {
      if (settings.lora) {
        saveAdapter(join(out, 'adapter'), model, settings.lora, settings.base ?? '../model');
        mergeLora(model);
      }
      saveCheckpoint(join(out, 'model'), {
        model,
        ...run.files,
        lora: undefined,
        state: { step: run.steps, totalSteps: run.steps, seed: run.seed, info },
      });
      await copyFile(metricsPath, join(out, 'metrics.jsonl'));
      model.dispose();
      return finalMetrics(metrics);
    },
  };
}

/**
 * One update of a held model from `parts`: each micro-batch's blocks scored by its forward, the loss and the
 * loss's gradient by the log-probs from the trainer's tfjs code (trainers/step.ts logpGradients), the backward
 * from there, the gradients clipped, then `apply` (AdamW where the model is). `dropoutSeed`: LoRA's dropout
 * this step (null: none), as on WASM.
 */
async function heldStep(
  held: HeldModel,
  parts: MicroBatch[],
  maxGradNorm: number,
  dropoutSeed: number | null,
  apply: () => void,
): Promise<StepResult> {
  held.dropout = dropoutSeed === null ? null : { seed: dropoutSeed, mask: dropoutMask };
  held.zeroGradients();
  const result: StepResult = { loss: 0, gradNorm: 0, metrics: {} };
  for (const part of parts) {
    const logps: Float32Array[] = [];
    for (const [slot, block] of part.blocks.entries()) logps.push(await held.forward(block, slot));
    const { loss, metrics, grads } = logpGradients(part, logps);
    result.loss += loss;
    for (const [k, x] of Object.entries(metrics)) result.metrics[k] = (result.metrics[k] ?? 0) + x;
    for (const [slot, dlogp] of grads.entries()) await held.backward(slot, dlogp);
  }
  const lossScale = held.lossScale;
  result.gradNorm = await held.clipGradients(maxGradNorm);
  // Mixed precision: a step whose gradients overflowed f16 is not taken (the loss scale is halved instead).
  if (lossScale !== undefined) Object.assign(result.metrics, { loss_scale: lossScale, skipped: held.skipped ? 1 : 0 });
  if (!held.skipped) apply();
  return result;
}

/** A trained weight as held outside tfjs, with AdamW's moments. */
type HeldState = { name: string; value: Float32Array; m: Float32Array; v: Float32Array };

/** The model's weights (the adapters' with LoRA) and, with `all`, AdamW's moments and step, into tfjs. */
function syncInto(model: Llama, optimizer: AdamW, from: HeldState[], step: number, what: 'weights' | 'all'): void {
  const trained = trainableParameters(model);
  const put = (variable: tf.Variable, values: Float32Array) =>
    tf.tidy(() => variable.assign(tf.tensor(values, variable.shape)));
  for (const p of from) {
    put(trained.get(p.name)!, p.value);
    if (what === 'weights') continue;
    put(optimizer.m.get(p.name)!, p.m);
    put(optimizer.v.get(p.name)!, p.v);
  }
  if (what === 'all') optimizer.step = step;
}

/** The model's adapters as plain arrays, for a model held outside tfjs. */
const adapterWeights = (model: Llama) =>
  new Map(
    [...model.adapters].map(([module, ad]) => [
      module,
      {
        a: ad.a.dataSync() as Float32Array,
        b: ad.b.dataSync() as Float32Array,
        r: ad.a.shape[0]!,
        scale: ad.scale,
        dropout: ad.dropout,
        index: ad.index,
      },
    ]),
  );

/**
 * Scores with a held model's weights as they are now, with each position's entropy, without dropout. In slot
 * 0: a trainer scores in batch(), between steps, when no forward there waits for its backward (a slot of its
 * own would hold a third set of activations for the whole run).
 */
const scorerOf =
  (held: HeldModel & { forward(b: TokenBlock, slot: number, entropy: Float32Array): Promise<Float32Array> }) =>
  async (b: TokenBlock): ReturnType<EntropyScorer> => {
    const [entropy, dropout] = [new Float32Array(b.batch * b.length), held.dropout];
    held.dropout = null;
    const logps = await held.forward(b, 0, entropy).finally(() => (held.dropout = dropout));
    return { logps, entropy };
  };

/** Where a run's updates are made when not in tfjs: one step, and the state copied back (`sync`). */
interface HeldRun {
  /**
   * The GPU buffers the weights train in, where the trainer's decoders read them in place (the GPU without
   * LoRA), so that no copy back is needed between steps.
   */
  trained?: Map<string, GPUBuffer>;
  step(parts: MicroBatch[], lr: number, maxGradNorm: number, dropoutSeed: number | null): Promise<StepResult>;
  /** The held weights into `model`, and with `all` AdamW's moments and step into the optimiser. */
  sync(what?: 'weights' | 'all'): Promise<void>;
  /** Scores with the held weights as they are now, where the held model can give entropy too. */
  score?: EntropyScorer;
}

/**
 * The run's updates on the GPU, starting from the model's and the optimiser's state (a resumed run's); `sync`
 * copies the state back before every checkpoint and at the end, so checkpoints, resumption and the saved model
 * are as the reference's. With LoRA the adapters ride on frozen weights, and only they are trained (as
 * trainableParameters says). `gpuReaders`: the trainer's decoders are the GPU's, and without LoRA read the
 * training buffers in place.
 */
async function gpuRun(kernels: GpuKernels, model: Llama, optimizer: AdamW, gpuReaders: boolean): Promise<HeldRun> {
  const { GpuLlama } = await import('../runtime/webgpu/llama.ts');
  const { GpuAdamW } = await import('../runtime/webgpu/adamw.ts');
  const { download, submit } = await import('../runtime/webgpu/buffers.ts');
  const onGpu = new GpuLlama(model.config, arraysOf(model.params), kernels, { adapters: adapterWeights(model) });
  // Without LoRA, decoders of the model (DAPO's rollouts and validation) read the training buffers themselves;
  // with it they fold the adapters into a copy of the tfjs model's weights, copied back after every step.
  const inPlace = model.adapters.size === 0 && gpuReaders;
  const adamw = new GpuAdamW(kernels, optimizer.options);
  adamw.step = optimizer.step;
  const [m, v] = [arraysOf(optimizer.m), arraysOf(optimizer.v)];
  for (const p of onGpu.parameters()) {
    kernels.gpu.device.queue.writeBuffer(p.m, 0, m.get(p.name)!);
    kernels.gpu.device.queue.writeBuffer(p.v, 0, v.get(p.name)!);
  }
  return {
    trained: inPlace ? onGpu.weights : undefined,
    step: (parts, lr, maxGradNorm, dropoutSeed) =>
      heldStep(onGpu, parts, maxGradNorm, dropoutSeed, () =>
        submit(kernels.gpu, (pass) => adamw.encode(pass, onGpu.parameters(), lr)),
      ),
    score: scorerOf(onGpu),
    async sync(what = 'all') {
      const none = new Float32Array(0);
      const read = async (buffer: GPUBuffer, length: number) =>
        what === 'all' ? download(kernels.gpu, buffer, length) : none;
      const state: HeldState[] = [];
      for (const p of onGpu.parameters())
        state.push({
          name: p.name,
          value: await onGpu.weight(p.name),
          m: await read(p.m, p.length),
          v: await read(p.v, p.length),
        });
      syncInto(model, optimizer, state, adamw.step, what);
    },
  };
}

/** The run's updates on the CPU path's C kernels, as gpuRun's on the GPU. */
async function cpuRun(k: CpuKernels, model: Llama, optimizer: AdamW): Promise<HeldRun> {
  const { CpuLlama } = await import('../runtime/cpu/llama.ts');
  const { CpuAdamW } = await import('../runtime/cpu/adamw.ts');
  const onCpu = new CpuLlama(model.config, arraysOf(model.params), k, { adapters: adapterWeights(model) });
  const adamw = new CpuAdamW(optimizer.options, k);
  adamw.step = optimizer.step;
  const [m, v] = [arraysOf(optimizer.m), arraysOf(optimizer.v)];
  for (const p of onCpu.parameters()) {
    p.m.set(m.get(p.name)!);
    p.v.set(v.get(p.name)!);
  }
  return {
    step: (parts, lr, maxGradNorm, dropoutSeed) =>
      heldStep(onCpu, parts, maxGradNorm, dropoutSeed, () => adamw.apply(onCpu.parameters(), lr)),
    score: scorerOf(onCpu),
    async sync(what = 'all') {
      syncInto(model, optimizer, onCpu.parameters(), adamw.step, what);
    },
  };
}

/** Every update a step's batch asks for, in order; the mean of their losses, metrics and gradient norms. No parts: no update. */
async function updates(
  batch: StepBatch,
  update: (parts: MicroBatch[]) => StepResult | Promise<StepResult>,
): Promise<StepResult> {
  const results: StepResult[] = [];
  if (batch.parts.length) results.push(await update(batch.parts));
  for (const next of batch.parts.length ? (batch.more ?? []) : []) {
    const parts = next(); // built now, after the update before it
    if (parts.length) results.push(await update(parts));
  }
  if (results.length === 0) return { loss: 0, gradNorm: 0, metrics: {} };
  const mean = (f: (r: StepResult) => number) => results.reduce((a, r) => a + f(r), 0) / results.length;
  const keys = [...new Set(results.flatMap((r) => Object.keys(r.metrics)))];
  // A skipped update's norm (mixed precision's overflow: Infinity) is left out, unless every one was skipped.
  const norms = results.map((r) => r.gradNorm).filter(Number.isFinite);
  return {
    loss: mean((r) => r.loss),
    gradNorm: norms.length ? norms.reduce((a, b) => a + b, 0) / norms.length : Infinity,
    metrics: Object.fromEntries(keys.map((k) => [k, mean((r) => r.metrics[k] ?? 0)])),
  };
}

/** Optimiser steps for `epochs` passes over `examples` in batches, at most `maxSteps`. */
export function stepsFor(
  cfg: { epochs: number; batch_size: number; max_steps: number | null },
  examples: number,
): number {
  return Math.min(cfg.max_steps ?? Infinity, Math.ceil((cfg.epochs * examples) / cfg.batch_size));
}

/**
 * Means of each metric over the last `n` rows: what a stage reports as its final figures. A value that is
 * not finite (the gradient norm of a step mixed precision skipped) is left out of its mean.
 */
export function finalMetrics(rows: MetricsRow[], n = 10): MetricsRow {
  const tail = rows.slice(-n);
  const out: MetricsRow = {};
  for (const key of Object.keys(tail[0] ?? {})) {
    // A metrics file read back has null where an infinity was written.
    const values = tail.map((r) => r[key]).filter((v): v is number => typeof v === 'number' && Number.isFinite(v));
    if (key !== 'step' && values.length) out[key] = values.reduce((s, v) => s + v, 0) / values.length;
  }
  return out;
}
