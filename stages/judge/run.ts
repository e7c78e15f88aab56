// The judge stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { mustDeclineTest } from '../../judges/rules.ts';
import { openPanel } from '../../judges/panel.ts';
import { addStats, type JudgeStats } from '../../core/verdict.ts';
import { JsonlWriter, LineBuffer, readJsonl } from '../../pipeline/jsonl.ts';
import { forEachLine, readLineBlocks } from '../../pipeline/records.ts';
import { WorkerPool, inOrder, workerCount, type InOrderOptions } from '../../pipeline/workers.ts';
import { safePoint } from '../../pipeline/interrupt.ts';
import { PipelineError } from '../../pipeline/errors.ts';
import { SPLITS, type CandidatePair, type JudgedPair, type Split } from '../../core/records.ts';
import { ChunkIndex, joinChunks, ownsBucket, sumCounts } from '../../pipeline/shards.ts';
import {
  MANY_BUCKETS,
  bucketFile,
  pairTaskId,
  readPairs,
  readPairsInfo,
  readSplitInfo,
  taskBuckets,
} from '../layout.ts';
import { StoredBucketReader } from '../../store/bucket-reader.ts';
import type { PairSide } from '../../store/messages.ts';
import { judgeBestOfN, type BestOfNBucket } from './best-of-n.ts';
import {
  OutcomeCouples,
  addTally,
  asGiven,
  judgeConstructed,
  newTally,
  tallyOne,
  type BestOfNJob,
  type BucketPairsJob,
  type JudgedBucket,
  type JudgeJob,
  type Tally,
} from './constructed.ts';
import type { JudgeThreadInit } from './worker.ts';

import type { Shard, ShardPart, StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

/**
 * A side's file holds three sections: the pairs stage's pairs, then the imported ones, then best-of-N. On a
 * shard, the pairs stage's and best-of-N's are the shard's buckets (each bucket a chunk, pipeline/shards.ts),
 * and the imported pairs, which have no task, are judged on shard 0 alone.
 */
export async function run({
  config: cfg,
  configDir,
  out,
  input,
  cache,
  lineage,
  log,
  signal,
  shard,
  options,
}: StageContext<Config>): Promise<StageReport> {
  const info = await readSplitInfo(input('split'));
  const folders = { split: input('split'), ingest: input('ingest') };
  // On this thread, best-of-N reads every bucket's sessions into the same buffers.
  const reader = new StoredBucketReader();
  const pairsInfo = (await readPairsInfo(input('pairs'))) ?? { must_decline: [], rewriter_model: null };
  const chunks = new ChunkIndex(out, shard);
  const mustDecline = mustDeclineTest(pairsInfo.must_decline);
  const { ensemble, endpoint, promptVersion } = await openPanel(cfg, {
    configDir,
    cacheDir: cache,
    redaction: cfg.redaction,
    mustDecline,
    log,
  });

  const tally: Tally = newTally();
  // Without an LLM judge, whose answers are asked of one endpoint and cached, the pairs stage's pairs are
  // judged in pieces of a bucket's on worker threads, and written in order: the same bytes.
  const owned = Array.from({ length: info.buckets }, (_, b) => b).filter((b) => ownsBucket(shard, b));
  const threads = endpoint ? 1 : workerCount(options.workers, owned.length >= MANY_BUCKETS);
  // `heldBucketBytes` (a test's): the largest bucket a thread holds whole (0: each read as a large one).
  const heldBytes = typeof options.heldBucketBytes === 'number' ? options.heldBucketBytes : undefined;
  const init: JudgeThreadInit = {
    cfg,
    configDir,
    cacheDir: cache,
    mustDecline: pairsInfo.must_decline,
    folders,
    buckets: info.buckets,
    heldBytes,
  };
  // The pairs lines a thread is given at once: `judgePieceBytes`, a test's, or PAIRS_PIECE.
  const piece = typeof options.judgePieceBytes === 'number' ? options.judgePieceBytes : PAIRS_PIECE;
  const pool =
    threads > 1
      ? new WorkerPool<JudgeJob, JudgedBucket>(
          'judge-worker',
          new URL('./worker.ts', import.meta.url),
          threads,
          init,
          (job) => ('bytes' in job ? [job.bytes.buffer as ArrayBuffer] : []),
        )
      : null;
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
      const stopped = () =>
        `judge: stopped while judging the ${side} pairs; the next run judges again (LLM answers received are cached)`;
      const pairsFile = join(input('pairs'), `${side}.jsonl`);
      if (pool) {
        const jobs = async function* () {
          for await (const job of piecesOfPairs(pairsFile, side, info.buckets, piece)) {
            await safePoint(signal, stopped);
            yield job;
          }
        };
        await inOrder(
          jobs(),
          pool,
          async (made, job) => {
            // A bucket's first piece starts its chunk.
            if (job.bucket !== bucket) chunks.mark(writer, [0, (bucket = job.bucket)]);
            if (couples)
              for (const [chosen, rejected] of made.couples)
                await couples.note(job.bucket, { chosen_session_id: chosen, rejected_session_id: rejected });
            await writer.writeBlock(made.lines, made.count, () => pool.giveBack([made.lines.buffer as ArrayBuffer]));
            addTally(tally, made.tally);
            progress.tick(made.count);
          },
          JUDGED_IN_FLIGHT,
        );
      } else
        await judgeConstructed(
          readPairs(pairsFile, folders, info.buckets),
          ensemble,
          cfg.batch_size,
          writeConstructed,
          () => progress.tick(),
          () => safePoint(signal, stopped),
        );
      progress.done();
      const imported = join(input('import'), `${side}.jsonl`);
      if (ownsImported(shard)) {
        chunks.mark(writer, [1]);
        if (cfg.imported === 'recheck')
          await judgeConstructed(
            readPairs(imported, folders, info.buckets),
            ensemble,
            cfg.batch_size,
            write,
            () => {},
            () => safePoint(signal, stopped),
          );
        else for await (const p of readJsonl<CandidatePair>(imported)) await write([asGiven(p)]);
      }
      if (couples) {
        const groups = log.progress(`judge ${side} best-of-N`, info.buckets);
        const where = (b: number): BestOfNBucket => ({
          splitFile: bucketFile(folders.split, side, b),
          sampleFile: bucketFile(input('sample'), side, b),
          min: cfg.best_of_n.min_candidates,
          max: cfg.best_of_n.max_candidates,
        });
        if (pool) {
          // The outcome pairs' couples are all noted: each bucket's go with it to its thread.
          const jobs = async function* () {
            for (const b of owned) {
              await safePoint(signal, stopped);
              yield {
                side,
                bucket: b,
                bestOfN: { ...where(b), outcomeKeys: [...(await couples.of(b))] },
              } satisfies BestOfNJob;
            }
          };
          await inOrder(
            jobs(),
            pool,
            async (made, job) => {
              chunks.mark(writer, [2, job.bucket]);
              await writer.writeBlock(made.lines, made.count, () => pool.giveBack([made.lines.buffer as ArrayBuffer]));
              addTally(tally, made.tally);
              groups.tick();
            },
            JUDGED_IN_FLIGHT,
          );
        } else {
          for (const b of owned) {
            chunks.mark(writer, [2, b]);
            await safePoint(signal, stopped);
            await judgeBestOfN(where(b), await couples.of(b), folders, reader, (c) => ensemble.judge(c), tally, write);
            groups.tick();
          }
        }
        groups.done();
        await couples.remove();
      }
      await writer.close();
    }
  } finally {
    await pool?.close();
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

/** Two jobs (pieces of pairs, or a bucket's best-of-N) a thread being judged; jobs judged out of turn wait to be written while their lines hold under 64 MiB. */
const JUDGED_IN_FLIGHT: InOrderOptions<JudgedBucket> = {
  perThread: 2,
  held: { bytes: (made) => made.lines.length, budget: 64 << 20 },
};

const ownsImported = (shard: Shard | null) => shard === null || shard.index === 0;

/** The pairs lines a thread is given at once (a bucket's, or a piece of them). */
const PAIRS_PIECE = 1 << 20;

/**
 * The pairs stage's file of a side cut into pieces of about `piece` bytes of lines, each of one bucket (it
 * writes them bucket by bucket: a bucket told by each line's task), with the number of its first line. A
 * bucket of a few large tasks is judged in many pieces, by every thread, rather than held whole by one.
 */
async function* piecesOfPairs(
  file: string,
  side: Split,
  buckets: number,
  piece: number,
): AsyncGenerator<BucketPairsJob> {
  const bucketOfTask = taskBuckets(buckets);
  let run: { bucket: number; lines: LineBuffer; firstLine: number } | null = null;
  const done = (r: NonNullable<typeof run>): BucketPairsJob => ({
    file,
    side,
    bucket: r.bucket,
    bytes: r.lines.take(),
    firstLine: r.firstLine,
  });
  for await (const block of readLineBlocks(file)) {
    if ('damaged' in block)
      throw new PipelineError(`${file}: ${block.damaged}; run \`prefab stage pairs\` to write it again`);
    const bytes = Buffer.from(block.bytes.buffer, block.bytes.byteOffset, block.bytes.length);
    let line = block.firstLine;
    const ready: BucketPairsJob[] = [];
    forEachLine(bytes, (start, end) => {
      const at = line++;
      if (end === start) return;
      const bucket = bucketOfTask(pairTaskId(bytes, start, end)!);
      if (run && (run.bucket !== bucket || run.lines.length >= piece)) {
        ready.push(done(run));
        run = null;
      }
      run ??= { bucket, lines: new LineBuffer(piece + (64 << 10)), firstLine: at };
      run.lines.pushBytes(bytes.subarray(start, end));
    });
    yield* ready;
  }
  if (run) yield done(run);
}

interface JudgeReport {
  judges: string[];
  prompt_version: string | null;
  endpoint: ({ url: string; model: string } & Record<string, unknown>) | null;
  counts: Record<string, number>;
  stats: JudgeStats;
}

function stageReport({ judges, endpoint, counts, stats }: JudgeReport): StageReport {
  const e = endpoint as Record<string, number> | null;
  const requests = e
    ? `; ${e.requests} requests, ${e.cached} from cache, ${e.retries} retries, ${stats.parse_failures} unreadable replies`
    : '';
  return {
    counts: {
      ...counts,
      requests: e?.requests ?? 0,
      cached: e?.cached ?? 0,
      retries: e?.retries ?? 0,
      parse_failures: stats.parse_failures,
      request_errors: stats.errors,
    },
    summary:
      `${counts.judged_train} train / ${counts.judged_test} test comparisons judged by ${judges.join(', ')}: ` +
      `${counts.chosen_wins} confirmed, ${counts.rejected_wins} reversed, ${counts.ties} ties, ${counts.abstained} abstained (${counts.flipped} order flips)${requests}` +
      (counts.kept_as_given
        ? `; ${counts.kept_as_given} imported pairs kept as given, not judged (judge.imported: as_given)`
        : ''),
  };
}

/** The shards' judged pairs in one run's order, and one report adding up theirs. */
export async function merge(parts: ShardPart[], out: string): Promise<StageReport> {
  for (const side of SPLITS) await joinChunks(parts, `${side}.jsonl`, out);
  const reports = await Promise.all(
    parts.map(async (p) => JSON.parse(await readFile(join(p.dir, 'report.json'), 'utf8')) as JudgeReport),
  );
  const first = reports[0]!;
  const endpoints = reports.map((r) => r.endpoint).filter((e) => e !== null);
  const report: JudgeReport = {
    judges: first.judges,
    prompt_version: first.prompt_version,
    endpoint: first.endpoint
      ? {
          url: first.endpoint.url,
          model: first.endpoint.model,
          ...sumCounts(endpoints.map(({ url: _u, model: _m, ...counts }) => counts as Record<string, number>)),
        }
      : null,
    counts: sumCounts(reports.map((r) => r.counts)),
    stats: reports.slice(1).reduce((s, r) => addStats(s, r.stats), first.stats),
  };
  await writeFile(join(out, 'report.json'), JSON.stringify(report, null, 2) + '\n');
  return stageReport(report);
}
