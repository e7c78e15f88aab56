// One episode: a policy acts in the environment until it finishes; the result is a logged Session.
import type { Message, Policy, Session } from '../core/records.ts';
import { SYSTEM_PROMPT, TOOLS, episodeReward, isSuccess, reset, step, type EnvState } from './env.ts';
import type { Task, World } from './world.ts';

export interface Episode {
  messages: Message[];
  state: EnvState;
  reward: number;
  success: boolean;
  /** Assistant messages in the episode. */
  turns: number;
}

function initialMessages(task: Task, notes: string): Message[] {
  return [
    { role: 'system', content: SYSTEM_PROMPT },
    { role: 'user', content: notes ? `${task.request}\n\n${notes}` : task.request },
  ];
}

/**
 * Runs the policy until the task ends: by the finish tool (the policy then says a closing line), by a
 * message without tool calls, by the environment's step limit, or after `maxTurns` assistant messages.
 * `notes`: a block the user's request carries (notes from earlier attempts: env/feedback.ts), logged with it.
 */
export async function runEpisode(
  world: World,
  task: Task,
  policy: Policy,
  maxTurns = Infinity,
  notes = '',
): Promise<Episode> {
  const messages = initialMessages(task, notes);
  let state = reset(world, task);
  let turns = 0;
  while (!state.done && turns < maxTurns) {
    const reply = await policy.respond(messages);
    messages.push(reply);
    turns++;
    if (!reply.tool_calls?.length) break;
    for (const call of reply.tool_calls) {
      const result = step(world, state, { name: call.function.name, arguments: call.function.arguments });
      messages.push({ role: 'tool', content: result.observation, tool_call_id: call.id });
      state = result.state;
      if (state.done) break;
    }
    if (state.done && messages.at(-1)!.role === 'tool') {
      const closing = await policy.respond(messages);
      if (closing.content && !closing.tool_calls?.length) {
        messages.push({ role: 'assistant', content: closing.content });
        turns++;
      }
    }
  }
  return { messages, state, reward: episodeReward(state), success: isSuccess(state), turns };
}

export interface SessionInfo {
  trial: number;
  createdAt: string;
}

export function episodeSession(world: World, task: Task, policy: Policy, episode: Episode, info: SessionInfo): Session {
  const o = world.options;
  return {
    session_id: `${task.task_id}:${policy.name}:${info.trial}`,
    task_id: task.task_id,
    messages: episode.messages,
    reward: Math.round(episode.reward * 1e6) / 1e6,
    feedback: episode.state.feedback.length ? episode.state.feedback.join('\n') : null,
    model: policy.name,
    source: `prefab simulate (seed ${o.seed})`,
    created_at: info.createdAt,
    metadata: JSON.stringify({
      world: {
        seed: o.seed,
        companies: o.companies,
        val_share: o.valShare,
        deviation: o.deviation,
        dependency: o.dependency,
      },
      split: task.split,
      difficulty: task.calls.length,
      success: episode.success,
      turns: episode.turns,
      trial: info.trial,
      // The agent's tools, as an OpenAI chat request carries them and logs keep them.
      tools: TOOLS,
    }),
  };
}
