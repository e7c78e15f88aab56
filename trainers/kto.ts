// The KTO trainer (Ethayarajh et al. 2024): single completions labelled desirable or not, against the frozen
// starting model. KTO's reference point is the batch's mean log-ratio on mismatched prompt–completion pairs,
// an estimate of KL(π‖π_ref), as TRL computes it.
import * as tf from '@tensorflow/tfjs-core';
import { NEVER } from '../pipeline/interrupt.ts';
import type { KtoRow } from '../core/records.ts';
import { truncatedSequences } from './data.ts';
import { hyperparameters, preferenceBatches, type Examples, type PreferenceTrainerOptions } from './dpo.ts';
import { LOSSES } from './losses/index.ts';
import type { Placeholders } from '../model/placeholders.ts';
import { stepsFor, type Trainer } from './run.ts';
import type { Chat } from '../model/chat.ts';
import { scoreSequences, sequenceValues, type Scores } from '../runtime/scoring.ts';

/**
 * KTO rows; beside each, the next row's completion after this row's prompt: the mismatched pair of the KL
 * estimate. A completion is a whole episode after the request, often longer than the context: one that does
 * not fit is cut at its end (its label is the episode's), as TRL truncates.
 */
export async function ktoExamples(
  chat: Chat,
  rows: KtoRow[],
  length: number,
  placeholders: Placeholders,
): Promise<Examples> {
  const examples = await Promise.all(
    rows.map(async (r, i) => {
      const [own] = await truncatedSequences(chat, r.prompt, [r.completion], length, placeholders);
      const [other] = await truncatedSequences(
        chat,
        r.prompt,
        [rows[(i + 1) % rows.length]!.completion],
        length,
        placeholders,
      );
      return { sequences: [own!, other!], label: r.label };
    }),
  );
  return { examples, rows: rows.map((_, i) => i), dropped: [] };
}

/** Trains `start()` with KTO; `reference` holds the starting model's scores of both sides of every example. */
export function ktoTrainer(o: PreferenceTrainerOptions & { reference: Scores[] }): Trainer {
  const { examples, reference, loss, cfg, pad, start } = o;
  if ((cfg.rpo_alpha ?? null) !== null)
    throw new Error('rpo_alpha: KTO has no chosen side to anchor (its rows are single completions); set it to null');
  const hyper = hyperparameters(cfg, loss);
  const batches = preferenceBatches(examples, reference, loss, cfg, pad);
  return {
    steps: stepsFor(cfg, examples.length),
    label: 'kto steps',
    start,
    batch: async (step, model, { score }) => {
      const b = batches(step);
      const B = b.idx.length;
      // The reference point: the batch's mean log-ratio on mismatched completions, not differentiated, at least 0 (in the loss).
      // Inside a step, so no safe point here: the step boundary is one, where the run can keep a checkpoint.
      const mismatched = sequenceValues(
        await scoreSequences(
          score ? async (block) => (await score(block)).logps : model, // where the run holds the weights
          b.idx.map((i) => examples[i]!.sequences[1]!),
          { maxTokens: cfg.micro_batch_tokens, pad, signal: NEVER },
        ),
        loss.average,
      );
      const kl = b.idx.reduce((sum, i, k) => sum + mismatched[k]! - b.refValue(1, i), 0) / B;
      const desirable = b.idx.filter((i) => examples[i]!.label).length;
      return {
        tokens: b.tokens,
        parts: b.groups.map((group) => {
          const block = b.block(group, 0);
          return {
            blocks: [block],
            loss: ([logps]) => {
              const labels = tf.tensor1d(group.map((i) => (examples[i]!.label ? 1 : 0)));
              const own = b.values(logps!, block);
              const out = LOSSES.kto.fn({ logps: own, refLogps: b.ref(group, 0), labels, kl }, hyper);
              const share = (x: tf.Tensor, n: number) => tf.div(tf.sum(x), Math.max(1, n)) as tf.Scalar;
              const unlabels = tf.sub(1, labels);
              const chosen = share(tf.mul(out.rewards, labels), desirable);
              const rejected = share(tf.mul(out.rewards, unlabels), B - desirable);
              return {
                loss: share(out.losses, B),
                metrics: {
                  'rewards/chosen': chosen,
                  'rewards/rejected': rejected,
                  'rewards/margins': tf.sub(chosen, rejected) as tf.Scalar,
                  'logps/chosen': share(tf.mul(own, labels), desirable),
                  'logps/rejected': share(tf.mul(own, unlabels), B - desirable),
                  kl: tf.scalar(kl * (group.length / B)),
                },
              };
            },
          };
        }),
      };
    },
  };
}
