// Records whose messages are already written as ingest writes them (JSON.stringify of each mapped Message:
// the simulator's logs, prefab's own outputs, most logs a Node program wrote), or as well but for white
// space between tokens (Python's json.dumps of ASCII text), are read without parsing their messages. Their
// bytes are checked to be exactly what parsing, mapping and JSON.stringify would give back (the white space
// left out), and copied into the session's line; the rest of the record is parsed and mapped as toSession
// maps it. A record that is not so (other key orders, \u escapes, content parts, extra keys, bytes that are
// not UTF-8) is read the ordinary way; either way the session's line is the same, byte for byte.
import { isUtf8 } from 'node:buffer';
import { ROLES, type Session } from '../../core/records.ts';
import { getPath, holdsAt, jsonStringEnd } from '../../pipeline/records.ts';
import { sessionAround, type MappingOptions } from './mapping.ts';

const [QUOTE, BACKSLASH, COMMA, COLON, OPEN_BRACE, CLOSE_BRACE, OPEN_BRACKET, CLOSE_BRACKET] = [
  0x22, 0x5c, 0x2c, 0x3a, 0x7b, 0x7d, 0x5b, 0x5d,
];
const REPLACEMENT_CHARACTER = Buffer.from('\uFFFD');

/**
 * The grammar of a non-empty array of messages as the mapping makes them and JSON.stringify writes them, with
 * `space` (a pattern) allowed between tokens: a message's fields in the order role, content, name,
 * tool_calls, tool_call_id; a tool call {id, type: "function", function: {name, arguments}} with a name; a
 * tool message with its tool_call_id. A string has no escape but \" \\ \b \f \n \r \t, and \u00xx (lower
 * case) for the other control characters. It is matched against the bytes read as Latin-1 (a character a
 * byte), so anything from 0x80 up passes here and the bytes are checked to be UTF-8 apart. A string is a run
 * of plain characters, then escapes each followed by a run ("unrolling the loop"): an escape starts with a
 * backslash, which no plain character is, so there is one way to match a string and a string that does not
 * match is given up in time linear in its length (runs that could also split, `(?:plain+|escape)*`, would
 * backtrack without end); it is also faster than matching a character a step.
 */
function messagesGrammar(space: string): RegExp {
  const plain = String.raw`[^"\\\x00-\x1f]`;
  const escape = String.raw`\\["\\bfnrt]|\\u00(?:0[0-7bef]|1[0-9a-f])`;
  const string = `"${plain}*(?:(?:${escape})${plain}*)*"`;
  // A name is not empty: its first character is not the closing quote.
  const nonEmpty = `"(?!")${plain}*(?:(?:${escape})${plain}*)*"`;
  const key = (name: string) => `"${name}"${space}:${space}`;
  const comma = `${space},${space}`;
  const open = (bracket: string) => `\\${bracket}${space}`;
  const close = (bracket: string) => `${space}\\${bracket}`;
  const call = `${open('{')}${key('id')}${string}${comma}${key('type')}"function"${comma}${key('function')}${open('{')}${key('name')}${nonEmpty}${comma}${key('arguments')}${string}${close('}')}${close('}')}`;
  const optional = `(?:${comma}${key('name')}${string})?(?:${comma}${key('tool_calls')}${open('[')}${call}(?:${comma}${call})*${close(']')})?`;
  const content = `${comma}${key('content')}(?:null|${string})${optional}`;
  const message = `${open('{')}${key('role')}(?:"(?:system|user|assistant)"${content}(?:${comma}${key('tool_call_id')}${string})?|"tool"${content}${comma}${key('tool_call_id')}${string})${close('}')}`;
  return new RegExp(`${open('[')}${message}(?:${comma}${message})*${close(']')}`, 'y');
}

/** As ingest writes messages; and with JSON's white space between tokens, as Python's json.dumps writes them (", ", ": "). */
const [MESSAGES, SPACED_MESSAGES] = [messagesGrammar(''), messagesGrammar('[ \\t\\n\\r]*')];

/** The length of the match of `grammar` at the start of `text`, or -1. */
function matchLength(grammar: RegExp, text: string): number {
  grammar.lastIndex = 0;
  try {
    return grammar.test(text) ? grammar.lastIndex : -1;
  } catch {
    return -1; // a string of many megabytes overflows the matcher's stack: read the ordinary way
  }
}

/**
 * Where the non-empty array of messages at `at` ('[') of `bytes` ends, when it is written as ingest writes
 * it (`spaced` false) or as well but for white space between tokens (`spaced`); null otherwise.
 */
function storedMessagesEnd(bytes: Buffer, at: number, end: number): { end: number; spaced: boolean } | null {
  const text = bytes.toString('latin1', at, end);
  // Messages that do not start as ingest writes them are not: only the grammar with white space is tried.
  let spaced = !text.startsWith('[{"role":"');
  let length = spaced ? -1 : matchLength(MESSAGES, text);
  if (length < 0) {
    spaced = true;
    length = matchLength(SPACED_MESSAGES, text);
  }
  return length >= 0 && isUtf8(bytes.subarray(at, at + length)) ? { end: at + length, spaced } : null;
}

/** JSON's white space: space, tab, line feed, carriage return. */
const isSpace = (c: number | undefined) => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

/** The bytes `from` to `to` without the white space between JSON tokens (inside strings, nothing changes). */
function withoutSpaces(bytes: Buffer, from: number, to: number): Buffer {
  const out = Buffer.allocUnsafe(to - from);
  let n = 0;
  let inString = false;
  for (let i = from; i < to; i++) {
    const c = bytes[i]!;
    if (inString) {
      out[n++] = c;
      if (c === BACKSLASH) out[n++] = bytes[++i]!;
      else if (c === QUOTE) inString = false;
    } else if (!isSpace(c)) {
      out[n++] = c;
      if (c === QUOTE) inString = true;
    }
  }
  return out.subarray(0, n);
}

function skipSpace(b: Uint8Array, at: number, end: number): number {
  while (at < end && isSpace(b[at])) at++;
  return at;
}

/** The end of the JSON value at `at`, found by its brackets and quotes, or -1; JSON.parse checks it later. */
function valueEnd(b: Uint8Array, at: number, end: number): number {
  if (b[at] === QUOTE) return jsonStringEnd(b, at, end);
  if (b[at] !== OPEN_BRACE && b[at] !== OPEN_BRACKET) {
    let i = at;
    while (i < end && b[i] !== COMMA && b[i] !== CLOSE_BRACE && b[i] !== CLOSE_BRACKET && !isSpace(b[i])) i++;
    return i > at ? i : -1;
  }
  let depth = 0;
  for (let i = at; i < end; i++) {
    const c = b[i];
    if (c === QUOTE) {
      i = jsonStringEnd(b, i, end) - 1;
      if (i < 0) return -1;
    } else if (c === OPEN_BRACE || c === OPEN_BRACKET) depth++;
    else if ((c === CLOSE_BRACE || c === CLOSE_BRACKET) && --depth === 0) return i + 1;
  }
  return -1;
}

/**
 * Where the value of the top-level key `key` (its JSON, quotes included) lies in the record at `start` to
 * `end`, when it is the only such key and its value is messages written as ingest writes them (`spaced`: but
 * for white space between tokens); else null.
 */
function messagesSpan(
  b: Buffer,
  start: number,
  end: number,
  key: Uint8Array,
): { from: number; to: number; spaced: boolean } | null {
  let i = skipSpace(b, start, end);
  if (b[i] !== OPEN_BRACE) return null;
  i = skipSpace(b, i + 1, end);
  let span: { from: number; to: number; spaced: boolean } | null = null;
  for (;;) {
    const keyEnd = jsonStringEnd(b, i, end);
    // A key with an escape might spell `key` another way: the ordinary reading decides.
    if (b[i] !== QUOTE || keyEnd < 0 || b.subarray(i, keyEnd).includes(BACKSLASH)) return null;
    const isKey = holdsAt(b, i, key) && i + key.length === keyEnd;
    i = skipSpace(b, keyEnd, end);
    if (b[i] !== COLON) return null;
    i = skipSpace(b, i + 1, end);
    if (isKey && span) return null;
    const messages = isKey ? storedMessagesEnd(b, i, end) : null;
    const after = isKey ? (messages?.end ?? -1) : valueEnd(b, i, end);
    if (after < 0) return null;
    if (messages) span = { from: i, to: after, spaced: messages.spaced };
    i = skipSpace(b, after, end);
    if (b[i] === CLOSE_BRACE) return skipSpace(b, i + 1, end) === end ? span : null;
    if (b[i] !== COMMA) return null;
    i = skipSpace(b, i + 1, end);
  }
}

/** A record read with its messages as stored: the session (its messages left empty), and the messages' JSON. */
interface StoredRead {
  session: Session;
  messages: Uint8Array;
}

/** Reads the record at `start` to `end` of `bytes` keeping its messages as stored, or says null: read it the ordinary way. */
export type StoredReader = (bytes: Buffer, start: number, end: number, source: string) => StoredRead | null;

/**
 * A reader of records that keeps their messages as stored, for records mapped with `o`; null where the
 * mapping reads messages otherwise (a dotted path, other keys or role names) or names sessions by a
 * template. It says null for a record it cannot read so: messages not written as ingest writes them, or
 * anything wrong with the record (the ordinary reading then says what), longer than `maxBytes`, nesting
 * deeper than `tooDeep` allows, or with bytes that are not UTF-8.
 */
export function storedReader(
  o: MappingOptions,
  maxBytes: number,
  tooDeep: (text: string, value: unknown) => boolean,
): StoredReader | null {
  const { fields, message } = o;
  if (fields.messages.includes('.') || message.role !== 'role' || message.content !== 'content') return null;
  if (!ROLES.every((r) => (message.roles[r] ?? r) === r) || (fields.session_id ?? 'session_id').includes('{'))
    return null;
  const key = Buffer.from(JSON.stringify(fields.messages));
  return (bytes, start, end, source) => {
    if (end - start > maxBytes) return null;
    const span = messagesSpan(bytes, start, end, key);
    if (!span) return null;
    const { from, to, spaced } = span;
    // Decoding is split at ASCII bytes, so the parts read as the whole line would.
    const rest = `${bytes.toString('utf8', start, from)}0${bytes.toString('utf8', to, end)}`;
    // U+FFFD, read from bytes that are not UTF-8 or written as such, is counted by the ordinary reading.
    if (rest.includes('\uFFFD') || bytes.subarray(from, to).includes(REPLACEMENT_CHARACTER)) return null;
    try {
      const record = JSON.parse(rest) as Record<string, unknown>;
      if (getPath(record, fields.messages) !== 0 || tooDeep(rest, record)) return null;
      const session = sessionAround(record, null, {}, source, o);
      return { session, messages: spaced ? withoutSpaces(bytes, from, to) : bytes.subarray(from, to) };
    } catch {
      return null;
    }
  };
}
