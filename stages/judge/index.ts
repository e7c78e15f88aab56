// judge: every pair from the pairs stage, and best-of-N among each task's candidates (logged trials and
// sampled ones), goes before the judges: a decisive verifier first, then the weighted votes of the rules
// and, when configured, an LLM judge. Every judged comparison is written, kept or not: the gate decides.
import { z } from 'zod';
import { panelConfig, panelEnvironment, panelPromptFile } from '../../judges/panel.ts';
import { defineStage } from '../../pipeline/stage.ts';
import { redactionConfig } from '../../core/redact.ts';

const config = z.strictObject({
  best_of_n: z
    .strictObject({
      enabled: z
        .boolean()
        .default(true)
        .describe(
          "Judge each task's candidates (logged and sampled sessions) to find the best, and pair it against the others.",
        ),
      min_candidates: z.number().int().min(2).default(2).describe('Groups with fewer candidates are not judged.'),
      max_candidates: z
        .number()
        .int()
        .min(2)
        .default(8)
        .describe('Larger groups are cut to this many (by session id, a stable choice unrelated to quality).'),
    })
    .prefault({})
    .describe(
      "Best-of-N: the judges pick the best of a task's candidates; it is the chosen side against each other candidate.",
    ),
  ...panelConfig,
  redaction: redactionConfig
    .prefault({})
    .describe("Personal data masked in the LLM judge's requests before they leave the machine."),
  imported: z
    .enum(['as_given', 'recheck'])
    .default('as_given')
    .describe(
      'Imported pairs (the import stage): kept as the data gives them (confidence 1), or judged like the pairs built here.',
    ),
  batch_size: z
    .number()
    .int()
    .min(1)
    .default(256)
    .describe("Comparisons judged at once; the endpoint's concurrency still bounds requests in flight."),
});

/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const judge = defineStage({
  name: 'judge',
  description:
    "judge every pair, and pick best-of-N among each task's candidates: verifier, rules and (optional) LLM judge",
  version: 5,
  inputs: ['ingest', 'import', 'split', 'sample', 'pairs'],
  outputs: ['train.jsonl', 'test.jsonl', 'report.json'],
  config,

  environment: panelEnvironment,

  async external(cfg, configDir) {
    const prompt = panelPromptFile(cfg, configDir);
    return prompt ? [prompt] : [];
  },

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
  shard: (parts, out) => import('./run.ts').then((m) => m.merge(parts, out)),
});
