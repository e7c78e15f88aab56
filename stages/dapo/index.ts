// dapo: reinforcement learning of the preference-tuned model in the simulator, by DAPO (verl's recipe:
// rl/dapo.ts runs it, rl/trainer.ts and trainers/losses/policy-gradient.ts are its trainer and loss). Each
// step draws training tasks, plays group_size episodes of each with the current policy, keeps the groups whose
// rewards differ (dynamic sampling, drawing more tasks up to max_generation_batches), and updates on them.
// mode: feedback plays a group's episodes in order, each reading what the representatives said in the failed
// ones before it (feedback-guided DAPO). Every validation.every steps the policy is measured on validation tasks. Off, the
// stage passes the dpo model on unchanged.
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import { dapoKnobs } from '../../rl/settings.ts';

const config = z.strictObject({
  enabled: z.boolean().default(false).describe('Run DAPO; off, the stage passes the dpo model on unchanged.'),
  ...dapoKnobs,
});

/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const dapo = defineStage({
  name: 'dapo',
  description:
    'reinforcement learning in the simulator by DAPO, standard or feedback-guided (dapo.enabled: false passes the dpo model on)',
  version: 2,
  inputs: ['dpo'],
  outputs: ['model', 'metrics.jsonl'],
  config,

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
});
