// eval: the untrained model, the SFT model and the preference-tuned model side by side, on held-out pairs
// (accuracy, DPO's implicit rewards against the SFT reference), held-out NLL, and acting in the simulator on
// validation tasks (success mean@k, pass@k, reward, turns). Prints the table and writes it as JSON.
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import { DEFAULT_WORLD } from '../../env/world.ts';
import { maxCalls } from '../../rl/settings.ts';

const config = z.strictObject({
  seed: z.string().default('prefab').describe("Which pairs and sessions the max_* draw, and the simulator's sampling."),
  max_pairs: z
    .number()
    .int()
    .min(1)
    .nullable()
    .default(100)
    .describe('Held-out pairs to score (null: all), drawn by a seeded shuffle.'),
  max_sessions: z
    .number()
    .int()
    .min(1)
    .nullable()
    .default(50)
    .describe('Held-out SFT sessions whose NLL is measured (null: all), drawn by a seeded shuffle.'),
  micro_batch_tokens: z
    .number()
    .int()
    .min(16)
    .default(2048)
    .describe('Largest micro-batch when scoring held-out pairs and sessions, in padded tokens.'),
  simulator: z
    .strictObject({
      world_seed: z
        .number()
        .int()
        .default(DEFAULT_WORLD.seed)
        .describe("The world the sessions came from (the sample's: `prefab simulate`'s defaults)."),
      companies: z
        .number()
        .int()
        .min(1)
        .default(DEFAULT_WORLD.companies)
        .describe(
          "Companies in that world, as the sessions were simulated (the sample's: `prefab simulate`'s default).",
        ),
      tasks: z
        .number()
        .int()
        .min(0)
        .default(20)
        .describe('Validation tasks (their companies never appear in training), each tried k times.'),
      k: z
        .number()
        .int()
        .min(1)
        .default(2)
        .describe('Tries per validation task: success is reported as mean@k and pass@k.'),
      temperature: z
        .number()
        .min(0)
        .default(0.5)
        .describe("The model's sampling temperature in the simulator; 0 always takes the likeliest token."),
      top_p: z
        .number()
        .min(0)
        .max(1)
        .default(0.95)
        .describe('Nucleus sampling: each token is drawn from the likeliest ones whose probabilities add up to top_p.'),
      max_tokens: z.number().int().min(1).default(160).describe('Most tokens in one assistant message.'),
      constrained: z
        .boolean()
        .default(true)
        .describe(
          "Tool calls decoded under the tools' JSON schemas, as a serving stack's structured outputs (model/constrain.ts).",
        ),
      max_turns: z
        .number()
        .int()
        .min(1)
        .default(12)
        .describe(
          "Most assistant messages in one episode. The oracle needs 9 at most (search, form, five calls, finish, a closing line); a model that loops on failed calls would otherwise go on to the environment's 24 steps, each a full generation.",
        ),
      max_calls: maxCalls(
        'Play only validation tasks with at most this many departments to call (the first `tasks` of them); null: tasks of every difficulty.',
      ),
    })
    .prefault({})
    .describe('Episodes in the simulator: each model acts as the agent on validation tasks.'),
});
/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const evalStage = defineStage({
  name: 'eval',
  description:
    'compare the untrained, SFT, preference-tuned and (when it ran) DAPO models: held-out pairs, NLL, simulator success',
  version: 6,
  inputs: ['sft', 'dpo', 'dapo', 'export'],
  outputs: ['eval.json', 'table.txt'],
  config,

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
});
