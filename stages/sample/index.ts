// sample: for tasks with too few logged candidates, draw more from an OpenAI-compatible endpoint at
// temperature 0.7, so best-of-N has N to choose from. A simulator task is rolled out in the environment
// with the model as the policy (so the candidate has a real reward); any other prompt gets one sampled
// reply (no reward). Every answer is cached per (model, request, index): a rerun pays nothing.
import { z } from 'zod';
import { endpointConfig, endpointEnvironment } from '../../judges/endpoint.ts';
import { defineStage } from '../../pipeline/stage.ts';
import { redactionConfig } from '../../core/redact.ts';

const config = z.strictObject({
  enabled: z.boolean().default(false).describe('Off by default: the default run needs no endpoint.'),
  min_candidates: z
    .number()
    .int()
    .min(2)
    .max(64)
    .default(4)
    .describe('A task with fewer logged sessions than this gets sampled candidates up to it.'),
  temperature: z
    .number()
    .min(0)
    .max(2)
    .default(0.7)
    .describe('Sampling temperature: above 0, so that the candidates differ.'),
  max_tokens: z.number().int().min(1).default(512).describe('Most tokens in one sampled assistant message.'),
  splits: z
    .array(z.enum(['train', 'test']))
    .default(['train'])
    .describe('Sides of the split whose tasks are topped up with sampled candidates.'),
  endpoint: endpointConfig
    .prefault({})
    .describe('The OpenAI-compatible endpoint candidates are drawn from; PREFAB_SAMPLE_MODEL overrides its model.'),
  redaction: redactionConfig
    .prefault({})
    .describe(
      'Personal data masked in a request before it leaves the machine; the values are put back into the reply.',
    ),
});

const ENDPOINT = { key: 'sample.endpoint', modelEnv: 'PREFAB_SAMPLE_MODEL' };

/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const sample = defineStage({
  name: 'sample',
  description:
    'draw more candidates from an OpenAI-compatible endpoint for tasks with too few logged sessions (off by default)',
  version: 1,
  inputs: ['ingest', 'split'],
  outputs: ['sessions', 'info.json'],
  config,
  environment: (cfg) => (cfg.enabled ? endpointEnvironment(ENDPOINT) : []),

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
  shard: (parts, out) => import('./run.ts').then((m) => m.merge(parts, out)),
});
