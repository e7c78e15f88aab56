// DAPO's rollouts in the simulator: for a step, groups of episodes of training tasks with the policy as it
// is, rewarded and shaped, and dynamic sampling's choice of the groups whose rewards differ. Every episode is
// seeded by (seed, step, task, try), so a step's rollouts are a function of the step and the weights.
// Feedback-guided, a group's episodes are played in order and each reads the notes that the
// representatives' replies in the failed episodes before it condense to (env/feedback.ts).
import type { Logger } from '../pipeline/log.ts';
import type { Policy } from '../core/records.ts';
import { sample, seeded } from '../core/random.ts';
import { settled } from '../core/settled.ts';
import { runEpisode } from '../env/rollout.ts';
import { taskPool, type Task, type World } from '../env/world.ts';
import type { Chat } from '../model/chat.ts';
import { informativeGroups, overlongPenalty } from '../trainers/losses/index.ts';
import type { Llama } from '../model/llama.ts';
import type { Placeholders } from '../model/placeholders.ts';
import { EpisodePlayers, ModelPolicy, type SamplingOptions } from '../runtime/policy.ts';
import { addNotes, emptyNotes, feedbackBlock, withFeedback } from '../env/feedback.ts';
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

/**
 * The step's rollouts by `model` (its informative groups) and figures over every episode played. The groups
 * of a generation batch are played side by side (in standard mode every episode), their tokens decoded
 * together (SharedDecoder, on the CPU or the GPU).
 */
export function simulatorRollouts(
  o: RolloutOptions,
): (step: number, model: Llama, trained?: Map<string, GPUBuffer>) => Promise<StepRollouts> {
  const pool = taskPool(o.world, 'train', o.taskPool, o.maxCalls);
  /** One episode of `task`, its group's `trial`-th, by `actor`; `block`: the notes it reads, if any. */
  const playTrial = async (actor: Actor, step: number, slot: number, task: Task, trial: number, block: string) => {
    actor.turns.length = 0;
    actor.random = seeded(o.seed, 'dapo', step, slot, task.task_id, trial);
    actor.reads = block ? (c) => withFeedback(c, block) : null;
    const episode = await runEpisode(o.world, task, actor, o.maxTurns);
    actor.reads = null;
    const turns = [...actor.turns];
    const longest = Math.max(0, ...turns.map((t) => t.generated.length));
    const shaping = o.overlongBuffer > 0 ? overlongPenalty(longest, o.sampling.maxTokens, o.overlongBuffer) : 0;
    return {
      episode,
      rollout: {
        group: `${slot}:${task.task_id}`,
        reward: (o.reward === 'success' ? (episode.success ? 1 : 0) : episode.reward) + shaping,
        turns,
      },
      lengths: turns.map((t) => t.generated.length),
    };
  };
  /** One group: groupSize episodes of `task`, the step's `slot`-th draw, with the policy as it is. */
  const playGroup = async (actor: () => Actor, step: number, slot: number, task: Task) => {
    const group: Group = { rollouts: [], successes: [], guided: [], lengths: [] };
    const trials = Array.from({ length: o.groupSize }, (_, trial) => trial);
    let played: { trial: Awaited<ReturnType<typeof playTrial>>; block: string }[];
    if (o.mode === 'feedback') {
      // In order: each episode reads the notes of the failed ones before it.
      const notes = emptyNotes();
      const player = actor();
      played = [];
      for (const trial of trials) {
        const block = feedbackBlock(notes);
        const t = await playTrial(player, step, slot, task, trial, block);
        if (!t.episode.success) addNotes(notes, t.episode.messages);
        played.push({ trial: t, block });
      }
    } else {
      played = await settled(
        trials.map(async (trial) => ({ trial: await playTrial(actor(), step, slot, task, trial, ''), block: '' })),
      );
    }
    for (const { trial: t, block } of played) {
      group.rollouts.push(t.rollout);
      group.successes.push(t.episode.success ? 1 : 0);
      group.guided.push(block !== '');
      group.lengths.push(...t.lengths);
    }
    return group;
  };

  return async (step, model, trained) => {
    const { context, chat, placeholders } = o;
    const sampling = { ...o.sampling, recordTurns: true, trained };
    const players = o.actor ? null : new EpisodePlayers({ name: 'dapo', model, context, chat, placeholders, sampling });
    const actor = (): Actor => o.actor?.(model) ?? players!.player(Math.random);
    const kept: Rollout[][] = [];
    const all: Group[] = [];
    // The step's tasks: a seeded draw without replacement (with it once the pool runs out), batch after batch.
    const draw = sample(seeded(o.seed, 'dapo-tasks', step), pool, pool.length);
    try {
      for (let b = 0; b < o.maxGenerationBatches && kept.length < o.tasksPerStep; b++) {
        const slots = Array.from({ length: o.tasksPerStep }, (_, k) => b * o.tasksPerStep + k);
        const play = (slot: number) => playGroup(actor, step, slot, draw[slot % draw.length]!);
        const groups: Group[] = await settled(slots.map(play));
        all.push(...groups);
        for (const i of informativeGroups(groups.map((g) => g.rollouts.map((r) => r.reward))))
          kept.push(groups[i]!.rollouts);
      }
    } finally {
      players?.dispose();
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

/** One validation task's outcomes: its first try, and within `tries` with the notes and without. */
export interface TaskOutcome {
  task: string;
  company: string;
  first: boolean;
  reward: number;
  withNotes: boolean;
  without: boolean;
}

/**
 * `model` on the validation tasks, task by task: the first try (no notes in context: what the policy has
 * internalised), then tries that read the notes of the failed ones before them until one succeeds, and, as
 * their control, as many tries that read none (what trying again is worth without feedback). Episodes are
 * seeded by task and try alone, so two models, or one model at two steps, are compared on the same draws.
 */
export async function validationTasks(
  o: ValidationOptions,
  model: Llama,
  trained?: Map<string, GPUBuffer>,
): Promise<TaskOutcome[]> {
  const { context, chat, placeholders } = o;
  const sampling = { ...o.sampling, recordTurns: false, trained };
  const players = new EpisodePlayers({ name: 'validation', model, context, chat, placeholders, sampling });
  const play = (task: Task, trial: number, block: string) => {
    const player = players.player(seeded(o.seed, 'dapo-validation', task.task_id, trial));
    player.reads = block ? (c) => withFeedback(c, block) : null;
    return runEpisode(o.world, task, player, o.maxTurns);
  };
  const onTask = async (task: Task): Promise<TaskOutcome> => {
    const opening = await play(task, 0, '');
    const notes = addNotes(emptyNotes(), opening.messages);
    let withNotes = opening.success;
    let without = opening.success;
    for (let trial = 1; trial < o.tries && !withNotes; trial++) {
      const episode = await play(task, trial, feedbackBlock(notes));
      withNotes = episode.success;
      addNotes(notes, episode.messages);
    }
    for (let trial = 1; trial < o.tries && !without; trial++) without = (await play(task, trial, '')).success;
    return {
      task: task.task_id,
      company: task.company,
      first: opening.success,
      reward: opening.reward,
      withNotes,
      without,
    };
  };
  try {
    return await settled(o.tasks.map(onTask));
  } finally {
    players.dispose();
  }
}

/** `validationTasks` summed: val/success_first, val/success_feedback, val/success_retry and val/reward_first. */
export async function validation(
  o: ValidationOptions,
  model: Llama,
  trained?: Map<string, GPUBuffer>,
): Promise<Record<string, number>> {
  const tasks = await validationTasks(o, model, trained);
  const count = (f: (t: TaskOutcome) => boolean) => tasks.filter(f).length;
  const first = count((t) => t.first);
  const firstReward = tasks.reduce((n, t) => n + t.reward, 0);
  const guided = count((t) => t.withNotes);
  const retried = count((t) => t.without);
  const n = Math.max(1, o.tasks.length);
  return {
    'val/success_first': first / n,
    'val/success_feedback': guided / n,
    'val/success_retry': retried / n,
    'val/reward_first': firstReward / n,
  };
}
