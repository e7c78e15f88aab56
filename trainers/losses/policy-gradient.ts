// Group-relative policy gradients, as verl's DAPO recipe computes them (core_algos.py): GRPO's advantages per
// group of rollouts of one task, DAPO's decoupled clip with a dual clip for negative advantages, token-mean
// aggregation, overlong reward shaping, an optional k3 KL to a reference, and dynamic sampling's group filter.
// Plain functions of plain numbers where nothing is differentiated, TensorFlow.js where the loss is.
import * as tf from '@tensorflow/tfjs-core';

type T2 = tf.Tensor2D;

/**
 * GRPO's outcome advantage: each rollout's reward against its group's, (r − mean) / (std + ε), std the
 * unbiased one (N − 1), as verl's compute_grpo_outcome_advantage; a group of one has mean 0 and std 1.
 * `groups[i]` names rollout i's group (its task).
 */
export function groupAdvantages(rewards: readonly number[], groups: readonly string[], epsilon = 1e-6): number[] {
  const byGroup = new Map<string, number[]>();
  rewards.forEach((r, i) => byGroup.set(groups[i]!, [...(byGroup.get(groups[i]!) ?? []), r]));
  const stats = new Map<string, { mean: number; std: number }>();
  for (const [g, rs] of byGroup) {
    if (rs.length === 1) {
      stats.set(g, { mean: 0, std: 1 });
      continue;
    }
    const mean = rs.reduce((a, b) => a + b, 0) / rs.length;
    const variance = rs.reduce((a, r) => a + (r - mean) ** 2, 0) / (rs.length - 1);
    stats.set(g, { mean, std: Math.sqrt(variance) });
  }
  return rewards.map((r, i) => {
    const s = stats.get(groups[i]!)!;
    return (r - s.mean) / (s.std + epsilon);
  });
}

/**
 * DAPO's overlong reward shaping for a response of `length` tokens: 0 up to `maxLength − buffer`, then a
 * linear penalty down to −1 at `maxLength`, and −1 beyond (the paper's R_length).
 */
export function overlongPenalty(length: number, maxLength: number, buffer: number): number {
  const expected = maxLength - buffer;
  if (length <= expected) return 0;
  if (length > maxLength) return -1;
  return (expected - length) / buffer;
}

/**
 * Dynamic sampling's filter: the groups whose rewards are not all equal (a group that all succeeded or all
 * failed has zero advantage everywhere and teaches nothing). Returns the indices of the kept groups.
 */
export function informativeGroups(groupRewards: readonly (readonly number[])[], tolerance = 1e-9): number[] {
  return groupRewards.flatMap((rs, i) => (rs.length > 1 && Math.max(...rs) - Math.min(...rs) > tolerance ? [i] : []));
}

export interface ClipSettings {
  /** ε_low: the ratio is clipped below at 1 − ε_low (DAPO: 0.2). */
  clipLow: number;
  /** ε_high: and above at 1 + ε_high (DAPO's clip-higher: 0.28). */
  clipHigh: number;
  /** c of the dual clip: a negative advantage's loss is at most −A·c (verl: 3; this issue asks 10). */
  dualClip: number;
  /** β of a k3 KL to the reference, added per token; 0: none (DAPO's default). */
  klCoef: number;
}

export const DAPO_CLIP: ClipSettings = { clipLow: 0.2, clipHigh: 0.28, dualClip: 10, klCoef: 0 };

export interface PolicyGradientInput {
  /** log π_θ of each response token under the policy being trained: (B, T). */
  logps: T2;
  /** log π_old of the same tokens, when the rollouts were sampled: (B, T). */
  oldLogps: T2;
  /** Each token's advantage (its rollout's, broadcast): (B, T). */
  advantages: T2;
  /** 1 on the tokens trained on (the policy's own, not the user's or the tools'), else 0: (B, T). */
  mask: T2;
  /** log π_ref, for the KL term: (B, T). */
  refLogps?: T2;
}

export interface PolicyGradientOutput {
  /** The token-mean loss over every masked token of the batch. */
  loss: tf.Scalar;
  /** Shares of the masked tokens whose ratio the clip held: below 1 − ε_low with A < 0, above 1 + ε_high with A > 0. */
  clipLow: tf.Scalar;
  clipHigh: tf.Scalar;
  /** Share of negative-advantage tokens the dual clip bounded. */
  dualClipped: tf.Scalar;
  /** The k3 KL's token mean (0 without a reference). */
  kl: tf.Scalar;
}

/**
 * DAPO's policy loss (verl's compute_policy_loss with clip_ratio_low/high and clip_ratio_c, loss_agg_mode
 * "token-mean"): with ratio = exp(log π_θ − log π_old),
 *   L1 = −A·ratio, L2 = −A·clip(ratio, 1 − ε_low, 1 + ε_high), L = max(L1, L2);
 *   for A < 0, L = min(L, −A·c) (the dual clip);
 * plus β·k3 KL to the reference, k3 = exp(ref − log π) − (ref − log π) − 1. Averaged over every masked token
 * of the batch, so a long response weighs by its tokens, not as one sample.
 */
export function dapoLoss(x: PolicyGradientInput, s: ClipSettings = DAPO_CLIP): PolicyGradientOutput {
  const count = tf.maximum(tf.sum(x.mask), 1);
  const tokenMean = (t: tf.Tensor) => tf.div(tf.sum(tf.mul(t, x.mask)), count) as tf.Scalar;
  const ratio = tf.exp(tf.sub(x.logps, x.oldLogps));
  const negA = tf.neg(x.advantages);
  const l1 = tf.mul(negA, ratio);
  const l2 = tf.mul(negA, tf.clipByValue(ratio, 1 - s.clipLow, 1 + s.clipHigh));
  const clipped = tf.maximum(l1, l2);
  const l3 = tf.mul(negA, s.dualClip);
  const negative = tf.less(x.advantages, 0);
  const perToken = tf.where(negative, tf.minimum(clipped, l3), clipped);
  let loss = tokenMean(perToken);
  let kl = tf.scalar(0);
  if (s.klCoef > 0) {
    if (!x.refLogps) throw new Error('a KL coefficient needs reference log-probabilities');
    const d = tf.sub(x.refLogps, x.logps);
    kl = tokenMean(tf.sub(tf.sub(tf.exp(d), d), 1));
    loss = tf.add(loss, tf.mul(kl, s.klCoef)) as tf.Scalar;
  }
  const share = (t: tf.Tensor) => tokenMean(tf.cast(t, 'float32'));
  return {
    loss,
    clipLow: share(tf.logicalAnd(tf.less(ratio, 1 - s.clipLow), negative)),
    clipHigh: share(tf.logicalAnd(tf.greater(ratio, 1 + s.clipHigh), tf.greater(x.advantages, 0))),
    dualClipped: share(tf.logicalAnd(negative, tf.greater(clipped, l3))),
    kl,
  };
}

/** The mean entropy of the policy's next-token distributions over the masked positions, from logits (B·T, V). */
export function tokenEntropy(logits: T2, mask: T2): tf.Scalar {
  const logp = tf.logSoftmax(logits);
  const h = tf.neg(tf.sum(tf.mul(tf.exp(logp), logp), -1)); // (B·T)
  const m = tf.reshape(mask, [-1]);
  return tf.div(tf.sum(tf.mul(h, m)), tf.maximum(tf.sum(m), 1)) as tf.Scalar;
}
