// The DAPO trainer (the dapo stage gathers the rollouts in the simulator): rollouts as the
// exact tokens the policy read and wrote, their group advantages, the old policy's log-probabilities, and one
// optimisation step's loss on them (trainers/losses/policy-gradient.ts), in micro-batches that add up to the
// batch's token mean.
// A rollout is recorded turn by turn: each assistant turn is the prompt the policy read (as it was cut) and
// the tokens it generated. Turns whose prompts extend each other are chained into one sequence, and only the
// generated tokens are trained on: the tokens trained on are the ones sampled, never a re-tokenisation of the
// text, and the user's and tools' tokens are never trained on.
import * as tf from '@tensorflow/tfjs-core';
import { safePoint } from '../pipeline/interrupt.ts';
import { seeded } from '../core/random.ts';
import { dapoLoss, groupAdvantages, tokenEntropy, type ClipSettings } from '../trainers/losses/index.ts';
import { targetLogprobs } from '../model/parameters.ts';
import type { Llama } from '../model/llama.ts';
import type { Turn } from '../runtime/policy.ts';
import type { Trainer } from '../trainers/run.ts';
import type { MicroBatch } from '../trainers/step.ts';
import { microBatches, padBatch, type Sequence } from '../model/windows.ts';
import type { EntropyScorer } from '../runtime/scoring.ts';

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

const startsWith = (ids: number[], prefix: number[]) =>
  prefix.length <= ids.length && prefix.every((x, i) => ids[i] === x);

/**
 * A rollout's turns as few sequences as their prompts allow: a turn whose prompt extends the sequence so far
 * (the conversation fitted the context, so nothing was cut) continues it, the tool results between masked
 * out; one that does not starts a new sequence. The same tokens and the same log-probabilities as one
 * sequence a turn (attention is causal), for a fraction of the tokens.
 */
export function chainTurns(turns: Turn[], prompt: (t: Turn) => number[] = (t) => t.prompt): Sequence[] {
  const out: Sequence[] = [];
  for (const t of turns) {
    if (t.generated.length === 0) continue;
    const p = prompt(t);
    const last = out.at(-1);
    if (last && startsWith(p, last.ids)) {
      last.mask.push(...p.slice(last.ids.length).map(() => 0), ...t.generated.map(() => 1));
      last.ids.push(...p.slice(last.ids.length), ...t.generated);
    } else out.push(turnSequence({ prompt: p, generated: t.generated }));
  }
  return out;
}

/** What one step trains on: every rollout as sequences, with its advantage and the old policy's log-probabilities. */
export interface RolloutBatch {
  sequences: Sequence[];
  /** Each sequence's advantage (its rollout's GRPO advantage). */
  advantages: number[];
  /** Each sequence's per-target log-probabilities under the policy that sampled it (length ids.length − 1; only the generated targets matter). */
  oldLogps: Float32Array[];
  /** Each sequence's under the reference (the starting model), when the loss has a KL term. */
  refLogps?: Float32Array[];
  /** The sampling policy's entropy, a token mean over every generated token (collapse shows here first). */
  entropy: number;
}

/** The generated targets of a sequence: the positions t whose target (token t + 1) the policy wrote. */
const generatedTargets = (s: Sequence) => s.mask.slice(1).flatMap((m, t) => (m ? [t] : []));

/** What a batch of rollouts is made with. */
export interface RolloutBatchOptions {
  pad: number;
  /** Padded tokens a scoring micro-batch holds at most. */
  maxTokens: number;
  signal: AbortSignal;
  /** How feedback-guided rollouts' turns are trained (default context). */
  on?: FeedbackTraining;
  /** The starting model, whose log-probabilities a KL term needs; absent: no KL. */
  reference?: Llama;
  /** The weights as the run holds them outside tfjs, where it does: the old log-probabilities are scored there. */
  score?: EntropyScorer;
}

/**
 * The batch of `rollouts`: GRPO advantages within each group, every rollout as chained sequences
 * (chainTurns; with notes, on the prompts `on` says, twice with `both`), and the old log-probabilities
 * recomputed with `model` before any update (as verl does) on the turns as they were sampled, micro-batch by
 * micro-batch, each a safe point (by `score` where the run holds the model outside tfjs). A sequence trained on
 * the plain prompt takes its generated tokens' old log-probabilities from the prompts with notes, token for token.
 */
export async function rolloutBatch(model: Llama, rollouts: Rollout[], o: RolloutBatchOptions): Promise<RolloutBatch> {
  const { pad, maxTokens, signal, on = 'context', reference, score } = o;
  const advantage = groupAdvantages(
    rollouts.map((r) => r.reward),
    rollouts.map((r) => r.group),
  );
  const sampled = rollouts.map((r) => chainTurns(r.turns));
  const behaviour = await scored(model, sampled.flat(), pad, maxTokens, signal, score);
  const entropy =
    behaviour.entropy.reduce((a, e) => a + e.sum, 0) /
    Math.max(
      1,
      behaviour.entropy.reduce((n, e) => n + e.tokens, 0),
    );
  const sequences: Sequence[] = [];
  const advantages: number[] = [];
  const oldLogps: Float32Array[] = [];
  let at = 0;
  rollouts.forEach((r, i) => {
    // The sampling policy's log-probability of each generated token, in the order they were written.
    const written: number[] = [];
    for (const s of sampled[i]!) {
      const lp = behaviour.logps[at++]!;
      for (const t of generatedTargets(s)) written.push(lp[t]!);
    }
    const guided = r.turns.some((t) => t.base);
    const trained =
      !guided || on === 'context'
        ? [sampled[i]!]
        : on === 'base'
          ? [chainTurns(r.turns, (t) => t.base ?? t.prompt)]
          : [sampled[i]!, chainTurns(r.turns, (t) => t.base ?? t.prompt)];
    for (const set of trained) {
      let k = 0;
      for (const s of set) {
        const old = new Float32Array(s.ids.length - 1);
        for (const t of generatedTargets(s)) old[t] = written[k++]!;
        sequences.push(s);
        advantages.push(advantage[i]!);
        oldLogps.push(old);
      }
    }
  });
  const refLogps = reference ? (await scored(reference, sequences, pad, maxTokens, signal)).logps : undefined;
  return { sequences, advantages, oldLogps, refLogps, entropy };
}

/**
 * `model`'s per-target log-probabilities of each sequence, and its entropy summed over each micro-batch's
 * masked tokens; every micro-batch a safe point. `score`: the same from a model held outside tfjs (the GPU's
 * or the CPU path's), in place of tfjs's forward.
 */
async function scored(
  model: Llama,
  sequences: Sequence[],
  pad: number,
  maxTokens: number,
  signal: AbortSignal,
  score?: EntropyScorer,
) {
  const logps: Float32Array[] = new Array(sequences.length);
  const entropy: { sum: number; tokens: number }[] = [];
  for (const idx of microBatches(
    sequences.map((_, i) => [i]),
    (i) => sequences[i]!.ids.length,
    maxTokens,
  )) {
    await safePoint(signal, () => 'dapo: stopped while scoring rollouts; the next run rolls out again');
    const b = padBatch(
      idx.map((i) => sequences[i]!),
      pad,
    );
    const tokens = b.mask.reduce((a, m) => a + m, 0);
    let values: Float32Array;
    if (score) {
      const out = await score(b);
      values = out.logps;
      entropy.push({ sum: out.entropy.reduce((a, h, t) => a + h * b.mask[t]!, 0), tokens });
    } else {
      let h: number;
      [values, h] = tf.tidy(() => {
        const logits = model.forward(b.ids, b.batch, b.length);
        const mask = tf.tensor2d(b.mask, [b.batch, b.length]);
        return [
          targetLogprobs(logits, b.targets, b.batch, b.length).dataSync() as Float32Array,
          tokenEntropy(logits, mask).dataSync()[0]!,
        ];
      });
      entropy.push({ sum: h * tokens, tokens });
    }
    idx.forEach((i, k) => (logps[i] = values.slice(k * b.length, k * b.length + sequences[i]!.ids.length - 1)));
  }
  return { logps, entropy };
}

/**
 * One optimisation step's loss on (a mini-batch of) a rollout batch: DAPO's clipped loss, token mean over
 * every generated token of the batch, in micro-batches of at most `maxTokens` padded tokens whose shares add
 * up to it. Reports clip_low, clip_high, dual_clip and kl as token means too.
 */
export function dapoParts(
  batch: RolloutBatch,
  indices: number[],
  pad: number,
  maxTokens: number,
  clip: ClipSettings,
): { parts: MicroBatch[]; tokens: number } {
  const generated = (i: number) => batch.sequences[i]!.mask.reduce((a, m) => a + m, 0);
  const total = Math.max(
    1,
    indices.reduce((n, i) => n + generated(i), 0),
  );
  const parts = microBatches(
    indices.map((i) => [i]),
    (i) => batch.sequences[i]!.ids.length,
    maxTokens,
  ).map((idx): MicroBatch => {
    const b = padBatch(
      idx.map((i) => batch.sequences[i]!),
      pad,
    );
    const old = new Float32Array(b.batch * b.length);
    const ref = batch.refLogps ? new Float32Array(b.batch * b.length) : null;
    const adv = new Float32Array(b.batch * b.length);
    idx.forEach((i, k) => {
      old.set(batch.oldLogps[i]!, k * b.length);
      ref?.set(batch.refLogps![i]!, k * b.length);
      adv.fill(batch.advantages[i]!, k * b.length, (k + 1) * b.length);
    });
    const shape: [number, number] = [b.batch, b.length];
    // This micro-batch's token mean, weighed by its share of the batch's tokens.
    const share = idx.reduce((n, i) => n + generated(i), 0) / total;
    const w = (t: tf.Scalar) => tf.mul(t, share) as tf.Scalar;
    return {
      blocks: [b],
      loss: ([logps]) => {
        const out = dapoLoss(
          {
            logps: logps!,
            oldLogps: tf.tensor2d(old, shape),
            refLogps: ref ? tf.tensor2d(ref, shape) : undefined,
            advantages: tf.tensor2d(adv, shape),
            mask: tf.tensor2d(b.mask, shape),
          },
          clip,
        );
        return {
          loss: w(out.loss),
          metrics: {
            clip_low: w(out.clipLow),
            clip_high: w(out.clipHigh),
            dual_clip: w(out.dualClipped),
            kl: w(out.kl),
          },
        };
      },
    };
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
  /**
   * The rollouts of step `step` by `model` as it is now (decoded from `trained`, the run's GPU buffers, where
   * given): a function of the step and the weights alone, so a resumed run gathers the same.
   */
  rollouts: (step: number, model: Llama, trained?: Map<string, GPUBuffer>) => Promise<StepRollouts>;
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
  after?: Trainer['after'];
  /** The rollouts decode on the CPU while the run trains on the GPU (Trainer.decodesOnCpu). */
  decodesOnCpu?: boolean;
  signal: AbortSignal;
}

/**
 * DAPO as a Trainer for trainingRun (trainers/run.ts): each step gathers a batch of rollouts with the current
 * weights, records their old log-probabilities, and makes ppoEpochs × miniBatches updates on it, each
 * mini-batch a seeded shuffle's slice of the batch's turns. A step without informative groups makes none.
 */
export function dapoTrainer(o: DapoOptions): Trainer {
  return {
    steps: o.steps,
    label: 'dapo steps',
    start: o.start,
    readsWeights: true, // each step rolls out with the current weights
    decodesOnCpu: o.decodesOnCpu,
    after: o.after,
    async batch(step, model, held) {
      const { rollouts, metrics } = await o.rollouts(step, model, held.trained);
      if (rollouts.length === 0) return { parts: [], tokens: 0, metrics };
      const batch = await rolloutBatch(model, rollouts, {
        pad: o.pad,
        maxTokens: o.microBatchTokens,
        signal: o.signal,
        on: o.feedbackTraining,
        reference: o.clip.klCoef > 0 ? o.reference : undefined,
        score: held.score,
      });
      const all = batch.sequences.map((_, i) => i);
      const updates: number[][] = [];
      for (let epoch = 0; epoch < o.ppoEpochs; epoch++) {
        const rand = seeded(o.seed, 'dapo-minibatches', step, epoch);
        const order = all
          .map((i) => ({ i, k: rand() }))
          .sort((a, b) => a.k - b.k)
          .map((x) => x.i);
        const size = Math.ceil(order.length / o.miniBatches);
        for (let m = 0; m < o.miniBatches && m * size < order.length; m++)
          updates.push(order.slice(m * size, (m + 1) * size));
      }
      const parts = (idx: number[]) => dapoParts(batch, idx, o.pad, o.microBatchTokens, o.clip).parts;
      const generated = batch.sequences.reduce((n, s) => n + s.mask.reduce((a, x) => a + x, 0), 0);
      return {
        parts: parts(updates[0]!),
        more: updates.slice(1).map((idx) => () => parts(idx)),
        tokens: generated,
        metrics: { ...metrics, entropy: batch.entropy },
      };
    },
  };
}
