// Where `--backend auto` runs each phase of the work on a model when it found a GPU: on the GPU, or on the
// CPU where the CPU is faster for the model's shape and the phase's size (a small model in small blocks, or
// decoding a few sequences, can be faster on the CPU than through a GPU's dispatches and readbacks). Each
// phase's work is timed once a process for each shape, on both, and the log's `placed` lines say both times:
// - training and scoring: a forward pass of one block of the run's micro-batch (rows × its sequence length),
//   on the GPU whole and on the CPU for one row of at most CPU_TOKENS, scaled to the block by the forward's
//   FLOPs; a backward pass is about twice a forward on either, so the forward's ratio is the step's;
// - decoding: sequences side by side, a prompt read and steps of a token each for all of them; the CPU's
//   timing stops as soon as it is past the GPU's.
// Every other device runs each phase on its one engine (runtime/device.ts mainEngine): `--backend webgpu` every
// phase on the GPU. docs/trainer.md "Where auto runs each phase".
import type { Logger } from '../pipeline/log.ts';
import { seeded } from '../core/random.ts';
import { flopsPerToken } from '../model/config.ts';
import type { Llama } from '../model/llama.ts';
import type { TokenBlock } from '../model/windows.ts';
import { CpuLlama } from './cpu/llama.ts';
import { Decoding, cpuCaches, readDecodings, type CachePool, type TokenCache } from './decode.ts';
import { cpuEngine, mainEngine, type Device, type Engine } from './device.ts';
import { arraysOf } from './held.ts';
import { tfjsScorer } from './scoring.ts';
import { GpuDecoder } from './webgpu/decode.ts';
import type { GpuKernels } from './webgpu/kernel.ts';
import { GpuLlama } from './webgpu/llama.ts';

/** Milliseconds a probe took on each side (Infinity: stopped once past the other, or failed, said in `failed`). */
export interface Timed {
  gpu: number;
  cpu: number;
  failed?: string;
}

/** The most tokens the CPU's forward probe reads (its time is scaled to the block's). */
const CPU_TOKENS = 256;
/** Tokens of each decoding probe's prompts, and the steps after them. */
const PROMPT = 64;
const STEPS = 8;
/** Prompts read together in the decoding probe (a phase's episodes start a few at a time too). */
const PROMPTS_A_READ = 8;

/**
 * The engine `model` trains and is scored on in blocks of `rows` rows of `length` tokens: the device's one
 * engine, unless it places each phase; then the GPU where a forward pass of such a block is faster there, else
 * the CPU's (the C kernels, or the reference).
 */
export async function trainingEngine(
  device: Device,
  model: Llama,
  block: { rows: number; length: number },
  log: Logger,
): Promise<Engine> {
  const { gpu } = device;
  if (!gpu || !device.placesEachPhase) return mainEngine(device);
  const rows = Math.max(1, Math.floor(block.rows));
  const length = Math.max(2, Math.min(block.length, model.config.maxPositions));
  const onGpu = await placedOnce(
    device,
    `training ${JSON.stringify(model.config)} ${rows}×${length}`,
    { phase: 'training and scoring', block: `${rows}×${length}` },
    log,
    () => forwardTimes(device, gpu, model, rows, length),
  );
  return onGpu ? { kind: 'gpu', kernels: gpu } : cpuEngine(device);
}

/**
 * The engine that decodes `sequences` sequences of `model` side by side: the device's one engine, unless it
 * places each phase; then the GPU where the probe finds it faster, else the CPU's.
 */
export async function decodingEngine(device: Device, model: Llama, sequences: number, log: Logger): Promise<Engine> {
  const { gpu } = device;
  if (!gpu || !device.placesEachPhase) return mainEngine(device);
  const onGpu = await placedOnce(
    device,
    `decoding ${JSON.stringify(model.config)} ${sequences}`,
    { phase: 'decoding', sequences },
    log,
    () => decodingTimes(device, gpu, model, sequences),
  );
  return onGpu ? { kind: 'gpu', kernels: gpu } : cpuEngine(device);
}

/**
 * Whether the GPU was the faster in `probe`, probed once a device for each `key` and logged with `fields`. A
 * side that fails loses (a warning says why); where both fail, the GPU is kept (auto's place for everything
 * before it measured) and the probe is tried again next time.
 */
async function placedOnce(
  device: Device,
  key: string,
  fields: Record<string, unknown>,
  log: Logger,
  probe: () => Promise<Timed>,
): Promise<boolean> {
  const placed = device.probes;
  let onGpu = placed.get(key);
  if (!onGpu) {
    onGpu = probe().then(
      (t) => {
        if (t.failed) log.warn('placed', { ...fields, ...said(t), why: t.failed });
        else log.info('placed', { ...fields, ...said(t) });
        return t.gpu < t.cpu;
      },
      (error: Error) => {
        placed.delete(key);
        log.warn('placed', { ...fields, on: 'gpu', why: `both sides failed: ${error.message}` });
        return true;
      },
    );
    placed.set(key, onGpu);
  }
  return onGpu;
}

/** A probe's times for the log, to 0.1 ms; the CPU's "over" the GPU's where its timing stopped there. */
function said(t: Timed): Record<string, unknown> {
  const ms = (x: number) => Math.round(x * 10) / 10;
  const failed = (side: string) => t.failed?.includes(`${side}: `);
  return {
    on: t.gpu < t.cpu ? 'gpu' : 'cpu',
    gpu_ms: failed('gpu') ? 'failed' : ms(t.gpu),
    cpu_ms: failed('cpu') ? 'failed' : Number.isFinite(t.cpu) ? ms(t.cpu) : `over ${ms(t.gpu)}`,
  };
}

/** Each side's time, Infinity for a side that fails (the other then wins); where both fail, their errors. */
async function bothSides(gpu: () => Promise<number>, cpu: (limit: number) => Promise<number>): Promise<Timed> {
  const failures: string[] = [];
  const side = async (name: string, time: () => Promise<number>) => {
    try {
      return await time();
    } catch (error) {
      failures.push(`${name}: ${(error as Error).message}`);
      return Infinity;
    }
  };
  const onGpu = await side('gpu', gpu);
  const onCpu = await side('cpu', () => cpu(onGpu));
  if (failures.length === 2) throw new Error(failures.join('; '));
  return { gpu: onGpu, cpu: onCpu, ...(failures.length ? { failed: failures[0] } : {}) };
}

/**
 * A forward pass of rows × length tokens of `model`: on the GPU, and on the CPU path for one row of at most
 * CPU_TOKENS, scaled to the block by the forward's FLOPs (flopsPerToken: the products, and attention's T²).
 */
export async function forwardTimes(
  device: Device,
  gpu: GpuKernels,
  model: Llama,
  rows: number,
  length: number,
): Promise<Timed> {
  const weights = arraysOf(model.params);
  const c = model.config;
  const tokens = Math.min(length, CPU_TOKENS);
  const scale = (rows * length * flopsPerToken(c, length)) / (tokens * flopsPerToken(c, tokens));
  return bothSides(
    () => forwardTime(new GpuLlama(c, weights, gpu, { trainable: false }), rows, length, c.vocabSize),
    async () => {
      const cpu = device.cpu
        ? new CpuLlama(c, weights, device.cpu, { trainable: false })
        : { forward: tfjsScorer(model), dispose() {} };
      return (await forwardTime(cpu, 1, tokens, c.vocabSize)) * scale;
    },
  );
}

/** Milliseconds a forward pass of rows × length random tokens (of V) takes on `held`, after one to warm it up; frees it. */
async function forwardTime(
  held: { forward(b: TokenBlock): Promise<Float32Array>; dispose(): void },
  rows: number,
  length: number,
  V: number,
): Promise<number> {
  const random = seeded('placement', rows, length);
  const block = () => {
    const ids = Int32Array.from({ length: rows * length }, () => Math.floor(random() * V));
    return { ids, targets: ids, batch: rows, length };
  };
  try {
    await held.forward(block());
    const began = performance.now();
    await held.forward(block());
    return performance.now() - began;
  } finally {
    held.dispose();
  }
}

/** Decoding `sequences` sequences of `model` side by side: on the GPU, then on the CPU until past the GPU's time. */
export function decodingTimes(device: Device, gpu: GpuKernels, model: Llama, sequences: number): Promise<Timed> {
  return bothSides(
    () => decodingTime(new GpuDecoder(model, gpu), sequences, Infinity),
    (limit) => decodingTime(cpuCaches(model, device.cpu), sequences, limit),
  );
}

/**
 * Milliseconds `pool` takes to read `sequences` prompts of PROMPT random tokens, PROMPTS_A_READ at a time, then
 * STEPS tokens each (sampled at temperature 1, top-p 0.9), every sequence in each step, after a warm-up read
 * (shaders compiled, buffers made); Infinity once past `limit`. Frees the pool.
 */
export async function decodingTime(pool: CachePool, sequences: number, limit: number): Promise<number> {
  const random = seeded('placement');
  const V = pool.model.config.vocabSize;
  const prompt = Math.max(1, Math.min(PROMPT, pool.model.config.maxPositions - STEPS - 1));
  const tokens = (n: number) => Array.from({ length: n }, () => Math.floor(random() * V));
  const options = { maxTokens: STEPS + 1, temperature: 1, topP: 0.9, random };
  const start = (n: number, length: number) =>
    Array.from({ length: n }, () => new Decoding(pool.create(), tokens(length), options, false));
  const read = (decodings: Decoding<TokenCache>[], reads: number[][]) => readDecodings(pool, decodings, reads);
  const all: Decoding<TokenCache>[] = [];
  try {
    const warm = start(1, 2);
    all.push(...warm);
    await read(warm, [warm[0]!.unread.splice(0)]);
    await read(warm, [[warm[0]!.next()!]]);
    const began = performance.now();
    const late = () => performance.now() - began > limit;
    const live: Decoding<TokenCache>[] = [];
    for (let b = 0; b < sequences; b += PROMPTS_A_READ) {
      const some = start(Math.min(PROMPTS_A_READ, sequences - b), prompt);
      all.push(...some);
      await read(
        some,
        some.map((d) => d.unread.splice(0)),
      );
      live.push(...some);
      if (late()) return Infinity;
    }
    for (let step = 0; step < STEPS; step++) {
      await read(
        live,
        live.map((d) => [d.next()!]),
      );
      if (late()) return Infinity;
    }
    return performance.now() - began;
  } finally {
    for (const d of all) pool.free(d.cache);
    pool.dispose();
  }
}
