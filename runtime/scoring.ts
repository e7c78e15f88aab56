// Scoring token blocks without gradients: every position's log p(target) under a model, by the reference
// model (tfjs) or a copy of its weights held by an engine (runtime/cpu/, runtime/webgpu/), and sequences'
// summed or averaged log-probabilities from them (DPO's frozen reference, eval's held-out pairs, NLL).
import * as tf from '@tensorflow/tfjs-core';
import type { Llama } from '../model/llama.ts';
import { microBatches, padBatch, type Sequence, type TokenBlock } from '../model/windows.ts';
import { safePoint } from '../pipeline/interrupt.ts';
import { arraysOf } from './held.ts';
import type { Logger } from '../pipeline/log.ts';

export interface Scores {
  /** Summed log-probability of each sequence's masked tokens. */
  sum: Float64Array;
  /** How many tokens were masked in. */
  count: Int32Array;
}

/**
 * What scores a token block: every position's log p(target), B·T f32s: an engine's (runtime/cpu/llama.ts
 * cpuScorer, runtime/webgpu/llama.ts gpuScorer), or the reference model's (tfjsScorer).
 */
export type BlockScorer = (b: TokenBlock) => Promise<Float32Array>;

/** A scorer that gives, beside each position's log p(target), the entropy of its next-token distribution. */
export type EntropyScorer = (b: TokenBlock) => Promise<{ logps: Float32Array; entropy: Float32Array }>;

/**
 * A scorer of token blocks by `model`'s weights as they are now, from a copy of them held outside tfjs (the
 * GPU's, the CPU path's: `hold` makes it); dispose() frees the copy. `where` names the place in the error.
 */
export function heldScorer(
  model: Llama,
  where: string,
  hold: (weights: Map<string, Float32Array>) => { forward(b: TokenBlock): Promise<Float32Array>; dispose(): void },
): { score: BlockScorer; dispose(): void } {
  if (model.adapters.size)
    throw new Error(`${where}: a model with LoRA adapters is scored only once they are merged (mergeLora)`);
  const held = hold(arraysOf(model.params));
  return { score: (b) => held.forward(b), dispose: () => held.dispose() };
}

/** The tfjs model as a scorer of blocks. */
export const tfjsScorer =
  (model: Llama): BlockScorer =>
  async (b) =>
    tf.tidy(() => model.tokenLogprobs(b.ids, b.targets, b.batch, b.length).dataSync() as Float32Array);

/** How sequences are scored: micro-batches of at most `maxTokens` padded tokens, each a safe point of `signal`. */
export interface ScoringOptions {
  maxTokens: number;
  pad: number;
  /** Aborted, scoring stops at the next micro-batch (Interrupted). */
  signal: AbortSignal;
  /** With a log, a progress bar named `label`. */
  log?: Logger;
  label?: string;
}

/**
 * Sequence log-probabilities under `model` (the reference model itself, or a scorer of blocks on an engine),
 * without gradients, in micro-batches of similar length.
 */
export async function scoreSequences(
  model: Llama | BlockScorer,
  sequences: Sequence[],
  o: ScoringOptions,
): Promise<Scores> {
  const { maxTokens, pad, signal, log, label = 'scoring' } = o;
  const score = typeof model === 'function' ? model : tfjsScorer(model);
  const sum = new Float64Array(sequences.length);
  const count = new Int32Array(sequences.length);
  const batches = microBatches(
    sequences.map((_, i) => [i]),
    (i) => sequences[i]!.ids.length,
    maxTokens,
  );
  const progress = log?.progress(label, batches.length);
  for (const [done, idx] of batches.entries()) {
    await safePoint(
      signal,
      () => `${label}: stopped after ${done} of ${batches.length} batches; the next run scores them again`,
    );
    const b = padBatch(
      idx.map((j) => sequences[j]!),
      pad,
    );
    const logp = await score(b);
    idx.forEach((j, k) => {
      let s = 0;
      for (let t = k * b.length; t < (k + 1) * b.length; t++) s += b.mask[t]! * logp[t]!;
      sum[j] = s;
      count[j] = sequences[j]!.mask.slice(1).reduce((s, m) => s + m, 0);
    });
    progress?.tick();
  }
  progress?.done();
  return { sum, count };
}

/** The negative log-likelihood per masked token over all the sequences scored (held-out NLL). */
export function meanNll(s: Scores): number {
  const sum = (xs: ArrayLike<number>) => Array.from(xs).reduce((a, b) => a + b, 0);
  return -sum(s.sum) / Math.max(1, sum(s.count));
}

/** Sequence log-probabilities as the loss wants them: sums, or means over the masked tokens. */
export function sequenceValues(s: Scores, average: boolean): Float64Array {
  return average ? s.sum.map((v, i) => v / Math.max(1, s.count[i]!)) : s.sum;
}
