// One bucket of tasks made into pairs: outcome pairs and (when asked) step pairs per task, hard negatives per
// successful session (by the transforms, and by the rewriter when there is one), written with every pair not
// made and why. A pair's
// message lists are runs of its sessions' messages as stored, written as where they lie in those sessions
// (stages/layout.ts PairSide): only what a transform changes is parsed and written out whole.
import { LineBuffer } from '../pipeline/jsonl.ts';
import type { BufferShelf } from '../pipeline/buffers.ts';
import type { Logger } from '../pipeline/log.ts';
import { NEGATIVE_TYPES, REWRITE_TYPES, type NegativeType, type Pair, type Split } from '../core/records.ts';
import { mustDeclineTest } from '../judges/rules.ts';
import { isRefusal } from '../core/refusal.ts';
import { storedSessions, type StoredMessages, type StoredSession, type StoredTaskGroups } from '../store/messages.ts';
import { buildHardNegatives } from './hard-negatives.ts';
import type { NegativeTemplates } from './templates.ts';
import { rank, rankedOutcomePairs, type Candidate, type Ranked } from './outcome.ts';
import { stepPairs } from './steps.ts';
import type { RewriteJob, RewriteOutcome, Rewriter } from './rewriter.ts';

export interface BucketOptions {
  outcome: { enabled: boolean; success_min: number; failure_max: number; max_pairs_per_task: number | null };
  steps: { enabled: boolean; margin: number; min_visits: number };
  hardNegatives: {
    enabled: boolean;
    from_min_reward: number;
    ratios: Partial<Record<NegativeType, number>>;
    salt: string;
    rewriter: { ratios: Partial<Record<NegativeType, number>> };
  };
  rewriter: Rewriter | null;
  /** Whether the session's request is one the agent must decline. */
  mustDecline: (s: StoredSession) => boolean;
  /** What the hard negatives' transforms write. */
  templates: NegativeTemplates;
}

/** The pairs config's sections a bucket is paired by. */
export interface PairingConfig {
  outcome: BucketOptions['outcome'];
  steps: BucketOptions['steps'];
  hard_negatives: BucketOptions['hardNegatives'];
  must_decline: string[];
  /** The templates file read (readTemplates), which worker threads are handed with the rest. */
  templates: NegativeTemplates;
}

export function bucketOptions(cfg: PairingConfig, rewriter: Rewriter | null): BucketOptions {
  const mustDecline = mustDeclineTest(cfg.must_decline);
  // The test reads the user's turns only when there are patterns to match them against.
  const users = (s: StoredSession) =>
    cfg.must_decline.length ? s.messages.indicesOf('user').map((i) => s.messages.at(i)) : [];
  // Without patterns, only metadata with `must_decline` in it can say so: other sessions' is not parsed.
  const patterns = cfg.must_decline.length > 0;
  return {
    outcome: cfg.outcome,
    steps: cfg.steps,
    hardNegatives: cfg.hard_negatives,
    rewriter,
    templates: cfg.templates,
    mustDecline: (s: StoredSession) =>
      (patterns || s.metadataMayHold('must_decline')) && mustDecline({ metadata: s.metadata, prompt: users(s) }),
  };
}

/** Every count the stage reports, at zero. */
export function pairCounts(): Record<string, number> {
  const counts: Record<string, number> = {
    train: 0,
    test: 0,
    outcome: 0,
    step: 0,
    hard_negative: 0,
    tasks: 0,
    tasks_with_pairs: 0,
    tasks_without_success: 0,
    tasks_without_failure: 0,
    dropped: 0,
  };
  // Buckets too large to pair whole, paired in pieces (pairer.ts); their large tasks get no step pairs.
  counts.buckets_in_pieces = 0;
  counts.step_tasks_too_large = 0;
  for (const t of NEGATIVE_TYPES) counts[`hard_negative_${t}`] = 0;
  // hard_negative counts both kinds; hard_negative_<type> the transforms', hard_negative_llm_<type> the rewriter's.
  Object.assign(counts, {
    hard_negative_llm: 0,
    rewrite_skipped: 0,
    rewrite_failed: 0,
    rewrite_over_budget: 0,
    rewrite_must_decline: 0,
    requests: 0,
    cached: 0,
    retries: 0,
  });
  for (const t of REWRITE_TYPES) counts[`hard_negative_llm_${t}`] = 0;
  return counts;
}

/** A bucket paired: its pairs' and drops' lines as blocks of UTF-8, and what it counted. */
export interface PairedBucket {
  pairs: Uint8Array;
  dropped: Uint8Array;
  lines: { pairs: number; dropped: number };
  counts: Record<string, number>;
}

/**
 * A pair's line: JSON.stringify of the pair with the metadata of `session` (its chosen side's: the verifier
 * replays it), its message lists written as PairSides, and the metadata copied from the stored bytes.
 * Field by field, in Pair's order (PAIR_FIELDS), as one string that takes the session's id and task as JSON
 * made once and remembers the few values of the enumerated fields: a write and a JSON.stringify a field took
 * twice as long, and JSON.stringify of the other fields as an object of their own (`...rest`) twice that.
 */
function writePair(out: LineBuffer, p: Pair<StoredMessages>, session: StoredSession): void {
  const q = JSON.stringify;
  const id = (sessionId: string) => (sessionId === session.session_id ? session.idJson : q(sessionId));
  out.write(
    `{"pair_id":${q(p.pair_id)},"prompt":${p.prompt.sideJson()},"chosen":${p.chosen.sideJson()},"rejected":${p.rejected.sideJson()},` +
      `"chosen_reward":${jsonNumber(p.chosen_reward)},"rejected_reward":${jsonNumber(p.rejected_reward)},"margin":${jsonNumber(p.margin)},"confidence":${jsonNumber(p.confidence)},` +
      `"source":${enumerated(p.source)},"negative_type":${enumerated(p.negative_type)},"judge":${enumerated(p.judge)},` +
      `"task_id":${p.task_id === session.task_id ? session.taskJson : q(p.task_id)},"chosen_session_id":${id(p.chosen_session_id)},` +
      `"rejected_session_id":${id(p.rejected_session_id)},"split":${enumerated(p.split)},"metadata":`,
  );
  session.writeMetadata(out);
  out.writeByte(0x7d); // }
  out.end();
}

/** JSON.stringify of a number or null. */
const jsonNumber = (x: number | null): string => (x !== null && Number.isFinite(x) ? String(x) : 'null');

/** JSON.stringify of a value of a field that takes few (a source, a type, a judge, a split), remembered. */
function enumerated(value: string | null): string {
  let json = ENUMERATED.get(value);
  if (json === undefined) {
    json = JSON.stringify(value);
    if (ENUMERATED.size < 64) ENUMERATED.set(value, json);
  }
  return json;
}
const ENUMERATED = new Map<string | null, string>();

/**
 * Pair's fields in the order writePair writes them: a field added to Pair does not compile here until it is
 * listed, and the test of stored pairs checks that every line holds these keys in this order.
 */
export const PAIR_FIELDS = {
  pair_id: 0,
  prompt: 1,
  chosen: 2,
  rejected: 3,
  chosen_reward: 4,
  rejected_reward: 5,
  margin: 6,
  confidence: 7,
  source: 8,
  negative_type: 9,
  judge: 10,
  task_id: 11,
  chosen_session_id: 12,
  rejected_session_id: 13,
  split: 14,
} satisfies Record<keyof Pair, number>;

/** A rewrite not made, for dropped.jsonl: where the transforms write `<session>~<type>`, the rewriter writes `<session>~<type>~llm`. */
const rewriteDrop = (s: StoredSession, type: NegativeType, reason: string) => ({
  task_id: s.task_id,
  chosen_session_id: s.session_id,
  rejected_session_id: `${s.session_id}~${type}~llm`,
  reason: `hard negative ${type} (llm rewrite): ${reason}`,
});

/** The first assistant turn's text, or null. */
function firstReply(s: StoredSession): string | null {
  const at = s.messages.indicesOf('assistant')[0];
  return at === undefined ? null : s.messages.at(at).content;
}

/** What a bucket's pairing logs: only the rewriter's failures (a worker thread, which never rewrites, passes a no-op). */
export type BucketLog = Pick<Logger, 'warn'>;

/** Where a bucket's pairing writes, what it counts, and the rewrites it has asked for. */
export interface BucketWork {
  o: BucketOptions;
  out: { pairs: LineBuffer; dropped: LineBuffer };
  counts: Record<string, number>;
  /** Rewrites of the whole bucket are asked for at once (the endpoint bounds what is in flight), written after its other pairs. */
  rewrites: Promise<{ job: RewriteJob; outcome: RewriteOutcome }>[];
}

const drop = (w: BucketWork, record: unknown) => w.out.dropped.push(JSON.stringify(record));

/**
 * Writes one task's outcome pairs and what was not made; returns how many pairs. The pairs are chosen from
 * the candidates as ranked (by reward and id), and `session` gives the sessions they take (the candidates
 * themselves, or a large task's read back: pairer.ts).
 */
export function writeOutcomePairs<C extends Candidate>(
  w: BucketWork,
  candidates: { successes: Ranked<C>; failures: Ranked<C> },
  session: (c: C) => StoredSession,
): number {
  const oc = w.o.outcome;
  const built = rankedOutcomePairs(candidates, session, {
    successMin: oc.success_min,
    failureMax: oc.failure_max,
    maxPairsPerTask: oc.max_pairs_per_task ?? Infinity,
  });
  if (candidates.successes.length === 0) w.counts.tasks_without_success!++;
  if (candidates.failures.length === 0) w.counts.tasks_without_failure!++;
  for (const { pair, chosen } of built.made) writePair(w.out.pairs, pair, chosen);
  for (const d of built.dropped) drop(w, d);
  w.counts.outcome! += built.made.length;
  w.counts.dropped! += built.dropped.length;
  return built.made.length;
}

/**
 * Writes one task's step pairs (pairing/steps.ts: where its sessions part, the turn after which more of them
 * succeeded against each sibling `margin` less likely); returns how many. The sides are runs of the stored
 * messages: the prompt and the chosen turn from the chosen side's session, the rejected turn from its own.
 */
function writeStepPairs(w: BucketWork, sessions: StoredSession[], side: Split): number {
  const st = w.o.steps;
  const parsed = sessions.map((s) => ({
    session_id: s.session_id,
    task_id: s.task_id,
    reward: s.reward,
    messages: s.messages.all(),
  }));
  const options = { margin: st.margin, successReward: w.o.outcome.success_min, minVisits: st.min_visits };
  const byId = new Map(sessions.map((s) => [s.session_id, s]));
  const made = stepPairs(parsed, options, side);
  for (const p of made) {
    const chosen = byId.get(p.chosen_session_id)!;
    const rejected = byId.get(p.rejected_session_id)!;
    const at = p.prompt.length;
    const sides = {
      prompt: chosen.messages.slice(0, at),
      chosen: chosen.messages.slice(at, at + 1),
      rejected: rejected.messages.slice(at, at + 1),
    };
    writePair(w.out.pairs, { ...p, ...sides }, chosen);
  }
  w.counts.step! += made.length;
  return made.length;
}

/** Writes one successful session's hard negatives (asking the rewriter for its own), and what was not made; returns how many pairs. */
function writeHardNegatives(w: BucketWork, s: StoredSession): number {
  const { o, counts } = w;
  const h = o.hardNegatives;
  const declining = o.mustDecline(s);
  // The rewriter writes worse replies, so a must-decline session is left to the transforms: its chosen side
  // would have to be a written refusal, which no logged session vouches for.
  if (o.rewriter && declining) counts.rewrite_must_decline!++;
  else if (o.rewriter) {
    const plan = o.rewriter.plan(s, { ratios: h.rewriter.ratios, salt: h.salt });
    for (const job of plan.jobs) w.rewrites.push(o.rewriter.rewrite(job).then((outcome) => ({ job, outcome })));
    for (const skip of plan.skipped) drop(w, rewriteDrop(s, skip.type, skip.reason));
    counts.rewrite_skipped! += plan.skipped.length;
    counts.dropped! += plan.skipped.length;
  }
  // A request that must be declined: the only contrast worth teaching is refusal over compliance, and only a
  // session that complied has a compliance to put on the rejected side.
  if (declining && isRefusal(firstReply(s))) return 0;
  const built = buildHardNegatives(s, {
    ratios: declining ? { refusal: h.ratios.refusal } : h.ratios,
    salt: h.salt,
    mustDecline: () => declining,
    templates: o.templates,
  });
  for (const pair of built.pairs) {
    writePair(w.out.pairs, pair, s);
    counts[`hard_negative_${pair.negative_type}`]!++;
  }
  for (const skip of built.skipped)
    drop(w, {
      task_id: s.task_id,
      chosen_session_id: s.session_id,
      rejected_session_id: `${s.session_id}~${skip.type}`,
      reason: `hard negative ${skip.type}: ${skip.reason}`,
    });
  counts.hard_negative! += built.pairs.length;
  counts.dropped! += built.skipped.length;
  return built.pairs.length;
}

/** Work on a bucket, or a piece of one, writing into buffers taken from `shelf`; `sizeHint` is about the bytes its pairs will take. */
export function bucketWork(o: BucketOptions, shelf: BufferShelf, sizeHint: number): BucketWork {
  return {
    o,
    out: { pairs: new LineBuffer(sizeHint, shelf), dropped: new LineBuffer(64 << 10, shelf) },
    counts: pairCounts(),
    rewrites: [],
  };
}

/** What `w` wrote, as a bucket's result. */
export function paired(w: BucketWork): PairedBucket {
  const lines = { pairs: w.out.pairs.count, dropped: w.out.dropped.count };
  return { pairs: w.out.pairs.take(), dropped: w.out.dropped.take(), lines, counts: w.counts };
}

/** Writes the hard negatives of those of a task's sessions they are made from; returns how many pairs. */
export function writeTaskHardNegatives(w: BucketWork, sessions: StoredSession[]): number {
  let made = 0;
  for (const s of sessions) {
    if (s.reward < w.o.hardNegatives.from_min_reward) continue;
    made += writeHardNegatives(w, s);
    // Its pairs are written (a rewrite asked for reads the messages later): what its messages made can go
    // while the task's other sessions are paired, rather than live through collections as they are.
    if (!w.o.rewriter) s.forgetMessages();
  }
  return made;
}

/**
 * The pairs of one bucket's task groups (or of a piece of a bucket's whole tasks) and what was not made
 * (and why), as lines in buffers taken from `shelf`; `sizeHint` is about the bytes the pairs will take,
 * so that their buffer rarely grows.
 */
export async function pairBucket(
  groups: StoredTaskGroups,
  side: Split,
  o: BucketOptions,
  log: BucketLog,
  shelf: BufferShelf,
  sizeHint = 1 << 20,
): Promise<PairedBucket> {
  const w = bucketWork(o, shelf, sizeHint);
  const { counts } = w;
  const madeByTask = new Map<string, number>();
  for (const [taskId, lines] of groups.tasks) {
    // A task's sessions are read as it is paired, and are done with after it.
    const sessions = storedSessions(groups, lines);
    counts.tasks!++;
    let made = o.outcome.enabled
      ? writeOutcomePairs(
          w,
          rank(sessions, { successMin: o.outcome.success_min, failureMax: o.outcome.failure_max }),
          (s) => s,
        )
      : 0;
    if (o.steps.enabled) made += writeStepPairs(w, sessions, side);
    if (o.hardNegatives.enabled) made += writeTaskHardNegatives(w, sessions);
    madeByTask.set(taskId, made);
  }
  for (const { job, outcome } of await Promise.all(w.rewrites)) {
    const s = job.session;
    if ('pair' in outcome) {
      writePair(w.out.pairs, outcome.pair, s);
      madeByTask.set(s.task_id, madeByTask.get(s.task_id)! + 1);
      counts.hard_negative!++;
      counts.hard_negative_llm!++;
      counts[`hard_negative_llm_${job.type}`]!++;
      continue;
    }
    if (outcome.cause === 'failed')
      log.warn('rewrite failed', { session_id: s.session_id, type: job.type, error: outcome.skip });
    counts[outcome.cause === 'unusable' ? 'rewrite_skipped' : `rewrite_${outcome.cause}`]!++;
    drop(w, rewriteDrop(s, job.type, outcome.skip));
    counts.dropped!++;
  }
  for (const made of madeByTask.values()) {
    if (made > 0) counts.tasks_with_pairs!++;
    counts[side]! += made;
  }
  return paired(w);
}
