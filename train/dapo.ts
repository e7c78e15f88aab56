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
import { dapoLoss, groupAdvantages, tokenEntropy, type ClipSettings } from './losses/index.ts';
import { targetLogprobs } from './parameters.ts';
import type { Llama } from './model.ts';
import type { Trainer } from './run.ts';
import type { MicroBatchLoss } from './step.ts';
import { microBatches, padBatch, type Sequence } from './windows.ts';

/** One assistant turn of a rollout: what the policy read and what it wrote, as token ids. */
export interface Turn {
  prompt: number[];
  generated: number[];
  /** A feedback-guided rollout's turn: the prompt without the notes it was shown (the plain task). */
  base?: number[];
}

/**
 * How a feedback-guided rollout's turns are trained: `context`, on the prompt they were generated from (notes
 * and all: on-policy); `base`, on the plain prompt, the old log-probabilities being the sampling policy's with
 * the notes (the clipped ratio is then an importance ratio between the two prompts); `both`, each turn twice.
 */
export type FeedbackTraining = 'context' | 'base' | 'both';

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
  /** Each sequence's under the reference (the starting model), when the loss has a KL term. */
  refLogps?: Float32Array[];
  /** The sampling policy's entropy, a token mean over every generated token (collapse shows here first). */
  entropy: number;
}

/** The sequences a turn is trained as, each with the turn as it was sampled (whose log-probabilities are the old ones). */
function trainedAs(t: Turn, on: FeedbackTraining): Sequence[] {
  const read = turnSequence(t);
  if (!t.base || on === 'context') return [read];
  const plain = turnSequence({ prompt: t.base, generated: t.generated });
  return on === 'base' ? [plain] : [read, plain];
}

/**
 * The batch of `rollouts`: GRPO advantages within each group, every turn a sequence (two with `both`), and
 * the old log-probabilities recomputed with `model` before any update (as verl does) on each turn as it was
 * sampled, micro-batch by micro-batch, each a safe point. A sequence trained on the plain prompt takes its
 * generated tokens' old log-probabilities from the prompt with notes.
 */
export async function rolloutBatch(model: Llama, rollouts: Rollout[], pad: number, maxTokens: number, signal: AbortSignal, on: FeedbackTraining = 'context', reference?: Llama): Promise<RolloutBatch> {
  const advantage = groupAdvantages(
    rollouts.map((r) => r.reward),
    rollouts.map((r) => r.group),
  );
  const sampled: Sequence[] = [];
  const sequences: Sequence[] = [];
  const advantages: number[] = [];
  /** Each sequence's turn, as an index into `sampled`. */
  const turnOf: number[] = [];
  rollouts.forEach((r, i) => {
    for (const t of r.turns) {
      if (t.generated.length === 0) continue;
      for (const s of trainedAs(t, on)) {
        sequences.push(s);
        advantages.push(advantage[i]!);
        turnOf.push(sampled.length);
      }
      sampled.push(turnSequence(t));
    }
  });
  const behaviour = await scored(model, sampled, pad, maxTokens, signal);
  let entropy = 0;
  for (const e of behaviour.entropy) entropy += e.sum;
  entropy /= Math.max(1, behaviour.entropy.reduce((n, e) => n + e.tokens, 0));
  // The generated tokens end every sequence: their old log-probabilities are the sampled turn's last ones.
  const oldLogps = sequences.map((s, i) => {
    const from = behaviour.logps[turnOf[i]!]!;
    if (s.ids.length - 1 === from.length) return from;
    const generated = s.mask.reduce((a, m) => a + m, 0);
    const old = new Float32Array(s.ids.length - 1);
    old.set(from.subarray(from.length - generated), old.length - generated);
    return old;
  });
  const refLogps = reference ? (await scored(reference, sequences, pad, maxTokens, signal)).logps : undefined;
  return { sequences, advantages, oldLogps, refLogps, entropy };
}

/** `model`'s per-target log-probabilities of each sequence, and its entropy summed over each micro-batch's masked tokens; every micro-batch a safe point. */
async function scored(model: Llama, sequences: Sequence[], pad: number, maxTokens: number, signal: AbortSignal) {
  const logps: Float32Array[] = new Array(sequences.length);
  const entropy: { sum: number; tokens: number }[] = [];
  for (const idx of microBatches(sequences.map((_, i) => [i]), (i) => sequences[i]!.ids.length, maxTokens)) {
    await safePoint(signal, () => 'dapo: stopped while scoring rollouts; the next run rolls out again');
    const b = padBatch(idx.map((i) => sequences[i]!), pad);
    const [values, h] = tf.tidy(() => {
      const logits = model.forward(b.ids, b.batch, b.length);
      const mask = tf.tensor2d(b.mask, [b.batch, b.length]);
      return [targetLogprobs(logits, b.targets, b.batch, b.length).dataSync() as Float32Array, tokenEntropy(logits, mask).dataSync()[0]!];
    });
    const tokens = b.mask.reduce((a, m) => a + m, 0);
    entropy.push({ sum: h * tokens, tokens });
    idx.forEach((i, k) => (logps[i] = values.slice(k * b.length, k * b.length + sequences[i]!.ids.length - 1)));
  }
  return { logps, entropy };
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
    const ref = batch.refLogps ? new Float32Array(b.batch * b.length) : null;
    const adv = new Float32Array(b.batch * b.length);
    idx.forEach((i, k) => {
      old.set(batch.oldLogps[i]!, k * b.length);
      ref?.set(batch.refLogps![i]!, k * b.length);
      adv.fill(batch.advantages[i]!, k * b.length, (k + 1) * b.length);
    });
    const shape: [number, number] = [b.batch, b.length];
    const out = dapoLoss({ logps: model.tokenLogprobs(b.ids, b.targets, b.batch, b.length), oldLogps: tf.tensor2d(old, shape), refLogps: ref ? tf.tensor2d(ref, shape) : undefined, advantages: tf.tensor2d(adv, shape), mask: tf.tensor2d(b.mask, shape) }, clip);
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
  /** How feedback-guided rollouts' turns are trained (default context; plain rollouts: on what they read). */
  feedbackTraining?: FeedbackTraining;
  /** The reference a KL term (clip.klCoef > 0) keeps the policy near: the starting model; absent: no KL. */
  reference?: Llama;
  /** After a step's update, figures of the model as it now is (validation), logged with the step; absent: none. */
  after?: (step: number, model: Llama) => Promise<Record<string, number>>;
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
    after: o.after,
    async batch(step, model) {
      const { rollouts, metrics } = await o.rollouts(step, model);
      if (rollouts.length === 0) return { parts: [], tokens: 0, metrics };
      const batch = await rolloutBatch(model, rollouts, o.pad, o.microBatchTokens, o.signal, o.feedbackTraining, o.clip.klCoef > 0 ? o.reference : undefined);
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
      return { parts: parts(updates[0]!), more: updates.slice(1).map((idx) => () => parts(idx)), tokens: generated, metrics: { ...metrics, entropy: batch.entropy } };
    },
  };
}
