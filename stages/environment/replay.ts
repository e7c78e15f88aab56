// The replay verifier: re-runs a logged session's tool calls in the environment and recomputes its reward,
// reporting every tool result or reward that does not match what was logged.
import type { Session } from '../records.ts';
import { episodeReward, reset, step, type EnvState } from './env.ts';
import { DEFAULT_WORLD, findTask, generateWorld, type World, type WorldOptions } from './world.ts';

export interface ReplayProblem {
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
  get(options: Partial<WorldOptions>): World {
    const full = { ...DEFAULT_WORLD, ...options };
    const key = JSON.stringify(full);
    let world = this.worlds.get(key);
    if (!world) this.worlds.set(key, (world = generateWorld(full)));
    return world;
  }
}

function worldOptions(session: Session): Partial<WorldOptions> | null {
  try {
    const w = (JSON.parse(session.metadata) as { world?: Record<string, number> }).world;
    if (!w || typeof w.seed !== 'number') return null;
    return { seed: w.seed, companies: w.companies, valShare: w.val_share, deviation: w.deviation, dependency: w.dependency };
  } catch {
    return null;
  }
}

export function replaySession(session: Session, worlds = new WorldCache()): ReplayReport {
  const base = { session_id: session.session_id, logged_reward: session.reward };
  const options = worldOptions(session);
  if (!options || !session.task_id) return { ...base, replayable: false, ok: false, problems: [], replayed_reward: null, reason: 'no simulator world in its metadata' };
  const world = worlds.get(options);
  let state: EnvState;
  try {
    state = reset(world, findTask(world, session.task_id));
  } catch (error) {
    return { ...base, replayable: false, ok: false, problems: [], replayed_reward: null, reason: (error as Error).message };
  }
  const problems: ReplayProblem[] = [];
  const messages = session.messages;
  messages.forEach((message, i) => {
    for (const call of message.role === 'assistant' ? (message.tool_calls ?? []) : []) {
      if (state.done) return; // calls after the end are never run, as in a rollout
      const result = step(world, state, { name: call.function.name, arguments: call.function.arguments });
      state = result.state;
      const at = messages.findIndex((m, j) => j > i && m.role === 'tool' && m.tool_call_id === call.id);
      if (at < 0) problems.push({ message_index: i, kind: 'missing_tool_result', logged: '', replayed: result.observation });
      else if (messages[at]!.content !== result.observation) problems.push({ message_index: at, kind: 'tool_result', logged: messages[at]!.content ?? '', replayed: result.observation });
    }
  });
  const replayed = Math.round(episodeReward(state) * 1e6) / 1e6;
  if (Math.abs(replayed - session.reward) > REWARD_TOLERANCE) {
    problems.push({ message_index: -1, kind: 'reward', logged: String(session.reward), replayed: String(replayed) });
  }
  return { ...base, replayable: true, ok: problems.length === 0, problems, replayed_reward: replayed };
}
