// The rows of the exported datasets made from sessions and pairs: KTO's unpaired form, and rows with their
// personal data masked.
import type { KtoRow, Pair, SplitSession } from '../../core/records.ts';
import type { Redactor } from '../../core/redact.ts';

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
