// The record types of prefab. Validated at the edges (ingest, config, HTTP); trusted inside.
import { sha256 } from '../pipeline/hash.ts';

export type Role = 'system' | 'user' | 'assistant' | 'tool';
export const ROLES: readonly Role[] = ['system', 'user', 'assistant', 'tool'];

export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/** An OpenAI chat message, kept losslessly. */
export interface Message {
  role: Role;
  content: string | null;
  name?: string;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
}

/** An agent: a scripted one of the simulator, a model behind an endpoint, or the trained model. */
export interface Policy {
  name: string;
  /** The next assistant message: tool calls to run, or plain content to end the task. */
  respond(messages: Message[]): Promise<Message>;
}

/** One logged agent episode. */
export interface Session {
  session_id: string;
  /** Attempts at the same task share it: the key for grouping and pairing. */
  task_id: string | null;
  messages: Message[];
  /** Outcome reward in [0, 1]. */
  reward: number;
  feedback: string | null;
  model: string | null;
  /** File and line or row it came from. */
  source: string;
  created_at: string | null;
  /** Every other field of the input record, as a JSON string. */
  metadata: string;
}

/**
 * The tools a session's agent had: the OpenAI `tools` list its record carried (the Session contract keeps it
 * in the metadata, as every other field), as JSON; null where it carried none.
 */
export function sessionTools(metadata: string): string | null {
  let tools: unknown;
  try {
    tools = (JSON.parse(metadata) as { tools?: unknown } | null)?.tools;
  } catch {
    return null;
  }
  return Array.isArray(tools) ? JSON.stringify(tools) : null;
}

export type Split = 'train' | 'test';

/** The sides of a split, in the order every stage writes them. */
export const SPLITS: readonly Split[] = ['train', 'test'];

/** A session placed on one side of the train/test split. */
export interface SplitSession extends Session {
  split: Split;
  /** The session had no task_id; it was grouped with `task_id` by prompt similarity (score in [0, 1]). */
  task_match: { score: number; kind: 'matched_task' | 'new_group' } | null;
}

export type PairSource = 'outcome' | 'best_of_n' | 'hard_negative' | 'step' | 'critique_rewrite' | 'imported';
export const PAIR_SOURCES: readonly PairSource[] = [
  'outcome',
  'best_of_n',
  'hard_negative',
  'step',
  'critique_rewrite',
  'imported',
];
export type NegativeType =
  'refusal' | 'hallucination' | 'off_topic' | 'format' | 'verbose' | 'under_explained' | 'repeated_call';
export const NEGATIVE_TYPES: readonly NegativeType[] = [
  'refusal',
  'hallucination',
  'off_topic',
  'format',
  'verbose',
  'under_explained',
  'repeated_call',
];
/** The negative types the LLM rewriter makes (pairing/rewriter.ts says why not the other two). */
export const REWRITE_TYPES = [
  'refusal',
  'off_topic',
  'verbose',
  'under_explained',
] as const satisfies readonly NegativeType[];
export type RewriteType = (typeof REWRITE_TYPES)[number];

/**
 * A preference pair in TRL's conversational explicit-prompt format, with provenance. `Turns` is how its
 * message lists are held: messages, or (while the pairs stage makes them) runs of messages as stored.
 */
export interface Pair<Turns = Message[]> {
  pair_id: string;
  prompt: Turns;
  chosen: Turns;
  rejected: Turns;
  /** Outcome rewards of the two sides; null where a side has none (a transformed turn, an unscored sample). */
  chosen_reward: number | null;
  rejected_reward: number | null;
  /** How far apart the sides are: the reward gap, or a judge's margin; null when nothing measured it. */
  margin: number | null;
  /** How sure the judges are that `chosen` is better, in [0, 1]. */
  confidence: number;
  source: PairSource;
  negative_type: NegativeType | null;
  /** Which judges decided, e.g. 'verifier:outcome'. */
  judge: string;
  task_id: string | null;
  chosen_session_id: string;
  rejected_session_id: string;
  split: Split;
}

/** A pair's kind: its source, and its negative type when it has one (`hard_negative/format`). */
export const pairKind = (p: Pick<Pair, 'source' | 'negative_type'>): string =>
  p.negative_type ? `${p.source}/${p.negative_type}` : p.source;

/** Every kind a pair can have: each source, and each hard negative's type (what dpo.pair_kinds may name). */
export const PAIR_KINDS = [
  ...PAIR_SOURCES,
  ...NEGATIVE_TYPES.map((t) => pairKind({ source: 'hard_negative', negative_type: t })),
] as [string, ...string[]];

/**
 * A pair's stable id: the same sides made the same way get the same id on every run. It is hashJson of
 * { source, chosen, rejected, extra }, its canonical JSON (keys in order) written out: pairs are made by the
 * hundred thousand.
 */
export function pairId(source: string, chosen: string, rejected: string, extra = ''): string {
  const q = JSON.stringify;
  return sha256(`{"chosen":${q(chosen)},"extra":${q(extra)},"rejected":${q(rejected)},"source":${q(source)}}`).slice(
    0,
    32,
  );
}

// The judges' contract (SPEC §4), kept with the records because judged pairs carry it on disk.

/** `a` or `b`: that side is better; `tie`: judged equally good; `abstain`: the judge cannot tell. */
type Winner = 'a' | 'b' | 'tie' | 'abstain';

export interface Verdict {
  winner: Winner;
  /** How sure, in [0, 1]; 0 for tie and abstain. */
  confidence: number;
  /** How far apart the sides are, where the judge measures it (the verifier: the reward gap). */
  margin?: number;
  rationale?: string;
}

/** What judging one comparison cost and how it went: summed into the gate's report. */
export interface JudgeStats {
  /** Requests sent to an endpoint. */
  requests: number;
  /** Answers served from the on-disk cache instead. */
  cached: number;
  retries: number;
  /** Requests that failed even after their retries: the comparison abstains, and a rerun asks again. */
  errors: number;
  /** Replies that could not be read as a verdict: errors, never preferences. */
  parse_failures: number;
  /** The two orders disagreed (a judge preferring a position, not a side). */
  flipped: boolean;
  /** The request budget ran out before this comparison could be judged. */
  over_budget: boolean;
}

/** A pair on its way to the judges: the sessions' metadata goes along for the verifier's replay. */
export interface CandidatePair<Turns = Message[]> extends Pair<Turns> {
  metadata: string;
}

/** A comparison after the judges, kept or not: the ensemble's verdict (a = chosen), each judge's, and the cost. */
export interface JudgedPair<Turns = Message[]> extends CandidatePair<Turns> {
  verdict: Verdict;
  verdicts: Record<string, Verdict>;
  judge_stats: JudgeStats;
}

export interface SftRow {
  messages: Message[];
  session_id: string;
  task_id: string | null;
  reward: number;
  /** The session's tools (sessionTools), which TRL renders into the chat template. */
  tools: string | null;
}

export interface KtoRow {
  prompt: Message[];
  completion: Message[];
  label: boolean;
  session_id: string;
  task_id: string | null;
  reward: number;
  tools: string | null;
}

/** Deep equality of two messages, field by field, as the prompt prefix needs it. */
export function sameMessage(a: Message, b: Message): boolean {
  if (a.role !== b.role || a.content !== b.content || a.name !== b.name || a.tool_call_id !== b.tool_call_id)
    return false;
  const ta = a.tool_calls ?? [];
  const tb = b.tool_calls ?? [];
  if (ta.length !== tb.length) return false;
  return ta.every((t, i) => {
    const u = tb[i]!;
    return t.id === u.id && t.function.name === u.function.name && t.function.arguments === u.function.arguments;
  });
}

/** The longest common prefix of two message lists (TRL's extract_prompt): the pair's prompt. */
export function commonPrefixLength(a: Message[], b: Message[]): number {
  let n = 0;
  while (n < a.length && n < b.length && sameMessage(a[n]!, b[n]!)) n++;
  return n;
}
