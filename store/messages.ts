// A bucket's sessions with their messages as stored: the JSON ingest wrote, read only as far as needed.
import { LineBuffer } from '../pipeline/jsonl.ts';
import { holdsAt, jsonStringEnd } from '../pipeline/records.ts';
import { sameMessage, sessionTools, type Message, type Role, type Split, type SplitSession } from '../core/records.ts';
import { HEAD, MESSAGES_END, decodeString, headOf, rewardAt } from './session-line.ts';

/**
 * A conversation's messages kept as the JSON they were stored as, and read only as far as asked: a message's
 * role without parsing it, a message parsed once when first asked for, a run of messages written out as the
 * bytes it was read from. Ingest writes each message as JSON.stringify of its Message (split's buckets point
 * at those bytes, merge links them), so equal bytes are equal messages. Messages made anew (a rewritten turn) are kept as objects.
 */
/**
 * A side of a pair (prompt, chosen or rejected) as a pairs file holds it: messages `from` to `to` - 1 of a
 * session in split's bucket of the pair's task and side (a pair's sides are runs of its sessions' messages:
 * the file does not copy them), or messages made anew (a rewritten turn), as they are.
 */
export type PairSide = Message[] | { session_id: string; messages: [from: number, to: number] };

export class StoredMessages {
  private constructor(
    /** The bytes the messages were read from, or null for messages made anew. */
    private readonly line: Buffer | null,
    /** Per message of `line`: where its JSON starts and ends. */
    private readonly starts: readonly number[],
    private readonly ends: readonly number[],
    private readonly roles: readonly Role[],
    /** Per message: the message, once parsed (all of them for messages made anew). */
    private readonly parsed: (Message | undefined)[],
    /** This list is messages first … first + length - 1 of the arrays (a slice shares them). */
    private readonly first: number,
    readonly length: number,
    /** The id of the stored session whose messages these are, or null for messages made anew. */
    readonly session: string | null,
    /** JSON.stringify of `session`, worked out once a session rather than once a pair side. */
    readonly sessionJson: string,
  ) {}

  /** Messages kept as they are: made anew, or (`session`) a stored session's, parsed whole. */
  static of(messages: Message[], session: string | null = null): StoredMessages {
    return new StoredMessages(
      null,
      [],
      [],
      messages.map((m) => m.role),
      messages,
      0,
      messages.length,
      session,
      JSON.stringify(session),
    );
  }

  /** The messages of stored session `session` whose JSON lies at `starts[i]` to `ends[i]` of `line`. */
  static read(
    line: Buffer,
    starts: number[],
    ends: number[],
    roles: Role[],
    session: string,
    sessionJson: string,
  ): StoredMessages {
    return new StoredMessages(
      line,
      starts,
      ends,
      roles,
      new Array<Message | undefined>(starts.length),
      0,
      starts.length,
      session,
      sessionJson,
    );
  }

  role(i: number): Role {
    return this.roles[this.first + i]!;
  }

  at(i: number): Message {
    const k = this.first + i;
    return (this.parsed[k] ??= JSON.parse(this.line!.toString('utf8', this.starts[k], this.ends[k])) as Message);
  }

  all(): Message[] {
    return Array.from({ length: this.length }, (_, i) => this.at(i));
  }

  /** Messages `from` to `to` - 1, sharing what is read and parsed. */
  slice(from: number, to = this.length): StoredMessages {
    return new StoredMessages(
      this.line,
      this.starts,
      this.ends,
      this.roles,
      this.parsed,
      this.first + from,
      Math.max(0, to - from),
      this.session,
      this.sessionJson,
    );
  }

  /** Whether message `i` calls tools: told by its bytes (ingest writes no empty tool_calls), or by the message. */
  hasToolCalls(i: number): boolean {
    const k = this.first + i;
    if (!this.line) return (this.at(i).tool_calls?.length ?? 0) > 0;
    return this.line.subarray(this.starts[k], this.ends[k]).includes(TOOL_CALLS);
  }

  /**
   * The arguments of message `i`'s tool calls, in order, as their JSON text (none for a message without
   * calls). A stored message's are read from its bytes, only their strings decoded, where its calls are
   * written as ingest writes them (`{"id":…,"type":"function","function":{"name":…,"arguments":…}}`, one
   * after another); any other shape is parsed. The hallucination transform reads every call of a session,
   * so parsing each of their messages whole would be much of its work.
   */
  callArguments(i: number): string[] {
    const k = this.first + i;
    if (!this.line || this.parsed[k]) return this.at(i).tool_calls?.map((c) => c.function.arguments) ?? [];
    const [line, end] = [this.line, this.ends[k]!];
    const opens = line.indexOf(TOOL_CALLS, this.starts[k]);
    if (opens < 0 || opens >= end) return [];
    const found: string[] = [];
    // At each call's `{`: its id, name and arguments, each a string that ends at its closing quote.
    for (let at = opens + TOOL_CALLS.length - 1; ;) {
      const id = holdsAt(line, at, CALL_ID) ? jsonStringEnd(line, at + CALL_ID.length - 1, end) : -1;
      const name = holdsAt(line, id, CALL_NAME) ? jsonStringEnd(line, id + CALL_NAME.length - 1, end) : -1;
      const args = holdsAt(line, name, CALL_ARGUMENTS) ? name + CALL_ARGUMENTS.length - 1 : -1;
      const close = args < 0 ? -1 : jsonStringEnd(line, args, end);
      if (close < 0 || line[close] !== 125 || line[close + 1] !== 125) break;
      found.push(JSON.parse(line.toString('utf8', args, close)) as string);
      if (line[close + 2] === 93) return found; // `]`: the last call
      if (line[close + 2] !== 44) break;
      at = close + 3;
    }
    return this.at(i).tool_calls?.map((c) => c.function.arguments) ?? [];
  }

  /** Indices of the messages of `role`. */
  indicesOf(role: Role): number[] {
    const found: number[] = [];
    for (let i = 0; i < this.length; i++) if (this.role(i) === role) found.push(i);
    return found;
  }

  /** Whether message `i` is message `j` of `other`: their bytes compared, or the messages where one was made anew. */
  same(i: number, other: StoredMessages, j: number): boolean {
    if (!this.line || !other.line) return sameMessage(this.at(i), other.at(j));
    const [a, b] = [this.first + i, other.first + j];
    return this.line.compare(other.line, other.starts[b], other.ends[b], this.starts[a], this.ends[a]) === 0;
  }

  /** Whether the JSON of these messages holds `ascii` (ASCII text: its bytes are the same in UTF-8 and UTF-16). */
  jsonIncludes(ascii: string): boolean {
    if (!this.line) return JSON.stringify(this.all()).includes(ascii);
    return (
      this.length > 0 &&
      this.line.subarray(this.starts[this.first], this.ends[this.first + this.length - 1]).includes(ascii)
    );
  }

  /**
   * These messages as a side of a pair (a PairSide), as JSON: a stored session's as where they lie in it,
   * `{"session_id":…,"messages":[from,to]}`; messages made anew (or none) as their array.
   */
  sideJson(): string {
    if (this.session === null) return JSON.stringify(this.parsed.slice(this.first, this.first + this.length));
    return this.length === 0
      ? '[]'
      : `{"session_id":${this.sessionJson},"messages":[${this.first},${this.first + this.length}]}`;
  }
}

/**
 * A split session as the pairs stage reads it from its bucket line: what it pairs by (id, task, reward,
 * side), its messages as stored, and its metadata as the JSON string literal the line holds, parsed only
 * when asked for.
 */
export class StoredSession {
  constructor(
    readonly session_id: string,
    readonly task_id: string,
    readonly reward: number,
    readonly split: Split,
    /** The metadata as a JSON string literal (quotes included), as JSON.stringify of the session wrote it. */
    private readonly metadataJson: Buffer,
    /** The messages of a session parsed whole, or where its line holds them, found when first asked for (readStoredSession). */
    messages: StoredMessages | MessageList,
  ) {
    if (messages instanceof StoredMessages) this.read = messages;
    else this.list = messages;
  }

  private read: StoredMessages | null = null;
  private readonly list: MessageList | null = null;

  /**
   * The messages, found in the line when first asked for: a task's sessions are all read to be paired, but
   * of a large task's failures only the few its outcome pairs take are asked for their messages, and what is
   * made of a session's messages is done with as soon as its hard negatives are written.
   */
  get messages(): StoredMessages {
    return (this.read ??= storedMessages(this.list!, this));
  }

  /** Lets go of what was made of the messages (they are found again if asked for): a large task's sessions outlive their pairs. */
  forgetMessages(): void {
    if (this.list) this.read = null;
  }

  /** JSON.stringify of the session's id, worked out when first asked for (every pair of the session writes it). */
  get idJson(): string {
    return (this.idJsonMade ??= JSON.stringify(this.session_id));
  }

  private idJsonMade: string | undefined;

  /** JSON.stringify of the task id, worked out when first asked for (every pair of the session writes it). */
  get taskJson(): string {
    return (this.taskJsonMade ??= JSON.stringify(this.task_id));
  }

  private taskJsonMade: string | undefined;

  /** The split session of a line read whole. */
  static of(s: SplitSession): StoredSession {
    return new StoredSession(
      s.session_id,
      s.task_id!,
      s.reward,
      s.split,
      Buffer.from(JSON.stringify(s.metadata)),
      StoredMessages.of(s.messages, s.session_id),
    );
  }

  /** Every other field of the input record, as a JSON string. */
  get metadata(): string {
    return JSON.parse(this.metadataJson.toString('utf8')) as string;
  }

  /**
   * The tools the session's agent had, as the JSON of the OpenAI `tools` list its record carried (kept in the
   * metadata, as every field the Session contract has no place for), or null; found when first asked for.
   */
  get toolsJson(): string | null {
    if (this.toolsMade === undefined)
      this.toolsMade = this.metadataMayHold('tools') ? sessionTools(this.metadata) : null;
    return this.toolsMade;
  }

  private toolsMade: string | null | undefined;

  /**
   * Whether the metadata may hold `ascii` (ASCII text without a quote or a backslash), told from its JSON
   * without parsing it: false only when it cannot (neither the text nor a \u escape, which could spell it, is
   * in the JSON).
   */
  metadataMayHold(ascii: string): boolean {
    // One pass of a loop: metadata is short, and two native searches took longer to call than to run.
    const json = this.metadataJson;
    const first = ascii.charCodeAt(0);
    next: for (let i = 0; i < json.length; i++) {
      if (json[i] === 92 && json[i + 1] === 117) return true; // \u
      if (json[i] !== first) continue;
      for (let j = 1; j < ascii.length; j++) if (json[i + j] !== ascii.charCodeAt(j)) continue next;
      return true;
    }
    return false;
  }

  /** Appends the metadata, as JSON, to `out`. */
  writeMetadata(out: LineBuffer): void {
    out.writeBytes(this.metadataJson);
  }
}

const TOOL_CALLS = Buffer.from(',"tool_calls":[{');
const CALL_ID = Buffer.from('{"id":"');
const CALL_NAME = Buffer.from(',"type":"function","function":{"name":"');
const CALL_ARGUMENTS = Buffer.from(',"arguments":"');
const MESSAGES = Buffer.from(',"messages":[');
const MESSAGE = Buffer.from('{"role":"');
const METADATA = Buffer.from(',"metadata":');
const SPLIT = Buffer.from(',"split":"');
const ROLE_BY_FIRST_BYTE: Record<number, Role> = { 115: 'system', 117: 'user', 97: 'assistant', 116: 'tool' };

/**
 * A session line of a bucket file read without parsing its messages or most of its fields. The line is
 * JSON.stringify of a SplitSession, its fields in a fixed order (session_id, task_id, messages, reward,
 * feedback, model, source, created_at, metadata, split, task_match), and no string in it holds an unescaped
 * quote: so `{"role":"` opens a message, `],"reward":` closes the list, and each `,"field":` is found where it
 * is, nothing else looking like it. A line not shaped so is parsed whole. Its messages are found when first
 * asked for (storedMessages).
 */
export function readStoredSession(line: Buffer): StoredSession {
  const open = line.indexOf(MESSAGES);
  const [close, feedback] = rewardAt(line, 0, line.length);
  const metadata = line.lastIndexOf(METADATA);
  const split = line.lastIndexOf(SPLIT);
  const side = split < 0 ? '' : line.toString('latin1', split + SPLIT.length, line.indexOf(34, split + SPLIT.length));
  // The list opens with a message and closes after one: its messages lie between.
  if (
    open < 0 ||
    close < 0 ||
    !holdsAt(line, open + MESSAGES.length, MESSAGE) ||
    line[close - 1] !== 125 ||
    feedback < 0 ||
    metadata < feedback ||
    split < metadata ||
    (side !== 'train' && side !== 'test')
  ) {
    return StoredSession.of(JSON.parse(line.toString('utf8')) as SplitSession);
  }
  // The head read as its two strings (split gave every session a task, its string ending where messages start).
  const at = headOf(line, 0, open);
  const head =
    at && line[at.task] === 34 && jsonStringEnd(line, at.task, open) === open
      ? { session_id: decodeString(line, HEAD.length - 1, at.idEnd), task_id: decodeString(line, at.task, open) }
      : (JSON.parse(`${line.toString('utf8', 0, open)}}`) as { session_id: string; task_id: string });
  const reward = JSON.parse(line.toString('latin1', close + MESSAGES_END.length, feedback)) as number;
  return new StoredSession(
    head.session_id,
    head.task_id,
    reward,
    side,
    line.subarray(metadata + METADATA.length, split),
    { line, open, close },
  );
}

/** Where a session line holds its message list: `open` at `,"messages":[`, `close` at the `],"reward":` after it. */
interface MessageList {
  line: Buffer;
  open: number;
  close: number;
}

/**
 * The messages of a session line that readStoredSession read (its list opens with a message and is closed
 * by the last `],"reward":`), found where they lie; a list whose messages are not each `{"role":"<role>"`
 * after a comma is parsed whole.
 */
function storedMessages({ line, open, close }: MessageList, session: StoredSession): StoredMessages {
  const starts: number[] = [];
  const ends: number[] = [];
  const roles: Role[] = [];
  // Braces are found by their byte (memchr, faster than searching for the whole literal) and checked for
  // `{"role":"`. A message ends at the comma before the next.
  for (let at = open + MESSAGES.length; at >= 0 && at < close; at = line.indexOf(0x7b, at + 1)) {
    if (!holdsAt(line, at, MESSAGE)) continue;
    const role = ROLE_BY_FIRST_BYTE[line[at + MESSAGE.length]!];
    if (!role || line[at + MESSAGE.length + role.length] !== 34 || (starts.length > 0 && line[at - 1] !== 44)) {
      return StoredMessages.of((JSON.parse(line.toString('utf8')) as SplitSession).messages, session.session_id);
    }
    if (starts.length > 0) ends.push(at - 1);
    starts.push(at);
    roles.push(role);
  }
  ends.push(close);
  return StoredMessages.read(line, starts, ends, roles, session.session_id, session.idJson);
}

/**
 * A bucket's lines grouped by task, tasks in a stable order: each task's lines as the offsets where they
 * start and end in `bytes` (numbers, not an object a line: they live as long as the bucket), made
 * StoredSessions when the task is paired (storedSessions).
 */
export interface StoredTaskGroups {
  bytes: Buffer;
  tasks: [string, number[]][];
}

/** The sessions of one task of a bucket, from the offsets of its lines. */
export function storedSessions(bucket: StoredTaskGroups, offsets: number[]): StoredSession[] {
  const sessions: StoredSession[] = [];
  for (let i = 0; i < offsets.length; i += 2)
    sessions.push(readStoredSession(bucket.bytes.subarray(offsets[i], offsets[i + 1])));
  return sessions;
}
