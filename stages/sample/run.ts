// The sample stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { RequestFailed, openEndpoint, requestCounts } from '../../judges/endpoint.ts';
import { JsonlWriter } from '../../pipeline/jsonl.ts';
import { WorldCache } from '../../env/replay.ts';
import { joinFolders, ownsBucket, sameInEvery, sumCounts } from '../../pipeline/shards.ts';
import { SPLITS } from '../../core/records.ts';
import { bucketFile, readSplitInfo } from '../layout.ts';
import { readTaskGroups } from '../../store/bucket-reader.ts';
import { drawCandidate, type SampledSession } from './candidate.ts';
import { BudgetSpent } from './policy.ts';

const ENDPOINT = { key: 'sample.endpoint', modelEnv: 'PREFAB_SAMPLE_MODEL' };
import type { ShardPart, StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

const OFF = 'sampling is off (sample.enabled: false); best-of-N uses the logged sessions';

/** Empty bucket files made at once: split may make 1,024 buckets a side, each a file descriptor while it is made. */
const EMPTY_AT_ONCE = 64;

/** On a shard, only the buckets it owns. */
export async function run({ config: cfg, out, input, cache, log, shard }: StageContext<Config>): Promise<StageReport> {
  const splitDir = input('split');
  const info = await readSplitInfo(splitDir);
  await mkdir(join(out, 'sessions'), { recursive: true });
  await writeFile(join(out, 'info.json'), JSON.stringify({ buckets: info.buckets }) + '\n');
  const counts: Record<string, number> = {
    tasks_sampled: 0,
    sampled: 0,
    rollouts: 0,
    replies: 0,
    failed: 0,
    over_budget: 0,
    requests: 0,
    cached: 0,
    retries: 0,
  };
  const endpoint = cfg.enabled
    ? await openEndpoint(ENDPOINT, cfg.endpoint, cfg.redaction, join(cache, 'answers.jsonl'), log)
    : null;
  const worlds = new WorldCache();
  try {
    for (const side of SPLITS) {
      const progress = log.progress(`sample ${side}`, info.buckets);
      // A side not sampled has its bucket files, empty, made a few dozen at once rather than each waiting for
      // the last (at most EMPTY_AT_ONCE files open).
      const empty: Promise<void>[] = [];
      for (let b = 0; b < info.buckets; b++) {
        if (!ownsBucket(shard, b)) continue;
        if (empty.length === EMPTY_AT_ONCE) await Promise.all(empty.splice(0));
        const writer = new JsonlWriter(bucketFile(out, side, b));
        if (!endpoint || !cfg.splits.includes(side)) {
          empty.push(writer.close().then(() => progress.tick()));
          continue;
        }
        const jobs: Promise<SampledSession | null>[] = [];
        // A task with min_candidates sessions or more is not sampled: no more of its sessions are kept.
        for (const [taskId, sessions] of readTaskGroups(bucketFile(splitDir, side, b), input('ingest'), undefined, {
          most: cfg.min_candidates,
        })) {
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
        await writer.close();
        progress.tick();
      }
      await Promise.all(empty);
      progress.done();
    }
  } finally {
    await endpoint?.close();
  }
  if (endpoint) Object.assign(counts, requestCounts(endpoint));
  if (counts.failed! > 0)
    log.warn('some candidates failed', {
      failed: counts.failed,
      hint: 'rerun `prefab stage sample`: answers already received are cached',
    });
  return endpoint ? report(counts) : { counts, summary: OFF };
}

function report(counts: Record<string, number>): StageReport {
  const c = counts as Record<
    'sampled' | 'tasks_sampled' | 'rollouts' | 'replies' | 'requests' | 'cached' | 'failed' | 'over_budget',
    number
  >;
  return {
    counts,
    summary:
      `${c.sampled} candidates sampled for ${c.tasks_sampled} tasks (${c.rollouts} rollouts, ${c.replies} single replies; ` +
      `${c.requests} requests, ${c.cached} from cache, ${c.failed} failed, ${c.over_budget} over budget)`,
  };
}

export async function merge(parts: ShardPart[], out: string): Promise<StageReport> {
  await joinFolders(parts, 'sessions', out);
  await sameInEvery(parts, 'info.json', out);
  const counts = sumCounts(parts.map((p) => p.counts));
  return parts[0]!.summary === OFF ? { counts, summary: OFF } : report(counts);
}
