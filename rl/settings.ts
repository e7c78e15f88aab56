// DAPO's settings, as a schema only: the dapo stage's config and a refresh night's `refresh.dapo` are checked
// without loading the trainer, the decoder or TensorFlow.js.
import { z } from 'zod';
import { DEFAULT_WORLD } from '../env/world.ts';

/** A task's difficulty bound, in the simulator's tasks of 1 to 5 departments to call: at most this many (null: any). */
export const maxCalls = (description: string) =>
  z.number().int().min(1).max(5).nullable().default(null).describe(description);

/** DAPO's knobs: the dapo stage's config, and a refresh night's `refresh.dapo`, beside their `enabled`. */
export const dapoKnobs = {
  seed: z.string().default('prefab').describe('Which tasks each step draws, the sampling, and the mini-batches.'),
  steps: z
    .number()
    .int()
    .min(1)
    .default(4)
    .describe('DAPO steps: each a batch of rollouts and ppo_epochs × mini_batches updates on it.'),
  tasks_per_step: z
    .number()
    .int()
    .min(1)
    .default(4)
    .describe('Groups (tasks) a step trains on, once dynamic sampling has kept them.'),
  group_size: z
    .number()
    .int()
    .min(2)
    .default(8)
    .describe('Episodes per task: a group, whose rewards give each other their advantage (GRPO).'),
  max_generation_batches: z
    .number()
    .int()
    .min(1)
    .default(3)
    .describe(
      'Dynamic sampling: batches of tasks_per_step tasks drawn at most per step to find groups whose rewards differ; a step that finds none makes no update.',
    ),
  mode: z
    .enum(['standard', 'feedback'])
    .default('standard')
    .describe(
      "standard: a group's episodes are independent (DAPO); feedback: played in order, each reading the notes that the representatives' replies in the group's failed episodes before it condense to (feedback-guided DAPO: learning from what the environment says, not only from the reward).",
    ),
  feedback_training: z
    .enum(['context', 'base', 'both'])
    .default('context')
    .describe(
      'mode feedback: train the guided episodes on the prompt they read, notes and all (context: on-policy), on the plain prompt with an importance ratio to the notes-reading policy (base), or both. docs/experiments.md measures the choice.',
    ),
  task_pool: z
    .number()
    .int()
    .min(1)
    .default(500)
    .describe(
      'Training tasks are drawn from the first task_pool tasks of the training split (those with at most max_calls calls).',
    ),
  max_calls: maxCalls(
    "Tasks with at most this many calls to make (the curriculum's easy end); null: tasks of every difficulty (1–5 calls).",
  ),
  reward: z
    .enum(['success', 'partial'])
    .default('success')
    .describe(
      "success: 1 for a completed task, else 0 (sparse); partial: the environment's share of requests completed, less penalties.",
    ),
  ppo_epochs: z.number().int().min(1).default(2).describe('Passes over each batch of rollouts.'),
  mini_batches: z
    .number()
    .int()
    .min(1)
    .default(2)
    .describe('Optimiser updates per pass (the batch is cut into this many mini-batches).'),
  lr: z.number().positive().default(5e-5).describe('Learning rate (constant after warmup).'),
  warmup: z.number().int().min(0).default(0).describe('Steps of linear warmup.'),
  weight_decay: z.number().min(0).default(0).describe("AdamW's weight decay."),
  max_grad_norm: z.number().positive().default(1).describe('Gradients are clipped to this global norm at each update.'),
  clip_low: z.number().min(0).max(1).default(0.2).describe('ε_low: the ratio is clipped below at 1 − clip_low.'),
  clip_high: z.number().min(0).default(0.28).describe("ε_high: and above at 1 + clip_high (DAPO's clip-higher)."),
  dual_clip: z.number().min(1).default(10).describe("c: a negative advantage's loss is at most −A·c."),
  kl_coef: z.number().min(0).default(0).describe('β of a k3 KL to the starting model, per token (0: none, as DAPO).'),
  overlong_buffer: z
    .number()
    .int()
    .min(0)
    .default(32)
    .describe(
      'Overlong shaping: an assistant turn within this many tokens of max_tokens is penalised linearly, down to −1 at max_tokens (0: off).',
    ),
  checkpoint_every: z
    .number()
    .int()
    .min(1)
    .default(1)
    .describe('Steps between checkpoints; a killed run resumes from the latest, gathering the same rollouts again.'),
  micro_batch_tokens: z.number().int().min(16).default(2048).describe('Largest micro-batch, in padded tokens.'),
  simulator: z
    .strictObject({
      world_seed: z.number().int().default(DEFAULT_WORLD.seed).describe('The world the sessions came from.'),
      companies: z.number().int().min(1).default(DEFAULT_WORLD.companies).describe('Companies in that world.'),
      temperature: z
        .number()
        .positive()
        .default(1)
        .describe(
          'Sampling temperature of the rollouts (the loss reads the policy at temperature 1: keep 1 for on-policy ratios).',
        ),
      top_p: z.number().min(0).max(1).default(1).describe('Nucleus sampling of the rollouts (1: the policy itself).'),
      max_tokens: z.number().int().min(1).default(160).describe('Most tokens in one assistant message.'),
      max_turns: z.number().int().min(1).default(12).describe('Most assistant messages in one episode.'),
      constrained: z.boolean().default(true).describe("Tool calls decoded under the tools' JSON schemas, as in eval."),
    })
    .prefault({})
    .describe('Episodes in the simulator, as eval plays them.'),
  validation: z
    .strictObject({
      every: z
        .number()
        .int()
        .min(0)
        .default(0)
        .describe('Steps between validations (and after the last step); 0: none.'),
      tasks: z
        .number()
        .int()
        .min(1)
        .default(20)
        .describe('Validation tasks (companies never trained on), with at most max_calls calls.'),
      tries: z
        .number()
        .int()
        .min(1)
        .default(3)
        .describe(
          'Attempts per task for with-feedback success: each after the first reads the notes of the failed ones before it.',
        ),
      temperature: z.number().min(0).default(0.5).describe('Sampling temperature of validation episodes.'),
    })
    .prefault({})
    .describe(
      'val/success_first (one try, no notes: what the policy has internalised), val/success_feedback (within tries, each reading the notes of the failed ones) and val/success_retry (as many tries, no notes), in metrics.jsonl.',
    ),
};
const dapoSettings = z.strictObject(dapoKnobs);
export type DapoSettings = z.infer<typeof dapoSettings>;

/**
 * Iterative on-policy DPO's knobs (rl/iterative.ts): rounds of the policy's own rollouts, step pairs where
 * they part, and DPO with RPO's NLL anchor on them; the preference run's knobs (trainers/settings.ts) say how
 * each round trains.
 */
export const iterativeKnobs = {
  seed: z.string().default('prefab').describe('Which tasks each round draws, and the rollouts’ sampling.'),
  rounds: z
    .number()
    .int()
    .min(1)
    .default(4)
    .describe('Rounds: rollouts by the policy as it is, then DPO on their step pairs.'),
  tasks_per_round: z.number().int().min(1).default(32).describe('Training tasks each round plays.'),
  rollouts_per_task: z
    .number()
    .int()
    .min(2)
    .default(8)
    .describe('Rollouts of each task: the prefix tree over them values each turn by its rollouts’ success rate.'),
  margin: z
    .number()
    .gt(0)
    .max(1)
    .default(0.5)
    .describe('Sibling turns make a step pair where their success rates differ by at least this.'),
  min_visits: z.number().int().min(1).default(1).describe('Rollouts a turn needs through it before it is valued.'),
  method: z
    .enum(['dpo', 'rft'])
    .default('dpo')
    .describe(
      "dpo: DPO (with the preference knobs, rpo_alpha among them) on the round's step pairs; rft: rejection-sampling fine-tuning, SFT on the round's successful rollouts with the same knobs' lr, batch_size and epochs: the control that says whether the negatives add anything.",
    ),
  reference: z
    .enum(['reset', 'fixed'])
    .default('fixed')
    .describe(
      "fixed: every round's reference is the starting model; reset: the policy the round starts from (RLHFlow, Iterative RPO). Fixed ended above reset in each of the head-to-head's three seeds (docs/experiments.md).",
    ),
  keep: z
    .enum(['best', 'last'])
    .default('best')
    .describe(
      "The model written: best, the round (or the starting model) with the highest validation first-try success, the earlier of equals (early stopping: the head-to-head's first run peaked at round 2 of 4 on its 200 × 2 evaluation as on this validation, docs/experiments.md); last, the last round's.",
    ),
  task_pool: dapoKnobs.task_pool,
  max_calls: dapoKnobs.max_calls,
  simulator: dapoKnobs.simulator,
  validation: z
    .strictObject({
      tasks: z
        .number()
        .int()
        .min(1)
        .default(20)
        .describe('Validation tasks (companies never trained on), after every round.'),
      tries: z.number().int().min(1).default(2).describe('Attempts per task for with-feedback success.'),
      temperature: z.number().min(0).default(0.5).describe('Sampling temperature of validation episodes.'),
    })
    .prefault({})
    .describe('The policy on validation tasks after every round: val/success_first, _feedback and _retry.'),
};
const iterativeSettings = z.strictObject(iterativeKnobs);
export type IterativeSettings = z.infer<typeof iterativeSettings>;
