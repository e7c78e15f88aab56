// The pairs stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { mkdir, stat, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { openEndpoint, requestCounts, type ChatEndpoint } from '../../judges/endpoint.ts';
import { JsonlWriter } from '../../pipeline/jsonl.ts';
import { BufferShelf } from '../../pipeline/buffers.ts';
import { safePoint } from '../../pipeline/interrupt.ts';
import { SPLITS, type Split } from '../../core/records.ts';
import { WorkerPool, inOrder, workerCount } from '../../pipeline/workers.ts';
import { ChunkIndex, joinChunks, ownsBucket, sameInEvery, sumCounts } from '../../pipeline/shards.ts';
import { MANY_BUCKETS, bucketFile, readPairsInfo, readSplitInfo, type PairsInfo } from '../layout.ts';
import { sessionSegments } from '../../store/runs.ts';
import { bucketOptions, pairCounts, type PairedBucket, type PairingConfig } from '../../pairing/bucket.ts';
import { BucketPairer, PIECE_BYTES, type BucketJob, type PairedJob, type PieceOfTask } from '../../pairing/pairer.ts';
import { Rewriter, activeTypes, loadRewritePrompt, rewritePromptPath } from '../../pairing/rewriter.ts';
import { PREFAB_TEMPLATES, readTemplates } from '../../pairing/templates.ts';

import type { Progress } from '../../pipeline/log.ts';
import type { ShardPart, StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

const rewriting = (cfg: Config) => cfg.hard_negatives.enabled && cfg.hard_negatives.rewriter.enabled;

const REWRITER_ENDPOINT = { key: 'pairs.hard_negatives.rewriter.endpoint', modelEnv: 'PREFAB_REWRITE_MODEL' };

/**
 * On a shard, only the buckets it owns; each bucket's pairs are a chunk of the files (pipeline/shards.ts).
 * Without the rewriter, buckets are paired on worker threads and written in order: the same bytes.
 */
export async function run({
  config: cfg,
  configDir,
  out,
  input,
  cache,
  log,
  signal,
  shard,
  options,
}: StageContext<Config>): Promise<StageReport> {
  const [splitDir, ingestDir] = [input('split'), input('ingest')];
  const info = await readSplitInfo(splitDir);
  await mkdir(out, { recursive: true });
  const chunks = new ChunkIndex(out, shard);
  const dropped = new JsonlWriter(join(out, 'dropped.jsonl'));
  const counts = pairCounts();
  const r = cfg.hard_negatives.rewriter;
  let endpoint: ChatEndpoint | null = null;
  let rewriter: Rewriter | null = null;
  if (rewriting(cfg)) {
    const prompt = loadRewritePrompt(rewritePromptPath(r, configDir), activeTypes(r.ratios));
    endpoint = await openEndpoint(REWRITER_ENDPOINT, r.endpoint, r.redaction, join(cache, 'rewrites.jsonl'), log);
    rewriter = new Rewriter(endpoint, prompt, { temperature: r.temperature, maxTokens: r.max_tokens });
  }
  const t = cfg.hard_negatives.templates;
  const pairing: PairingConfig = {
    ...cfg,
    templates: readTemplates(t === null ? PREFAB_TEMPLATES : resolve(configDir, t)),
  };
  const o = bucketOptions(pairing, rewriter);
  const owned = Array.from({ length: info.buckets }, (_, b) => b).filter((b) => ownsBucket(shard, b));
  // On two cores, two threads pair buckets while the main thread only writes.
  const threads = rewriter ? 1 : workerCount(options.workers, owned.length >= MANY_BUCKETS);
  const pool =
    threads > 1
      ? new WorkerPool<BucketJob, PairedJob>('pairs-worker', new URL('./worker.ts', import.meta.url), threads, pairing)
      : null;
  // A bucket's pairs (up to about twice its sessions' bytes) go to disk while the next bucket is paired, rather
  // than first. Tasks are spread over the buckets by a hash, so a bucket holds about its share of the sessions;
  // one that holds more than one and a half times that (a few tasks far larger than the rest) is paired in
  // pieces of about a MiB (a task within that limit whole: pairer.ts), so that what a thread holds does not
  // grow with the largest task. `limitBytes` and `pieceBytes` (a test's) set the two.
  let sessionBytes = 0;
  for (const segment of await sessionSegments(ingestDir)) sessionBytes += (await stat(segment)).size;
  const share = Math.ceil(sessionBytes / info.buckets);
  const limit = typeof options.limitBytes === 'number' ? options.limitBytes : Math.max(4 << 20, Math.ceil(1.5 * share));
  const pieceBytes = Math.min(limit, typeof options.pieceBytes === 'number' ? options.pieceBytes : PIECE_BYTES);
  // A large task's outcome candidates held at first, and the bytes of a large bucket file read at once
  // (pairer.ts): a test's.
  const [outcomeHeld, bucketBlock] = [options.outcomeHeld, options.bucketBlock].map((v) =>
    typeof v === 'number' ? v : undefined,
  );
  const inFlight = Math.max(16 << 20, 3 * share);
  // Every bucket of both sides, in the order their pairs are written; threads go on from one side to the next.
  const jobs: BucketJob[] = [];
  for (const [s, side] of SPLITS.entries())
    for (const b of owned)
      jobs.push({
        path: bucketFile(splitDir, side, b),
        ingest: ingestDir,
        side,
        s,
        b,
        limit,
        pieceBytes,
        outcomeHeld,
        bucketBlock,
      });
  const writers = {
    train: new JsonlWriter(join(out, 'train.jsonl'), 'w', inFlight),
    test: new JsonlWriter(join(out, 'test.jsonl'), 'w', inFlight),
  } satisfies Record<Split, JsonlWriter>;
  const progress: { side: Split | null; bar: Progress | null } = { side: null, bar: null };
  const stopped = (job: BucketJob) =>
    `pairs: stopped at ${job.side} bucket ${job.b + 1} of ${info.buckets}; the next run makes pairs again${rewriter ? ' (rewrites received are cached)' : ''}`;
  // Each job is let go once given (a large bucket's pieces hold where their sessions lie).
  async function* each(batches: BucketJob[]) {
    for (let job = batches.shift(); job; job = batches.shift()) {
      await safePoint(signal, () => stopped(job!));
      yield job;
    }
  }
  try {
    // A bucket's buffers are filled again, by the thread they came from or by this one, once written.
    const shelf = new BufferShelf(4);
    const pairer = new BucketPairer(o, log, shelf);
    // Both of a bucket's buffers go back together, once both are written: to the thread that made them, as
    // results come in turn from the threads and are given back in turn.
    const recycle = (made: PairedBucket) => {
      let unwritten = 2;
      const buffers = [made.pairs.buffer as ArrayBuffer, made.dropped.buffer as ArrayBuffer];
      return () => {
        if (--unwritten > 0) return;
        if (pool) pool.giveBack(buffers);
        else for (const buffer of buffers) shelf.put(buffer);
      };
    };
    // A task paired in pieces has pairs when any of its pieces made some.
    let taskMade = 0;
    const write = async (made: PairedBucket & { ofTask?: PieceOfTask }, { side, s, b, piece }: BucketJob) => {
      if (progress.side !== side) {
        progress.bar?.done();
        Object.assign(progress, { side, bar: log.progress(`pairs ${side}`, info.buckets) });
      }
      // A bucket's pieces are one chunk, marked by its first.
      if (!piece || piece.opens) {
        chunks.mark(writers[side], [b]);
        chunks.mark(dropped, [s, b]);
      }
      const written = recycle(made);
      await writers[side].writeBlock(made.pairs, made.lines.pairs, written);
      await dropped.writeBlock(made.dropped, made.lines.dropped, written);
      for (const [k, v] of Object.entries(made.counts)) counts[k] = (counts[k] ?? 0) + v;
      if (made.ofTask) {
        taskMade += made.ofTask.made;
        if (made.ofTask.endsTask)
          [counts.tasks_with_pairs, taskMade] = [counts.tasks_with_pairs! + (taskMade > 0 ? 1 : 0), 0];
      }
      if (!piece || piece.closes) progress.bar!.tick();
    };
    // Two buckets a thread being paired: while the bucket to be written next is still being paired, the other
    // thread goes on with the ones after it (with one, it would wait).
    // Buckets paired out of turn wait to be written while their pairs hold under what the writers may
    // have in flight: where a few large tasks fill a few buckets among many empty or small ones, both
    // threads pair the large ones (when any four buckets in flight counted, one thread paired alone).
    // A large bucket answers with its pieces, which go to the threads in turn before the buckets after it
    // are written (those already given out are paired meanwhile).
    // A large task's outcome pairs come made with its bucket's plan: only the other pieces are paired.
    const planned = ({ piece }: BucketJob) => (piece?.part === 'outcome' ? piece.made : null);
    const work = pool
      ? { size: pool.size, run: (job: BucketJob) => Promise.resolve(planned(job) ?? pool.run(job)) }
      : (job: BucketJob) => planned(job) ?? pairer.pair(job);
    const keep = {
      perThread: 2,
      held: {
        bytes: (made: PairedJob) => ('pieces' in made ? 0 : made.pairs.length + made.dropped.length),
        budget: inFlight,
      },
    };
    await inOrder(
      each(jobs),
      work,
      async (made, job) => {
        if (!('pieces' in made)) return write(made, job);
        counts.buckets_in_pieces!++;
        // A piece answers with its pairs, never with pieces of its own.
        await inOrder(each(made.pieces), work, async (piece, job) => write(piece as PairedBucket, job), keep);
      },
      keep,
    );
    progress.bar?.done();
    for (const writer of Object.values(writers)) await writer.close();
  } finally {
    await pool?.close();
    await endpoint?.close();
  }
  if (endpoint) Object.assign(counts, requestCounts(endpoint));
  if (counts.rewrite_failed! > 0)
    log.warn('some rewrites failed', {
      failed: counts.rewrite_failed,
      hint: 'rerun `prefab stage pairs`: rewrites already received are cached',
    });
  await dropped.close();
  await chunks.save();
  await writeFile(
    join(out, 'info.json'),
    JSON.stringify(
      { must_decline: cfg.must_decline, rewriter_model: endpoint?.model ?? null } satisfies PairsInfo,
      null,
      2,
    ) + '\n',
  );
  return report(counts, endpoint?.model ?? null);
}

function report(counts: Record<string, number>, rewriterModel: string | null): StageReport {
  const c = counts;
  return {
    counts,
    summary:
      `${c.train} train / ${c.test} test pairs (${c.outcome} outcome, ${c.step ? `${c.step} step, ` : ''}${c.hard_negative} hard negatives) from ${c.tasks_with_pairs} of ${c.tasks} tasks ` +
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
