// Where `--backend auto` decodes on a machine with a GPU: on the GPU or on the CPU, whichever is faster for
// the model's shape and the number of sequences a phase decodes side by side (a small model with a few
// sequences can step faster on the CPU than through a GPU's dispatches and readbacks). Each (shape,
// sequences) is timed once a process, the same work on both: the prompts read a few at a time, then steps of
// a token each for all of them, drawn as the phase draws them; the CPU's timing stops as soon as it is past
// the GPU's. The log says both times. Training and scoring stay on the GPU (docs/trainer.md says why); an
// explicit `--backend webgpu` decodes on the GPU too. The rule: docs/trainer.md "Where auto runs each phase".
import type { Logger } from '../pipeline/log.ts';
import { seeded } from '../core/random.ts';
import { autoGpu } from './backend.ts';
import { Decoding, cpuCaches, readDecodings, type CachePool, type TokenCache } from './decode.ts';
import type { Llama } from './model.ts';
import { GpuDecoder } from './webgpu/decode.ts';
import type { Kernels } from './webgpu/kernel.ts';

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
  log.info('decoding', {
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
