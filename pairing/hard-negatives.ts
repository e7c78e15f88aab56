// Hard negatives ("hard negatives move the model most"). From one successful session,
// deterministic transforms make a worse version of one assistant turn. Pairs are turn-level: the prompt is
// everything before the turn, each side is that one turn, so the sides differ only in what the type changes
// (no length or trajectory confound). The rules judge detects each type, so the transforms keep to the
// properties it checks: refusals match REFUSAL_PATTERN, format breakages fail a parse or schema check,
// padding adds no digits, and so on. What they write comes from templates (templates.ts: prefab's fit any
// agent; a config can give its own), and which tools a call may name from the session's own tools.
import { canonicalJson, sha256Bytes, uint32LE } from '../pipeline/hash.ts';
import { int, pick, sample, sfc32, type Random } from '../core/random.ts';
import { NEGATIVE_TYPES, pairId, type Message, type NegativeType, type Pair, type ToolCall } from '../core/records.ts';
import { StoredMessages, type StoredSession } from '../store/messages.ts';
import type { NegativeTemplates } from './templates.ts';
import { parseArguments } from '../judges/tool-calls.ts';

export interface HardNegativeOptions {
  /** Per type, the share of eligible chosen sessions that get a negative of that type (0..1). */
  ratios: Partial<Record<NegativeType, number>>;
  /** Salt for the deterministic choices (which sessions, which turn, which template). */
  salt: string;
  /** True when the session's request is one the agent must decline: then the refusal is the CHOSEN side. */
  mustDecline(session: StoredSession): boolean;
  /** What the transforms write (refusals, off-topic remarks, padding, terse lines). */
  templates: NegativeTemplates;
}

/** What a transform knows beside the session's messages: the texts it writes, and the session's tools. */
interface Context {
  templates: NegativeTemplates;
  /** The tools the session's agent had (its record's `tools`), by name, with their required arguments; null when unknown. */
  tools: Map<string, string[]> | null;
}

export interface SkippedNegative {
  session_id: string;
  type: NegativeType;
  reason: string;
}

/** The least text a closing turn has to be padded (verbose) or cut short (under_explained); the rewriter uses them too. */
export const VERBOSE_MIN_TEXT = 20;
export const UNDER_EXPLAINED_MIN_TEXT = 40;
/** Re-draws of a hallucinated value before giving up on a session (each draw collides only by chance). */
const HALLUCINATION_DRAWS = 32;

/** Which turn to replace, and with what; or why the transform does not apply to this session. */
type Rewrite = { at: number; message: Message } | { skip: string };

/**
 * The hard negatives of one session: for each type, the session is selected when its number
 * (HardNegativeDraws) falls under that type's ratio; a selected session the transform cannot apply to is
 * reported, not dropped. Only the assistant turns a transform looks at are parsed.
 */
export function buildHardNegatives(
  session: StoredSession,
  options: HardNegativeOptions,
): { pairs: Pair<StoredMessages>[]; skipped: SkippedNegative[] } {
  const pairs: Pair<StoredMessages>[] = [];
  const skipped: SkippedNegative[] = [];
  let draws: HardNegativeDraws | null = null;
  let context: Context | null = null;
  for (let t = 0; t < NEGATIVE_TYPES.length; t++) {
    const type = NEGATIVE_TYPES[t]!;
    const ratio = options.ratios[type] ?? 0;
    if (ratio <= 0) continue;
    draws ??= new HardNegativeDraws(session.session_id, options.salt);
    if (draws.number(t) >= ratio) continue;
    const rand = draws.random(t);
    context ??= { templates: options.templates, tools: toolsOf(session) };
    const rewrite = TRANSFORMS[type](session.messages, rand, context);
    if ('skip' in rewrite) {
      skipped.push({ session_id: session.session_id, type, reason: rewrite.skip });
      continue;
    }
    const flipped = type === 'refusal' && options.mustDecline(session);
    pairs.push(hardNegativePair(session, type, rewrite, flipped));
  }
  return { pairs, skipped };
}

// Six types take the first six words of a session's digest (HardNegativeDraws), the seventh a digest of its own.
if (NEGATIVE_TYPES.length > 7)
  throw new Error(
    'pairing/hard-negatives.ts: HardNegativeDraws draws for seven types; give an eighth type a draw of its own',
  );

/**
 * What decides a session's hard negatives, all from one SHA-256 of the salt and its id: type `t` (its place
 * in NEGATIVE_TYPES) is made when the digest's word `t` over 2^32 falls under the type's ratio, and its
 * transform draws from sfc32 seeded by the digest's last two words and `t`, its first 12 numbers dropped so
 * that the types' streams part. A type's draws are its own: changing one ratio leaves the other types' pairs
 * as they were. One digest a session rather than one a type and one a transform: digests were a tenth of
 * the stage's CPU. The seventh type, added later, takes the same words of a second digest, made only when
 * its ratio asks for it, so the first six types' draws stayed as they were.
 */
class HardNegativeDraws {
  private readonly digest: string;
  private seventh: string | null = null;

  constructor(
    private readonly sessionId: string,
    private readonly salt: string,
  ) {
    this.digest = sha256Bytes(`hard_negative:${salt}\0${sessionId}`);
  }

  private digestFor(t: number): [string, number] {
    if (t < 6) return [this.digest, t];
    this.seventh ??= sha256Bytes(`hard_negative:7:${this.salt}\0${this.sessionId}`);
    return [this.seventh, 0];
  }

  /** Type `t`'s number in [0, 1). */
  number(t: number): number {
    const [digest, word] = this.digestFor(t);
    return uint32LE(digest, 4 * word) / 2 ** 32;
  }

  /** The generator type `t`'s transform draws from. */
  random(t: number): Random {
    const [digest] = this.digestFor(t);
    const rand = sfc32(uint32LE(digest, 24), uint32LE(digest, 28), t, 1);
    for (let i = 0; i < 12; i++) rand();
    return rand;
  }
}

/** The session's tools by name, with their required arguments, from the OpenAI tools list its record carried. */
function toolsOf(session: StoredSession): Map<string, string[]> | null {
  const json = session.toolsJson;
  if (json === null) return null;
  const tools = new Map<string, string[]>();
  for (const tool of JSON.parse(json) as { function?: { name?: unknown; parameters?: { required?: unknown } } }[]) {
    const name = tool.function?.name;
    const required = tool.function?.parameters?.required;
    if (typeof name === 'string') tools.set(name, Array.isArray(required) ? required.map(String) : []);
  }
  return tools;
}

const TRANSFORMS: Record<NegativeType, (messages: StoredMessages, rand: Random, context: Context) => Rewrite> = {
  refusal: unwarrantedRefusal,
  hallucination: hallucinatedValue,
  off_topic: offTopic,
  format: formatViolation,
  verbose: padded,
  under_explained: underExplained,
  repeated_call: repeatedCall,
};

function unwarrantedRefusal(messages: StoredMessages, rand: Random, { templates }: Context): Rewrite {
  const at = messages.indicesOf('assistant')[0];
  if (at === undefined) return { skip: 'no assistant turn' };
  return { at, message: textReply(messages.at(at), pick(rand, templates.refusal)) };
}

/** Whether the session's messages hold `word` (ASCII letters), as written or capitalised. */
const mentions = (messages: StoredMessages, word: string) =>
  messages.jsonIncludes(word) || messages.jsonIncludes(word[0]!.toUpperCase() + word.slice(1));

function offTopic(messages: StoredMessages, rand: Random, { templates }: Context): Rewrite {
  const turns = messages.indicesOf('assistant');
  if (turns.length === 0) return { skip: 'no assistant turn' };
  const at = pick(rand, turns);
  // Off the topic of this session, whatever it is about: a remark that shares a word of four or more letters
  // with it is passed over for another.
  const remarks = [...templates.off_topic];
  while (remarks.length > 0) {
    const remark = pick(rand, remarks);
    const words = remark.toLowerCase().match(/[a-z]{4,}/g) ?? [];
    if (!words.some((w) => mentions(messages, w))) return { at, message: textReply(messages.at(at), remark) };
    remarks.splice(remarks.indexOf(remark), 1);
  }
  return { skip: 'every off-topic template shares a word with the conversation' };
}

function padded(messages: StoredMessages, rand: Random, { templates }: Context): Rewrite {
  const at = lastTextTurn(messages, VERBOSE_MIN_TEXT);
  if (at < 0) return { skip: `no assistant turn with ${VERBOSE_MIN_TEXT} or more characters of text` };
  const original = messages.at(at).content!;
  const target = Math.max(Math.ceil(2.5 * original.length), original.length + 200);
  const fillers = sample(rand, templates.verbose_fillers, templates.verbose_fillers.length);
  const parts = [pick(rand, templates.verbose_openers), original];
  // A very long original cycles through the fillers again: repeating itself is what verbosity looks like.
  for (let i = 0; parts.join(' ').length < target; i++) parts.push(fillers[i % fillers.length]!);
  return { at, message: { ...messages.at(at), content: parts.join(' ') } };
}

function underExplained(messages: StoredMessages, rand: Random, { templates }: Context): Rewrite {
  const at = lastTextTurn(messages, UNDER_EXPLAINED_MIN_TEXT);
  if (at < 0) return { skip: `no assistant turn with ${UNDER_EXPLAINED_MIN_TEXT} or more characters of text` };
  return { at, message: { ...messages.at(at), content: pick(rand, templates.terse) } };
}

// ---- repeated_call: a retry that ignores what the tool answered -----------------------------------------

/**
 * A retry (a tool call that keeps most of the arguments of the call to the same tool just before it and
 * changes the rest: the fields a representative named added) made with the earlier arguments again, as if
 * the answer had not been read. Only retries: a call to the same tool for something else (the next
 * department) may itself have failed, where the repeat would have done no harm.
 */
function repeatedCall(messages: StoredMessages, rand: Random): Rewrite {
  const turns = messages.indicesOf('assistant').filter((i) => messages.hasToolCalls(i));
  const changed: { at: number; call: number; previous: string }[] = [];
  for (let k = 1; k < turns.length; k++) {
    const before = messages.at(turns[k - 1]!).tool_calls!;
    messages.at(turns[k]!).tool_calls!.forEach((call, c) => {
      const previous = before.findLast((b) => b.function.name === call.function.name);
      if (previous && isRetry(previous.function.arguments, call.function.arguments))
        changed.push({ at: turns[k]!, call: c, previous: previous.function.arguments });
    });
  }
  if (changed.length === 0) return { skip: 'no tool call retries the call before it with changed arguments' };
  const { at, call, previous } = pick(rand, changed);
  return {
    at,
    message: withToolCall(messages.at(at), call, (c) => ({ ...c, function: { ...c.function, arguments: previous } })),
  };
}

/** Whether `after` keeps more than half of `before`'s arguments (by key, the same values) and changes some. */
function isRetry(before: string, after: string): boolean {
  const a = parseArguments(before);
  const b = parseArguments(after);
  if (!isObject(a) || !isObject(b)) return false;
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  const kept = [...keys].filter((k) => k in a && k in b && canonicalJson(a[k]) === canonicalJson(b[k]));
  return kept.length > Object.keys(a).length / 2 && kept.length < keys.size;
}

// ---- hallucination: one identifier in one tool call's arguments, redrawn with the same shape -------------

/** A run of letters and digits joined by single separators: a phone number, a date, REF-123456. */
const IDENTIFIER = /[A-Za-z0-9]+(?:[-./][A-Za-z0-9]+)*/g;
const MIN_IDENTIFIER_DIGITS = 3;
/** The argument whose identifiers are taken first. */
const PHONE_KEY = 'phone_number';

interface Identifier {
  at: number;
  call: number;
  /** Where the string holding it sits in the parsed arguments. */
  path: (string | number)[];
  /** The nearest object key above it. */
  key: string | null;
  /** Offset of the identifier inside that string. */
  start: number;
  token: string;
}

function hallucinatedValue(messages: StoredMessages, rand: Random): Rewrite {
  // A phone number is taken where the session's calls hold any, and only arguments that name one (or hide a
  // name in a \u escape) can: the others are searched only where none does.
  const phones = identifiers(messages, PHONE_KEY);
  const found = phones.length > 0 ? phones : identifiers(messages, null);
  if (found.length === 0)
    return { skip: `no tool call argument holds an identifier (${MIN_IDENTIFIER_DIGITS} or more digits)` };
  const target = pick(rand, found);
  // The conversation up to the turn, as its JSON (an identifier is ASCII, so its bytes are its text).
  const context = messages.slice(0, target.at + 1);
  for (let draw = 0; draw < HALLUCINATION_DRAWS; draw++) {
    const token = perturbDigits(target.token, rand);
    if (!context.jsonIncludes(token))
      return { at: target.at, message: withIdentifier(messages.at(target.at), target, token) };
  }
  return { skip: `every value redrawn for ${target.token} already appears in the context` };
}

/**
 * Every identifier in the arguments of the session's tool calls, or (`only`) those whose nearest key is that
 * one. Text with fewer digits than an identifier holds is not searched (most arguments: a company, a
 * request); nor are arguments whose JSON shows fewer, or does not name the key (unless a \u escape hides
 * some).
 */
function identifiers(messages: StoredMessages, only: string | null): Identifier[] {
  const found: Identifier[] = [];
  // The call visited, and where in its arguments the value visited sits (pushed and popped on the way down
  // and up, copied for an identifier found).
  let at = 0;
  let call = 0;
  const path: (string | number)[] = [];
  const visit = (value: unknown, key: string | null): void => {
    if (typeof value === 'string') {
      if ((only !== null && key !== only) || digitCount(value) < MIN_IDENTIFIER_DIGITS) return;
      IDENTIFIER.lastIndex = 0;
      for (let match = IDENTIFIER.exec(value); match; match = IDENTIFIER.exec(value)) {
        if (digitCount(match[0]) >= MIN_IDENTIFIER_DIGITS)
          found.push({ at, call, path: [...path], key, start: match.index, token: match[0] });
      }
    } else if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) {
        path.push(i);
        visit(value[i], key);
        path.pop();
      }
    } else if (value !== null && typeof value === 'object') {
      for (const k in value) {
        path.push(k);
        visit((value as Record<string, unknown>)[k], k);
        path.pop();
      }
    }
  };
  for (const turn of messages.indicesOf('assistant')) {
    const calls = messages.callArguments(turn);
    at = turn;
    for (call = 0; call < calls.length; call++) {
      const raw = calls[call]!;
      const escaped = raw.includes('\\u');
      if ((only === null || escaped || raw.includes(only)) && (escaped || digitCount(raw) >= MIN_IDENTIFIER_DIGITS))
        visit(parseArguments(raw), null);
    }
  }
  return found;
}

/**
 * Changes one or a few of the trailing half of the digits, each to a different digit; letters, separators,
 * length and the leading digits (an area code, a year) stay, so the value still looks right.
 */
function perturbDigits(token: string, rand: Random): string {
  const chars = [...token];
  const digits: number[] = [];
  for (let i = 0; i < chars.length; i++) if (isDigit(chars[i]!)) digits.push(i);
  const trailing = digits.slice(Math.floor(digits.length / 2));
  for (const i of sample(rand, trailing, int(rand, 1, Math.ceil(trailing.length / 2)))) {
    chars[i] = String((Number(chars[i]) + int(rand, 1, 9)) % 10);
  }
  return chars.join('');
}

/**
 * The message with the identifier changed where its call's arguments write it, the rest of their text as it
 * was (spacing, key order, escapes): a negative that differed in how its JSON is spaced would teach the
 * spacing. Arguments whose string is not written as JSON.stringify writes it are written out anew.
 */
function withIdentifier(message: Message, target: Identifier, token: string): Message {
  const change = (value: string) =>
    value.slice(0, target.start) + token + value.slice(target.start + target.token.length);
  const raw = message.tool_calls![target.call]!.function.arguments;
  const parsed = parseArguments(raw);
  const span = literalAt(raw, target.path);
  const before = stringAt(parsed, target.path);
  const inPlace = span && raw.slice(span[0], span[1]) === JSON.stringify(before);
  const args = inPlace
    ? raw.slice(0, span[0]) + JSON.stringify(change(before)) + raw.slice(span[1])
    : JSON.stringify(replaceString(parsed, target.path, change));
  return withToolCall(message, target.call, (call) => ({ ...call, function: { ...call.function, arguments: args } }));
}

/** The string at `path` of a parsed JSON value. */
const stringAt = (value: unknown, path: (string | number)[]): string =>
  path.reduce<unknown>((v, step) => (v as Record<string | number, unknown>)[step], value) as string;

/**
 * Where the string at `path` of the JSON text `raw` is written: its literal's offsets, quotes included (the
 * last such member, as JSON.parse keeps the last of a repeated key); null where there is none.
 */
function literalAt(raw: string, path: (string | number)[]): [number, number] | null {
  let i = 0;
  const space = () => {
    while (raw[i] === ' ' || raw[i] === '\t' || raw[i] === '\n' || raw[i] === '\r') i++;
  };
  const string = (): [number, number] => {
    const start = i++;
    while (i < raw.length && raw[i] !== '"') i += raw[i] === '\\' ? 2 : 1;
    return [start, ++i];
  };
  // The value at `i`, passed over; at `depth` of the path, the span found inside it, if any.
  const value = (depth: number | null): [number, number] | null => {
    space();
    const c = raw[i];
    if (c === '"') {
      const span = string();
      return depth === path.length ? span : null;
    }
    if (c !== '{' && c !== '[') {
      while (i < raw.length && !',}] \t\n\r'.includes(raw[i]!)) i++;
      return null;
    }
    const step = depth === null || depth >= path.length ? null : path[depth]!;
    let found: [number, number] | null = null;
    i++;
    for (let k = 0; ; k++) {
      space();
      if (raw[i] === '}' || raw[i] === ']' || i >= raw.length) break;
      let here = c === '[' && step === k;
      if (c === '{') {
        const [s, e] = string();
        here = step === JSON.parse(raw.slice(s, e));
        space();
        i++; // the colon
      }
      const inner = value(here ? depth! + 1 : null);
      if (here) found = inner;
      space();
      if (raw[i] === ',') i++;
    }
    i++;
    return found;
  };
  return value(0);
}

/** A copy of a parsed JSON value with the string at `path` changed; key order stays as it was. */
function replaceString(value: unknown, path: (string | number)[], change: (value: string) => string): unknown {
  if (path.length === 0) return change(value as string);
  const [head, ...rest] = path;
  if (Array.isArray(value)) return value.map((v, i) => (i === head ? replaceString(v, rest, change) : v));
  const object = value as Record<string, unknown>;
  return { ...object, [head!]: replaceString(object[head!], rest, change) };
}

// ---- format: one tool call broken in one of four ways ----------------------------------------------------

/**
 * A name close to `name` that none of the session's tools has: its separators changed, or its last letter
 * left out (search_directory → search-directory, call → cal).
 */
function misspelt(name: string, tools: Map<string, string[]>): string {
  const tries = [name.replace(/_/g, '-'), name.replace(/-/g, '_'), name.slice(0, -1), `${name}s`];
  return tries.find((t) => t !== name && t.length > 0 && !tools.has(t))!;
}

interface Breakage {
  applies(call: ToolCall, tools: Map<string, string[]> | null): boolean;
  apply(message: Message, index: number, rand: Random, tools: Map<string, string[]> | null): Message;
}

const BREAKAGES: Breakage[] = [
  {
    // Truncated arguments: any proper prefix of a JSON object (trailing space trimmed) fails to parse.
    applies: (call) => isObject(parseArguments(call.function.arguments)),
    apply: (message, index, rand) =>
      withToolCall(message, index, (call) => {
        const raw = call.function.arguments.trimEnd();
        return { ...call, function: { ...call.function, arguments: raw.slice(0, int(rand, 1, raw.length - 1)) } };
      }),
  },
  {
    // A function name none of the session's tools has (so only where its tools are known, as the judge needs).
    applies: (call, tools) => tools !== null && tools.has(call.function.name),
    apply: (message, index, _rand, tools) =>
      withToolCall(message, index, (call) => ({
        ...call,
        function: { ...call.function, name: misspelt(call.function.name, tools!) },
      })),
  },
  {
    // A required argument left out.
    applies: (call, tools) => presentRequired(call, tools).length > 0,
    apply: (message, index, rand, tools) =>
      withToolCall(message, index, (call) => {
        const args = parseArguments(call.function.arguments) as Record<string, unknown>;
        delete args[pick(rand, presentRequired(call, tools))];
        return { ...call, function: { ...call.function, arguments: JSON.stringify(args) } };
      }),
  },
  {
    // The call written out as text instead of made.
    applies: () => true,
    apply: (message, index) => {
      const call = message.tool_calls![index]!;
      const parsed = parseArguments(call.function.arguments);
      const written = JSON.stringify({
        name: call.function.name,
        arguments: parsed === undefined ? call.function.arguments : parsed,
      });
      const rest = message.tool_calls!.filter((_, i) => i !== index);
      const broken: Message = {
        ...message,
        content: message.content ? `${message.content}\n\n${written}` : written,
        tool_calls: rest,
      };
      if (rest.length === 0) delete broken.tool_calls;
      return broken;
    },
  },
];

function formatViolation(messages: StoredMessages, rand: Random, { tools }: Context): Rewrite {
  const turns = messages.indicesOf('assistant').filter((i) => messages.hasToolCalls(i));
  if (turns.length === 0) return { skip: 'no assistant turn with tool calls' };
  const at = pick(rand, turns);
  const message = messages.at(at);
  const index = int(rand, 0, message.tool_calls!.length - 1);
  const breakage = pick(
    rand,
    BREAKAGES.filter((b) => b.applies(message.tool_calls![index]!, tools)),
  );
  return { at, message: breakage.apply(message, index, rand, tools) };
}

/** The required arguments of the call's tool (by the session's tools) that the call actually gives. */
function presentRequired(call: ToolCall, tools: Map<string, string[]> | null): string[] {
  const args = parseArguments(call.function.arguments);
  const required = tools?.get(call.function.name);
  if (!isObject(args) || !required) return [];
  return required.filter((key) => key in args);
}

// ---- shared pieces ---------------------------------------------------------------------------------------

/**
 * The turn-level pair of one session's turn at `rewrite.at` and its rewrite. `variant` tells rewrites of one
 * type apart by how they were made (`llm` for the rewriter): it goes into the rewritten side's id and the pair id.
 */
export function hardNegativePair(
  session: StoredSession,
  type: NegativeType,
  rewrite: { at: number; message: Message },
  flipped: boolean,
  variant = '',
): Pair<StoredMessages> {
  const original = {
    turn: session.messages.slice(rewrite.at, rewrite.at + 1),
    id: session.session_id,
    reward: session.reward,
  };
  const transformed = {
    turn: StoredMessages.of([rewrite.message]),
    id: `${session.session_id}~${type}${variant ? `~${variant}` : ''}`,
    reward: null,
  };
  const [chosen, rejected] = flipped ? [transformed, original] : [original, transformed];
  return {
    pair_id: pairId('hard_negative', chosen.id, rejected.id, variant ? `${type}:${variant}` : type),
    prompt: session.messages.slice(0, rewrite.at),
    chosen: chosen.turn,
    rejected: rejected.turn,
    chosen_reward: chosen.reward,
    rejected_reward: rejected.reward,
    margin: null,
    confidence: 0,
    source: 'hard_negative',
    negative_type: type,
    judge: '',
    task_id: session.task_id,
    chosen_session_id: chosen.id,
    rejected_session_id: rejected.id,
    split: session.split,
  };
}

/** The turn as plain text: same role (and name, if any), the given content, no tool calls. */
function textReply(message: Message, content: string): Message {
  const reply: Message = { ...message, content };
  delete reply.tool_calls;
  return reply;
}

function withToolCall(message: Message, index: number, change: (call: ToolCall) => ToolCall): Message {
  return { ...message, tool_calls: message.tool_calls!.map((call, i) => (i === index ? change(call) : call)) };
}

/** Index of the last assistant turn whose text has at least `minLength` characters, or -1. */
function lastTextTurn(messages: StoredMessages, minLength: number): number {
  return messages.indicesOf('assistant').findLast((i) => (messages.at(i).content?.length ?? 0) >= minLength) ?? -1;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

const isDigit = (c: string) => c >= '0' && c <= '9';
function digitCount(text: string): number {
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 48 && c <= 57) n++;
  }
  return n;
}
