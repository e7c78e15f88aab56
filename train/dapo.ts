// The DAPO trainer (the dapo stage gathers the rollouts in the simulator): rollouts as the
// exact tokens the policy read and wrote, their group advantages, the old policy's log-probabilities, and one
// optimisation step's loss on them (train/losses/policy-gradient.ts), in micro-batches that add up to the
// batch's token mean.
// A rollout is trained turn by turn: each assistant turn is the prompt the policy read (as it was cut) and
// the tokens it generated, and only the generated tokens are trained on. So the tokens trained on are the
// ones sampled, never a re-tokenisation of the text, and the user's and tools' tokens are never trained on.
import * as tf from '@tensorflow/tfjs-core';
import { safePoint } from '../pipeline/interrupt.ts';
import { seeded } from '../core/random.ts';
import { dapoLoss, groupAdvantages, type ClipSettings } from './losses/index.ts';
import type { Llama } from './model.ts';
import type { Trainer } from './run.ts';
import type { MicroBatchLoss } from './step.ts';
import { microBatches, padBatch, type Sequence } from './windows.ts';

/** One assistant turn of a rollout: what the policy read and what it wrote, as token ids. */
export interface Turn {
  prompt: number[];
  generated: number[];
}

export interface Rollout {
  /** The group it is compared within: its task. */
  group: string;
  reward: number;
  turns: Turn[];
}

/** A turn as a training sequence: its prompt then its generated tokens, only the generated ones masked in. */
export function turnSequence(t: Turn): Sequence {
  return { ids: [...t.prompt, ...t.generated], mask: [...t.prompt.map(() => 0), ...t.generated.map(() => 1)] };
}

/** What one step trains on: every turn of every rollout, with its rollout's advantage and the old policy's log-probabilities. */
export interface RolloutBatch {
  sequences: Sequence[];
  /** Each sequence's advantage (its rollout's GRPO advantage). */
  advantages: number[];
  /** Each sequence's per-target log-probabilities under the policy that sampled it (length ids.length − 1). */
  oldLogps: Float32Array[];
}

/**
 * The batch of `rollouts`: GRPO advantages within each group, every turn a sequence, and the old
 * log-probabilities recomputed with `model` before any update (as verl does), micro-batch by micro-batch,
 * each a safe point.
 */
export async function rolloutBatch(model: Llama, rollouts: Rollout[], pad: number, maxTokens: number, signal: AbortSignal): Promise<RolloutBatch> {
  const advantage = groupAdvantages(
    rollouts.map((r) => r.reward),
    rollouts.map((r) => r.group),
  );
  const sequences: Sequence[] = [];
  const advantages: number[] = [];
  rollouts.forEach((r, i) => {
    for (const t of r.turns) {
      if (t.generated.length === 0) continue;
      sequences.push(turnSequence(t));
      advantages.push(advantage[i]!);
    }
  });
  const oldLogps: Float32Array[] = new Array(sequences.length);
  for (const idx of microBatches(sequences.map((_, i) => [i]), (i) => sequences[i]!.ids.length, maxTokens)) {
    await safePoint(signal, () => 'dapo: stopped while scoring rollouts; the next run rolls out again');
    const b = padBatch(idx.map((i) => sequences[i]!), pad);
    const values = tf.tidy(() => model.tokenLogprobs(b.ids, b.targets, b.batch, b.length).dataSync() as Float32Array);
    idx.forEach((i, k) => (oldLogps[i] = values.slice(k * b.length, k * b.length + sequences[i]!.ids.length - 1)));
  }
  return { sequences, advantages, oldLogps };
}

/**
 * One optimisation step's loss on (a mini-batch of) a rollout batch: DAPO's clipped loss, token mean over
 * every generated token of the batch, in micro-batches of at most `maxTokens` padded tokens whose shares add
 * up to it. Reports clip_low, clip_high, dual_clip and kl as token means too.
 */
export function dapoParts(model: Llama, batch: RolloutBatch, indices: number[], pad: number, maxTokens: number, clip: ClipSettings): { parts: MicroBatchLoss[]; tokens: number } {
  const generated = (i: number) => batch.sequences[i]!.mask.reduce((a, m) => a + m, 0);
  const total = Math.max(1, indices.reduce((n, i) => n + generated(i), 0));
  const parts = microBatches(indices.map((i) => [i]), (i) => batch.sequences[i]!.ids.length, maxTokens).map((idx): MicroBatchLoss => () => {
    const b = padBatch(idx.map((i) => batch.sequences[i]!), pad);
    const old = new Float32Array(b.batch * b.length);
    const adv = new Float32Array(b.batch * b.length);
    idx.forEach((i, k) => {
      old.set(batch.oldLogps[i]!, k * b.length);
      adv.fill(batch.advantages[i]!, k * b.length, (k + 1) * b.length);
    });
    const shape: [number, number] = [b.batch, b.length];
    const out = dapoLoss({ logps: model.tokenLogprobs(b.ids, b.targets, b.batch, b.length), oldLogps: tf.tensor2d(old, shape), advantages: tf.tensor2d(adv, shape), mask: tf.tensor2d(b.mask, shape) }, clip);
    // This micro-batch's token mean, weighed by its share of the batch's tokens.
    const share = idx.reduce((n, i) => n + generated(i), 0) / total;
    const w = (t: tf.Scalar) => tf.mul(t, share) as tf.Scalar;
    return { loss: w(out.loss), metrics: { clip_low: w(out.clipLow), clip_high: w(out.clipHigh), dual_clip: w(out.dualClipped), kl: w(out.kl) } };
  });
  return { parts, tokens: indices.reduce((n, i) => n + batch.sequences[i]!.ids.length, 0) };
}

/** A step's rollouts, as the stage gathered them in the environment (informative groups only), and figures about them. */
export interface StepRollouts {
  rollouts: Rollout[];
  metrics: Record<string, number>;
}

export interface DapoOptions {
  steps: number;
  /** The model to start from when there is no checkpoint. */
  start: () => Llama;
  /** The rollouts of step `step` by `model` as it is now: a function of the step and the weights alone, so a resumed run gathers the same. */
  rollouts: (step: number, model: Llama) => Promise<StepRollouts>;
  pad: number;
  microBatchTokens: number;
  clip: ClipSettings;
  /** Passes over each batch of rollouts, and the mini-batches (optimiser updates) each pass is cut into. */
  ppoEpochs: number;
  miniBatches: number;
  seed: string;
  signal: AbortSignal;
}

/**
 * DAPO as a Trainer for trainingRun (train/run.ts): each step gathers a batch of rollouts with the current
 * weights, records their old log-probabilities, and makes ppoEpochs × miniBatches updates on it, each
 * mini-batch a seeded shuffle's slice of the batch's turns. A step without informative groups makes none.
 */
export function dapoTrainer(o: DapoOptions): Trainer {
  return {
    steps: o.steps,
    label: 'dapo steps',
    start: o.start,
    async batch(step, model) {
      const { rollouts, metrics } = await o.rollouts(step, model);
      if (rollouts.length === 0) return { parts: [], tokens: 0, metrics };
      const batch = await rolloutBatch(model, rollouts, o.pad, o.microBatchTokens, o.signal);
      const all = batch.sequences.map((_, i) => i);
      const updates: number[][] = [];
      for (let epoch = 0; epoch < o.ppoEpochs; epoch++) {
        const rand = seeded(o.seed, 'dapo-minibatches', step, epoch);
        const order = all.map((i) => ({ i, k: rand() })).sort((a, b) => a.k - b.k).map((x) => x.i);
        const size = Math.ceil(order.length / o.miniBatches);
        for (let m = 0; m < o.miniBatches && m * size < order.length; m++) updates.push(order.slice(m * size, (m + 1) * size));
      }
      const parts = (idx: number[]) => dapoParts(model, batch, idx, o.pad, o.microBatchTokens, o.clip).parts;
      const generated = batch.sequences.reduce((n, s) => n + s.mask.reduce((a, x) => a + x, 0), 0);
      return { parts: parts(updates[0]!), more: updates.slice(1).map((idx) => () => parts(idx)), tokens: generated, metrics };
    },
  };
}
