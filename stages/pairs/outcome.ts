// Outcome pairs: within a task, successful sessions against failed ones, margin = reward gap.
import { commonPrefixLength, pairId, sameMessage, type Message, type Pair, type SplitSession } from '../../core/records.ts';

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

const hasAssistant = (messages: Message[]) => messages.some((m) => m.role === 'assistant');

/**
 * Pairs for one task's sessions. When successes × failures exceeds the cap, combinations are taken
 * diagonal by diagonal over (successes by reward desc) × (failures by reward asc), so every session is
 * used about equally often and the widest margins come first.
 */
export function buildOutcomePairs(sessions: SplitSession[], options: OutcomeOptions): { pairs: Pair[]; dropped: DroppedPair[] } {
  const byId = (a: SplitSession, b: SplitSession) => (a.session_id < b.session_id ? -1 : a.session_id > b.session_id ? 1 : 0);
  const successes = sessions.filter((s) => s.reward >= options.successMin).sort((a, b) => b.reward - a.reward || byId(a, b));
  const failures = sessions.filter((s) => s.reward <= options.failureMax).sort((a, b) => a.reward - b.reward || byId(a, b));
  const pairs: Pair[] = [];
  const dropped: DroppedPair[] = [];
  const S = successes.length;
  const F = failures.length;
  for (let d = 0; d < F && pairs.length < options.maxPairsPerTask; d++) {
    for (let i = 0; i < S && pairs.length < options.maxPairsPerTask; i++) {
      const chosen = successes[i]!;
      const rejected = failures[(i + d) % F]!;
      const reason = unusable(chosen.messages, rejected.messages);
      if (reason) {
        dropped.push({ task_id: chosen.task_id, chosen_session_id: chosen.session_id, rejected_session_id: rejected.session_id, reason });
        continue;
      }
      pairs.push(outcomePair(chosen, rejected));
    }
  }
  return { pairs, dropped };
}

function unusable(chosen: Message[], rejected: Message[]): string | null {
  if (chosen.length === rejected.length && chosen.every((m, i) => sameMessage(m, rejected[i]!))) return 'identical messages with different rewards';
  const n = commonPrefixLength(chosen, rejected);
  if (!hasAssistant(chosen.slice(n))) return 'chosen has no assistant turn after the shared prompt';
  if (!hasAssistant(rejected.slice(n))) return 'rejected has no assistant turn after the shared prompt';
  return null;
}

function outcomePair(chosen: SplitSession, rejected: SplitSession): Pair {
  const n = commonPrefixLength(chosen.messages, rejected.messages);
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
