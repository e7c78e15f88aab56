// The rules judge: a checklist run on both sides — refusal, format, grounding of tool-call values,
// topic, and length against the other side. The side with the lighter violations wins, as sure as the
// weight of the difference; when no rule separates them it abstains.
import { daysIn } from '../core/dates.ts';
import { isRefusal } from '../core/refusal.ts';
import type { Message } from '../core/records.ts';
import { formatProblems, knownTools, repeatedCalls } from './tool-calls.ts';
import {
  NO_COST,
  abstain,
  metadataOf,
  type Comparison,
  type Completion,
  type Judge,
  type Judged,
  type Verdict,
} from '../core/verdict.ts';

export const CHECKS = [
  'refusal',
  'complied',
  'format',
  'hallucination',
  'off_topic',
  'verbose',
  'under_explained',
  'repeated_call',
] as const;
export type Check = (typeof CHECKS)[number];

export const DEFAULT_WEIGHTS: Record<Check, number> = {
  refusal: 0.9,
  complied: 0.9,
  format: 0.9,
  hallucination: 0.8,
  off_topic: 0.8,
  verbose: 0.6,
  under_explained: 0.6,
  repeated_call: 0.8,
};

export interface RulesOptions {
  weights: Record<Check, number>;
  /** True when the request must be declined: then a refusal is right and compliance is the violation. */
  mustDecline(c: Comparison): boolean;
}

export interface Violation {
  check: Check;
  detail: string;
}

/** A test for requests the agent must decline: `must_decline: true` in the metadata, or a user turn matching a pattern. */
export function mustDeclineTest(
  patterns: readonly string[],
): (c: Pick<Comparison, 'metadata' | 'prompt'> & { a?: Completion; b?: Completion }) => boolean {
  const regexes = patterns.map((p) => new RegExp(p, 'i'));
  return (c) => {
    // Only metadata that can hold the key is parsed (spelt out, or with \u escapes).
    if (
      (c.metadata.includes('must_decline') || c.metadata.includes('\\u')) &&
      metadataOf(c as Comparison).must_decline === true
    )
      return true;
    const users = [...c.prompt, ...(c.a?.messages ?? []), ...(c.b?.messages ?? [])]
      .filter((m) => m.role === 'user')
      .map((m) => m.content ?? '');
    return regexes.some((r) => users.some((u) => r.test(u)));
  };
}

const STOPWORDS = new Set(
  (
    'that this with from your have will would could should there their they them then than what when where which while about after before ' +
    'also just like into over only some such very more most much many each every other been being were here make made does done ' +
    'know need want sure okay well good great thanks thank please sorry today really because these those time first last next ' +
    'still even back down again through under between both same able going something anything everything nothing yours ours'
  ).split(' '),
);

/** A closing courtesy ("You're welcome!", "Have a great day") is on topic wherever it is. */
const COURTESY =
  /^\W*(?:you(?:'|’)?re (?:very )?welcome|(?:thank you|thanks)\b|have a (?:great|good|nice|wonderful|safe)\b|(?:glad|happy) (?:i could|to) help|my pleasure|(?:good)?bye\b|take care\b|safe travels\b|is there anything else)/i;

function contentWords(text: string): Set<string> {
  return new Set((text.toLowerCase().match(/[a-z]{4,}/g) ?? []).filter((w) => !STOPWORDS.has(w)));
}

const facts = (text: string) => new Set(text.match(/[A-Za-z]*\d[\w-]*/g) ?? []);

function finalText(messages: Message[]): string | null {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i]!;
    if (m.role === 'assistant' && m.content?.trim()) return m.content;
  }
  return null;
}

function stringLeaves(value: unknown, out: string[] = []): string[] {
  if (typeof value === 'string') out.push(value);
  else if (Array.isArray(value)) for (const v of value) stringLeaves(v, out);
  else if (value !== null && typeof value === 'object') for (const v of Object.values(value)) stringLeaves(v, out);
  return out;
}

/** The digit strings a text holds, each run of digits and separators read as its digits alone ("(412) 555-0193" is 4125550193). */
function digitRuns(text: string): Set<string> {
  const out = new Set<string>();
  for (const m of text.matchAll(/\+?\d[\d\s().-]*\d|\d/g)) {
    const digits = m[0].replace(/\D/g, '');
    out.add(digits);
    if (digits.length === 11 && digits.startsWith('1')) out.add(digits.slice(1));
  }
  return out;
}

/** Whether `id` is in `context` as it is, or as the same number or the same day written another way. */
function groundedIn(id: string, context: { text: string; digits: Set<string>; days: Set<string> }): boolean {
  if (context.text.includes(id)) return true;
  const days = daysIn(id);
  if (days.size > 0) return [...days].some((d) => context.days.has(d));
  // Letters make an identifier (REF-204816): its digits alone do not ground it.
  if (/[a-z]/i.test(id)) return false;
  const digits = id.replace(/\D/g, '');
  return (
    context.digits.has(digits) ||
    (digits.length === 11 && digits.startsWith('1') && context.digits.has(digits.slice(1)))
  );
}

/** Identifier-like values (three or more digits) in a side's tool calls that appear nowhere in what the agent had been told. */
function ungroundedValues(prompt: Message[], completion: Message[]): string[] {
  const ungrounded: string[] = [];
  let context = prompt
    .filter((m) => m.role !== 'assistant')
    .map((m) => m.content ?? '')
    .join('\n');
  // The context's numbers and days, read when a value is first checked against it and again only once it has grown.
  let known: { text: string; digits: Set<string>; days: Set<string> } | null = null;
  for (const m of completion) {
    if (m.role !== 'assistant') {
      context += `\n${m.content ?? ''}`;
      known = null;
      continue;
    }
    for (const call of m.tool_calls ?? []) {
      let args: unknown;
      try {
        args = JSON.parse(call.function.arguments);
      } catch {
        continue; // malformed arguments are the format check's business
      }
      for (const value of stringLeaves(args)) {
        if ((value.match(/\d/g) ?? []).length < 3) continue;
        // A value used inside a longer string (a reference number in a request) counts by its identifiers.
        const ids = value.match(/[A-Za-z]*[\d][\d\w.@()+-]*\d/g) ?? [value];
        known ??= { text: context, digits: digitRuns(context), days: daysIn(context) };
        for (const id of ids) if ((id.match(/\d/g) ?? []).length >= 3 && !groundedIn(id, known)) ungrounded.push(id);
      }
    }
  }
  return ungrounded;
}

/** The words of the messages' text (contentWords of it joined by line breaks, which no word spans). */
const wordsOf = (messages: Message[]) => contentWords(messages.map((m) => m.content ?? '').join('\n'));

/**
 * The violations of one side; length checks look at the other side too. `promptWords` are the prompt's
 * words (wordsOf), given when both sides are checked, so that they are read once.
 */
export function violations(
  c: Comparison,
  side: Completion,
  other: Completion,
  decline: boolean,
  promptWords = wordsOf(c.prompt),
): Violation[] {
  const found: Violation[] = [];
  const assistant = side.messages.filter((m) => m.role === 'assistant');
  const refusals = assistant.filter((m) => !m.tool_calls?.length && isRefusal(m.content));
  // A refusal is a defect only where the outcome says the request should have been served: not when the
  // refusing side did at least as well as the other (a denial the policy requires scores as well).
  const servedBetter = side.reward === null || other.reward === null || other.reward > side.reward;
  if (!decline && refusals.length > 0 && servedBetter)
    found.push({ check: 'refusal', detail: `refuses a request it should carry out: "${refusals[0]!.content}"` });
  if (decline && assistant.length > 0 && refusals.length === 0)
    found.push({ check: 'complied', detail: 'goes along with a request it should decline' });

  const format = formatProblems(side.messages, knownTools(c));
  if (format.length > 0) found.push({ check: 'format', detail: format[0]! });

  const repeats = repeatedCalls(c.prompt, side.messages);
  if (repeats.length > 0)
    found.push({
      check: 'repeated_call',
      detail: `calls ${repeats[0]!.function.name} again with the arguments of the call before, whatever it answered`,
    });

  const ungrounded = ungroundedValues(c.prompt, side.messages);
  if (ungrounded.length > 0)
    found.push({ check: 'hallucination', detail: `uses ${ungrounded[0]}, which appears nowhere in the conversation` });

  // The conversation's words: the prompt's and those of the side's turns that are not the agent's.
  const told = wordsOf(side.messages.filter((m) => m.role !== 'assistant'));
  for (const m of assistant) {
    if (m.tool_calls?.length || !m.content || isRefusal(m.content) || COURTESY.test(m.content)) continue;
    const words = contentWords(m.content);
    const shared = [...words].filter((w) => promptWords.has(w) || told.has(w)).length;
    if (words.size >= 5 && shared / words.size < 0.15) {
      found.push({
        check: 'off_topic',
        detail: `"${m.content.slice(0, 60)}" shares ${shared} of ${words.size} words with the conversation`,
      });
      break;
    }
  }

  const mine = finalText(side.messages);
  const theirs = finalText(other.messages);
  if (mine !== null && theirs !== null) {
    const mf = facts(mine);
    const tf = facts(theirs);
    const addsFacts = [...mf].some((f) => !tf.has(f));
    const missesFacts = [...tf].some((f) => !mf.has(f));
    if (mine.length >= 2 * theirs.length && mine.length - theirs.length >= 150 && !addsFacts) {
      found.push({
        check: 'verbose',
        detail: `final reply is ${mine.length} characters against ${theirs.length}, with nothing more in it`,
      });
    }
    if (mine.length <= 0.5 * theirs.length && theirs.length >= 40 && (missesFacts || mine.length < 20)) {
      found.push({
        check: 'under_explained',
        detail: `final reply "${mine.slice(0, 40)}" leaves out what the other reports`,
      });
    }
  }
  return found;
}

export class RulesJudge implements Judge {
  readonly name = 'rules';
  constructor(private readonly options: RulesOptions) {}

  async judge(c: Comparison): Promise<Judged> {
    return { verdict: this.verdict(c), stats: NO_COST };
  }

  verdict(c: Comparison): Verdict {
    const decline = this.options.mustDecline(c);
    const promptWords = wordsOf(c.prompt);
    const va = violations(c, c.a, c.b, decline, promptWords);
    const vb = violations(c, c.b, c.a, decline, promptWords);
    const weight = (vs: Violation[]) => vs.reduce((sum, v) => sum + this.options.weights[v.check], 0);
    const diff = weight(va) - weight(vb);
    const said = (label: string, vs: Violation[]) =>
      vs.length ? `${label}: ${vs.map((v) => `${v.check} (${v.detail})`).join('; ')}` : `${label}: no violation`;
    const rationale = `${said('a', va)}. ${said('b', vb)}.`;
    if (Math.abs(diff) < 1e-9) return abstain(va.length === 0 ? 'no rule separates the two' : rationale);
    return { winner: diff < 0 ? 'a' : 'b', confidence: Math.min(1, Math.abs(diff)), rationale };
  }
}
