// The pairwise preference trainer: DPO and its sigmoid, robust, hinge and IPO losses, SimPO and ORPO (the
// losses registry), on (chosen, rejected) sequences that share one cut of the prompt. The losses that need a
// reference take the frozen starting model's log-probabilities, computed once and cached.
import { existsSync, readFileSync } from 'node:fs';
import * as tf from '@tensorflow/tfjs-core';
import { z } from 'zod';
import type { Logger } from '../pipeline/log.ts';
import { writeFileAtomic } from '../pipeline/workspace.ts';
import type { Pair } from '../core/records.ts';
import { completionSequences } from './data.ts';
import {
  LOSSES,
  nllAnchor,
  preferenceMetrics,
  sequenceLogps,
  type LossName,
  type PairwiseLoss,
  type PreferenceHyperparameters,
} from './losses/index.ts';
import type { Llama } from '../model/llama.ts';
import type { Placeholders } from '../model/placeholders.ts';
import { stepsFor, type StepBatch, type Trainer } from './run.ts';
import type { TrainingSettings } from './settings.ts';
import type { Chat } from '../model/chat.ts';
import { batchAt, microBatches, padBatch, type Padded, type Sequence } from '../model/windows.ts';
import {
  scoreSequences,
  sequenceValues,
  type BlockScorer,
  type ScoringOptions,
  type Scores,
} from '../runtime/scoring.ts';

/** A loss as a run uses it: its registry name, traits and β. */
export interface LossChoice {
  name: LossName;
  average: boolean;
  reference: boolean;
  beta: number;
}

/** The loss a config names (`dpo` is the registry's `sigmoid`), with β or the loss's paper default. */
export function lossOf(loss: LossName | 'dpo', beta: number | null): LossChoice {
  const name = loss === 'dpo' ? 'sigmoid' : loss;
  const spec = LOSSES[name];
  return { name, average: spec.average, reference: spec.reference, beta: beta ?? spec.defaultBeta };
}

/** What a preference run records in its model's trainer_state.json (`info`), so eval reads the model as it was trained. */
const preferenceTraining = z.object({
  stage: z.literal('dpo'),
  loss: z.enum(Object.keys(LOSSES) as [LossName, ...LossName[]]),
  beta: z.number(),
  /** Tokens of prompt and completion together that a pair was cut to. */
  max_length: z.number().int(),
});
export type PreferenceTraining = z.infer<typeof preferenceTraining>;

/** The preference training a model folder's trainer state records; names the folder when it records none. */
export function readPreferenceTraining(info: unknown, source: string): PreferenceTraining & { choice: LossChoice } {
  const parsed = preferenceTraining.safeParse(info);
  if (!parsed.success)
    throw new Error(
      `${source}: trainer_state.json does not say how the model was preference-tuned (${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')})`,
    );
  return { ...parsed.data, choice: lossOf(parsed.data.loss, parsed.data.beta) };
}

/** One training example: a pair's [chosen, rejected], or a KTO row's [completion, the completion of another row after this prompt]. */
export interface Example {
  sequences: Sequence[];
  label?: boolean;
}

/** A row that could not become an example, and why. */
interface DroppedExample {
  /** Its index among the rows given. */
  row: number;
  reason: string;
}

/** Examples made from rows, and the rows left out. */
export interface Examples {
  examples: Example[];
  /** The row each example came from. */
  rows: number[];
  dropped: DroppedExample[];
}

/** Collects examples, or the reason a row gave none. */
function collectExamples(made: (Example | { tooLong: string })[]): Examples {
  const out: Examples = { examples: [], rows: [], dropped: [] };
  made.forEach((m, row) => {
    if ('tooLong' in m) out.dropped.push({ row, reason: m.tooLong });
    else {
      out.examples.push(m);
      out.rows.push(row);
    }
  });
  return out;
}

/** Pairs as [chosen, rejected] sequences sharing one cut of the prompt; a pair with a side that does not fit is left out. */
export async function pairExamples(
  chat: Chat,
  pairs: Pair[],
  length: number,
  placeholders: Placeholders,
): Promise<Examples> {
  const made = await Promise.all(
    pairs.map(async (p) => {
      const sequences = await completionSequences(chat, p.prompt, [p.chosen, p.rejected], length, placeholders);
      return 'tooLong' in sequences ? sequences : { sequences };
    }),
  );
  return collectExamples(made);
}

/** The reference model's scores of every example's sequences, computed once per (reference, data) and kept in `path`. */
export async function referenceScores(
  model: Llama | BlockScorer,
  examples: Example[],
  o: ScoringOptions & { path: string; log: Logger },
): Promise<Scores[]> {
  const { path, log } = o;
  const sides = examples[0]?.sequences.length ?? 0;
  const saved = readSavedScores(path);
  if (
    saved?.length === sides &&
    saved.every((s) => s.sum.length === examples.length && s.count.length === examples.length)
  ) {
    log.info('reference log-probabilities from the cache', { path });
    return saved.map((s) => ({ sum: Float64Array.from(s.sum), count: Int32Array.from(s.count) }));
  }
  const scores: Scores[] = [];
  for (let k = 0; k < sides; k++)
    scores.push(
      await scoreSequences(
        model,
        examples.map((e) => e.sequences[k]!),
        { ...o, label: `reference log-probabilities ${k + 1}/${sides}` },
      ),
    );
  await writeFileAtomic(path, JSON.stringify(scores.map((s) => ({ sum: [...s.sum], count: [...s.count] }))));
  return scores;
}

/** The cached scores in `path`, or null when there are none or the file cannot be read (it is then computed again). */
function readSavedScores(path: string): { sum: number[]; count: number[] }[] | null {
  if (!existsSync(path)) return null;
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as { sum: number[]; count: number[] }[];
  } catch {
    return null;
  }
}

/** The settings a preference trainer reads from its stage's config. */
export interface PreferenceSettings extends TrainingSettings {
  label_smoothing: number;
  /** RPO's α on the chosen side's NLL (pairwise losses but ORPO, which has its own); null or absent: none. */
  rpo_alpha?: number | null;
  gamma_beta_ratio: number;
  desirable_weight: number;
  undesirable_weight: number;
}

export const hyperparameters = (cfg: PreferenceSettings, loss: LossChoice): PreferenceHyperparameters => ({
  beta: loss.beta,
  label_smoothing: cfg.label_smoothing,
  gamma_beta_ratio: cfg.gamma_beta_ratio,
  desirable_weight: cfg.desirable_weight,
  undesirable_weight: cfg.undesirable_weight,
});

/** One step's batch of examples, as every preference trainer cuts it: whole examples in micro-batches. */
export interface PreferenceBatch {
  idx: number[];
  /** Micro-batches of example indices; each adds its share (its size / the batch's) of the mean loss and metrics. */
  groups: number[][];
  tokens: number;
  /** Side `side` of the examples in `group`, as one padded block for the model to score. */
  block(group: number[], side: number): Padded;
  /** A block's sequence log-probabilities (sums, or means when the loss averages) from its token log-probs. (group,) */
  values(logps: tf.Tensor2D, block: Padded): tf.Tensor1D;
  /** The reference's values of side `side` of the examples in `group`. (group,) */
  ref(group: number[], side: number): tf.Tensor1D;
  /** The reference's value of side `side` of example `i`. */
  refValue(side: number, i: number): number;
}

/** The batches of a preference run over `examples`, drawn by the seed and step, with the reference's scores. */
export function preferenceBatches(
  examples: Example[],
  reference: Scores[] | null,
  loss: LossChoice,
  cfg: TrainingSettings,
  pad: number,
): (step: number) => PreferenceBatch {
  const lengths = examples.map((e) => Math.max(...e.sequences.map((s) => s.ids.length)));
  const refValues = reference?.map((r) => sequenceValues(r, loss.average));
  const refValue = (k: number, i: number) => refValues![k]![i]!;
  return (step) => {
    const idx = batchAt(lengths, cfg.batch_size, cfg.seed, step);
    return {
      idx,
      groups: microBatches(
        idx.map((i) => [i]),
        (i) => lengths[i]! * 2,
        cfg.micro_batch_tokens,
      ),
      tokens: idx.reduce((n, i) => n + examples[i]!.sequences.reduce((m, s) => m + s.ids.length, 0), 0),
      block: (group, side) =>
        padBatch(
          group.map((i) => examples[i]!.sequences[side]!),
          pad,
        ),
      values: (logps, b) => sequenceLogps(logps, tf.tensor2d(b.mask, [b.batch, b.length]), loss.average),
      ref: (group, side) => tf.tensor1d(group.map((i) => refValue(side, i))),
      refValue,
    };
  };
}

/** What a preference trainer trains on, with which loss and settings, from which model. */
export interface PreferenceTrainerOptions {
  examples: Example[];
  /** The frozen starting model's scores of both sides of every example; null where the loss needs none. */
  reference: Scores[] | null;
  loss: LossChoice;
  cfg: PreferenceSettings;
  pad: number;
  /** The model to start from when there is no checkpoint. */
  start: () => Llama;
}

/** Trains `start()` on pairs with a pairwise loss of the registry; `reference` when the loss needs one. */
export function dpoTrainer(o: PreferenceTrainerOptions): Trainer {
  const { examples, reference, loss, cfg, pad, start } = o;
  const family = LOSSES[loss.name] as PairwiseLoss;
  const hyper = hyperparameters(cfg, loss);
  const alpha = cfg.rpo_alpha ?? null;
  if (alpha !== null && loss.name === 'orpo')
    throw new Error('rpo_alpha: ORPO adds the chosen side’s NLL itself; set rpo_alpha to null');
  const batches = preferenceBatches(examples, reference, loss, cfg, pad);
  /** The chosen side's trained tokens (its targets' mask) in example i. */
  const chosenTokens = (i: number) => examples[i]!.sequences[0]!.mask.slice(1).reduce((n, m) => n + m, 0);
  return {
    steps: stepsFor(cfg, examples.length),
    label: `${loss.name === 'sigmoid' ? 'dpo' : loss.name} steps`,
    start,
    batch: (step): StepBatch => {
      const b = batches(step);
      const B = b.idx.length;
      // RPO's NLL is a mean over the whole batch's chosen tokens: each micro-batch adds its tokens' part.
      const batchTokens = alpha === null ? 0 : b.idx.reduce((n, i) => n + chosenTokens(i), 0);
      return {
        tokens: b.tokens,
        parts: b.groups.map((group) => {
          const [chosen, rejected] = [b.block(group, 0), b.block(group, 1)];
          return {
            blocks: [chosen, rejected],
            loss: ([c, r]) => {
              const x = {
                chosen: b.values(c!, chosen),
                rejected: b.values(r!, rejected),
                ...(reference ? { refChosen: b.ref(group, 0), refRejected: b.ref(group, 1) } : {}),
              };
              const o = family.fn(x, hyper);
              const share = group.length / B;
              const metrics = Object.fromEntries(
                Object.entries(preferenceMetrics(o, x)).map(([k, v]) => [k, tf.mul(v, share) as tf.Scalar]),
              );
              const pairwise = tf.mul(tf.mean(o.losses), share) as tf.Scalar;
              if (alpha === null) return { loss: pairwise, metrics };
              const sums = loss.average
                ? sequenceLogps(c!, tf.tensor2d(chosen.mask, [chosen.batch, chosen.length]), false)
                : x.chosen;
              metrics.nll_loss = nllAnchor(sums, batchTokens, 1);
              return { loss: tf.add(pairwise, tf.mul(metrics.nll_loss, alpha)) as tf.Scalar, metrics };
            },
          };
        }),
      };
    },
  };
}

/** Mean of the values; null for none. */
const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);

/**
 * Held-out pair figures of one model against the reference's scores: accuracy of its own log-probabilities,
 * and DPO's implicit rewards β·(log π − log π_ref) (reference-free losses: β·log π, on means).
 */
export function heldOutPairFigures(
  policy: Scores[],
  reference: Scores[],
  training: Omit<LossChoice, 'name'>,
  isReference: boolean,
): Record<string, number | null> {
  const [chosen, rejected] = policy.map((s) => sequenceValues(s, training.average)) as [Float64Array, Float64Array];
  const [refChosen, refRejected] = reference.map((s) => sequenceValues(s, training.average)) as [
    Float64Array,
    Float64Array,
  ];
  const own: number[] = [];
  const margins: number[] = [];
  chosen.forEach((c, i) => {
    own.push(c - rejected[i]!);
    const ratio = training.reference ? c - refChosen[i]! - (rejected[i]! - refRejected[i]!) : c - rejected[i]!;
    margins.push(training.beta * ratio);
  });
  const rewards = !training.reference || !isReference;
  return {
    'pairs/accuracy': mean(own.map((m) => (m > 0 ? 1 : 0))),
    'rewards/accuracies': rewards ? mean(margins.map((m) => (m > 0 ? 1 : 0))) : null,
    'rewards/margins': rewards ? mean(margins) : null,
  };
}

/** Per pair: 1 when the model gives the chosen side the higher log-probability (sums, or means when `average`), else 0. */
export function pairWins(scores: Scores[], average: boolean): number[] {
  const [chosen, rejected] = scores.map((s) => sequenceValues(s, average)) as [Float64Array, Float64Array];
  return Array.from(chosen, (c, i) => (c > rejected[i]! ? 1 : 0));
}

/**
 * Per pair: 1 when the chosen side has fewer trained (assistant) tokens, ½ on a tie, else 0. Its mean is what
 * "prefer the shorter side" scores, the accuracy a model gets from summed log-probabilities of a length cue alone.
 */
export function shorterChosen(examples: Example[]): number[] {
  const tokens = (s: Sequence) => s.mask.reduce((n, m) => n + m, 0);
  return examples.map((e) => {
    const [c, r] = e.sequences.map(tokens) as [number, number];
    return c < r ? 1 : c === r ? 0.5 : 0;
  });
}
