// One candidate drawn from the endpoint for a task with too few logged sessions: a simulator task is rolled
// out in the environment with the model as the policy (a real reward); any other prompt gets one reply (no reward).
import type { ChatEndpoint } from '../../judges/endpoint.ts';
import { TOOLS } from '../../env/env.ts';
import { sessionTask, type WorldCache } from '../../env/replay.ts';
import { runEpisode } from '../../env/rollout.ts';
import { commonPrefixLength, type Message, type SplitSession } from '../../core/records.ts';
import { EndpointPolicy, sampleMessage } from './policy.ts';

/** A candidate drawn from the endpoint: a session whose reward is null when no environment scored it. */
export interface SampledSession extends Omit<SplitSession, 'reward'> {
  reward: number | null;
}

/** The shared prompt of a task's logged sessions: their longest common prefix, up to the first assistant turn. */
function groupPrompt(sessions: SplitSession[]): Message[] {
  let n = sessions[0]!.messages.length;
  for (const s of sessions.slice(1)) n = Math.min(n, commonPrefixLength(sessions[0]!.messages, s.messages));
  const prefix = sessions[0]!.messages.slice(0, n);
  const firstAssistant = prefix.findIndex((m) => m.role === 'assistant');
  return firstAssistant < 0 ? prefix : prefix.slice(0, firstAssistant);
}

/** Candidate number `index` of task `taskId`, whose logged sessions are `sessions`. */
export async function drawCandidate(
  endpoint: ChatEndpoint,
  worlds: WorldCache,
  taskId: string,
  sessions: SplitSession[],
  index: number,
  cfg: { temperature: number; max_tokens: number },
): Promise<SampledSession> {
  const first = sessions[0]!;
  const options = { temperature: cfg.temperature, maxTokens: cfg.max_tokens, index };
  const found = sessionTask(first, worlds);
  const base = {
    session_id: `sample:${endpoint.model}:${taskId}:${index}`,
    task_id: taskId,
    feedback: null,
    model: endpoint.model,
    source: `prefab sample (${endpoint.baseURL})`,
    created_at: null,
    split: first.split,
    task_match: first.task_match,
  };
  const sampled = { model: endpoint.model, index, temperature: cfg.temperature };
  // The task's metadata, without what describes the logged session itself rather than the task.
  const {
    trial: _t,
    _message_extras: _x,
    success: _s,
    turns: _n,
    ...taskMetadata
  } = JSON.parse(first.metadata) as Record<string, unknown>;
  if (!('reason' in found)) {
    const episode = await runEpisode(
      found.world,
      found.task,
      new EndpointPolicy(endpoint, { ...options, tools: TOOLS }),
    );
    const metadata = { ...taskMetadata, success: episode.success, turns: episode.turns, sampled };
    return {
      ...base,
      messages: episode.messages,
      reward: Math.round(episode.reward * 1e6) / 1e6,
      feedback: episode.state.feedback.join('\n') || null,
      metadata: JSON.stringify(metadata),
    };
  }
  const prompt = groupPrompt(sessions);
  const reply = await sampleMessage(endpoint, prompt, options);
  return {
    ...base,
    messages: [...prompt, reply],
    reward: null,
    metadata: JSON.stringify({ ...taskMetadata, sampled }),
  };
}
