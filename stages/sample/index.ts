// sample: for tasks with too few logged candidates, draw more from an OpenAI-compatible endpoint at
// temperature 0.7, so best-of-N has N to choose from. A simulator task is rolled out in the environment
// with the model as the policy (so the candidate has a real reward); any other prompt gets one sampled
// reply (no reward). Every answer is cached per (model, request, index): a rerun pays nothing.
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { z } from 'zod';
import { RequestFailed, endpointConfig, endpointEnvironment, openEndpoint, requestCounts, type ChatEndpoint } from '../../judges/endpoint.ts';
import { JsonlWriter } from '../../pipeline/jsonl.ts';
import { defineStage } from '../../pipeline/stage.ts';
import { TOOLS } from '../../env/env.ts';
import { WorldCache, sessionTask } from '../../env/replay.ts';
import { runEpisode } from '../../env/rollout.ts';
import { commonPrefixLength, type Message, type SplitSession } from '../../core/records.ts';
import { redactionConfig } from '../../core/redact.ts';
import { SPLITS, bucketFile, readSplitInfo, readTaskGroups } from '../layout.ts';
import { BudgetSpent, EndpointPolicy, sampleMessage } from './policy.ts';

const config = z.strictObject({
  enabled: z.boolean().default(false).describe('Off by default: the default run needs no endpoint.'),
  min_candidates: z.number().int().min(2).max(64).default(4).describe('A task with fewer logged sessions than this gets sampled candidates up to it.'),
  temperature: z.number().min(0).max(2).default(0.7).describe('Sampling temperature: above 0, so that the candidates differ.'),
  max_tokens: z.number().int().min(1).default(512).describe('Most tokens in one sampled assistant message.'),
  splits: z.array(z.enum(['train', 'test'])).default(['train']).describe('Sides of the split whose tasks are topped up with sampled candidates.'),
  endpoint: endpointConfig.prefault({}).describe('The OpenAI-compatible endpoint candidates are drawn from; PREFAB_SAMPLE_MODEL overrides its model.'),
  redaction: redactionConfig.prefault({}).describe('Personal data masked in a request before it leaves the machine; the values are put back into the reply.'),
});

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

const ENDPOINT = { key: 'sample.endpoint', modelEnv: 'PREFAB_SAMPLE_MODEL' };

export const sample = defineStage({
  name: 'sample',
  description: 'draw more candidates from an OpenAI-compatible endpoint for tasks with too few logged sessions (off by default)',
  version: 1,
  inputs: ['split'],
  outputs: ['sessions', 'info.json'],
  config,
  environment: (cfg) => (cfg.enabled ? endpointEnvironment(ENDPOINT) : []),

  async run({ config: cfg, out, input, cache, log }) {
    const splitDir = input('split');
    const info = await readSplitInfo(splitDir);
    await mkdir(join(out, 'sessions'), { recursive: true });
    await writeFile(join(out, 'info.json'), JSON.stringify({ buckets: info.buckets }) + '\n');
    const counts: Record<string, number> = { tasks_sampled: 0, sampled: 0, rollouts: 0, replies: 0, failed: 0, over_budget: 0, requests: 0, cached: 0, retries: 0 };
    const endpoint = cfg.enabled ? await openEndpoint(ENDPOINT, cfg.endpoint, cfg.redaction, join(cache, 'answers.jsonl'), log) : null;
    const worlds = new WorldCache();
    try {
      for (const side of SPLITS) {
        const progress = log.progress(`sample ${side}`, info.buckets);
        for (let b = 0; b < info.buckets; b++) {
          const path = bucketFile(out, side, b);
          await mkdir(dirname(path), { recursive: true });
          const writer = new JsonlWriter(path);
          if (endpoint && cfg.splits.includes(side)) {
            const jobs: Promise<SampledSession | null>[] = [];
            for (const [taskId, sessions] of await readTaskGroups(bucketFile(splitDir, side, b))) {
              if (sessions.length >= cfg.min_candidates) continue;
              counts.tasks_sampled!++;
              for (let index = sessions.length; index < cfg.min_candidates; index++) {
                jobs.push(
                  drawCandidate(endpoint, worlds, taskId, sessions, index, cfg).catch((error: unknown) => {
                    if (error instanceof BudgetSpent) counts.over_budget!++;
                    else if (error instanceof RequestFailed) {
                      counts.failed!++;
                      log.warn('sample failed', { task_id: taskId, index, error: error.message });
                    } else throw error;
                    return null;
                  }),
                );
              }
            }
            for (const candidate of await Promise.all(jobs)) {
              if (!candidate) continue;
              await writer.write(candidate);
              counts.sampled!++;
              counts[candidate.reward === null ? 'replies' : 'rollouts']!++;
            }
          }
          await writer.close();
          progress.tick();
        }
        progress.done();
      }
    } finally {
      await endpoint?.close();
    }
    if (endpoint) Object.assign(counts, requestCounts(endpoint));
    if (counts.failed! > 0) log.warn('some candidates failed', { failed: counts.failed, hint: 'rerun `prefab stage sample`: answers already received are cached' });
    return {
      counts,
      summary: endpoint
        ? `${counts.sampled} candidates sampled for ${counts.tasks_sampled} tasks (${counts.rollouts} rollouts, ${counts.replies} single replies; ` +
          `${counts.requests} requests, ${counts.cached} from cache, ${counts.failed} failed, ${counts.over_budget} over budget)`
        : 'sampling is off (sample.enabled: false); best-of-N uses the logged sessions',
    };
  },
});

async function drawCandidate(endpoint: ChatEndpoint, worlds: WorldCache, taskId: string, sessions: SplitSession[], index: number, cfg: z.infer<typeof config>): Promise<SampledSession> {
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
  const { trial: _t, _message_extras: _x, success: _s, turns: _n, ...taskMetadata } = JSON.parse(first.metadata) as Record<string, unknown>;
  if (!('reason' in found)) {
    const episode = await runEpisode(found.world, found.task, new EndpointPolicy(endpoint, { ...options, tools: TOOLS }));
    const metadata = { ...taskMetadata, success: episode.success, turns: episode.turns, sampled };
    return { ...base, messages: episode.messages, reward: Math.round(episode.reward * 1e6) / 1e6, feedback: episode.state.feedback.join('\n') || null, metadata: JSON.stringify(metadata) };
  }
  const prompt = groupPrompt(sessions);
  const reply = await sampleMessage(endpoint, prompt, options);
  return { ...base, messages: [...prompt, reply], reward: null, metadata: JSON.stringify({ ...taskMetadata, sampled }) };
}
