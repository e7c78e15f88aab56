// tokenizer: a byte-level BPE trained on the training split's sessions as the model will read them (values it
// copies as placeholders: model/placeholders.ts), saved as tokenizer.json beside placeholders.json.
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import { placeholdersConfig } from './placeholders.ts';
import { PLACEHOLDERS_FILE } from '../../model/placeholders.ts';

const config = z.strictObject({
  vocab_size: z
    .number()
    .int()
    .min(263)
    .default(1024)
    .describe(
      "The whole vocabulary: bytes (256), the placeholder tokens, the chat template's 7 special tokens, and BPE's merges in the rest.",
    ),
  split_digits: z
    .boolean()
    .default(true)
    .describe(
      "Every digit a token of its own: a model then copies a phone or account number digit by digit, instead of learning each number's merges.",
    ),
  placeholders: placeholdersConfig
    .prefault({})
    .describe('Values the agent copies (phone numbers, form values) shown to the model as placeholders: [PHONE_3].'),
  placeholder_tokens: z
    .number()
    .int()
    .min(0)
    .default(64)
    .describe(
      'At most this many placeholders made tokens of their own (taken from the vocabulary): for each label, [PHONE_1] up to one past the highest number a training session reaches, so copying [PHONE_3] is picking one token, not spelling "[", "PHONE", "_", "3", "]", and a made-up value (the next number) is one token too.',
    ),
});

/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const tokenizer = defineStage({
  name: 'tokenizer',
  description: 'train a byte-level BPE tokenizer on the training sessions',
  version: 6,
  inputs: ['export'],
  outputs: ['tokenizer.json', PLACEHOLDERS_FILE],
  config,

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
});
