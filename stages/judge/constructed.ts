// Pairs made by construction (outcome pairs, hard negatives): the chosen side is side a, and the judges
// confirm it, or not. Judged in batches, each written as soon as its verdicts are in.
import { rm } from 'node:fs/promises';
import { JsonlWriter, readJsonl } from '../../pipeline/jsonl.ts';
import { NO_COST, chosenConfidence } from '../../core/verdict.ts';
import type { CandidatePair, JudgedPair } from '../../core/records.ts';
import type { EnsembleJudge } from '../../judges/ensemble.ts';
import type { PairSide, ReadPair } from '../layout.ts';

/** A (chosen, rejected) couple of sessions, as outcome pairs and best-of-N pairs are compared. */
export const coupleKey = (p: Pick<JudgedPair, 'chosen_session_id' | 'rejected_session_id'>) => `${p.chosen_session_id}\u0000${p.rejected_session_id}`;

/** An imported pair kept as the data gives it: chosen is better, as sure as the data is. */
export function asGiven<Turns>(p: CandidatePair<Turns>): JudgedPair<Turns> {
  const verdict = { winner: 'a' as const, confidence: 1, rationale: 'imported: kept as the data gives it (judge.imported: as_given)' };
  return { ...p, confidence: 1, judge: 'imported', verdict, verdicts: {}, judge_stats: NO_COST };
}

/**
 * Judges every one of `pairs` (whole), `batchSize` at a time (each batch after a safe point), and hands
 * each batch to `write`, as they were stored: a side that points at a session's messages is written so.
 */
export async function judgeConstructed(pairs: AsyncIterable<ReadPair<CandidatePair<PairSide>>>, ensemble: EnsembleJudge, batchSize: number, write: (pairs: JudgedPair<PairSide>[]) => Promise<void>, tick: () => void, safePoint: () => Promise<void>): Promise<void> {
  let batch: ReadPair<CandidatePair<PairSide>>[] = [];
  const flush = async () => {
    await safePoint();
    const verdicts = await Promise.all(
      batch.map(({ whole: p }) => ensemble.judge({ prompt: p.prompt, a: { id: p.chosen_session_id, messages: p.chosen, reward: p.chosen_reward }, b: { id: p.rejected_session_id, messages: p.rejected, reward: p.rejected_reward }, task_id: p.task_id, metadata: p.metadata })),
    );
    await write(
      batch.map(({ stored: p }, i) => {
        const v = verdicts[i]!;
        const won = v.verdict.winner === 'a';
        return { ...p, confidence: chosenConfidence(v.verdict), margin: p.margin ?? (won ? (v.verdict.margin ?? null) : null), judge: v.judge, verdict: v.verdict, verdicts: v.verdicts, judge_stats: v.stats };
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
