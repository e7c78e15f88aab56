// Where `--backend auto` runs each phase of the work on a model when it found a GPU: on the GPU, or on the
// CPU where the CPU is faster for the model's shape and the phase's size (a small model in small blocks, or
// decoding a few sequences, can be faster on the CPU than through a GPU's dispatches and readbacks). Each
// phase's work is timed once a process for each shape on both, and the log says both times:
// - training and scoring: a forward pass of one block of the run's micro-batch (rows × its sequence length),
//   on the GPU whole and on the CPU for one row, times the rows (the CPU's forward time grows with its rows);
//   a backward pass is about twice a forward on either, so the forward's ratio is the step's;
// - decoding: sequences side by side, a prompt read and steps of a token each for all of them, drawn as
//   the phase draws; the CPU's timing stops as soon as it is past the GPU's.
// An explicit `--backend webgpu` runs every phase on the GPU. docs/trainer.md "Where auto runs each phase".
import type { Logger } from '../pipeline/log.ts';
import { seeded } from '../core/random.ts';
import { autoGpu } from './backend.ts';
import { Decoding, cpuCaches, readDecodings, type CachePool, type TokenCache } from './decode.ts';
import type { Llama } from './model.ts';
import type { OrtRuntime } from './ort/onnx.ts';
import type { TokenBlock } from './windows.ts';
import { GpuDecoder } from './webgpu/decode.ts';
import type { Kernels } from './webgpu/kernel.ts';

/** Where a phase trains and scores: on the GPU's kernels, or on the CPU path's ONNX Runtime; neither: WASM. */
export interface Device {
  gpu?: Kernels;
  ort?: OrtRuntime;
}

const trained = new Map<string, Promise<boolean>>();
let cpuRuntime: Promise<OrtRuntime | undefined> | null = null;

/**
 * Where `model` trains and is scored in blocks of `rows` rows of `length` tokens: `device` as it is unless auto
 * chose its GPU; then the GPU where a forward pass of such a block is faster there, else the CPU path (ONNX
 * Runtime where it loads, else WASM).
 */
export async function trainingDevice(
  device: Device,
  model: Llama,
  block: { rows: number; length: number },
  log: Logger,
): Promise<Device> {
  const { gpu } = device;
  if (!gpu || gpu !== autoGpu()) return device;
  const rows = Math.max(1, block.rows);
  const length = Math.max(2, Math.min(block.length, model.config.maxPositions));
  const key = `${JSON.stringify(model.config)} ${rows}×${length}`;
  let onGpu = trained.get(key);
  if (!onGpu) trained.set(key, (onGpu = forwardFasterOnGpu(gpu, model, rows, length, log)));
  return (await onGpu) ? device : { ort: await cpuPath() };
}

/** The CPU path's runtime: ONNX Runtime, opened once, where it loads; undefined (WASM) where it does not. */
const cpuPath = () =>
  (cpuRuntime ??= import('./ort/onnx.ts').then(({ OrtRuntime }) => OrtRuntime.open()).catch(() => undefined));

/** Whether a forward pass of rows × length tokens of `model` is faster on the GPU than on the CPU path; logged. */
export async function forwardFasterOnGpu(
  gpu: Kernels,
  model: Llama,
  rows: number,
  length: number,
  log: Logger,
): Promise<boolean> {
  const { GpuLlama } = await import('./webgpu/llama.ts');
  const weights = new Map([...model.params].map(([name, v]) => [name, v.dataSync() as Float32Array]));
  const V = model.config.vocabSize;
  const onGpu = await forwardTime(new GpuLlama(model.config, weights, gpu, { trainable: false }), rows, length, V);
  const ort = await cpuPath();
  const cpu = ort
    ? new (await import('./ort/llama.ts')).OrtLlama(model.config, weights, ort, { trainable: false })
    : { forward: (await import('./data.ts')).tfjsScorer(model), dispose() {} };
  const onCpu = (await forwardTime(cpu, 1, length, V)) * rows;
  log.info('placed', {
    phase: 'training and scoring',
    on: onGpu < onCpu ? 'gpu' : 'cpu',
    block: `${rows}×${length}`,
    gpu_ms: Math.round(onGpu),
    cpu_ms: Math.round(onCpu),
    cpu: ort ? 'onnxruntime' : 'wasm',
  });
  return onGpu < onCpu;
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

/** Tokens of each probe's prompts, and the steps after them. */
const PROMPT = 64;
const STEPS = 8;
/** Prompts read together in the probe (a phase's episodes start a few at a time too). */
const PROMPTS_A_READ = 8;

const placed = new Map<string, Promise<boolean>>();

/**
 * The GPU's kernels for decoding `sequences` sequences of `model` side by side, or undefined for the CPU: `gpu`
 * where it was asked for (`--backend webgpu`), and under auto where the probe finds it faster than the CPU.
 */
export async function decodingGpu(
  gpu: Kernels | undefined,
  model: Llama,
  sequences: number,
  log: Logger,
): Promise<Kernels | undefined> {
  if (!gpu || gpu !== autoGpu()) return gpu;
  const key = `${JSON.stringify(model.config)} ${sequences}`;
  let onGpu = placed.get(key);
  if (!onGpu) placed.set(key, (onGpu = fasterOnGpu(gpu, model, sequences, log)));
  return (await onGpu) ? gpu : undefined;
}

/** Whether decoding `sequences` sequences of `model` side by side is faster on the GPU than on the CPU, timed on both and logged. */
export async function fasterOnGpu(gpu: Kernels, model: Llama, sequences: number, log: Logger): Promise<boolean> {
  const onGpu = await decodingTime(new GpuDecoder(model, gpu), sequences, Infinity);
  const onCpu = await decodingTime(cpuCaches(model), sequences, onGpu);
  const where = onGpu < onCpu ? 'gpu' : 'cpu';
  log.info('placed', {
    phase: 'decoding',
    on: where,
    sequences,
    gpu_ms: Math.round(onGpu),
    cpu_ms: Number.isFinite(onCpu) ? Math.round(onCpu) : `over ${Math.round(onGpu)}`,
  });
  return where === 'gpu';
}

/**
 * Milliseconds `pool` takes to read `sequences` prompts of PROMPT random tokens, PROMPTS_A_READ at a time, then
 * STEPS tokens each, every sequence in each step (after a warm-up read: shaders compiled, buffers made);
 * Infinity once past `limit`. Frees the pool.
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
