// Tool calls decoded under their JSON schemas, as a serving stack's structured outputs do (OpenAI's strict
// function calling, vLLM's guided decoding): while the model writes a call, a token that could not continue
// `{"name":…,"arguments":{…}}` (or the legacy format's `name {arguments}`) into a call of a listed tool, with
// arguments its schema accepts, is never sampled. The model still chooses everything the schema leaves open
// (which tool, which fields, which values); what it can no longer do is write a field name no tool has, or
// arguments that are not JSON. Content before the first call is free text.
//
// Calls are compact JSON (no whitespace between tokens), as the chat template renders every call the
// model trains on. The schemas are the subset tools use: objects (properties, required, additionalProperties,
// propertyNames), arrays (items), strings (enum), numbers, integers, booleans and null.
import type { CallTokens } from './tokenizer.ts';

export interface JsonSchema {
  type?: 'object' | 'array' | 'string' | 'number' | 'integer' | 'boolean' | 'null';
  properties?: Readonly<Record<string, JsonSchema>>;
  required?: readonly string[];
  /** false: no other keys; a schema: other keys' values; absent or true: any value. */
  additionalProperties?: boolean | JsonSchema;
  propertyNames?: { enum?: readonly string[] };
  items?: JsonSchema;
  enum?: readonly string[];
}

export interface ToolSchema {
  function: { name: string; parameters: JsonSchema };
}

/** How far a text gets as JSON of a schema. */
export type Reading = 'invalid' | 'partial' | 'complete';

// Thrown by the reader to stop at the first character that settles the answer: two plain values, not
// Errors, since a tool call's every candidate token is read and an Error captures a stack trace each time
// (a third of decoding under the constraint went there).
const PARTIAL = { reading: 'partial' } as const;
const INVALID = { reading: 'invalid' } as const;

/** Reads `text` as compact JSON of `schema`: complete, a prefix of some valid value, or neither. */
export function readJson(schema: JsonSchema, text: string): Reading {
  try {
    const end = new Reader(text).value(schema, 0);
    return end === text.length ? 'complete' : 'invalid';
  } catch (e) {
    return caught(e);
  }
}

function caught(e: unknown): Reading {
  if (e === PARTIAL || e === INVALID) return (e as typeof PARTIAL | typeof INVALID).reading;
  throw e;
}

class Reader {
  constructor(private readonly s: string) {}

  at(i: number): string {
    if (i >= this.s.length) throw PARTIAL;
    return this.s[i]!;
  }

  private expect(i: number, ch: string): number {
    if (this.at(i) !== ch) throw INVALID;
    return i + 1;
  }

  /** A literal (true, false, null), which may be cut short. */
  private literal(i: number, word: string): number {
    for (let k = 0; k < word.length; k++) if (this.at(i + k) !== word[k]) throw INVALID;
    return i + word.length;
  }

  value(schema: JsonSchema, i: number): number {
    const ch = this.at(i);
    switch (schema.type) {
      case 'object':
        return this.object(schema, i);
      case 'array':
        return this.array(schema, i);
      case 'string':
        return this.string(i, schema.enum).end;
      case 'number':
      case 'integer':
        return this.number(i, schema.type === 'integer');
      case 'boolean':
        return this.literal(i, ch === 't' ? 'true' : 'false');
      case 'null':
        return this.literal(i, 'null');
      default: // any JSON value
        if (ch === '{') return this.object({}, i);
        if (ch === '[') return this.array({}, i);
        if (ch === '"') return this.string(i).end;
        if (ch === 't' || ch === 'f' || ch === 'n')
          return this.literal(i, ch === 't' ? 'true' : ch === 'f' ? 'false' : 'null');
        return this.number(i, false);
    }
  }

  /** A string, whose content must lead to one of `allowed` when given. */
  private string(i: number, allowed?: readonly string[]): { end: number; text: string } {
    i = this.expect(i, '"');
    let text = '';
    for (;;) {
      const ch = this.at(i);
      if (ch === '"') {
        if (allowed && !allowed.includes(text)) throw INVALID;
        return { end: i + 1, text };
      }
      if (ch < ' ') throw INVALID;
      if (ch === '\\') {
        const e = this.at(i + 1);
        if (e === 'u') {
          for (let k = 2; k < 6; k++) if (!/[0-9a-fA-F]/.test(this.at(i + k))) throw INVALID;
          text += String.fromCharCode(parseInt(this.s.slice(i + 2, i + 6), 16));
          i += 6;
        } else {
          const escaped = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' }[e];
          if (escaped === undefined) throw INVALID;
          text += escaped;
          i += 2;
        }
      } else {
        text += ch;
        i++;
      }
      if (allowed && !allowed.some((a) => a.startsWith(text))) throw INVALID;
    }
  }

  private number(i: number, integer: boolean): number {
    let end = i;
    while (end < this.s.length && /[-+0-9.eE]/.test(this.s[end]!)) end++;
    const text = this.s.slice(i, end);
    const whole = integer ? /^-?(?:0|[1-9]\d*)$/ : /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$/;
    // Cut off here, a number may go on: "-", "1.", "1e+" are on their way to one.
    if (end === this.s.length)
      throw whole.test(text) || whole.test(`${text}0`) || whole.test(`${text}1`) ? PARTIAL : INVALID;
    if (!whole.test(text)) throw INVALID;
    return end;
  }

  private object(schema: JsonSchema, i: number): number {
    i = this.expect(i, '{');
    const props = schema.properties ?? {};
    const named = schema.additionalProperties === false ? Object.keys(props) : schema.propertyNames?.enum;
    const seen = new Set<string>();
    if (this.at(i) === '}') return this.close(schema, seen, i);
    for (;;) {
      // A key no schema allows, or one already given, is refused as soon as it cannot become an allowed one.
      const { end, text: key } = this.string(
        i,
        named?.filter((k) => !seen.has(k)),
      );
      if (seen.has(key)) throw INVALID;
      seen.add(key);
      i = this.expect(end, ':');
      i = this.value(
        props[key] ?? (typeof schema.additionalProperties === 'object' ? schema.additionalProperties : {}),
        i,
      );
      if (this.at(i) === '}') return this.close(schema, seen, i);
      if (named?.every((k) => seen.has(k))) throw INVALID; // no key is left to follow a comma
      i = this.expect(i, ',');
    }
  }

  private close(schema: JsonSchema, seen: Set<string>, i: number): number {
    if ((schema.required ?? []).some((k) => !seen.has(k))) throw INVALID;
    return i + 1;
  }

  private array(schema: JsonSchema, i: number): number {
    i = this.expect(i, '[');
    if (this.at(i) === ']') return i + 1;
    for (;;) {
      i = this.value(schema.items ?? {}, i);
      const next = this.at(i);
      if (next === ']') return i + 1;
      i = this.expect(i, ',');
    }
  }
}

/** Reads a legacy call's text, "name {arguments}", against the tools. */
export function readCall(tools: readonly ToolSchema[], text: string): Reading {
  const space = text.indexOf(' ');
  if (space < 0) return tools.some((t) => t.function.name.startsWith(text)) ? 'partial' : 'invalid';
  const tool = tools.find((t) => t.function.name === text.slice(0, space));
  return tool ? readJson({ type: 'object', ...tool.function.parameters }, text.slice(space + 1)) : 'invalid';
}

/** Reads a Hermes call's text, {"name":"…","arguments":{…}} compact, against the tools. */
export function readHermesCall(tools: readonly ToolSchema[], text: string): Reading {
  let open = false;
  for (const tool of tools) {
    const head = `{"name":${JSON.stringify(tool.function.name)},"arguments":`;
    if (text.length <= head.length) {
      open ||= head.startsWith(text);
      continue;
    }
    if (!text.startsWith(head)) continue;
    try {
      const reader = new Reader(text);
      const end = reader.value({ type: 'object', ...tool.function.parameters }, head.length);
      if (reader.at(end) !== '}') return 'invalid';
      return end + 1 === text.length ? 'complete' : 'invalid';
    } catch (e) {
      return caught(e);
    }
  }
  return open ? 'partial' : 'invalid';
}

/**
 * What a reply must do about tools (OpenAI's `tool_choice`): `auto` call or not, `none` never call (the
 * call token is not drawn, so a reply is text only), `required` begin with a call. A named function is
 * `required` over a list of that one tool.
 */
export type ToolChoice = 'auto' | 'none' | 'required';

// Where a message stands, beside the text of an open call: two markers no call text can be.
const CONTENT = Symbol('content');
const AFTER_CALL = Symbol('after a call');
type State = typeof CONTENT | typeof AFTER_CALL | string;

/** The tokens a constraint watches: where calls open (and close), the end of the message, and every token that is never text. */
export interface ConstraintTokens {
  calls: CallTokens;
  end: number;
  control: readonly number[];
}

/** Which token may follow the ones generated so far: what decoding asks of a constraint. */
export interface TokenConstraint {
  allows(generated: readonly number[], candidate: number): boolean;
}

/**
 * Which token may come next in an assistant message whose tool calls must be calls of `tools`: any token in
 * the content before the first call (none but the call token first where a call is required, never it where
 * none may be made); within a call, a token that keeps it readable, and the token that ends it only once it
 * is complete; after a Hermes call, another call or the end.
 */
export class ToolCallConstraint implements TokenConstraint {
  private readonly read: (tools: readonly ToolSchema[], text: string) => Reading;
  /** The tokens that end an open call: Hermes's close; the legacy format's next call or the message's end. */
  private readonly closes: readonly number[];

  constructor(
    private readonly tools: readonly ToolSchema[],
    /** Each token's text, by id. */
    private readonly texts: readonly string[],
    private readonly tokens: ConstraintTokens,
    private readonly choice: ToolChoice = 'auto',
  ) {
    const { calls, end } = tokens;
    this.read = calls.format === 'hermes' ? readHermesCall : readCall;
    this.closes = calls.format === 'hermes' ? [calls.close] : [calls.open, end];
  }

  /** Where `generated` stands, kept while the same ids are asked about (every candidate of a step). */
  private last: { ids: readonly number[]; length: number; state: State } | null = null;

  allows(generated: readonly number[], candidate: number): boolean {
    const { calls, end, control } = this.tokens;
    const state = this.stateOf(generated);
    // A Hermes call has closed: what may follow is another call or the end.
    if (state === AFTER_CALL) return candidate === calls.open || candidate === end;
    if (state === CONTENT) {
      // Content: free text, but for what the choice rules out (and a call's close, with no call open).
      if (calls.format === 'hermes' && candidate === calls.close) return false;
      if (this.choice === 'none') return candidate !== calls.open;
      if (this.choice === 'required' && generated.length === 0) return candidate === calls.open;
      return true;
    }
    if (this.closes.includes(candidate)) return this.read(this.tools, state) === 'complete';
    if (control.includes(candidate)) return false;
    const next = state + (this.texts[candidate] ?? '');
    return next !== state && this.read(this.tools, next) !== 'invalid';
  }

  /** Content before the first call, after a Hermes call's close, or the text of the call being written. */
  private stateOf(generated: readonly number[]): State {
    if (this.last?.ids === generated && this.last.length === generated.length) return this.last.state;
    const { calls } = this.tokens;
    const open = generated.lastIndexOf(calls.open);
    const state =
      open < 0
        ? CONTENT
        : calls.format === 'hermes' && generated.lastIndexOf(calls.close) > open
          ? AFTER_CALL
          : generated
              .slice(open + 1)
              .map((id) => this.texts[id] ?? '')
              .join('');
    this.last = { ids: generated, length: generated.length, state };
    return state;
  }
}
