// A policy acting on the validation tasks (their companies never appear in training), k tries each: success
// mean@k and pass@k, reward and turns, and two signs of what a policy that does not succeed yet has learnt:
// calls the environment accepts, and episodes that looked up the right company.
import type { Policy } from '../core/records.ts';
import { settled } from '../core/settled.ts';
import { runEpisode } from './rollout.ts';
import { DEFAULT_WORLD, SENSITIVE, generateWorld, taskPool, type Field } from './world.ts';

export interface ValidationOptions {
  /** The world the sessions came from (its seed and size). */
  worldSeed: number;
  companies: number;
  /** Validation tasks, each tried k times. */
  tasks: number;
  k: number;
  /** Most assistant messages in one episode. */
  maxTurns: number;
  /** Only tasks with at most this many calls (the first `tasks` of them); absent or null: every task. */
  maxCalls?: number | null;
  /** The eligible tasks passed over first: fresh draws beside the usual first `tasks` (absent: none). */
  skip?: number;
}

export type Figures = Record<string, number | null>;

/** Mean of the values; null for none. */
const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);

/** What one episode on a validation task shows: the figures' per-episode values. */
export interface EpisodeRecord {
  task: string;
  trial: number;
  success: number;
  reward: number;
  turns: number;
  /** Tool results, and those that were not errors (calls the environment accepted). */
  calls: number;
  calls_ok: number;
  /** Whether a result named the task's company (it was looked up). */
  company_found: number;
  /** Sensitive fields asked for on the form that no department needed (the environment penalises each). */
  sensitive_asked: number;
}

/**
 * The episodes over `tasks` × `k` validation tasks, each played by `player(task, trial)`: a sampling policy
 * seeded by the task and try alone, so every episode is reproducible on its own and two policies seeded
 * alike meet the same draws (a paired comparison). `together`: all started at once, so a shared decoder
 * steps them together; otherwise one after another. `afterEpisode` is called as each ends (progress).
 * The records are in task and try order either way.
 */
export async function validationEpisodes(
  player: (taskId: string, trial: number) => Policy,
  o: ValidationOptions & { together?: boolean },
  afterEpisode: () => void = () => {},
): Promise<EpisodeRecord[]> {
  const world = generateWorld({ ...DEFAULT_WORLD, seed: o.worldSeed, companies: o.companies });
  const tasks = taskPool(world, 'val', (o.skip ?? 0) + o.tasks, o.maxCalls ?? null).slice(o.skip ?? 0);
  const episodes = Array.from({ length: o.tasks * o.k }, (_, i) => ({
    task: tasks[Math.floor(i / o.k)]!,
    trial: i % o.k,
  }));
  const play = async ({ task, trial }: (typeof episodes)[number]): Promise<EpisodeRecord> => {
    const episode = await runEpisode(world, task, player(task.task_id, trial), o.maxTurns);
    const results = episode.messages.filter((x) => x.role === 'tool').map((x) => x.content ?? '');
    const form = episode.state.form ?? {};
    afterEpisode();
    return {
      task: task.task_id,
      trial,
      success: episode.success ? 1 : 0,
      reward: episode.reward,
      turns: episode.turns,
      calls: results.length,
      calls_ok: results.filter((r) => !r.startsWith('Error:')).length,
      company_found: results.some((r) => r.startsWith(JSON.stringify({ company: task.company }).slice(0, -1))) ? 1 : 0,
      sensitive_asked: Object.keys(form).filter(
        (f) => SENSITIVE.has(f as Field) && !episode.state.needed.includes(f as Field),
      ).length,
    };
  };
  if (!o.together) {
    const records: EpisodeRecord[] = [];
    for (const e of episodes) records.push(await play(e));
    return records;
  }
  return settled(episodes.map(play));
}

/** Episodes of k tries a task, summed up: success mean@k and pass@k, reward, turns, calls accepted, company found. */
export function figuresOf(records: EpisodeRecord[], k: number): Figures {
  const byTask = new Map<string, number>();
  for (const r of records) byTask.set(r.task, Math.max(byTask.get(r.task) ?? 0, r.success));
  const calls = records.reduce((n, r) => n + r.calls, 0);
  return {
    [`success/mean@${k}`]: mean(records.map((r) => r.success)),
    [`success/pass@${k}`]: mean([...byTask.values()]),
    'reward/mean': mean(records.map((r) => r.reward)),
    'turns/mean': mean(records.map((r) => r.turns)),
    'calls/well_formed': calls ? records.reduce((n, r) => n + r.calls_ok, 0) / calls : null,
    company_found: mean(records.map((r) => r.company_found)),
  };
}
