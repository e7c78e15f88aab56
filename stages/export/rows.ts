// The rows of the exported datasets made from sessions and pairs: pairs cut as TRL reads them, KTO's unpaired
// form, and rows with their personal data masked.
import { sessionTools, type KtoRow, type Message, type Pair, type SplitSession } from '../../core/records.ts';
import type { Redactor } from '../../core/redact.ts';

const opensTurn = (m: Message | undefined) => m?.role === 'user' || m?.role === 'tool';

/**
 * A pair as TRL's DPOTrainer reads it right: it renders `prompt` with a generation prompt (so the prompt must
 * end on a user or tool turn) and trains on every token of `prompt + chosen` after the prompt's, so each side
 * must start with an assistant turn. A pair that is not so is cut at the last place its two trajectories
 * still share where a user or tool turn is followed by an assistant turn on both sides: the messages after
 * it, shared, open both sides (for DPO their log-probabilities cancel). Null when there is no such place: the
 * trajectories part before any assistant turn (a simulated user words the request differently in each
 * trial), a trajectory-level pair.
 */
export function trlPair<P extends Pair>(pair: P): P | null {
  const { prompt, chosen, rejected } = pair;
  const sideAt = (side: Message[], i: number) => (i < prompt.length ? prompt[i] : side[i - prompt.length]);
  for (let cut = prompt.length; cut >= 1; cut--) {
    if (!opensTurn(prompt[cut - 1])) continue;
    if (sideAt(chosen, cut)?.role !== 'assistant' || sideAt(rejected, cut)?.role !== 'assistant') continue;
    if (cut === prompt.length) return pair;
    const shared = prompt.slice(cut);
    return {
      ...pair,
      prompt: prompt.slice(0, cut),
      chosen: [...shared, ...chosen],
      rejected: [...shared, ...rejected],
    };
  }
  return null;
}

/** KTO's unpaired form: the messages before the first assistant turn are the prompt, the rest the completion. */
export function ktoRow(s: SplitSession, label: boolean): KtoRow | null {
  const first = s.messages.findIndex((m) => m.role === 'assistant');
  if (first < 0) return null;
  return {
    prompt: s.messages.slice(0, first),
    completion: s.messages.slice(first),
    label,
    session_id: s.session_id,
    task_id: s.task_id,
    reward: s.reward,
    tools: sessionTools(s.metadata),
  };
}

export function maskSession(s: SplitSession, r: Redactor): SplitSession {
  return {
    ...s,
    messages: r.messages(s.messages),
    feedback: s.feedback === null ? null : r.text(s.feedback),
    metadata: r.text(s.metadata),
  };
}

export function maskPair(p: Pair, r: Redactor): Pair {
  r.learn([...p.prompt, ...p.chosen, ...p.rejected]); // what either side reveals is masked in both
  return { ...p, prompt: r.messages(p.prompt), chosen: r.messages(p.chosen), rejected: r.messages(p.rejected) };
}
