// Where a large bucket's sessions lie, task by task: spans of consecutive session lines of one source (a
// segment of ingest's, or the bucket file itself), so a bucket too large to hold is read a piece at a time.
import { NumberList } from '../pipeline/buffers.ts';
import type { Split } from '../core/records.ts';
import { SESSION_TAILS, decodeString } from './session-line.ts';

/** What a span points into: a segment of ingest's whose sessions take `split`'s tail, or (null) the bucket file's own lines. */
export type SpanSource = { ingest: string; split: Split } | null;

/**
 * Where a large bucket's sessions lie, task by task (StoredBucketReader.readOrPlan). A span is a run of
 * consecutive lines of one source, four numbers: the source (its place in `sources`; 0, null, is the bucket
 * file itself), the bytes `from` to `to` of it (a run's newlines included, a bucket file's last newline not),
 * and how many sessions.
 */
export interface BucketSpans<L extends LargeTask = LargeTask> {
  sources: SpanSource[];
  tasks: TaskSpans<L>[];
}

/**
 * A task of a large bucket and its sessions' bytes as read (tails added): for a task within the limit, the
 * spans of its sessions in the bucket's order; for a larger one, instead, what its LargeTask kept.
 */
export type TaskSpans<L extends LargeTask> = { task: string; bytes: number } & (
  { spans: Float64Array; large: null } | { spans: null; large: L }
);

/**
 * A task's sessions as a large bucket's plan gathers them: ids kept as their JSON's bytes, not strings that
 * would live through collections; once the task is larger than the limit, given to its LargeTask instead.
 */
export class GatheredTask<L extends LargeTask> {
  bytes = 0;
  ids = new ByteList();
  rewards = new NumberList();
  /** A span (source, from, to) a session. */
  at = new NumberList();
  /** Where in the bucket file each session's line starts. */
  lines = new NumberList();
  large: L | null = null;

  constructor(readonly task: string) {}

  /** What was gathered given to `large`, which takes the task's sessions from now on. */
  toLarge(large: L): void {
    const [ids, ends, rewards, at, lines] = [
      this.ids.bytes(),
      this.ids.ends.view(),
      this.rewards.view(),
      this.at.view(),
      this.lines.view(),
    ];
    const bytes = Buffer.from(ids.buffer, ids.byteOffset, ids.byteLength);
    for (let i = 0; i < rewards.length; i++)
      large.add(
        decodeString(bytes, i === 0 ? 0 : ends[i - 1]!, ends[i]!),
        rewards[i]!,
        at[3 * i]!,
        at[3 * i + 1]!,
        at[3 * i + 2]!,
        lines[i]!,
      );
    this.large = large;
    [this.ids, this.rewards, this.at, this.lines] = [
      new ByteList(),
      new NumberList(),
      new NumberList(),
      new NumberList(),
    ];
  }
}

/**
 * What a large bucket's plan keeps of a task larger than the limit (pairing/pairer.ts makes it): each of
 * its sessions in turn, its id, reward and where it lies (a span of source, from, to), and where its line
 * starts in the bucket file, from the first.
 */
export interface LargeTask {
  add(id: string, reward: number, source: number, from: number, to: number, line: number): void;
}

/**
 * Some of a bucket's lines, as readTaskRange reads them: from its line at byte `first` (a run's from byte
 * `firstFrom` of its segment; -1: the whole line) to its line at byte `last` (a run's up to byte `lastTo`;
 * -1: not that line).
 */
export type TaskRange = [first: number, firstFrom: number, last: number, lastTo: number];

/** Byte strings one after another in one growing buffer, with where each ends. */
class ByteList {
  private buffer = Buffer.allocUnsafe(256);
  private length = 0;
  readonly ends = new NumberList();

  push(from: Buffer, start: number, end: number): void {
    if (this.length + end - start > this.buffer.length) {
      const grown = Buffer.allocUnsafe(Math.max(2 * this.buffer.length, this.length + end - start));
      this.buffer.copy(grown, 0, 0, this.length);
      this.buffer = grown;
    }
    this.length += from.copy(this.buffer, this.length, start, end);
    this.ends.push(this.length);
  }

  /** The strings pushed, a view of the list's buffer (no copy). */
  bytes(): Uint8Array {
    return this.buffer.subarray(0, this.length);
  }
}

/** What a session line of `source` takes once read, beyond its stored bytes: a run's sessions their tail in place of the closing brace. */
const tailExtra = (source: SpanSource) => (source ? SESSION_TAILS[source.split].length - 1 : 0);

/** What the session line at `from` to `to` of source `source` takes once read (its tail added, or its newline). */
export const sessionLineBytes = (sources: SpanSource[], source: number, from: number, to: number) => {
  const s = sources[source]!;
  return to - from + (s ? tailExtra(s) : 1);
};

/**
 * The spans of the sessions at `at` (a span of one session each: source, from, to): a session continues the
 * last span where it follows it in the same source (a whole line after the last one's newline, a run's line
 * where the last one's ended) and the span stays within `limit` bytes once read.
 */
export function spansOf(sources: SpanSource[], at: Float64Array, limit: number): Float64Array {
  const spans = new NumberList();
  for (let i = 0; i < at.length / 3; i++) {
    const [source, from, to] = [at[3 * i]!, at[3 * i + 1]!, at[3 * i + 2]!];
    const n = spans.length;
    if (
      n > 0 &&
      spans.get(n - 4) === source &&
      (source === 0 ? spans.get(n - 2) + 1 : spans.get(n - 2)) === from &&
      spanBytes(spans.view(), n / 4 - 1, sources) + sessionLineBytes(sources, source, from, to) <= limit
    ) {
      spans.set(n - 2, to);
      spans.set(n - 1, spans.get(n - 1) + 1);
    } else for (const v of [source, from, to, 1]) spans.push(v);
  }
  return spans.view().slice();
}

/** The bytes span `q` of `spans` takes once read (its sessions' tails added, a bucket file's lines their last newline). */
export function spanBytes(spans: ArrayLike<number>, q: number, sources: SpanSource[]): number {
  const source = sources[spans[4 * q]!]!;
  return spans[4 * q + 2]! - spans[4 * q + 1]! + (source ? spans[4 * q + 3]! * tailExtra(source) : 1);
}
