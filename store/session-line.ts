// A stored session's line: JSON.stringify of a Session as ingest writes it (session_id first, then task_id,
// its fields in a fixed order), read where its bytes lie instead of parsed whole; and the tail split gives a
// session that had its task, which makes the line a SplitSession's.
import { holdsAt, jsonStringEnd } from '../pipeline/records.ts';
import type { Split, SplitSession } from '../core/records.ts';

/** A JSON string literal (quotes included) of `bytes`, decoded: parsed only when it holds an escape. */
export function decodeString(bytes: Buffer, from: number, to: number): string {
  for (let i = from + 1; i < to - 1; i++)
    if (bytes[i] === 92) return JSON.parse(bytes.toString('utf8', from, to)) as string;
  return bytes.toString('utf8', from + 1, to - 1);
}

export const HEAD = Buffer.from('{"session_id":"');
const TASK = Buffer.from(',"task_id":');
const NULL = Buffer.from('null,');

/**
 * The head of a session's line as ingest writes it (JSON.stringify of a Session: session_id first, then
 * task_id), in the line at `start` to `end` of `bytes`: where its session_id's JSON string ends (`idEnd`) and
 * its task_id's value starts (`task`); null for a line that does not start so.
 */
export function headOf(bytes: Buffer, start: number, end: number): { idEnd: number; task: number } | null {
  if (!holdsAt(bytes, start, HEAD)) return null;
  const idEnd = jsonStringEnd(bytes, start + HEAD.length - 1, end);
  return idEnd < 0 || !holdsAt(bytes, idEnd, TASK) ? null : { idEnd, task: idEnd + TASK.length };
}

/**
 * The task_id of a session's line as ingest writes it, read from the line's head (headOf) without parsing
 * the rest; undefined for a line that does not start so.
 */
export function leadingTaskId(bytes: Buffer, start = 0, end = bytes.length): string | null | undefined {
  const head = headOf(bytes, start, end);
  if (!head) return undefined;
  return holdsAt(bytes, head.task, NULL) ? null : stringAt(bytes, head.task, end);
}

/** The JSON string that starts at `at` (its opening quote) and ends by `end`, decoded; undefined where there is none. */
export function stringAt(bytes: Buffer, at: number, end: number): string | undefined {
  if (bytes[at] !== 34) return undefined;
  const close = jsonStringEnd(bytes, at, end);
  return close < 0 ? undefined : decodeString(bytes, at, close);
}

/** The session_id of a session's line (the head ingest writes, or the line parsed whole). */
export function leadingSessionId(bytes: Buffer, start: number, end: number): string {
  const idEnd = holdsAt(bytes, start, HEAD) ? jsonStringEnd(bytes, start + HEAD.length - 1, end) : -1;
  if (idEnd > 0) return decodeString(bytes, start + HEAD.length - 1, idEnd);
  return (JSON.parse(bytes.toString('utf8', start, end)) as SplitSession).session_id;
}

/** The task_id of a session's line (the head ingest writes, or the line parsed whole). */
export const taskOfLine = (bytes: Buffer, start: number, end: number): string =>
  leadingTaskId(bytes, start, end) ?? (JSON.parse(bytes.toString('utf8', start, end)) as SplitSession).task_id!;

/**
 * What ends the line of a split session that had its task, in place of the closing brace of the line ingest
 * wrote: JSON.stringify of { ...session, split, task_match: null }.
 */
export const sessionTail = (split: Split): Buffer => SESSION_TAILS[split];

export const SESSION_TAILS: Record<Split, Buffer> = {
  train: Buffer.from(',"split":"train","task_match":null}'),
  test: Buffer.from(',"split":"test","task_match":null}'),
};
export const SESSION_TAIL_TEXT: Record<Split, string> = {
  train: SESSION_TAILS.train.toString(),
  test: SESSION_TAILS.test.toString(),
};
export const MESSAGES_END = Buffer.from('],"reward":');
const FEEDBACK = Buffer.from(',"feedback":');

/**
 * Where the session line at `start` to `end` of `bytes` holds its reward: after its last `],"reward":`
 * (`close`; found from the end, past the few fields after it rather than every message, and nothing else can
 * look like it: a string holds no bare quote), up to the `,"feedback":` after it. -1 for either not there.
 */
export function rewardAt(bytes: Buffer, start: number, end: number): [close: number, feedback: number] {
  const close = bytes.lastIndexOf(MESSAGES_END, end - MESSAGES_END.length);
  if (close < start) return [-1, -1];
  const feedback = bytes.indexOf(FEEDBACK, close);
  return [close, feedback >= 0 && feedback < end ? feedback : -1];
}

/**
 * The id, task and reward of a session's line, stored as ingest writes it or as a bucket file holds it
 * whole, read as readStoredSession reads them (id and task from the head, the reward between `],"reward":`
 * and the `,"feedback":` after it): the id's and the task's JSON strings where they lie (`idAt`, `taskAt`),
 * or, where the line is not shaped so, the id as JSON and the task from the line parsed whole.
 */
export function readHead(
  bytes: Buffer,
  start: number,
  end: number,
): { idAt?: [number, number]; taskAt?: [number, number]; idJson?: Buffer; task?: string; reward: number } {
  const head = headOf(bytes, start, end);
  const [close, feedback] = rewardAt(bytes, start, end);
  if (head && bytes[head.task] === 34 && feedback > 0) {
    const taskEnd = jsonStringEnd(bytes, head.task, end);
    let reward: unknown;
    try {
      reward = JSON.parse(bytes.toString('latin1', close + MESSAGES_END.length, feedback));
    } catch {
      // parsed whole below
    }
    if (taskEnd > 0 && typeof reward === 'number')
      return { idAt: [start + HEAD.length - 1, head.idEnd], taskAt: [head.task, taskEnd], reward };
  }
  const s = JSON.parse(bytes.toString('utf8', start, end)) as SplitSession;
  return { idJson: Buffer.from(JSON.stringify(s.session_id)), task: s.task_id!, reward: s.reward };
}
