// The replay verifier: re-runs a logged session's tool calls in the environment and recomputes its reward,
// reporting every tool result or reward that does not match what was logged.
import type { Message, Session } from '../core/records.ts';
import { episodeReward, reset, step, type EnvState } from './env.ts';
import { DEFAULT_WORLD, findTask, generateWorld, type Task, type World, type WorldOptions } from './world.ts';

interface ReplayProblem {
  message_index: number;
  kind: 'tool_result' | 'missing_tool_result' | 'reward';
  logged: string;
  replayed: string;
}

export interface ReplayReport {
  session_id: string;
  /** False when the session is not from this simulator (no world in its metadata, or an unknown task). */
  replayable: boolean;
  ok: boolean;
  problems: ReplayProblem[];
  logged_reward: number;
  replayed_reward: number | null;
  reason?: string;
}

const REWARD_TOLERANCE = 1e-6;

/** Worlds rebuilt from session metadata, kept so that verifying many sessions builds each world once. */
export class WorldCache {
  private readonly worlds = new Map<string, World>();
  /** The task found last: a stage's comparisons come one task's after another's (tasks are not changed by replay). */
  private last: { world: World; id: string; task: Task } | null = null;

  get(options: Partial<WorldOptions>): World {
    const full = { ...DEFAULT_WORLD, ...options };
    const key = JSON.stringify(full);
    let world = this.worlds.get(key);
    if (!world) this.worlds.set(key, (world = generateWorld(full)));
    return world;
  }

  /** Task `id` of `world` (findTask), made again only when it is not the one found last. */
  task(world: World, id: string): Task {
    if (this.last && this.last.world === world && this.last.id === id) return this.last.task;
    const task = findTask(world, id);
    this.last = { world, id, task };
    return task;
  }
}

function worldOptions(metadata: string): Partial<WorldOptions> | null {
  try {
    const w = (JSON.parse(metadata) as { world?: Record<string, number> }).world;
    if (!w || typeof w.seed !== 'number') return null;
    return {
      seed: w.seed,
      companies: w.companies,
      valShare: w.val_share,
      deviation: w.deviation,
      dependency: w.dependency,
    };
  } catch {
    return null;
  }
}

/** One tool call of a message list, as the environment answers it on replay. */
export interface ReplayedCall {
  /** Index of the assistant message that made the call. */
  message_index: number;
  call_id: string;
  observation: string;
  /** The environment's feedback when the call failed (wrong number, missing field, broken arguments), else null. */
  feedback: string | null;
  /** Index of the logged tool result for this call, or -1 when the messages hold none. */
  result_index: number;
}

/** Runs every tool call of `messages` in the environment from the task's start; calls after the end are not run. */
export function replayCalls(world: World, task: Task, messages: Message[]): { calls: ReplayedCall[]; state: EnvState } {
  return replayOn(world, { calls: [], state: reset(world, task) }, messages, 0);
}

/**
 * The replay of `messages` continued from `opening`, the replay of its first `start` messages (which is left
 * as it was): an opening that several conversations share is replayed once. A call of the opening whose
 * result the opening does not hold takes the first one after it in `messages`, as a replay of them all would.
 */
export function replayOn(
  world: World,
  opening: { calls: ReplayedCall[]; state: EnvState },
  messages: Message[],
  start: number,
): { calls: ReplayedCall[]; state: EnvState } {
  const calls = opening.calls.map((c) =>
    c.result_index >= 0 ? c : { ...c, result_index: resultIndex(messages, c.message_index, c.call_id) },
  );
  let state = opening.state;
  for (let i = start; i < messages.length && !state.done; i++) {
    const message = messages[i]!;
    for (const call of message.role === 'assistant' ? (message.tool_calls ?? []) : []) {
      if (state.done) break;
      const result = step(world, state, { name: call.function.name, arguments: call.function.arguments });
      state = result.state;
      calls.push({
        message_index: i,
        call_id: call.id,
        observation: result.observation,
        feedback: result.feedback,
        result_index: resultIndex(messages, i, call.id),
      });
    }
  }
  return { calls, state };
}

/** Where the logged result of call `id`, made in message `at`, is: the first tool message after it that answers it, or -1. */
const resultIndex = (messages: Message[], at: number, id: string) =>
  messages.findIndex((m, j) => j > at && m.role === 'tool' && m.tool_call_id === id);

/** The simulator world and task a session was logged in, or the reason there is none. */
export function sessionTask(
  session: Pick<Session, 'task_id' | 'metadata'>,
  worlds: WorldCache,
): { world: World; task: Task } | { reason: string } {
  const options = worldOptions(session.metadata);
  if (!options || !session.task_id) return { reason: 'no simulator world in its metadata' };
  const world = worlds.get(options);
  try {
    return { world, task: worlds.task(world, session.task_id) };
  } catch (error) {
    return { reason: (error as Error).message };
  }
}

export function replaySession(session: Session, worlds = new WorldCache()): ReplayReport {
  const base = { session_id: session.session_id, logged_reward: session.reward };
  const found = sessionTask(session, worlds);
  if ('reason' in found)
    return { ...base, replayable: false, ok: false, problems: [], replayed_reward: null, reason: found.reason };
  const { calls, state } = replayCalls(found.world, found.task, session.messages);
  const problems: ReplayProblem[] = [];
  for (const call of calls) {
    const logged = call.result_index < 0 ? null : session.messages[call.result_index]!;
    if (!logged)
      problems.push({
        message_index: call.message_index,
        kind: 'missing_tool_result',
        logged: '',
        replayed: call.observation,
      });
    else if (logged.content !== call.observation)
      problems.push({
        message_index: call.result_index,
        kind: 'tool_result',
        logged: logged.content ?? '',
        replayed: call.observation,
      });
  }
  const replayed = Math.round(episodeReward(state) * 1e6) / 1e6;
  if (Math.abs(replayed - session.reward) > REWARD_TOLERANCE) {
    problems.push({ message_index: -1, kind: 'reward', logged: String(session.reward), replayed: String(replayed) });
  }
  return { ...base, replayable: true, ok: problems.length === 0, problems, replayed_reward: replayed };
}
