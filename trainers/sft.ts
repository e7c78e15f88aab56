// The SFT trainer: next-token cross-entropy on assistant tokens, over a corpus of windows cut to the context.
import * as tf from '@tensorflow/tfjs-core';
import { sftLoss } from './losses/index.ts';
import type { Llama } from '../model/llama.ts';
import type { Trainer } from './run.ts';
import type { TrainingSettings } from './settings.ts';
import { stepsFor } from './run.ts';
import { batchAt, maskedIn, microBatches, padBatch, type Sequence } from '../model/windows.ts';

/** Trains the model `start` makes (a new one, or a pretrained one) on `sequences` (sftSequences in data.ts), batches drawn by the seed. */
export function sftTrainer(sequences: Sequence[], start: () => Llama, cfg: TrainingSettings, pad: number): Trainer {
  const lengths = sequences.map((s) => s.ids.length);
  return {
    steps: stepsFor(cfg, sequences.length),
    label: 'sft steps',
    start,
    batch: (step) => {
      const batch = batchAt(lengths, cfg.batch_size, cfg.seed, step).map((i) => sequences[i]!);
      const blocks = microBatches(
        batch.map((s) => [s]),
        (s) => s.ids.length,
        cfg.micro_batch_tokens,
      ).map((b) => padBatch(b, pad));
      const counted = blocks.reduce((n, b) => n + maskedIn(b), 0);
      return {
        tokens: blocks.reduce((n, b) => n + b.tokens, 0),
        // Mean NLL over the batch's assistant tokens: each micro-batch adds its tokens' share.
        parts: blocks.map((b) => ({
          blocks: [b],
          loss: ([logps]) => ({
            loss: tf.mul(
              sftLoss(logps!, tf.tensor2d(b.mask, [b.batch, b.length])),
              maskedIn(b) / Math.max(1, counted),
            ) as tf.Scalar,
          }),
        })),
      };
    },
  };
}
