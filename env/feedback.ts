// Feedback-guided rollouts: what the representatives said in a failed episode, condensed by rules
// into one short block that a later attempt at the same task reads beside the user's request. The block is
// built from the tool results the policy itself saw (the representatives' replies), never from the task's
// hidden requirements: a department that was not asked, or asked with every field it needs, adds nothing.
import type { Message } from '../core/records.ts';
import { FIELDS, FIELD_WORDS, type Field } from './world.ts';

/** What the representatives of one task's departments said, gathered over failed attempts. */
export interface Notes {
  /** Department → the fields its representative said were missing, in FIELDS order. */
  asked: Map<string, Set<Field>>;
  /** Department → the department whose reference number it asked for first. */
  references: Map<string, string>;
  /** Departments that said they were the wrong one for the task. */
  wrong: Set<string>;
}

export const emptyNotes = (): Notes => ({ asked: new Map(), references: new Map(), wrong: new Set() });

const MISSING = /^(.+?) here\. I can't verify your identity yet: I need your (.+)\.$/;
const REFERENCE = /^(.+?) here\. Before I can do that, I need the reference number from your call with (.+)\.$/;
const WRONG = /^You've reached (.+?)\. I'm sorry, we can't help with that here: wrong department\.$/;
// The representative's words for each field, longest first (so "account PIN" is not read as "account number").
const WORDS = FIELDS.map((f) => [FIELD_WORDS[f], f] as const).sort((a, b) => b[0].length - a[0].length);

/** The fields a representative's "I need your A, B and C" names. */
function namedFields(list: string): Field[] {
  const found = new Set<Field>();
  let rest = list;
  for (const [words, field] of WORDS) {
    if (!rest.includes(words)) continue;
    found.add(field);
    rest = rest.replace(words, '');
  }
  return FIELDS.filter((f) => found.has(f));
}

/** Adds what the representatives said in `messages` (one episode) to `notes`. */
export function addNotes(notes: Notes, messages: Message[]): Notes {
  for (const m of messages) {
    if (m.role !== 'tool' || !m.content) continue;
    const reply = m.content.split('\n')[0]!;
    let hit: RegExpExecArray | null;
    if ((hit = MISSING.exec(reply))) {
      const asked = notes.asked.get(hit[1]!) ?? new Set<Field>();
      for (const f of namedFields(hit[2]!)) asked.add(f);
      notes.asked.set(hit[1]!, asked);
    } else if ((hit = REFERENCE.exec(reply))) notes.references.set(hit[1]!, hit[2]!);
    else if ((hit = WRONG.exec(reply))) notes.wrong.add(hit[1]!);
  }
  return notes;
}

/** The notes as the block a later attempt reads (empty when there is nothing to say). */
export function feedbackBlock(notes: Notes): string {
  const lines: string[] = [];
  for (const [department, fields] of [...notes.asked].sort((a, b) => a[0].localeCompare(b[0]))) {
    const all = FIELDS.filter((f) => fields.has(f));
    if (all.length) lines.push(`- ${department} asked for ${all.join(', ')}.`);
  }
  for (const [department, prior] of [...notes.references].sort((a, b) => a[0].localeCompare(b[0])))
    lines.push(`- ${department} needs the reference number from ${prior}: call ${prior} first.`);
  for (const department of [...notes.wrong].sort()) lines.push(`- ${department} is the wrong department.`);
  return lines.length ? `Notes from earlier attempts at this task:\n${lines.join('\n')}` : '';
}

/** The conversation with `block` after the user's first message, as the policy reads it (unchanged when empty). */
export function withFeedback(messages: Message[], block: string): Message[] {
  if (!block) return messages;
  const first = messages.findIndex((m) => m.role === 'user');
  if (first < 0) return messages;
  return messages.map((m, i) => (i === first ? { ...m, content: `${m.content ?? ''}\n\n${block}` } : m));
}
