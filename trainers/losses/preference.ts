// Pairwise preference losses, as pure functions of per-example sequence log-probabilities (B,), following
// the papers and TRL (DPOTrainer.dpo_loss, CPOTrainer for SimPO, ORPOTrainer.odds_ratio_loss).
// Each returns per-example losses and the implicit rewards TRL logs as rewards/chosen and rewards/rejected.
import * as tf from '@tensorflow/tfjs-core';

type T1 = tf.Tensor1D;

/** log σ(x) = −softplus(−x). tf.logSigmoid's gradient reads its input after tfjs may have disposed it. */
function logSigmoid(x: tf.Tensor): tf.Tensor {
  return tf.neg(tf.softplus(tf.neg(x)));
}

export interface PairLogps {
  /** Policy log-probabilities of the chosen and rejected completions. */
  chosen: T1;
  rejected: T1;
  /** The frozen reference model's, for losses that use one. */
  refChosen?: T1;
  refRejected?: T1;
}

export interface PreferenceOutput {
  losses: T1;
  chosenRewards: T1;
  rejectedRewards: T1;
}

export interface DpoParams {
  beta: number;
  /** Label smoothing ε: the chance a label is flipped (sigmoid: conservative DPO; robust: rDPO). */
  labelSmoothing: number;
}

/** β·(log π − log π_ref) for both sides, and the DPO logit (π_c − π_r) − (ref_c − ref_r). */
function dpoTerms(x: PairLogps, beta: number) {
  if (!x.refChosen || !x.refRejected) throw new Error('this loss needs reference log-probabilities');
  const chosenRatio = tf.sub(x.chosen, x.refChosen);
  const rejectedRatio = tf.sub(x.rejected, x.refRejected);
  return {
    logits: tf.sub(chosenRatio, rejectedRatio) as T1,
    chosenRewards: tf.mul(chosenRatio, beta) as T1,
    rejectedRewards: tf.mul(rejectedRatio, beta) as T1,
  };
}

/** DPO (Rafailov et al. 2023): −log σ(β·logits), with label smoothing ε as cDPO: −(1−ε)·log σ(βz) − ε·log σ(−βz). */
export function dpoSigmoidLoss(x: PairLogps, p: DpoParams): PreferenceOutput {
  const { logits, chosenRewards, rejectedRewards } = dpoTerms(x, p.beta);
  const z = tf.mul(logits, p.beta);
  const losses = tf.sub(
    tf.mul(logSigmoid(z), -(1 - p.labelSmoothing)),
    tf.mul(logSigmoid(tf.neg(z)), p.labelSmoothing),
  ) as T1;
  return { losses, chosenRewards, rejectedRewards };
}

/** Robust DPO (Chowdhury et al. 2024): unbiased under flip rate ε: ((1−ε)·(−log σ(βz)) + ε·log σ(−βz)) / (1 − 2ε). */
export function dpoRobustLoss(x: PairLogps, p: DpoParams): PreferenceOutput {
  const { logits, chosenRewards, rejectedRewards } = dpoTerms(x, p.beta);
  const z = tf.mul(logits, p.beta);
  const losses = tf.div(
    tf.add(tf.mul(logSigmoid(z), -(1 - p.labelSmoothing)), tf.mul(logSigmoid(tf.neg(z)), p.labelSmoothing)),
    1 - 2 * p.labelSmoothing,
  ) as T1;
  return { losses, chosenRewards, rejectedRewards };
}

/** Hinge (SLiC, Zhao et al. 2023): max(0, 1 − β·logits). */
export function dpoHingeLoss(x: PairLogps, p: DpoParams): PreferenceOutput {
  const { logits, chosenRewards, rejectedRewards } = dpoTerms(x, p.beta);
  return { losses: tf.relu(tf.sub(1, tf.mul(logits, p.beta))) as T1, chosenRewards, rejectedRewards };
}

/** IPO (Azar et al. 2023): (logits − 1/(2β))², on average (not summed) log-probabilities. */
export function ipoLoss(x: PairLogps, p: DpoParams): PreferenceOutput {
  const { logits, chosenRewards, rejectedRewards } = dpoTerms(x, p.beta);
  return { losses: tf.square(tf.sub(logits, 1 / (2 * p.beta))) as T1, chosenRewards, rejectedRewards };
}

export interface SimpoParams {
  beta: number;
  /** γ/β: the target margin in units of β (SimPO's gamma_beta_ratio). */
  gammaBetaRatio: number;
  labelSmoothing: number;
}

/** SimPO (Meng et al. 2024): −log σ(β·(avg π_c − avg π_r) − γ), no reference model. Rewards are β·avg log π. */
export function simpoLoss(x: PairLogps, p: SimpoParams): PreferenceOutput {
  const z = tf.mul(tf.sub(tf.sub(x.chosen, x.rejected), p.gammaBetaRatio), p.beta);
  const losses = tf.sub(
    tf.mul(logSigmoid(z), -(1 - p.labelSmoothing)),
    tf.mul(logSigmoid(tf.neg(z)), p.labelSmoothing),
  ) as T1;
  return { losses, chosenRewards: tf.mul(x.chosen, p.beta) as T1, rejectedRewards: tf.mul(x.rejected, p.beta) as T1 };
}

export interface OrpoParams {
  /** λ, the weight of the odds-ratio term against the chosen side's NLL (TRL calls it beta). */
  lambda: number;
}

/** log(1 − eˣ) for x < 0, kept finite as x → 0. */
function log1mExp(x: tf.Tensor): tf.Tensor {
  return tf.log1p(tf.neg(tf.exp(tf.minimum(x, -1e-6))));
}

/**
 * ORPO's odds-ratio term (Hong et al. 2024), on average log-probabilities: −λ·log σ(log odds(c) − log odds(r)),
 * odds(y) = p/(1−p). The full ORPO loss adds the chosen side's SFT loss: the registry's `orpo` entry does.
 */
export function orpoOddsRatioLoss(x: PairLogps, p: OrpoParams): PreferenceOutput {
  const logOdds = tf.sub(tf.sub(x.chosen, x.rejected), tf.sub(log1mExp(x.chosen), log1mExp(x.rejected)));
  return {
    losses: tf.mul(logSigmoid(logOdds), -p.lambda) as T1,
    chosenRewards: tf.mul(x.chosen, p.lambda) as T1,
    rejectedRewards: tf.mul(x.rejected, p.lambda) as T1,
  };
}

/**
 * RPO's anchor (Pang et al. 2024, Iterative Reasoning Preference Optimization; TRL's `rpo_alpha`): α times the
 * chosen sides' negative log-likelihood, a mean over all their tokens, added to a pairwise loss's batch mean,
 * so that widening the margin cannot pay by lowering the chosen side's likelihood. `chosenSums`: each chosen
 * side's summed token log-probabilities; `tokens`: their tokens in the whole batch (a micro-batch adds its
 * part).
 */
export function nllAnchor(chosenSums: T1, tokens: number, alpha: number): tf.Scalar {
  return tf.mul(tf.div(tf.neg(tf.sum(chosenSums)), Math.max(1, tokens)), alpha) as tf.Scalar;
}

/** TRL's logged metrics, as means over the batch. */
export function preferenceMetrics(out: PreferenceOutput, x: PairLogps): Record<string, tf.Scalar> {
  return {
    'rewards/chosen': tf.mean(out.chosenRewards),
    'rewards/rejected': tf.mean(out.rejectedRewards),
    'rewards/accuracies': tf.mean(tf.cast(tf.greater(out.chosenRewards, out.rejectedRewards), 'float32')),
    'rewards/margins': tf.mean(tf.sub(out.chosenRewards, out.rejectedRewards)),
    'logps/chosen': tf.mean(x.chosen),
    'logps/rejected': tf.mean(x.rejected),
  };
}
