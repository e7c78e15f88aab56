// Outcome pairs: within a task, successful sessions against failed ones, margin = reward gap.
import { pairId, type Pair } from '../core/records.ts';
import type { StoredMessages, StoredSession } from '../store/messages.ts';

export interface OutcomeOptions {
  successMin: number;
  failureMax: number;
  /** Infinity: no cap. */
  maxPairsPerTask: number;
}

export interface DroppedPair {
  task_id: string | null;
  chosen_session_id: string;
  rejected_session_id: string;
  reason: string;
}

/** The longest common prefix of two message lists (TRL's extract_prompt): the pair's prompt. */
function commonPrefixLength(a: StoredMessages, b: StoredMessages): number {
  let n = 0;
  while (n < a.length && n < b.length && a.same(n, b, n)) n++;
  return n;
}

const hasAssistant = (messages: StoredMessages, from: number) => messages.indicesOf('assistant').some((i) => i >= from);

/** What outcome pairs are chosen by: a session's id and reward (the session itself is asked for only if it is taken). */
export interface Candidate {
  session_id: string;
  reward: number;
}

const byId = (a: Candidate, b: Candidate) => (a.session_id < b.session_id ? -1 : a.session_id > b.session_id ? 1 : 0);

/** The order pairs take successes in (reward descending, then id) and failures in (reward ascending, then id). */
export const SUCCESS_ORDER = (a: Candidate, b: Candidate) => b.reward - a.reward || byId(a, b);
export const FAILURE_ORDER = (a: Candidate, b: Candidate) => a.reward - b.reward || byId(a, b);

/**
 * A task's successes or failures in that order: how many there are, and the k-th. A large task's may hold
 * only the first few (pairer.ts): asking past them throws DEEPER.
 */
export interface Ranked<C> {
  length: number;
  at(k: number): C;
}

/** What a Ranked that holds only its first few throws when asked past them. */
export const DEEPER = new Error('outcome pairs reach past the candidates held');

/** A list of candidates, every one held. */
const ranked = <C>(list: C[]): Ranked<C> => ({ length: list.length, at: (k) => list[k]! });

/** A task's candidates as pairs take them. */
export function rank<C extends Candidate>(
  candidates: C[],
  options: Pick<OutcomeOptions, 'successMin' | 'failureMax'>,
): { successes: Ranked<C>; failures: Ranked<C> } {
  return {
    successes: ranked(candidates.filter((s) => s.reward >= options.successMin).sort(SUCCESS_ORDER)),
    failures: ranked(candidates.filter((s) => s.reward <= options.failureMax).sort(FAILURE_ORDER)),
  };
}

/**
 * Pairs for one task's candidates, already ranked (`rank`; for a task too large to hold, only the first few,
 * read back as taken: pairer.ts), each pair with its chosen session: `session` gives the StoredSession of a
 * candidate a combination takes. When successes × failures exceeds the cap, combinations are taken diagonal
 * by diagonal over (successes by reward desc) × (failures by reward asc), so every session is used about
 * equally often and the widest margins come first. The pairs' message lists are runs of the sessions'
 * stored messages: nothing is parsed.
 */
export function rankedOutcomePairs<C extends Candidate>(
  { successes, failures }: { successes: Ranked<C>; failures: Ranked<C> },
  session: (c: C) => StoredSession,
  options: OutcomeOptions,
): { made: { pair: Pair<StoredMessages>; chosen: StoredSession }[]; dropped: DroppedPair[] } {
  const made: { pair: Pair<StoredMessages>; chosen: StoredSession }[] = [];
  const dropped: DroppedPair[] = [];
  const S = successes.length;
  const F = failures.length;
  for (let d = 0; d < F && made.length < options.maxPairsPerTask; d++) {
    for (let i = 0; i < S && made.length < options.maxPairsPerTask; i++) {
      const chosen = session(successes.at(i));
      const rejected = session(failures.at((i + d) % F));
      const n = commonPrefixLength(chosen.messages, rejected.messages);
      const reason = unusable(chosen.messages, rejected.messages, n);
      if (reason) {
        dropped.push({
          task_id: chosen.task_id,
          chosen_session_id: chosen.session_id,
          rejected_session_id: rejected.session_id,
          reason,
        });
        continue;
      }
      made.push({ pair: outcomePair(chosen, rejected, n), chosen });
    }
  }
  return { made, dropped };
}

/** Why a pair whose sides share their first `n` messages has nothing to teach, or null. */
function unusable(chosen: StoredMessages, rejected: StoredMessages, n: number): string | null {
  if (n === chosen.length && n === rejected.length) return 'identical messages with different rewards';
  if (!hasAssistant(chosen, n)) return 'chosen has no assistant turn after the shared prompt';
  if (!hasAssistant(rejected, n)) return 'rejected has no assistant turn after the shared prompt';
  return null;
}

function outcomePair(chosen: StoredSession, rejected: StoredSession, n: number): Pair<StoredMessages> {
  return {
    pair_id: pairId('outcome', chosen.session_id, rejected.session_id),
    prompt: chosen.messages.slice(0, n),
    chosen: chosen.messages.slice(n),
    rejected: rejected.messages.slice(n),
    chosen_reward: chosen.reward,
    rejected_reward: rejected.reward,
    margin: chosen.reward - rejected.reward,
    confidence: 1,
    source: 'outcome',
    negative_type: null,
    judge: 'verifier:outcome',
    task_id: chosen.task_id,
    chosen_session_id: chosen.session_id,
    rejected_session_id: rejected.session_id,
    split: chosen.split,
  };
}
