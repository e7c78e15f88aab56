// sample: for tasks with too few logged candidates, draw more from an OpenAI-compatible endpoint at
// temperature 0.7, so best-of-N has N to choose from. A simulator task is rolled out in the environment
// with the model as the policy (so the candidate has a real reward); any other prompt gets one sampled
// reply (no reward). Every answer is cached per (model, request, index): a rerun pays nothing.
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { z } from 'zod';
import { RequestFailed, endpointConfig, endpointEnvironment, openEndpoint, requestCounts } from '../../judges/endpoint.ts';
import { JsonlWriter } from '../../pipeline/jsonl.ts';
import { defineStage } from '../../pipeline/stage.ts';
import { WorldCache } from '../../env/replay.ts';
import { redactionConfig } from '../../core/redact.ts';
import { SPLITS, bucketFile, readSplitInfo, readTaskGroups } from '../layout.ts';
import { drawCandidate, type SampledSession } from './candidate.ts';
import { BudgetSpent } from './policy.ts';

const config = z.strictObject({
  enabled: z.boolean().default(false).describe('Off by default: the default run needs no endpoint.'),
  min_candidates: z.number().int().min(2).max(64).default(4).describe('A task with fewer logged sessions than this gets sampled candidates up to it.'),
  temperature: z.number().min(0).max(2).default(0.7).describe('Sampling temperature: above 0, so that the candidates differ.'),
  max_tokens: z.number().int().min(1).default(512).describe('Most tokens in one sampled assistant message.'),
  splits: z.array(z.enum(['train', 'test'])).default(['train']).describe('Sides of the split whose tasks are topped up with sampled candidates.'),
  endpoint: endpointConfig.prefault({}).describe('The OpenAI-compatible endpoint candidates are drawn from; PREFAB_SAMPLE_MODEL overrides its model.'),
  redaction: redactionConfig.prefault({}).describe('Personal data masked in a request before it leaves the machine; the values are put back into the reply.'),
});

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
