// The judge stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
// judge: every pair from the pairs stage, and best-of-N among each task's candidates (logged trials and
// sampled ones), goes before the judges: a decisive verifier first, then the weighted votes of the rules
// and, when configured, an LLM judge. Every judged comparison is written, kept or not: the gate decides.
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { mustDeclineTest } from '../../judges/rules.ts';
import { openPanel } from '../../judges/panel.ts';
import { addStats, NO_COST, type JudgeStats } from '../../core/verdict.ts';
import { JsonlWriter, readJsonl } from '../../pipeline/jsonl.ts';
import { safePoint } from '../../pipeline/interrupt.ts';
import type { CandidatePair, JudgedPair } from '../../core/records.ts';
import { ChunkIndex, joinChunks, ownsBucket, sumCounts } from '../../pipeline/shards.ts';
import { SPLITS, StoredBucketReader, bucketFile, readPairs, readPairsInfo, readSplitInfo, taskBuckets, type PairSide } from '../layout.ts';
import { candidateGroups, judgeGroup } from './best-of-n.ts';
import { OutcomeCouples, asGiven, coupleKey, judgeConstructed } from './constructed.ts';

interface Tally {
  counts: Record<string, number>;
  stats: JudgeStats;
}

import type { Shard, ShardPart, StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

function tallyOne(t: Tally, p: JudgedPair<PairSide>): void {
  const c = t.counts;
  c[`judged_${p.split}`]!++;
  c[p.source] = (c[p.source] ?? 0) + 1;
  c[p.verdict.winner === 'a' ? 'chosen_wins' : p.verdict.winner === 'b' ? 'rejected_wins' : p.verdict.winner === 'tie' ? 'ties' : 'abstained']!++;
  t.stats = addStats(t.stats, p.judge_stats);
  if (p.judge_stats.flipped) c.flipped!++;
  if (p.judge_stats.over_budget) c.over_budget!++;
}

/**
 * A side's file holds three sections: the pairs stage's pairs, then the imported ones, then best-of-N. On a
 * shard, the pairs stage's and best-of-N's are the shard's buckets (each bucket a chunk, pipeline/shards.ts),
 * and the imported pairs, which have no task, are judged on shard 0 alone.
 */
export async function run({ config: cfg, configDir, out, input, cache, lineage, log, signal, shard }: StageContext<Config>): Promise<StageReport> {
  const info = await readSplitInfo(input('split'));
  const folders = { split: input('split'), ingest: input('ingest') };
  // Best-of-N reads every bucket's sessions into the same buffers.
  const reader = new StoredBucketReader();
  const pairsInfo = (await readPairsInfo(input('pairs'))) ?? { must_decline: [], rewriter_model: null };
  const chunks = new ChunkIndex(out, shard);
  const mustDecline = mustDeclineTest(pairsInfo.must_decline);
  const { ensemble, endpoint, promptVersion } = await openPanel(cfg, { configDir, cacheDir: cache, redaction: cfg.redaction, mustDecline, log });

  const tally: Tally = {
    counts: { judged_train: 0, judged_test: 0, chosen_wins: 0, rejected_wins: 0, ties: 0, abstained: 0, flipped: 0, over_budget: 0, best_of_n_groups: 0, best_of_n_same_as_outcome: 0, best_of_n_duplicates: 0 },
    stats: NO_COST,
  };
  try {
    for (const side of SPLITS) {
      const writer = new JsonlWriter(join(out, `${side}.jsonl`));
      // Only best-of-N asks which couples the outcome pairs took; the file goes before the stage ends.
      const couples = cfg.best_of_n.enabled ? new OutcomeCouples(join(out, `outcome-couples-${side}.jsonl`)) : null;
      let bucket = -1;
      const write = async (pairs: JudgedPair<PairSide>[]) => {
        for (const p of pairs) {
          await writer.write(p);
          tallyOne(tally, p);
        }
      };
      // The pairs stage wrote its pairs bucket by bucket: a new bucket starts a chunk.
      const bucketOfTask = taskBuckets(info.buckets);
      const writeConstructed = async (pairs: JudgedPair<PairSide>[]) => {
        for (const p of pairs) {
          const b = bucketOfTask(p.task_id!);
          if (b !== bucket) chunks.mark(writer, [0, (bucket = b)]);
          if (couples && p.source === 'outcome') await couples.note(b, p);
          await write([p]);
        }
      };

      const progress = log.progress(`judge ${side} pairs`, lineage.find((l) => l.stage === 'pairs')?.counts[side]);
      const stopped = () => `judge: stopped while judging the ${side} pairs; the next run judges again (LLM answers received are cached)`;
      await judgeConstructed(readPairs(join(input('pairs'), `${side}.jsonl`), folders, info.buckets), ensemble, cfg.batch_size, writeConstructed, () => progress.tick(), () => safePoint(signal, stopped));
      progress.done();
      const imported = join(input('import'), `${side}.jsonl`);
      if (ownsImported(shard)) {
        chunks.mark(writer, [1]);
        if (cfg.imported === 'recheck') await judgeConstructed(readPairs(imported, folders, info.buckets), ensemble, cfg.batch_size, write, () => {}, () => safePoint(signal, stopped));
        else for await (const p of readJsonl<CandidatePair>(imported)) await write([asGiven(p)]);
      }
      if (couples) {
        const groups = log.progress(`judge ${side} best-of-N`, info.buckets);
        for (let b = 0; b < info.buckets; b++) {
          if (!ownsBucket(shard, b)) continue;
          chunks.mark(writer, [2, b]);
          await safePoint(signal, stopped);
          const outcomeKeys = await couples.of(b);
          const bucket = await candidateGroups(bucketFile(folders.split, side, b), bucketFile(input('sample'), side, b), folders, reader, cfg.best_of_n.max_candidates);
          const results = await Promise.all(bucket.filter((g) => g.candidates.length >= cfg.best_of_n.min_candidates).map((g) => judgeGroup(g, (c) => ensemble.judge(c))));
          for (const r of results) {
            tally.counts.best_of_n_groups!++;
            tally.counts.best_of_n_duplicates! += r.duplicates.length;
            tally.stats = addStats(tally.stats, r.offRecord);
            // A couple already paired by outcome would only be a duplicate row.
            const fresh = r.judged.filter((p) => !outcomeKeys.has(coupleKey(p)));
            tally.counts.best_of_n_same_as_outcome! += r.judged.length - fresh.length;
            await write(fresh);
          }
          groups.tick();
        }
        groups.done();
        await couples.remove();
      }
      await writer.close();
    }
  } finally {
    await endpoint?.close();
  }

  await chunks.save();
  const report: JudgeReport = {
    judges: ensemble.names,
    prompt_version: promptVersion,
    endpoint: endpoint ? { url: endpoint.baseURL, model: endpoint.model, ...endpoint.counts } : null,
    counts: tally.counts,
    stats: { ...tally.stats },
  };
  await writeFile(join(out, 'report.json'), JSON.stringify(report, null, 2) + '\n');
  return stageReport(report);
}

const ownsImported = (shard: Shard | null) => shard === null || shard.index === 0;

interface JudgeReport {
  judges: string[];
  prompt_version: string | null;
  endpoint: ({ url: string; model: string } & Record<string, unknown>) | null;
  counts: Record<string, number>;
  stats: JudgeStats;
}

function stageReport({ judges, endpoint, counts, stats }: JudgeReport): StageReport {
  const e = endpoint as Record<string, number> | null;
  const requests = e ? `; ${e.requests} requests, ${e.cached} from cache, ${e.retries} retries, ${stats.parse_failures} unreadable replies` : '';
  return {
    counts: { ...counts, requests: e?.requests ?? 0, cached: e?.cached ?? 0, retries: e?.retries ?? 0, parse_failures: stats.parse_failures, request_errors: stats.errors },
    summary:
      `${counts.judged_train} train / ${counts.judged_test} test comparisons judged by ${judges.join(', ')}: ` +
      `${counts.chosen_wins} confirmed, ${counts.rejected_wins} reversed, ${counts.ties} ties, ${counts.abstained} abstained (${counts.flipped} order flips)${requests}`,
  };
}

/** The shards' judged pairs in one run's order, and one report adding up theirs. */
export async function merge(parts: ShardPart[], out: string): Promise<StageReport> {
  for (const side of SPLITS) await joinChunks(parts, `${side}.jsonl`, out);
  const reports = await Promise.all(parts.map(async (p) => JSON.parse(await readFile(join(p.dir, 'report.json'), 'utf8')) as JudgeReport));
  const first = reports[0]!;
  const endpoints = reports.map((r) => r.endpoint).filter((e) => e !== null);
  const report: JudgeReport = {
    judges: first.judges,
    prompt_version: first.prompt_version,
    endpoint: first.endpoint ? { url: first.endpoint.url, model: first.endpoint.model, ...sumCounts(endpoints.map(({ url: _u, model: _m, ...counts }) => counts as Record<string, number>)) } : null,
    counts: sumCounts(reports.map((r) => r.counts)),
    stats: reports.slice(1).reduce((s, r) => addStats(s, r.stats), first.stats),
  };
  await writeFile(join(out, 'report.json'), JSON.stringify(report, null, 2) + '\n');
  return stageReport(report);
}
