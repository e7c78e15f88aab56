// Supervised fine-tuning: next-token cross-entropy on assistant tokens only.
import * as tf from '@tensorflow/tfjs-core';

/** Mean negative log-likelihood over the tokens where mask is 1. tokenLogps, mask: (B, T). */
export function sftLoss(tokenLogps: tf.Tensor2D, mask: tf.Tensor2D): tf.Scalar {
  return tf.div(tf.neg(tf.sum(tf.mul(tokenLogps, mask))), tf.maximum(tf.sum(mask), 1)) as tf.Scalar;
}

/** A sequence's log-probability over its masked tokens: the sum (DPO, KTO) or the mean (SimPO, IPO, ORPO). (B,) */
export function sequenceLogps(tokenLogps: tf.Tensor2D, mask: tf.Tensor2D, average: boolean): tf.Tensor1D {
  const sum = tf.sum(tf.mul(tokenLogps, mask), 1) as tf.Tensor1D;
  return average ? (tf.div(sum, tf.maximum(tf.sum(mask, 1), 1)) as tf.Tensor1D) : sum;
}
