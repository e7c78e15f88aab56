// Pairs made by construction (outcome pairs, hard negatives): the chosen side is side a, and the judges
// confirm it, or not. Judged in batches, each written as soon as its verdicts are in.
import { readJsonl } from '../../pipeline/jsonl.ts';
import { NO_COST, chosenConfidence } from '../../core/verdict.ts';
import type { CandidatePair, JudgedPair } from '../../core/records.ts';
import type { EnsembleJudge } from '../../judges/ensemble.ts';

/** A (chosen, rejected) couple of sessions, as outcome pairs and best-of-N pairs are compared. */
export const coupleKey = (p: Pick<JudgedPair, 'chosen_session_id' | 'rejected_session_id'>) => `${p.chosen_session_id}\u0000${p.rejected_session_id}`;

/** An imported pair kept as the data gives it: chosen is better, as sure as the data is. */
export function asGiven(p: CandidatePair): JudgedPair {
  const verdict = { winner: 'a' as const, confidence: 1, rationale: 'imported: kept as the data gives it (judge.imported: as_given)' };
  return { ...p, confidence: 1, judge: 'imported', verdict, verdicts: {}, judge_stats: NO_COST };
}

/** Judges every pair of `file`, `batchSize` at a time (each batch after a safe point), and hands each batch to `write`; returns the outcome pairs' couples. */
export async function judgeConstructed(file: string, ensemble: EnsembleJudge, batchSize: number, write: (pairs: JudgedPair[]) => Promise<void>, tick: () => void, safePoint: () => Promise<void>): Promise<Set<string>> {
  const outcomeKeys = new Set<string>();
  let batch: CandidatePair[] = [];
  const flush = async () => {
    await safePoint();
    const verdicts = await Promise.all(
      batch.map((p) => ensemble.judge({ prompt: p.prompt, a: { id: p.chosen_session_id, messages: p.chosen, reward: p.chosen_reward }, b: { id: p.rejected_session_id, messages: p.rejected, reward: p.rejected_reward }, task_id: p.task_id, metadata: p.metadata })),
    );
    await write(
      batch.map((p, i) => {
        const v = verdicts[i]!;
        const won = v.verdict.winner === 'a';
        return { ...p, confidence: chosenConfidence(v.verdict), margin: p.margin ?? (won ? (v.verdict.margin ?? null) : null), judge: v.judge, verdict: v.verdict, verdicts: v.verdicts, judge_stats: v.stats };
      }),
    );
    batch = [];
  };
  for await (const pair of readJsonl<CandidatePair>(file)) {
    if (pair.source === 'outcome') outcomeKeys.add(coupleKey(pair));
    batch.push(pair);
    tick();
    if (batch.length >= batchSize) await flush();
  }
  await flush();
  return outcomeKeys;
}
