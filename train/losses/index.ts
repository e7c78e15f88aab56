// The losses by name, as the config chooses them. A new loss is one function in a family file and one entry here.
import type * as tf from '@tensorflow/tfjs-core';
import { dpoHingeLoss, dpoRobustLoss, dpoSigmoidLoss, ipoLoss, orpoOddsRatioLoss, simpoLoss, type PairLogps, type PreferenceOutput } from './preference.ts';

export { sftLoss, sequenceLogps } from './sft.ts';
export { ktoLoss } from './kto.ts';
export { preferenceMetrics } from './preference.ts';

export interface PreferenceHyperparameters {
  beta: number;
  label_smoothing: number;
  /** SimPO's γ/β. */
  gamma_beta_ratio: number;
}

export interface PreferenceLoss {
  fn: (x: PairLogps, h: PreferenceHyperparameters) => PreferenceOutput;
  /** Sequence log-probabilities are means over assistant tokens (true) or sums (false). */
  average: boolean;
  /** Needs a frozen reference model's log-probabilities. */
  reference: boolean;
  /** Adds the chosen side's SFT loss (ORPO). */
  sft: boolean;
  /** β when the config gives none: the paper's default. */
  defaultBeta: number;
}

export const PREFERENCE_LOSSES = {
  sigmoid: { fn: (x, h) => dpoSigmoidLoss(x, { beta: h.beta, labelSmoothing: h.label_smoothing }), average: false, reference: true, sft: false, defaultBeta: 0.1 },
  robust: { fn: (x, h) => dpoRobustLoss(x, { beta: h.beta, labelSmoothing: h.label_smoothing }), average: false, reference: true, sft: false, defaultBeta: 0.1 },
  hinge: { fn: (x, h) => dpoHingeLoss(x, { beta: h.beta, labelSmoothing: 0 }), average: false, reference: true, sft: false, defaultBeta: 0.1 },
  ipo: { fn: (x, h) => ipoLoss(x, { beta: h.beta, labelSmoothing: 0 }), average: true, reference: true, sft: false, defaultBeta: 0.1 },
  simpo: { fn: (x, h) => simpoLoss(x, { beta: h.beta, gammaBetaRatio: h.gamma_beta_ratio, labelSmoothing: h.label_smoothing }), average: true, reference: false, sft: false, defaultBeta: 2.0 },
  orpo: { fn: (x, h) => orpoOddsRatioLoss(x, { lambda: h.beta }), average: true, reference: false, sft: true, defaultBeta: 0.1 },
} satisfies Record<string, PreferenceLoss>;

export type PreferenceLossName = keyof typeof PREFERENCE_LOSSES;

/** The loss names a config may give: the pairwise ones, `dpo` for DPO's sigmoid loss, and `kto`. */
export const LOSS_NAMES = ['dpo', ...Object.keys(PREFERENCE_LOSSES), 'kto'] as const;

export type Scalars = Record<string, tf.Scalar>;
