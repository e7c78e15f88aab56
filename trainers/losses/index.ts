// The losses by name, as the config chooses them. A new loss is one function in a family file and one entry here.
import * as tf from '@tensorflow/tfjs-core';
import { ktoLoss, type KtoInput, type KtoOutput } from './kto.ts';
import {
  dpoHingeLoss,
  dpoRobustLoss,
  dpoSigmoidLoss,
  ipoLoss,
  orpoOddsRatioLoss,
  simpoLoss,
  type PairLogps,
  type PreferenceOutput,
} from './preference.ts';

export { sftLoss, sequenceLogps } from './sft.ts';
export { nllAnchor, preferenceMetrics } from './preference.ts';
// Reinforcement learning from rollouts (the dapo stage): GRPO advantages, DAPO's clipped token-mean loss.
export {
  DAPO_CLIP,
  dapoLoss,
  groupAdvantages,
  informativeGroups,
  overlongPenalty,
  tokenEntropy,
  type ClipSettings,
} from './policy-gradient.ts';

export interface PreferenceHyperparameters {
  beta: number;
  label_smoothing: number;
  /** SimPO's γ/β. */
  gamma_beta_ratio: number;
  /** KTO's weights on desirable and undesirable completions. */
  desirable_weight: number;
  undesirable_weight: number;
}

interface LossTraits {
  /** Sequence log-probabilities are means over assistant tokens (true) or sums (false). */
  average: boolean;
  /** Needs a frozen reference model's log-probabilities. */
  reference: boolean;
  /** β when the config gives none: the paper's default. */
  defaultBeta: number;
}

/** A loss on (chosen, rejected) pairs. */
export interface PairwiseLoss extends LossTraits {
  kind: 'pairwise';
  fn: (x: PairLogps, h: PreferenceHyperparameters) => PreferenceOutput;
}

/** A loss on single completions labelled desirable or not (KTO). */
export interface UnpairedLoss extends LossTraits {
  kind: 'unpaired';
  fn: (x: KtoInput, h: PreferenceHyperparameters) => KtoOutput;
}

const pairwise = (fn: PairwiseLoss['fn'], traits: LossTraits): PairwiseLoss => ({ kind: 'pairwise', fn, ...traits });

export const LOSSES = {
  sigmoid: pairwise((x, h) => dpoSigmoidLoss(x, { beta: h.beta, labelSmoothing: h.label_smoothing }), {
    average: false,
    reference: true,
    defaultBeta: 0.1,
  }),
  robust: pairwise((x, h) => dpoRobustLoss(x, { beta: h.beta, labelSmoothing: h.label_smoothing }), {
    average: false,
    reference: true,
    defaultBeta: 0.1,
  }),
  hinge: pairwise((x, h) => dpoHingeLoss(x, { beta: h.beta, labelSmoothing: 0 }), {
    average: false,
    reference: true,
    defaultBeta: 0.1,
  }),
  ipo: pairwise((x, h) => ipoLoss(x, { beta: h.beta, labelSmoothing: 0 }), {
    average: true,
    reference: true,
    defaultBeta: 0.1,
  }),
  simpo: pairwise(
    (x, h) => simpoLoss(x, { beta: h.beta, gammaBetaRatio: h.gamma_beta_ratio, labelSmoothing: h.label_smoothing }),
    { average: true, reference: false, defaultBeta: 2.0 },
  ),
  // ORPO: the odds-ratio term plus the chosen side's SFT loss (its mean log-probability, negated).
  orpo: pairwise(
    (x, h) => {
      const o = orpoOddsRatioLoss(x, { lambda: h.beta });
      return { ...o, losses: tf.sub(o.losses, x.chosen) as tf.Tensor1D };
    },
    { average: true, reference: false, defaultBeta: 0.1 },
  ),
  kto: {
    kind: 'unpaired',
    fn: (x, h) =>
      ktoLoss(x, { beta: h.beta, desirableWeight: h.desirable_weight, undesirableWeight: h.undesirable_weight }),
    average: false,
    reference: true,
    defaultBeta: 0.1,
  } satisfies UnpairedLoss,
} satisfies Record<string, PairwiseLoss | UnpairedLoss>;

export type LossName = keyof typeof LOSSES;
