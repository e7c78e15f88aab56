// One bucket of tasks made into pairs: outcome pairs per task, hard negatives per successful session (by the
// transforms, and by the rewriter when there is one), written with every pair not made and why.
/** Where pairBucket writes records: a JsonlWriter, or lines kept in memory on a worker thread. */
interface RecordSink {
  write(record: unknown): Promise<void>;
}
import { LineBuffer } from '../../pipeline/jsonl.ts';
import type { Logger } from '../../pipeline/log.ts';
import { NEGATIVE_TYPES, type CandidatePair, type NegativeType, type Pair, type Split, type SplitSession } from '../../core/records.ts';
import { mustDeclineTest } from '../../judges/rules.ts';
import { isRefusal } from '../../core/refusal.ts';
import { readTaskGroups } from '../layout.ts';
import { buildHardNegatives } from './hard-negatives.ts';
import { buildOutcomePairs } from './outcome.ts';
import { REWRITE_TYPES, planRewrites, type RewriteJob, type RewriteOutcome, type Rewriter } from './rewriter.ts';

export interface BucketOptions {
  outcome: { enabled: boolean; success_min: number; failure_max: number; max_pairs_per_task: number | null };
  hardNegatives: { enabled: boolean; from_min_reward: number; ratios: Partial<Record<NegativeType, number>>; salt: string; rewriter: { ratios: Partial<Record<NegativeType, number>> } };
  rewriter: Rewriter | null;
  /** Whether the session's request is one the agent must decline. */
  mustDecline: (s: SplitSession) => boolean;
}

/** The pairs config's sections a bucket is paired by. */
export interface PairingConfig {
  outcome: BucketOptions['outcome'];
  hard_negatives: BucketOptions['hardNegatives'];
  must_decline: string[];
}

export function bucketOptions(cfg: PairingConfig, rewriter: Rewriter | null): BucketOptions {
  const mustDecline = mustDeclineTest(cfg.must_decline);
  return { outcome: cfg.outcome, hardNegatives: cfg.hard_negatives, rewriter, mustDecline: (s: SplitSession) => mustDecline({ metadata: s.metadata, prompt: s.messages }) };
}

/** Every count the stage reports, at zero. */
export function pairCounts(): Record<string, number> {
  const counts: Record<string, number> = { train: 0, test: 0, outcome: 0, hard_negative: 0, tasks: 0, tasks_with_pairs: 0, tasks_without_success: 0, tasks_without_failure: 0, dropped: 0 };
  for (const t of NEGATIVE_TYPES) counts[`hard_negative_${t}`] = 0;
  // hard_negative counts both kinds; hard_negative_<type> the transforms', hard_negative_llm_<type> the rewriter's.
  Object.assign(counts, { hard_negative_llm: 0, rewrite_skipped: 0, rewrite_failed: 0, rewrite_over_budget: 0, rewrite_must_decline: 0, requests: 0, cached: 0, retries: 0 });
  for (const t of REWRITE_TYPES) counts[`hard_negative_llm_${t}`] = 0;
  return counts;
}

/** A bucket paired on a worker thread: its pairs' and drops' lines as blocks of UTF-8, and what it counted. */
export interface PairedBucket {
  pairs: Uint8Array;
  dropped: Uint8Array;
  lines: { pairs: number; dropped: number };
  counts: Record<string, number>;
}

/** Pairs the bucket file `path` into memory, as pairBucket writes it (no rewriter: that one talks to an endpoint). */
export async function pairBucketFile(path: string, side: Split, o: BucketOptions, log: Logger): Promise<PairedBucket> {
  const sink = () => {
    const lines = new LineBuffer();
    return { lines, write: async (record: unknown) => lines.push(JSON.stringify(record)) };
  };
  const [pairs, dropped] = [sink(), sink()];
  const counts = pairCounts();
  await pairBucket(await readTaskGroups(path), side, o, { pairs, dropped }, counts, log);
  return { pairs: pairs.lines.bytes(), dropped: dropped.lines.bytes(), lines: { pairs: pairs.lines.count, dropped: dropped.lines.count }, counts };
}

const withMetadata = (pair: Pair, session: SplitSession): CandidatePair => ({ ...pair, metadata: session.metadata });

/** A rewrite not made, for dropped.jsonl: where the transforms write `<session>~<type>`, the rewriter writes `<session>~<type>~llm`. */
const rewriteDrop = (s: SplitSession, type: NegativeType, reason: string) => ({
  task_id: s.task_id,
  chosen_session_id: s.session_id,
  rejected_session_id: `${s.session_id}~${type}~llm`,
  reason: `hard negative ${type} (llm rewrite): ${reason}`,
});

/** Writes the pairs of one bucket's task groups to `out.pairs`, what was not made to `out.dropped`, and counts both. */
export async function pairBucket(groups: [string, SplitSession[]][], side: Split, o: BucketOptions, out: { pairs: RecordSink; dropped: RecordSink }, counts: Record<string, number>, log: Logger): Promise<void> {
  const oc = o.outcome;
  const h = o.hardNegatives;
  const negativeOptions = { ratios: h.ratios, salt: h.salt, mustDecline: o.mustDecline };
  // Rewrites of the whole bucket are asked for at once (the endpoint bounds what is in flight) and
  // written after the bucket's other pairs, in a fixed order.
  const rewrites: Promise<{ job: RewriteJob; outcome: RewriteOutcome }>[] = [];
  const madeByTask = new Map<string, number>();
  for (const [taskId, sessions] of groups) {
    counts.tasks!++;
    let made = 0;
    if (oc.enabled) {
      if (!sessions.some((s) => s.reward >= oc.success_min)) counts.tasks_without_success!++;
      if (!sessions.some((s) => s.reward <= oc.failure_max)) counts.tasks_without_failure!++;
      const built = buildOutcomePairs(sessions, { successMin: oc.success_min, failureMax: oc.failure_max, maxPairsPerTask: oc.max_pairs_per_task ?? Infinity });
      const byId = new Map(sessions.map((s) => [s.session_id, s]));
      for (const pair of built.pairs) await out.pairs.write(withMetadata(pair, byId.get(pair.chosen_session_id)!));
      for (const d of built.dropped) await out.dropped.write(d);
      made += built.pairs.length;
      counts.outcome! += built.pairs.length;
      counts.dropped! += built.dropped.length;
    }
    if (h.enabled) {
      for (const s of sessions.filter((x) => x.reward >= h.from_min_reward)) {
        const declining = o.mustDecline(s);
        // The rewriter writes worse replies, so a must-decline session is left to the transforms: its
        // chosen side would have to be a written refusal, which no logged session vouches for.
        if (o.rewriter && declining) counts.rewrite_must_decline!++;
        else if (o.rewriter) {
          const plan = planRewrites(s, { ratios: h.rewriter.ratios, salt: h.salt });
          for (const job of plan.jobs) rewrites.push(o.rewriter.rewrite(job).then((outcome) => ({ job, outcome })));
          for (const skip of plan.skipped) await out.dropped.write(rewriteDrop(s, skip.type, skip.reason));
          counts.rewrite_skipped! += plan.skipped.length;
          counts.dropped! += plan.skipped.length;
        }
        // A request that must be declined: the only contrast worth teaching is refusal over compliance,
        // and only a session that complied has a compliance to put on the rejected side.
        if (declining && isRefusal(s.messages.find((m) => m.role === 'assistant')?.content ?? null)) continue;
        const built = buildHardNegatives(s, declining ? { ...negativeOptions, ratios: { refusal: h.ratios.refusal } } : negativeOptions);
        for (const pair of built.pairs) {
          await out.pairs.write(withMetadata(pair, s));
          counts[`hard_negative_${pair.negative_type}`]!++;
        }
        for (const skip of built.skipped) await out.dropped.write({ task_id: s.task_id, chosen_session_id: s.session_id, rejected_session_id: `${s.session_id}~${skip.type}`, reason: `hard negative ${skip.type}: ${skip.reason}` });
        made += built.pairs.length;
        counts.hard_negative! += built.pairs.length;
        counts.dropped! += built.skipped.length;
      }
    }
    madeByTask.set(taskId, made);
  }
  for (const { job, outcome } of await Promise.all(rewrites)) {
    const s = job.session;
    if ('pair' in outcome) {
      await out.pairs.write(withMetadata(outcome.pair, s));
      madeByTask.set(s.task_id!, madeByTask.get(s.task_id!)! + 1);
      counts.hard_negative!++;
      counts.hard_negative_llm!++;
      counts[`hard_negative_llm_${job.type}`]!++;
      continue;
    }
    if (outcome.cause === 'failed') log.warn('rewrite failed', { session_id: s.session_id, type: job.type, error: outcome.skip });
    counts[outcome.cause === 'unusable' ? 'rewrite_skipped' : `rewrite_${outcome.cause}`]!++;
    await out.dropped.write(rewriteDrop(s, job.type, outcome.skip));
    counts.dropped!++;
  }
  for (const made of madeByTask.values()) {
    if (made > 0) counts.tasks_with_pairs!++;
    counts[side]! += made;
  }
}
