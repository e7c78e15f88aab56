// DAPO's rollouts in the simulator: for a step, groups of episodes of training tasks with the policy as it
// is, rewarded and shaped, and dynamic sampling's choice of the groups whose rewards differ. Every episode is
// seeded by (seed, step, task, try), so a step's rollouts are a function of the step and the weights.
// Feedback-guided (seed 004), a group's episodes are played in order and each reads the notes that the
// representatives' replies in the failed episodes before it condense to (feedback.ts).
import type { Logger } from '../pipeline/log.ts';
import type { Policy } from '../core/records.ts';
import { sample, seeded } from '../core/random.ts';
import { runEpisode } from '../env/rollout.ts';
import { generateTask, type Task, type World } from '../env/world.ts';
import type { Chat } from '../train/chat.ts';
import { informativeGroups, overlongPenalty } from '../train/losses/index.ts';
import type { Llama } from '../train/model.ts';
import type { Placeholders } from '../train/placeholders.ts';
import { ModelPolicy, type SamplingOptions } from '../train/policy.ts';
import { addNotes, emptyNotes, feedbackBlock, withFeedback } from './feedback.ts';
import type { Rollout, StepRollouts } from './trainer.ts';

/** How the model plays an episode: the world, how it reads and writes, and the seed its draws come from. */
interface EpisodeSettings {
  world: World;
  chat: Chat;
  /** The model's context and placeholders (its checkpoint's). */
  context: number;
  placeholders: Placeholders;
  sampling: SamplingOptions;
  maxTurns: number;
  seed: string;
}

export interface RolloutOptions extends EpisodeSettings {
  groupSize: number;
  tasksPerStep: number;
  maxGenerationBatches: number;
  taskPool: number;
  /** Tasks of at most this many calls only (a curriculum's easy end); null: every task. */
  maxCalls: number | null;
  /** `feedback`: a group's episodes in order, each reading the notes of the failed ones before it. */
  mode: RolloutMode;
  reward: 'success' | 'partial';
  /** Tokens before max_tokens where a turn's overlong penalty starts (0: none). */
  overlongBuffer: number;
  log: Logger;
  /** What plays the episodes; absent: the model itself (ModelPolicy). Tests put a scripted agent here. */
  actor?: (model: Llama) => Actor;
}

/** A policy that plays a step's episodes: it records its turns, samples from `random`, and reads what `reads` shows it. */
export type Actor = Policy & Pick<ModelPolicy, 'turns' | 'random' | 'reads'>;

export type RolloutMode = 'standard' | 'feedback';

interface Group {
  rollouts: Rollout[];
  successes: number[];
  /** Whether each episode read notes from earlier ones. */
  guided: boolean[];
  /** Tokens generated in each turn. */
  lengths: number[];
}

/** The first `count` tasks of `split` with at most `maxCalls` calls (every task when null), in index order. */
export function taskPool(world: World, split: 'train' | 'val', count: number, maxCalls: number | null): Task[] {
  const tasks: Task[] = [];
  for (let i = 0; tasks.length < count; i++) {
    if (i > 100 * count + 1000) throw new Error(`fewer than ${count} ${split} tasks have at most ${maxCalls} calls`);
    const task = generateTask(world, split, i);
    if (maxCalls === null || task.calls.length <= maxCalls) tasks.push(task);
  }
  return tasks;
}

/** The step's rollouts by `model` (its informative groups) and figures over every episode played. */
export function simulatorRollouts(o: RolloutOptions): (step: number, model: Llama) => Promise<StepRollouts> {
  const pool = taskPool(o.world, 'train', o.taskPool, o.maxCalls);
  /** One group: groupSize episodes of `task`, the step's `slot`-th draw, with the policy as it is. */
  const playGroup = async (policy: Actor, step: number, slot: number, task: Task): Promise<Group> => {
    const group: Group = { rollouts: [], successes: [], guided: [], lengths: [] };
    const notes = emptyNotes();
    for (let trial = 0; trial < o.groupSize; trial++) {
      policy.turns.length = 0;
      policy.random = seeded(o.seed, 'dapo', step, slot, task.task_id, trial);
      const block = o.mode === 'feedback' ? feedbackBlock(notes) : '';
      policy.reads = block ? (c) => withFeedback(c, block) : null;
      const episode = await runEpisode(o.world, task, policy, o.maxTurns);
      if (o.mode === 'feedback' && !episode.success) addNotes(notes, episode.messages);
      const turns = [...policy.turns];
      const longest = Math.max(0, ...turns.map((t) => t.generated.length));
      const shaping = o.overlongBuffer > 0 ? overlongPenalty(longest, o.sampling.maxTokens, o.overlongBuffer) : 0;
      group.rollouts.push({
        group: `${slot}:${task.task_id}`,
        reward: (o.reward === 'success' ? (episode.success ? 1 : 0) : episode.reward) + shaping,
        turns,
      });
      group.successes.push(episode.success ? 1 : 0);
      group.guided.push(block !== '');
      group.lengths.push(...turns.map((t) => t.generated.length));
    }
    policy.reads = null;
    return group;
  };

  return async (step, model) => {
    const policy =
      o.actor?.(model) ??
      new ModelPolicy(
        'dapo',
        model,
        o.context,
        o.chat,
        o.placeholders,
        { ...o.sampling, recordTurns: true },
        Math.random,
      );
    const kept: Rollout[][] = [];
    const all: Group[] = [];
    // The step's tasks: a seeded draw without replacement (with it once the pool runs out), batch after batch.
    const draw = sample(seeded(o.seed, 'dapo-tasks', step), pool, pool.length);
    try {
      for (let b = 0; b < o.maxGenerationBatches && kept.length < o.tasksPerStep; b++) {
        const groups: Group[] = [];
        for (let k = 0; k < o.tasksPerStep; k++) {
          const slot = b * o.tasksPerStep + k;
          groups.push(await playGroup(policy, step, slot, draw[slot % draw.length]!));
        }
        all.push(...groups);
        for (const i of informativeGroups(groups.map((g) => g.rollouts.map((r) => r.reward))))
          kept.push(groups[i]!.rollouts);
      }
    } finally {
      if (policy instanceof ModelPolicy) policy.dispose();
    }
    const rewards = all.flatMap((g) => g.rollouts.map((r) => r.reward));
    const mean = (xs: number[]) => xs.reduce((a, x) => a + x, 0) / Math.max(1, xs.length);
    const rewardMean = mean(rewards);
    const lengths = all.flatMap((g) => g.lengths);
    const guided = all.flatMap((g) => g.guided);
    const successes = all.flatMap((g) => g.successes);
    const metrics: Record<string, number> = {
      reward_mean: rewardMean,
      reward_std: Math.sqrt(mean(rewards.map((r) => (r - rewardMean) ** 2))),
      success: mean(successes),
      // Feedback-guided: the episodes that read no notes (each group's first, and those after no failure) and those that did.
      success_plain: mean(successes.filter((_, i) => !guided[i])),
      ...(guided.some(Boolean) ? { success_guided: mean(successes.filter((_, i) => guided[i])) } : {}),
      guided: mean(guided.map((g) => (g ? 1 : 0))),
      groups: all.length,
      kept_groups: Math.min(kept.length, o.tasksPerStep),
      episodes: rewards.length,
      response_length: mean(lengths),
      overlong: mean(lengths.map((l) => (l >= o.sampling.maxTokens ? 1 : 0))),
    };
    o.log.info('rollouts', { step: step + 1, ...metrics });
    return { rollouts: kept.slice(0, o.tasksPerStep).flat(), metrics };
  };
}

export interface ValidationOptions extends EpisodeSettings {
  /** The validation tasks (companies never seen in training). */
  tasks: Task[];
  /** Attempts at each task when feedback is read: each after the first reads the notes of the failed ones before it. */
  tries: number;
}

/**
 * `model` on the validation tasks: first-try success (no notes in context: what the policy has internalised),
 * success within `tries` attempts that read the notes of the failed ones before them, and, as its control,
 * within `tries` attempts that read none (what trying again is worth without feedback). Episodes are seeded
 * by task and try alone, so two models, or one model at two steps, are compared on the same draws.
 */
export async function validation(o: ValidationOptions, model: Llama): Promise<Record<string, number>> {
  const policy = new ModelPolicy(
    'validation',
    model,
    o.context,
    o.chat,
    o.placeholders,
    { ...o.sampling, recordTurns: false },
    Math.random,
  );
  const play = (task: Task, trial: number, block: string) => {
    policy.random = seeded(o.seed, 'dapo-validation', task.task_id, trial);
    policy.reads = block ? (c) => withFeedback(c, block) : null;
    return runEpisode(o.world, task, policy, o.maxTurns);
  };
  let first = 0;
  let firstReward = 0;
  let guided = 0;
  let retried = 0;
  try {
    for (const task of o.tasks) {
      const opening = await play(task, 0, '');
      first += opening.success ? 1 : 0;
      firstReward += opening.reward;
      const notes = addNotes(emptyNotes(), opening.messages);
      let withNotes = opening.success;
      let without = opening.success;
      for (let trial = 1; trial < o.tries && !withNotes; trial++) {
        const episode = await play(task, trial, feedbackBlock(notes));
        withNotes = episode.success;
        addNotes(notes, episode.messages);
      }
      for (let trial = 1; trial < o.tries && !without; trial++) without = (await play(task, trial, '')).success;
      guided += withNotes ? 1 : 0;
      retried += without ? 1 : 0;
    }
  } finally {
    policy.dispose();
  }
  const n = Math.max(1, o.tasks.length);
  return {
    'val/success_first': first / n,
    'val/success_feedback': guided / n,
    'val/success_retry': retried / n,
    'val/reward_first': firstReward / n,
  };
}
