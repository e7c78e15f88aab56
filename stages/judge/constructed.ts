// Pairs made by construction (outcome pairs, hard negatives): the chosen side is side a, and the judges
// confirm it, or not. Judged in batches, each written as soon as its verdicts are in.
import { rm } from 'node:fs/promises';
import { JsonlWriter, LineBuffer, readJsonl } from '../../pipeline/jsonl.ts';
import type { BufferShelf } from '../../pipeline/buffers.ts';
import { forEachLine } from '../../pipeline/records.ts';
import { NO_COST, addStats, chosenConfidence, type JudgeStats } from '../../core/verdict.ts';
import type { CandidatePair, JudgedPair, Split } from '../../core/records.ts';
import type { EnsembleJudge } from '../../judges/ensemble.ts';
import { readPairs, type ReadPair, type SplitFolders } from '../layout.ts';
import type { PairSide } from '../../store/messages.ts';
import type { SessionsById } from '../../store/sessions-by-id.ts';
import type { StoredBucketReader } from '../../store/bucket-reader.ts';
import { judgeBestOfN, type BestOfNBucket } from './best-of-n.ts';

/** What the stage counts of the comparisons it writes. */
export interface Tally {
  counts: Record<string, number>;
  stats: JudgeStats;
}

export function newTally(): Tally {
  return {
    counts: {
      judged_train: 0,
      judged_test: 0,
      chosen_wins: 0,
      rejected_wins: 0,
      ties: 0,
      abstained: 0,
      flipped: 0,
      over_budget: 0,
      best_of_n_groups: 0,
      best_of_n_same_as_outcome: 0,
      best_of_n_duplicates: 0,
      kept_as_given: 0,
    },
    stats: NO_COST,
  };
}

export function tallyOne(t: Tally, p: JudgedPair<PairSide>): void {
  const c = t.counts;
  c[p.source] = (c[p.source] ?? 0) + 1;
  // An imported pair kept as the data gives it was not judged.
  if (p.judge === 'imported') {
    c.kept_as_given!++;
    return;
  }
  c[`judged_${p.split}`]!++;
  c[
    p.verdict.winner === 'a'
      ? 'chosen_wins'
      : p.verdict.winner === 'b'
        ? 'rejected_wins'
        : p.verdict.winner === 'tie'
          ? 'ties'
          : 'abstained'
  ]!++;
  t.stats = addStats(t.stats, p.judge_stats);
  if (p.judge_stats.flipped) c.flipped!++;
  if (p.judge_stats.over_budget) c.over_budget!++;
}

/** Adds `more` (a job's, from a thread) to `t`. */
export function addTally(t: Tally, more: Tally): void {
  for (const [k, v] of Object.entries(more.counts)) t.counts[k] = (t.counts[k] ?? 0) + v;
  t.stats = addStats(t.stats, more.stats);
}

/** A (chosen, rejected) couple of sessions, as outcome pairs and best-of-N pairs are compared. */
export const coupleKey = (p: Pick<JudgedPair, 'chosen_session_id' | 'rejected_session_id'>) =>
  `${p.chosen_session_id}\u0000${p.rejected_session_id}`;

/** An imported pair kept as the data gives it: chosen is better, as sure as the data is. */
export function asGiven<Turns>(p: CandidatePair<Turns>): JudgedPair<Turns> {
  const verdict = {
    winner: 'a' as const,
    confidence: 1,
    rationale: 'imported: kept as the data gives it (judge.imported: as_given)',
  };
  return { ...p, confidence: 1, judge: 'imported', verdict, verdicts: {}, judge_stats: NO_COST };
}

/**
 * Judges every one of `pairs` (whole), `batchSize` at a time (each batch after a safe point), and hands
 * each batch to `write`, as they were stored: a side that points at a session's messages is written so.
 */
export async function judgeConstructed(
  pairs: AsyncIterable<ReadPair<CandidatePair<PairSide>>>,
  ensemble: EnsembleJudge,
  batchSize: number,
  write: (pairs: JudgedPair<PairSide>[]) => Promise<void>,
  tick: () => void,
  safePoint: () => Promise<void>,
): Promise<void> {
  let batch: ReadPair<CandidatePair<PairSide>>[] = [];
  const flush = async () => {
    await safePoint();
    const verdicts = await Promise.all(
      batch.map(({ whole: p }) =>
        ensemble.judge({
          prompt: p.prompt,
          a: { id: p.chosen_session_id, messages: p.chosen, reward: p.chosen_reward },
          b: { id: p.rejected_session_id, messages: p.rejected, reward: p.rejected_reward },
          task_id: p.task_id,
          metadata: p.metadata,
        }),
      ),
    );
    await write(
      batch.map(({ stored: p }, i) => {
        const v = verdicts[i]!;
        const won = v.verdict.winner === 'a';
        return {
          ...p,
          confidence: chosenConfidence(v.verdict),
          margin: p.margin ?? (won ? (v.verdict.margin ?? null) : null),
          judge: v.judge,
          verdict: v.verdict,
          verdicts: v.verdicts,
          judge_stats: v.stats,
        };
      }),
    );
    batch = [];
  };
  for await (const pair of pairs) {
    batch.push(pair);
    tick();
    if (batch.length >= batchSize) await flush();
  }
  await flush();
}

/** Some of the pairs stage's lines of one bucket of a side (their first line's number in `file`), to judge on a thread. */
export interface BucketPairsJob {
  file: string;
  side: Split;
  bucket: number;
  /** Whole lines, each with its newline. */
  bytes: Uint8Array;
  firstLine: number;
}

/** A bucket's best-of-N, to judge on a thread, with the couples the outcome pairs took (coupleKey). */
export interface BestOfNJob {
  side: Split;
  bucket: number;
  bestOfN: BestOfNBucket & { outcomeKeys: string[] };
}

export type JudgeJob = BucketPairsJob | BestOfNJob;

/** A bucket's pairs judged on a thread: their lines, what they count, and the couples of its outcome pairs (chosen, rejected). */
export interface JudgedBucket {
  lines: Uint8Array;
  count: number;
  tally: Tally;
  couples: [string, string][];
}

/** What a thread judges every bucket with. */
export interface BucketJudging {
  ensemble: EnsembleJudge;
  folders: SplitFolders;
  buckets: number;
  batchSize: number;
  reader: StoredBucketReader;
  /** The sessions pairs point at, kept from one piece of a bucket's pairs to the next. */
  sessions: SessionsById;
  shelf: BufferShelf;
}

/**
 * Judged pairs written as JsonlWriter writes them (JSON.stringify, a line each) into a buffer of about
 * `size` bytes, counted as the stage counts them. For a panel without an LLM judge, whose costs are all
 * zero: adding them up bucket by bucket changes no sum.
 */
function judgedLines(shelf: BufferShelf, size: number) {
  const out = new LineBuffer(size, shelf);
  const tally = newTally();
  const couples: [string, string][] = [];
  return {
    tally,
    write: async (pairs: JudgedPair<PairSide>[]) => {
      for (const p of pairs) {
        out.push(JSON.stringify(p));
        tallyOne(tally, p);
        if (p.source === 'outcome') couples.push([p.chosen_session_id, p.rejected_session_id]);
      }
    },
    done: (): JudgedBucket => {
      const count = out.count;
      return { lines: out.take(), count, tally, couples };
    },
  };
}

/** A job of a thread: a piece of a bucket's pairs (judgeConstructed) or its best-of-N (judgeBestOfN), as the main thread judges them. */
export async function judgeJob(job: JudgeJob, j: BucketJudging): Promise<JudgedBucket> {
  if (!('bytes' in job)) {
    const made = judgedLines(j.shelf, 1 << 20);
    await judgeBestOfN(
      job.bestOfN,
      new Set(job.bestOfN.outcomeKeys),
      j.folders,
      j.reader,
      (c) => j.ensemble.judge(c),
      made.tally,
      made.write,
    );
    return made.done();
  }
  const made = judgedLines(j.shelf, 2 * job.bytes.length + (64 << 10));
  const bytes = Buffer.from(job.bytes.buffer, job.bytes.byteOffset, job.bytes.length);
  const lines: { line: number; text: string }[] = [];
  forEachLine(
    bytes,
    (start, end) => void lines.push({ line: job.firstLine + lines.length, text: bytes.toString('utf8', start, end) }),
  );
  try {
    await judgeConstructed(
      readPairs(job.file, j.folders, j.buckets, lines, j.sessions),
      j.ensemble,
      j.batchSize,
      made.write,
      () => {},
      async () => {},
    );
  } finally {
    // The files it read are closed (a thread's are the process's): the bucket stays indexed, and they open again for the next piece.
    j.sessions.close();
  }
  return made.done();
}

/**
 * The couples of the pairs stage's outcome pairs, which best-of-N must not pair again, a bucket at a time.
 * They are noted as those pairs are written, bucket after bucket, into a file beside the stage's outputs,
 * and read back as best-of-N goes through the buckets in the same order: memory holds one bucket's couples,
 * not the night's (a million sessions make over 600k outcome pairs; held at once, they and the heap V8
 * kept beside them more than doubled the stage's peak RSS against 100k sessions).
 */
export class OutcomeCouples {
  private readonly writer: JsonlWriter;
  private reader: AsyncGenerator<[number, string, string]> | null = null;
  /** The first couple read of a bucket not yet asked for. */
  private ahead: [number, string, string] | null = null;

  constructor(readonly path: string) {
    // Appended to (in the stage's empty folder, so from nothing): no output, so not hashed as outputs are.
    this.writer = new JsonlWriter(path, 'a');
  }

  /** Notes an outcome pair of `bucket`; buckets come in ascending order. */
  async note(bucket: number, p: Pick<JudgedPair, 'chosen_session_id' | 'rejected_session_id'>): Promise<void> {
    await this.writer.write([bucket, p.chosen_session_id, p.rejected_session_id]);
  }

  /** Every couple noted for `bucket`, read on from the last bucket asked for (asked in ascending order, after the last note). */
  async of(bucket: number): Promise<Set<string>> {
    if (!this.reader) {
      await this.writer.close();
      this.reader = readJsonl<[number, string, string]>(this.path);
    }
    const couples = new Set<string>();
    for (;;) {
      if (!this.ahead) {
        const next = await this.reader.next();
        if (next.done) return couples;
        this.ahead = next.value;
      }
      const [b, chosen, rejected] = this.ahead;
      if (b > bucket) return couples;
      if (b === bucket) couples.add(coupleKey({ chosen_session_id: chosen, rejected_session_id: rejected }));
      this.ahead = null;
    }
  }

  /** Closes and deletes the file. */
  async remove(): Promise<void> {
    if (this.reader) await this.reader.return(undefined);
    else await this.writer.close();
    await rm(this.path, { force: true });
  }
}
