// A policy acting on the validation tasks (their companies never appear in training), k tries each: success
// mean@k and pass@k, reward and turns, and two signs of what a policy that does not succeed yet has learnt:
// calls the environment accepts, and episodes that looked up the right company.
import type { Policy } from '../core/records.ts';
import { runEpisode } from './rollout.ts';
import { DEFAULT_WORLD, generateTask, generateWorld } from './world.ts';

export interface ValidationOptions {
  /** The world the sessions came from (its seed and size). */
  worldSeed: number;
  companies: number;
  /** Validation tasks, each tried k times. */
  tasks: number;
  k: number;
  /** Most assistant messages in one episode. */
  maxTurns: number;
}

export type Figures = Record<string, number | null>;

/** Mean of the values; null for none. */
const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);

/**
 * The policy's figures over `tasks` × `k` episodes. `beforeEpisode` is called before each (a sampling policy
 * reseeds there, so every episode is reproducible on its own); `afterEpisode` after it (progress).
 */
export async function validationFigures(policy: Policy, o: ValidationOptions, beforeEpisode: (taskId: string, trial: number) => void, afterEpisode: () => void = () => {}): Promise<Figures> {
  if (o.tasks === 0) return {};
  const world = generateWorld({ ...DEFAULT_WORLD, seed: o.worldSeed, companies: o.companies });
  const successes: number[] = [];
  const passed: number[] = [];
  const rewards: number[] = [];
  const turns: number[] = [];
  const wellFormed: number[] = [];
  const found: number[] = [];
  for (let t = 0; t < o.tasks; t++) {
    const task = generateTask(world, 'val', t);
    let any = 0;
    for (let trial = 0; trial < o.k; trial++) {
      beforeEpisode(task.task_id, trial);
      const episode = await runEpisode(world, task, policy, o.maxTurns);
      successes.push(episode.success ? 1 : 0);
      rewards.push(episode.reward);
      turns.push(episode.turns);
      const results = episode.messages.filter((x) => x.role === 'tool').map((x) => x.content ?? '');
      wellFormed.push(...results.map((r) => (r.startsWith('Error:') ? 0 : 1)));
      found.push(results.some((r) => r.startsWith(JSON.stringify({ company: task.company }).slice(0, -1))) ? 1 : 0);
      any = Math.max(any, episode.success ? 1 : 0);
      afterEpisode();
    }
    passed.push(any);
  }
  return {
    [`success/mean@${o.k}`]: mean(successes),
    [`success/pass@${o.k}`]: mean(passed),
    'reward/mean': mean(rewards),
    'turns/mean': mean(turns),
    'calls/well_formed': mean(wellFormed),
    'company_found': mean(found),
  };
}
