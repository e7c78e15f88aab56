// What an engine gives the rest of prefab, whichever it is: a scorer of token blocks (log-probs without
// gradients: DPO's frozen reference, eval's held-out pairs, `prefab model score`) and a pool of decoding caches
// (episodes, the server, `prefab model generate`). Which engine a phase gets is runtime/placement.ts's; a
// training run's model held by an engine is trainers/run.ts's.
import type { Logger } from '../pipeline/log.ts';
import type { Llama } from '../model/llama.ts';
import { cpuScorer } from './cpu/llama.ts';
import { cpuCaches, type CachePool } from './decode.ts';
import type { Device, Engine } from './device.ts';
import { trainingEngine } from './placement.ts';
import { tfjsScorer, type BlockScorer } from './scoring.ts';
import { GpuDecoder } from './webgpu/decode.ts';
import { gpuScorer } from './webgpu/llama.ts';

/** The block a scorer is placed by where its caller does not say (placement.ts trainingEngine). */
const SCORED = { rows: 4, length: 512 };

/**
 * What scores token blocks with `model`'s weights on `device` (under auto, where a forward pass of `block` is
 * faster: placement.ts): a copy of the weights on the GPU or the CPU path, freed by dispose; or the reference
 * model itself.
 */
export async function scorerOn(
  device: Device,
  model: Llama,
  log: Logger,
  block = SCORED,
): Promise<{ score: BlockScorer; dispose(): void }> {
  const engine = await trainingEngine(device, model, block, log);
  if (engine.kind === 'gpu') return gpuScorer(model, engine.kernels);
  if (engine.kind === 'cpu') return cpuScorer(model, engine.kernels);
  return { score: tfjsScorer(model), dispose: () => {} };
}

/** `use` with a scorer of `model` on `device` (scorerOn), freed after. */
export async function withScorer<T>(
  device: Device,
  model: Llama,
  log: Logger,
  use: (score: BlockScorer) => Promise<T>,
  block = SCORED,
): Promise<T> {
  const scorer = await scorerOn(device, model, log, block);
  try {
    return await use(scorer.score);
  } finally {
    scorer.dispose();
  }
}

/**
 * Caches that decode `model` on `engine`: the GPU's pages, or KVCaches with the C kernels or the reference's
 * loops. `trained`: the GPU buffers the model is being trained in, which a GPU decoder then reads in place.
 */
export function cachePool(engine: Engine, model: Llama, trained?: Map<string, GPUBuffer>): CachePool {
  if (engine.kind === 'gpu') return new GpuDecoder(model, engine.kernels, trained);
  return cpuCaches(model, engine.kind === 'cpu' ? engine.kernels : null);
}
