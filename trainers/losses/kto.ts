// KTO (Ethayarajh et al. 2024) for unpaired completions labelled desirable or undesirable, as TRL's kto_loss.
import * as tf from '@tensorflow/tfjs-core';

type T1 = tf.Tensor1D;

export interface KtoParams {
  beta: number;
  desirableWeight: number;
  undesirableWeight: number;
}

export interface KtoInput {
  /** Policy and reference log-probabilities of each completion (summed over its tokens). */
  logps: T1;
  refLogps: T1;
  /** 1 for desirable, 0 for undesirable. */
  labels: T1;
  /**
   * The reference point z₀: an estimate of KL(π ‖ π_ref), from completions paired with prompts they do not
   * belong to, clamped at 0 and not differentiated (a number).
   */
  kl: number;
}

/**
 * Desirable: w_d·(1 − σ(β·(r − z₀))); undesirable: w_u·(1 − σ(β·(z₀ − r))), where r = log π − log π_ref.
 * Returns per-example losses and rewards β·r.
 */
export interface KtoOutput {
  losses: T1;
  rewards: T1;
}

export function ktoLoss(x: KtoInput, p: KtoParams): KtoOutput {
  const ratio = tf.sub(x.logps, x.refLogps);
  const kl = Math.max(0, x.kl);
  const desirable = tf.mul(tf.sub(1, tf.sigmoid(tf.mul(tf.sub(ratio, kl), p.beta))), p.desirableWeight);
  const undesirable = tf.mul(tf.sub(1, tf.sigmoid(tf.mul(tf.sub(kl, ratio), p.beta))), p.undesirableWeight);
  const losses = tf.add(tf.mul(x.labels, desirable), tf.mul(tf.sub(1, x.labels), undesirable)) as T1;
  return { losses, rewards: tf.mul(ratio, p.beta) as T1 };
}
