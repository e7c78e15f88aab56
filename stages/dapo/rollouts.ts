// DAPO's rollouts in the simulator: for a step, groups of episodes of training tasks with the policy as it
// is, rewarded and shaped, and dynamic sampling's choice of the groups whose rewards differ. Every episode is
// seeded by (seed, step, task, try), so a step's rollouts are a function of the step and the weights.
import type { Logger } from '../../pipeline/log.ts';
import { hashJson } from '../../pipeline/hash.ts';
import { seeded } from '../../core/random.ts';
import { runEpisode } from '../../env/rollout.ts';
import { generateTask, type World } from '../../env/world.ts';
import type { Chat } from '../../train/chat.ts';
import type { Rollout, StepRollouts } from '../../train/dapo.ts';
import { informativeGroups, overlongPenalty } from '../../train/losses/index.ts';
import type { Llama } from '../../train/model.ts';
import type { Placeholders } from '../../train/placeholders.ts';
import { ModelPolicy, type SamplingOptions } from '../../train/policy.ts';

export interface RolloutOptions {
  world: World;
  chat: Chat;
  context: number;
  placeholders: Placeholders;
  sampling: SamplingOptions;
  maxTurns: number;
  seed: string;
  groupSize: number;
  tasksPerStep: number;
  maxGenerationBatches: number;
  taskPool: number;
  reward: 'success' | 'partial';
  /** Tokens before max_tokens where a turn's overlong penalty starts (0: none). */
  overlongBuffer: number;
  log: Logger;
}

interface Group {
  rollouts: Rollout[];
  successes: number[];
  /** Tokens generated in each turn. */
  lengths: number[];
}

/** The step's rollouts by `model` (its informative groups) and figures over every episode played. */
export function simulatorRollouts(o: RolloutOptions): (step: number, model: Llama) => Promise<StepRollouts> {
  /** One group: groupSize episodes of training task `index` with the policy as it is. */
  const playGroup = async (policy: ModelPolicy, step: number, index: number): Promise<Group> => {
    const task = generateTask(o.world, 'train', index);
    const group: Group = { rollouts: [], successes: [], lengths: [] };
    for (let trial = 0; trial < o.groupSize; trial++) {
      policy.turns.length = 0;
      policy.random = seeded(o.seed, 'dapo', step, task.task_id, trial);
      const episode = await runEpisode(o.world, task, policy, o.maxTurns);
      const turns = [...policy.turns];
      const longest = Math.max(0, ...turns.map((t) => t.generated.length));
      const shaping = o.overlongBuffer > 0 ? overlongPenalty(longest, o.sampling.maxTokens, o.overlongBuffer) : 0;
      group.rollouts.push({ group: task.task_id, reward: (o.reward === 'success' ? (episode.success ? 1 : 0) : episode.reward) + shaping, turns });
      group.successes.push(episode.success ? 1 : 0);
      group.lengths.push(...turns.map((t) => t.generated.length));
    }
    return group;
  };

  return async (step, model) => {
    const policy = new ModelPolicy('dapo', model, o.context, o.chat, o.placeholders, { ...o.sampling, recordTurns: true }, Math.random);
    const kept: Rollout[][] = [];
    const all: Group[] = [];
    for (let b = 0; b < o.maxGenerationBatches && kept.length < o.tasksPerStep; b++) {
      const groups: Group[] = [];
      for (let k = 0; k < o.tasksPerStep; k++) {
        const index = parseInt(hashJson({ seed: o.seed, step, b, k }).slice(0, 8), 16) % o.taskPool;
        groups.push(await playGroup(policy, step, index));
      }
      all.push(...groups);
      for (const i of informativeGroups(groups.map((g) => g.rollouts.map((r) => r.reward)))) kept.push(groups[i]!.rollouts);
    }
    const rewards = all.flatMap((g) => g.rollouts.map((r) => r.reward));
    const mean = (xs: number[]) => xs.reduce((a, x) => a + x, 0) / Math.max(1, xs.length);
    const rewardMean = mean(rewards);
    const lengths = all.flatMap((g) => g.lengths);
    const metrics = {
      reward_mean: rewardMean,
      reward_std: Math.sqrt(mean(rewards.map((r) => (r - rewardMean) ** 2))),
      success: mean(all.flatMap((g) => g.successes)),
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
