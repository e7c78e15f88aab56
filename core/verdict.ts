// The one contract every judge answers in, and what a judge is shown.
import type { JudgeStats, Message, Verdict } from './records.ts';

export type { JudgeStats, Verdict } from './records.ts';

/** One side of a comparison: a completion of the shared prompt. */
export interface Completion {
  /** Session id, or an id made for a transformed or sampled completion. */
  id: string;
  messages: Message[];
  /** Outcome reward, when the side has one. */
  reward: number | null;
}

/** Two completions of one prompt, and what is known of the task they attempt. */
export interface Comparison {
  prompt: Message[];
  a: Completion;
  b: Completion;
  task_id: string | null;
  /** The sessions' metadata (a JSON string): the simulator's world for replay, a `tools` list, `must_decline`. */
  metadata: string;
}

export const NO_COST: JudgeStats = {
  requests: 0,
  cached: 0,
  retries: 0,
  errors: 0,
  parse_failures: 0,
  flipped: false,
  over_budget: false,
};

export interface Judged {
  verdict: Verdict;
  stats: JudgeStats;
}

export interface Judge {
  /** e.g. `verifier`, `rules`, `llm:gpt-4o-mini`: recorded on every pair it decides. */
  name: string;
  judge(comparison: Comparison): Promise<Judged>;
}

export const abstain = (rationale: string): Verdict => ({ winner: 'abstain', confidence: 0, rationale });

/** How sure the judges are that side a, the chosen one, is better: their confidence when a won, else 0. */
export const chosenConfidence = (v: Verdict): number => (v.winner === 'a' ? v.confidence : 0);

/** The same verdict seen from the other side: a comparison of (b, a). */
export function swapped(v: Verdict): Verdict {
  return { ...v, winner: v.winner === 'a' ? 'b' : v.winner === 'b' ? 'a' : v.winner };
}

export function addStats(x: JudgeStats, y: JudgeStats): JudgeStats {
  return {
    requests: x.requests + y.requests,
    cached: x.cached + y.cached,
    retries: x.retries + y.retries,
    errors: x.errors + y.errors,
    parse_failures: x.parse_failures + y.parse_failures,
    flipped: x.flipped || y.flipped,
    over_budget: x.over_budget || y.over_budget,
  };
}

/** Metadata of a comparison, parsed; {} when it is not a JSON object. */
export function metadataOf(c: Comparison): Record<string, unknown> {
  try {
    const m = JSON.parse(c.metadata) as unknown;
    return m !== null && typeof m === 'object' && !Array.isArray(m) ? (m as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}
