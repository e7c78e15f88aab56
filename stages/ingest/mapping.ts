// Turns one input record into a Session: field mapping, validation, and metadata for everything unmapped.
import { hashJson } from '../../pipeline/hash.ts';
import { getPath } from '../../pipeline/records.ts';
import { ROLES, type Message, type Role, type Session, type ToolCall } from '../../core/records.ts';

interface FieldMapping {
  session_id?: string;
  task_id?: string;
  messages: string;
  reward: string;
  feedback: string;
  model: string;
  created_at: string;
}

interface MessageMapping {
  role: string;
  content: string;
  /** Role names of the input mapped to OpenAI's (e.g. human: user, gpt: assistant). */
  roles: Record<string, Role>;
}

export interface MappingOptions {
  fields: FieldMapping;
  message: MessageMapping;
  outOfRangeReward: 'reject' | 'clamp';
  /** ingest.tools: the tools a session whose record has none of its own gets in its metadata; null: none. */
  tools: unknown[] | null;
}

/** A record that cannot become a Session; the message says what is wrong and what to do. */
export class RecordError extends Error {}

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => v !== null && typeof v === 'object' && !Array.isArray(v);

/**
 * The record without the mapped paths, so metadata keeps only what was not mapped: one pass copies the
 * top-level keys that stay, then a dotted path is removed from a copy of the branch it descends.
 */
function withoutPaths(record: Json, paths: string[]): Json {
  const top = new Set(paths.filter((p) => !p.includes('.')));
  const rest: Json = {};
  for (const key in record) if (!top.has(key)) setOwn(rest, key, record[key]);
  return paths.filter((p) => p.includes('.')).reduce(withoutPath, rest);
}

/** Sets an own property, `__proto__` too (a key like any other, as JSON.parse makes it). */
function setOwn(target: Json, key: string, value: unknown): void {
  if (key === '__proto__')
    Object.defineProperty(target, key, { value, enumerable: true, writable: true, configurable: true });
  else target[key] = value;
}

/** Removes a dotted path from a record (a deep copy where it descends). */
function withoutPath(record: Json, path: string): Json {
  const [head, ...rest] = path.split('.');
  if (!(head! in record)) return record;
  const copy = { ...record };
  if (rest.length === 0 || !isObject(copy[head!])) delete copy[head!];
  else {
    copy[head!] = withoutPath(copy[head!] as Json, rest.join('.'));
    if (Object.keys(copy[head!] as Json).length === 0) delete copy[head!];
  }
  return copy;
}

function asObject(value: unknown): Json | null {
  if (isObject(value)) return value;
  if (typeof value !== 'string') return null;
  try {
    const parsed = JSON.parse(value) as unknown;
    return isObject(parsed) ? parsed : null;
  } catch {
    return null;
  }
}

const TEMPLATE_FIELD = /\{([^{}]+)\}/g;

function fillTemplate(template: string, record: Json, mapped: Record<string, unknown>): string {
  return template.replace(TEMPLATE_FIELD, (_, name: string) => {
    const value = getPath(record, name) ?? mapped[name];
    if (value === undefined || value === null)
      throw new RecordError(`session_id template '${template}': field '${name}' is missing`);
    return String(value);
  });
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

function optionalString(value: unknown, field: string): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value === 'string') {
    // A lone surrogate (JSON's "\ud800") is no character: written as UTF-8 every one becomes U+FFFD, so
    // distinct ids would collide as duplicates. Refused, shown escaped.
    if (LONE_SURROGATE.test(value))
      throw new RecordError(`${field} ${JSON.stringify(value)} holds a lone surrogate, which is not Unicode text`);
    return value;
  }
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  throw new RecordError(`${field} must be a string, got ${describe(value)}`);
}

function describe(value: unknown): string {
  if (value === undefined) return 'nothing there';
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'number' && !Number.isFinite(value)) return String(value); // NaN, Infinity: JSON would say null
  if (typeof value === 'string')
    return `the string ${JSON.stringify(value.length > 40 ? value.slice(0, 40) + '…' : value)}`;
  return `${typeof value} ${JSON.stringify(value)}`.slice(0, 60);
}

/** An ISO timestamp Date would give back unchanged (days past 28 and hour 24 it moves on to the next month or day). */
const CANONICAL_TIME = /^\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d\.\d{3}Z$/;

function toTimestamp(value: unknown): string | null {
  if (value === undefined || value === null || value === '') return null;
  if (typeof value === 'string' && CANONICAL_TIME.test(value)) return value;
  let date: Date;
  if (typeof value === 'number')
    date = new Date(value < 1e11 ? value * 1000 : value); // seconds or milliseconds
  else if (typeof value === 'string') date = new Date(value);
  else throw new RecordError(`created_at must be an ISO date or epoch seconds, got ${describe(value)}`);
  if (Number.isNaN(date.getTime())) throw new RecordError(`created_at ${describe(value)} is not a date`);
  return date.toISOString();
}

function toReward(value: unknown, policy: MappingOptions['outOfRangeReward'], path: string): number {
  if (value === undefined || value === null)
    throw new RecordError(`reward is missing (looked at the field ${path}; map it with ingest.mapping.reward)`);
  const reward = typeof value === 'boolean' ? Number(value) : value;
  if (typeof reward !== 'number' || !Number.isFinite(reward))
    throw new RecordError(`reward must be a number in [0, 1], got ${describe(value)}`);
  if (reward < 0 || reward > 1) {
    if (policy === 'clamp') return Math.min(1, Math.max(0, reward));
    throw new RecordError(`reward ${reward} is outside [0, 1] (set ingest.out_of_range_reward: clamp to clamp it)`);
  }
  return reward;
}

function toContent(value: unknown, at: string): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value === 'string') return value;
  // OpenAI content parts: text parts are joined; anything else (images, audio) cannot be trained on here.
  if (Array.isArray(value) && value.every((p) => isObject(p) && p.type === 'text' && typeof p.text === 'string')) {
    return value.map((p) => (p as Json).text).join('');
  }
  throw new RecordError(`${at}.content must be a string, null or text parts, got ${describe(value)}`);
}

function toToolCalls(value: unknown, at: string): ToolCall[] {
  if (!Array.isArray(value)) throw new RecordError(`${at}.tool_calls must be an array, got ${describe(value)}`);
  return value.map((call, j) => {
    const where = `${at}.tool_calls[${j}]`;
    if (!isObject(call) || !isObject(call.function))
      throw new RecordError(`${where} must be {id, type: 'function', function: {name, arguments}}`);
    const { name, arguments: args } = call.function;
    if (typeof name !== 'string' || name === '')
      throw new RecordError(`${where}.function.name must be a non-empty string`);
    if (typeof call.id !== 'string') throw new RecordError(`${where}.id must be a string`);
    if (call.type !== undefined && call.type !== 'function')
      throw new RecordError(`${where}.type must be 'function', got ${describe(call.type)}`);
    // arguments is a JSON string in OpenAI's format; some logs store the parsed object.
    if (typeof args !== 'string' && args !== undefined) checkNumbers(args, `${where}.function.arguments`);
    const argumentsText = typeof args === 'string' ? args : args === undefined ? '{}' : JSON.stringify(args);
    return { id: call.id, type: 'function' as const, function: { name, arguments: argumentsText } };
  });
}

/**
 * Arguments stored as an object were parsed as doubles: a number past 2^53 has lost digits (an account number
 * 12345678901234567890123 reads 1.2345678901234568e+22) and one past 1.8e308 reads Infinity (written as
 * null). Either would be trained on as another value than the log's, so the record is refused, saying so.
 */
function checkNumbers(value: unknown, at: string): void {
  if (typeof value === 'number') {
    if (!Number.isFinite(value))
      throw new RecordError(
        `${at} holds a number too large for a double (read as ${value}); store arguments as a JSON string`,
      );
    if (Number.isInteger(value) && !Number.isSafeInteger(value))
      throw new RecordError(
        `${at} holds ${value}, past 2^53, where a number read from JSON loses digits; store arguments as a JSON string to keep them`,
      );
  } else if (Array.isArray(value)) value.forEach((v, i) => checkNumbers(v, `${at}[${i}]`));
  else if (isObject(value)) for (const key in value) checkNumbers(value[key], `${at}.${key}`);
}

const MESSAGE_KEYS = new Set(['role', 'content', 'name', 'tool_calls', 'tool_call_id']);

/** A message in OpenAI's format; keys outside it are returned as extras so nothing is lost. */
function toMessage(raw: unknown, i: number, m: MessageMapping): { message: Message; extras: Json | null } {
  const at = `messages[${i}]`;
  if (!isObject(raw)) throw new RecordError(`${at} must be an object, got ${describe(raw)}`);
  const rawRole = raw[m.role];
  const role = (typeof rawRole === 'string' ? (m.roles[rawRole] ?? rawRole) : rawRole) as Role;
  if (!ROLES.includes(role)) {
    throw new RecordError(
      `${at}.${m.role}: ${describe(rawRole)} is not one of ${ROLES.join(', ')} (map other names with ingest.message.roles)`,
    );
  }
  const message: Message = { role, content: toContent(raw[m.content], at) };
  if (raw.name !== undefined && raw.name !== null) message.name = String(raw.name);
  if (raw.tool_calls !== undefined && raw.tool_calls !== null) {
    const calls = toToolCalls(raw.tool_calls, at);
    if (calls.length > 0) message.tool_calls = calls;
  }
  if (raw.tool_call_id !== undefined && raw.tool_call_id !== null) message.tool_call_id = String(raw.tool_call_id);
  if (role === 'tool' && message.tool_call_id === undefined)
    throw new RecordError(`${at}: a tool message needs tool_call_id`);
  let extras: Json | null = null;
  for (const key in raw) {
    const value = raw[key];
    if (key === m.role || key === m.content || MESSAGE_KEYS.has(key) || value === undefined) continue;
    (extras ??= {})[key] = value;
  }
  return { message, extras };
}

/** Maps and validates one input record. Throws RecordError with a reason a person can act on. */
export function toSession(record: unknown, source: string, options: MappingOptions): Session {
  if (!isObject(record)) throw new RecordError(`a session must be a JSON object, got ${describe(record)}`);
  const f = options.fields;
  const rawMessages = getPath(record, f.messages);
  if (!Array.isArray(rawMessages)) {
    const keys = Object.keys(record);
    throw new RecordError(
      `messages must be an array (looked at the field ${f.messages}; map it with ingest.mapping.messages), got ${describe(rawMessages)}; the record's keys: ${keys.slice(0, 12).join(', ')}${keys.length > 12 ? ', …' : ''}`,
    );
  }
  if (rawMessages.length === 0) throw new RecordError('messages is empty');
  const messageExtras: Record<string, Json> = {};
  const messages = rawMessages.map((raw, i) => {
    const { message, extras } = toMessage(raw, i, options.message);
    if (extras) messageExtras[i] = extras;
    return message;
  });
  return sessionAround(record, messages, messageExtras, source, options);
}

/** What the ingest of a record whose messages are kept as stored needs that it cannot work out: an error, never a reason the record is bad. */
class MessagesNeeded extends Error {}

/**
 * The session of a record whose messages were mapped apart: every other field mapped and validated as
 * toSession maps it. `messages` null: the caller keeps them as stored (they are not read here, and the
 * session's `messages` is left empty); a record whose id would be a hash of its messages then throws
 * MessagesNeeded.
 */
export function sessionAround(
  record: Json,
  messages: Message[] | null,
  messageExtras: Record<string, Json>,
  source: string,
  options: MappingOptions,
): Session {
  const f = options.fields;
  const taskPath = f.task_id ?? 'task_id';
  const mapped = {
    task_id: optionalString(getPath(record, taskPath), 'task_id'),
    reward: toReward(getPath(record, f.reward), options.outOfRangeReward, f.reward),
    feedback: optionalString(getPath(record, f.feedback), 'feedback'),
    model: optionalString(getPath(record, f.model), 'model'),
    created_at: toTimestamp(getPath(record, f.created_at)),
  };

  const consumed = [f.messages, taskPath, f.reward, f.feedback, f.model, f.created_at];
  let sessionId: string | null = null;
  const idSpec = f.session_id ?? 'session_id';
  if (idSpec.includes('{')) {
    // The fields a template reads stay in metadata: they usually mean something (a trial number).
    sessionId = fillTemplate(idSpec, record, mapped);
  } else {
    sessionId = optionalString(getPath(record, idSpec), 'session_id');
    consumed.push(idSpec);
  }
  const rest = withoutPaths(record, consumed); // a copy of its own
  // A record already in the Session format carries `metadata` (an object or its JSON string): merge it, its
  // keys first, then the record's other fields (as `{ ...carried, ...others }` would, into what was parsed
  // from the string rather than through two copies).
  const carried = asObject(rest.metadata);
  let extra = rest;
  if (carried) {
    extra = carried === rest.metadata ? { ...carried } : carried;
    for (const key in rest) if (key !== 'metadata') setOwn(extra, key, rest[key]);
  }
  if (options.tools && !Array.isArray(extra.tools)) setOwn(extra, 'tools', options.tools);
  if (Object.keys(messageExtras).length > 0) extra._message_extras = messageExtras;
  const metadata = JSON.stringify(extra);

  if ((sessionId === null || sessionId === '') && messages === null)
    throw new MessagesNeeded('a session without an id is named by a hash of its messages');
  return {
    session_id:
      sessionId === null || sessionId === ''
        ? `h-${hashJson({ messages, ...mapped, metadata }).slice(0, 32)}`
        : sessionId,
    task_id: mapped.task_id === '' ? null : mapped.task_id,
    messages: messages ?? [],
    reward: mapped.reward,
    feedback: mapped.feedback,
    model: mapped.model,
    source,
    created_at: mapped.created_at,
    metadata,
  };
}
