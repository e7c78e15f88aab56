// The pairs stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
// pairs: preference pairs from the split sessions, one bucket of tasks in memory at a time: outcome pairs
// (successes against failures) and hard negatives (a successful session's turn against a worse version of it).
// Hard negatives come from deterministic transforms and, when configured, from an LLM rewriter.
// Best-of-N pairs need the judges to pick the best, so the judge stage builds them.
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { openEndpoint, requestCounts, type ChatEndpoint } from '../../judges/endpoint.ts';
import { JsonlWriter } from '../../pipeline/jsonl.ts';
import { safePoint } from '../../pipeline/interrupt.ts';
import { mustDeclineTest } from '../../judges/rules.ts';
import { NEGATIVE_TYPES, type SplitSession } from '../../core/records.ts';
import { ChunkIndex, joinChunks, ownsBucket, sameInEvery, sumCounts } from '../../pipeline/shards.ts';
import { SPLITS, bucketFile, readPairsInfo, readSplitInfo, readTaskGroups, type PairsInfo } from '../layout.ts';
import { pairBucket } from './bucket.ts';
import { REWRITE_TYPES, Rewriter, activeTypes, loadRewritePrompt, rewritePromptPath } from './rewriter.ts';

const rewriting = (cfg: Config) => cfg.hard_negatives.enabled && cfg.hard_negatives.rewriter.enabled;


const REWRITER_ENDPOINT = { key: 'pairs.hard_negatives.rewriter.endpoint', modelEnv: 'PREFAB_REWRITE_MODEL' };
import type { ShardPart, StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

/** On a shard, only the buckets it owns; each bucket's pairs are a chunk of the files (pipeline/shards.ts). */
export async function run({ config: cfg, configDir, out, input, cache, log, signal, shard }: StageContext<Config>): Promise<StageReport> {
  const splitDir = input('split');
  const info = await readSplitInfo(splitDir);
  await mkdir(out, { recursive: true });
  const chunks = new ChunkIndex(out, shard);
  const dropped = new JsonlWriter(join(out, 'dropped.jsonl'));
  const counts: Record<string, number> = { train: 0, test: 0, outcome: 0, hard_negative: 0, tasks: 0, tasks_with_pairs: 0, tasks_without_success: 0, tasks_without_failure: 0, dropped: 0 };
  for (const t of NEGATIVE_TYPES) counts[`hard_negative_${t}`] = 0;
  // hard_negative counts both kinds; hard_negative_<type> the transforms', hard_negative_llm_<type> the rewriter's.
  Object.assign(counts, { hard_negative_llm: 0, rewrite_skipped: 0, rewrite_failed: 0, rewrite_over_budget: 0, rewrite_must_decline: 0, requests: 0, cached: 0, retries: 0 });
  for (const t of REWRITE_TYPES) counts[`hard_negative_llm_${t}`] = 0;
  const r = cfg.hard_negatives.rewriter;
  let endpoint: ChatEndpoint | null = null;
  let rewriter: Rewriter | null = null;
  if (rewriting(cfg)) {
    const prompt = loadRewritePrompt(rewritePromptPath(r, configDir), activeTypes(r.ratios));
    endpoint = await openEndpoint(REWRITER_ENDPOINT, r.endpoint, r.redaction, join(cache, 'rewrites.jsonl'), log);
    rewriter = new Rewriter(endpoint, prompt, { temperature: r.temperature, maxTokens: r.max_tokens });
  }
  const mustDecline = mustDeclineTest(cfg.must_decline);
  const bucketOptions = { outcome: cfg.outcome, hardNegatives: cfg.hard_negatives, rewriter, mustDecline: (s: SplitSession) => mustDecline({ metadata: s.metadata, prompt: s.messages }) };
  try {
    for (const [s, side] of SPLITS.entries()) {
      const writer = new JsonlWriter(join(out, `${side}.jsonl`));
      const progress = log.progress(`pairs ${side}`, info.buckets);
      for (let b = 0; b < info.buckets; b++) {
        if (!ownsBucket(shard, b)) continue;
        chunks.mark(writer, [b]);
        chunks.mark(dropped, [s, b]);
        await safePoint(signal, () => `pairs: stopped at ${side} bucket ${b + 1} of ${info.buckets}; the next run makes pairs again${rewriter ? ' (rewrites received are cached)' : ''}`);
        await pairBucket(await readTaskGroups(bucketFile(splitDir, side, b)), side, bucketOptions, { pairs: writer, dropped }, counts, log);
        progress.tick();
      }
      progress.done();
      await writer.close();
    }
  } finally {
    await endpoint?.close();
  }
  if (endpoint) Object.assign(counts, requestCounts(endpoint));
  if (counts.rewrite_failed! > 0) log.warn('some rewrites failed', { failed: counts.rewrite_failed, hint: 'rerun `prefab stage pairs`: rewrites already received are cached' });
  await dropped.close();
  await chunks.save();
  await writeFile(join(out, 'info.json'), JSON.stringify({ must_decline: cfg.must_decline, rewriter_model: endpoint?.model ?? null } satisfies PairsInfo, null, 2) + '\n');
  return report(counts, endpoint?.model ?? null);
}

function report(counts: Record<string, number>, rewriterModel: string | null): StageReport {
  const c = counts;
  return {
    counts,
    summary:
      `${c.train} train / ${c.test} test pairs (${c.outcome} outcome, ${c.hard_negative} hard negatives) from ${c.tasks_with_pairs} of ${c.tasks} tasks ` +
      `(${c.tasks_without_success} without a success, ${c.tasks_without_failure} without a failure, ${c.dropped} pairs dropped)` +
      (rewriterModel
        ? `; ${c.hard_negative_llm} hard negatives rewritten by ${rewriterModel} (${c.requests} requests, ${c.cached} from cache, ` +
          `${c.rewrite_skipped} skipped, ${c.rewrite_failed} failed, ${c.rewrite_over_budget} over budget)`
        : ''),
  };
}

/** The shards' pairs, bucket by bucket as one run writes them. */
export async function merge(parts: ShardPart[], out: string): Promise<StageReport> {
  for (const file of ['train.jsonl', 'test.jsonl', 'dropped.jsonl']) await joinChunks(parts, file, out);
  await sameInEvery(parts, 'info.json', out);
  return report(sumCounts(parts.map((p) => p.counts)), (await readPairsInfo(out))!.rewriter_model);
}
