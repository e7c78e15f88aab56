// A thread's pairing: bucket files one after another, each bucket whose sessions take more than a job's
// `limit` bytes in pieces that each keep at most `pieceBytes` (PIECE_BYTES; a task within the limit whole),
// so that what a thread holds does not grow with the largest task. The pieces write, in order, the bytes
// pairing the bucket whole writes:
//   - whole tasks, several to a piece, as pairBucket pairs them;
//   - a task larger than the limit: first its outcome pairs, chosen from its first few successes and failures
//     in order and only the sessions they take read back; then its hard negatives, from its sessions with a
//     reward of at least from_min_reward, read again a piece at a time.
// A large bucket's job plans it (StoredBucketReader.readOrPlan, a block of the bucket file at a time): where
// each small task's sessions lie, and for a large task what its LargeTaskPlan keeps as the sessions come. It
// makes the large tasks' outcome pairs there and then, and answers with its pieces (BucketPlan), those
// outcome pairs among them, made. stages/pairs/run.ts hands the other pieces to the threads in turn, as it
// hands buckets. A large task's sessions are so read twice, and yet pairing is faster than whole, in less memory.
import type { BufferShelf } from '../pipeline/buffers.ts';
import type { Split } from '../core/records.ts';
import { StoredBucketReader } from '../store/bucket-reader.ts';
import { readStoredSession, storedSessions, type StoredSession, type StoredTaskGroups } from '../store/messages.ts';
import { sessionLineBytes, type BucketSpans, type LargeTask, type SpanSource, type TaskRange } from '../store/spans.ts';
import {
  bucketWork,
  pairBucket,
  paired,
  writeOutcomePairs,
  writeTaskHardNegatives,
  type BucketLog,
  type BucketOptions,
  type PairedBucket,
} from './bucket.ts';
import { DEEPER, FAILURE_ORDER, SUCCESS_ORDER, type Ranked } from './outcome.ts';

/** One bucket file of one side to pair, its runs of sessions read from `ingest`; `s` is the side's place in SPLITS. */
export interface BucketJob {
  path: string;
  ingest: string;
  side: Split;
  s: number;
  b: number;
  /** Session bytes a thread reads at once: a bucket whose sessions take more is paired in pieces. */
  limit: number;
  /** What such a piece reads at most (a task within the limit whole): at most the limit. */
  pieceBytes: number;
  /** A large task's successes and failures held at first, each (a test's; OUTCOME_HELD, or four times the cap). */
  outcomeHeld?: number;
  /** The bytes of a large bucket file read at once (a test's; StoredBucketReader's block). */
  bucketBlock?: number;
  /** A piece of a large bucket; none for a whole bucket. */
  piece?: BucketPiece;
}

/**
 * A piece of a large bucket, and what is made of it. `tasks`: whole tasks, where their sessions lie (spans,
 * as BucketSpans has them), each task its spans from `from` to `to` (span indices). `outcome` and
 * `negatives`: a part of one task larger than the limit: its outcome pairs, `made` as the bucket was planned;
 * its hard negatives, from the sessions of a `range` of the bucket file (all of them where the task is
 * `alone` in its bucket). `endsTask` when no part of the task comes after.
 */
type PiecePart = { endsTask: boolean } & (
  | { part: 'tasks'; sources: SpanSource[]; spans: Float64Array; tasks: { task: string; from: number; to: number }[] }
  | { part: 'outcome'; task: string; made: PairedPiece }
  | { part: 'negatives'; task: string; range: TaskRange; alone: boolean }
);

/** A piece of a large bucket; `opens` and `closes`: the bucket's first and last piece. */
export type BucketPiece = PiecePart & { opens: boolean; closes: boolean };

/** A large bucket's answer: its pieces, to be paired and written in this order. */
interface BucketPlan {
  pieces: BucketJob[];
}

/** What a piece of a task larger than the limit made: counted towards `tasks_with_pairs` over all its pieces, when the last is written. */
export interface PieceOfTask {
  made: number;
  endsTask: boolean;
}

/** A piece of a large task paired. */
export type PairedPiece = PairedBucket & { ofTask: PieceOfTask };

export type PairedJob = (PairedBucket & { ofTask?: PieceOfTask }) | BucketPlan;

/** The buffers a job's answer moves to the main thread rather than copies: its pairs', or a plan's outcome pairs'. */
export function movedBuffers(made: PairedJob): ArrayBuffer[] {
  const buffers = (p: PairedBucket) => [p.pairs.buffer as ArrayBuffer, p.dropped.buffer as ArrayBuffer];
  return 'pieces' in made
    ? made.pieces.flatMap(({ piece }) => (piece?.part === 'outcome' ? buffers(piece.made) : []))
    : buffers(made);
}

/**
 * The session bytes a piece reads at most, where the limit is larger (a task within the limit is read whole,
 * whatever its size): small pieces keep what a thread holds small and both threads busy to the end.
 */
export const PIECE_BYTES = 1 << 20;

/**
 * The pieces of a bucket too large to pair whole, in the order their pairs are written; `outcome` makes a
 * large task's outcome pairs from its plan (`endsTask` where it has no hard negatives to make).
 */
function planPieces(
  { sources, tasks }: BucketSpans<LargeTaskPlan>,
  job: BucketJob,
  o: BucketOptions,
  outcome: (task: string, plan: LargeTaskPlan, endsTask: boolean) => PairedPiece,
): BucketJob[] {
  const { pieceBytes } = job;
  const pieces: PiecePart[] = [];
  // A piece of whole tasks' spans, laid one after another in an array of its own (a view into a larger one
  // would take all of it to the thread).
  const ofSpans = (group: { task: string; spans: Float64Array }[]) => {
    const spans = new Float64Array(group.reduce((n, t) => n + t.spans.length, 0));
    let at = 0;
    const listed = group.map((t) => {
      spans.set(t.spans, at);
      at += t.spans.length;
      return { task: t.task, from: (at - t.spans.length) / 4, to: at / 4 };
    });
    pieces.push({ part: 'tasks', sources, spans, tasks: listed, endsTask: true });
  };
  let whole: { task: string; spans: Float64Array }[] = [];
  let bytes = 0;
  const flush = () => {
    if (whole.length > 0) ofSpans(whole);
    [whole, bytes] = [[], 0];
  };
  for (const t of tasks) {
    if (t.large === null) {
      if (bytes + t.bytes > pieceBytes) flush();
      whole.push(t);
      bytes += t.bytes;
      continue;
    }
    flush();
    // Its hard negatives: its sessions read again, a range of the bucket file a piece (those with a reward
    // under from_min_reward passed over).
    const ranges = o.hardNegatives.enabled ? t.large.ranges() : [];
    const endsTask = ranges.length === 0;
    pieces.push({ part: 'outcome', task: t.task, made: outcome(t.task, t.large, endsTask), endsTask });
    // A task alone in its bucket reads its ranges whole; one beside others keeps its own sessions of them.
    const alone = tasks.length === 1;
    ranges.forEach((range, i) =>
      pieces.push({ part: 'negatives', task: t.task, range, alone, endsTask: i === ranges.length - 1 }),
    );
  }
  flush();
  return pieces.map((piece, i) => ({ ...job, piece: { ...piece, opens: i === 0, closes: i === pieces.length - 1 } }));
}

/** A candidate for a large task's outcome pairs: its id and reward, and where it lies (source, from, to). */
interface Head {
  session_id: string;
  reward: number;
  at: [source: number, from: number, to: number];
}

/**
 * What a large bucket's plan keeps of a task larger than the limit, as its sessions come: the first `held`
 * of its successes and of its failures in the order outcome pairs take them (OUTCOME_HELD, or four times the
 * cap; all of them uncapped), and where in the bucket file each piece of its sessions for hard negatives
 * starts (a piece about `pieceBytes` of them). Nothing is kept a session, so what a thread holds of a task
 * does not grow with it (but where outcome pairs are uncapped: every candidate is held then).
 */
class LargeTaskPlan implements LargeTask {
  readonly successes: FirstInOrder;
  readonly failures: FirstInOrder;
  /** Its hard negatives' pieces so far, and where the next starts (its line, a run's session's byte or -1) and what it holds. */
  private readonly done: TaskRange[] = [];
  private next: [line: number, from: number] | null = null;
  private held = 0;

  constructor(
    private readonly o: BucketOptions,
    private readonly sources: SpanSource[],
    private readonly pieceBytes: number,
    held: number,
  ) {
    [this.successes, this.failures] = [new FirstInOrder(SUCCESS_ORDER, held), new FirstInOrder(FAILURE_ORDER, held)];
  }

  add(id: string, reward: number, source: number, from: number, to: number, line: number): void {
    const { outcome: oc, hardNegatives: h } = this.o;
    if (oc.enabled && (reward >= oc.success_min || reward <= oc.failure_max)) {
      const head: Head = { session_id: id, reward, at: [source, from, to] };
      if (reward >= oc.success_min) this.successes.add(head);
      if (reward <= oc.failure_max) this.failures.add(head);
    }
    if (!h.enabled) return;
    // A piece ends where its sessions would pass the piece's bytes: the next starts at this session. Every
    // session of the task counts (those its hard negatives are not made from are read too, and passed over),
    // so that a piece keeps at most its bytes without the task's sessions' rewards read again. Where other
    // tasks share the bucket, their sessions in the range are read as well, and not kept.
    const here: [number, number] = [line, source === 0 ? -1 : from];
    const bytes = sessionLineBytes(this.sources, source, from, to);
    if (this.next && this.held > 0 && this.held + bytes > this.pieceBytes) {
      this.done.push([...this.next, ...here]);
      [this.next, this.held] = [null, 0];
    }
    this.next ??= here;
    this.held += bytes;
  }

  /** Its hard negatives' pieces, as the lines of the bucket file each reads (the last to its end). */
  ranges(): TaskRange[] {
    return this.next ? [...this.done, [...this.next, Infinity, -1]] : this.done;
  }
}

/** The first `most` of a list in `order`, kept as the list comes (cut to them each time it reaches twice that), and how many came. */
class FirstInOrder {
  private list: Head[] = [];
  private count = 0;

  constructor(
    private readonly order: (a: Head, b: Head) => number,
    private readonly most: number,
  ) {}

  add(h: Head): void {
    this.count++;
    this.list.push(h);
    if (this.list.length >= 2 * this.most) this.list = this.list.sort(this.order).slice(0, this.most);
  }

  /** The list as pairs take it: asking past the first `most` of a longer one throws DEEPER. */
  ranked(): Ranked<Head> {
    const list = this.list.sort(this.order).slice(0, this.most);
    const { count } = this;
    return {
      length: count,
      at: (k) => {
        if (k < list.length) return list[k]!;
        if (list.length === count) throw new Error(`candidate ${k} of ${count}`);
        throw DEEPER;
      },
    };
  }
}

/**
 * Pairs bucket files one after another on one thread: each bucket's sessions read into the same buffer
 * (StoredBucketReader), its pairs into a buffer sized by what the last bucket's pairs took for its sessions'
 * bytes (about 1.2 to 1.9 times them), so that the buffer rarely grows. A bucket whose sessions take more
 * than the job's limit answers with its pieces (a rewriter's buckets are paired whole: their rewrites are
 * written after the bucket's other pairs).
 */
export class BucketPairer {
  private readonly reader = new StoredBucketReader();
  private pairBytesPerByte = 1.25;

  constructor(
    private readonly o: BucketOptions,
    private readonly log: BucketLog,
    private readonly shelf: BufferShelf,
  ) {}

  async pair(job: BucketJob): Promise<PairedJob> {
    if (job.piece) return this.pairPiece(job, job.piece);
    const read = await this.reader.readOrPlan(
      job.path,
      job.ingest,
      this.o.rewriter ? Infinity : job.limit,
      this.largeTasks(job, this.held(job)),
      job.bucketBlock,
    );
    if (!('bytes' in read))
      return {
        pieces: planPieces(read, job, this.o, (task, plan, endsTask) =>
          this.pairOutcome(job, task, read.sources, plan, endsTask),
        ),
      };
    return this.pairGroups(read, job.side);
  }

  private async pairGroups(groups: StoredTaskGroups, side: Split): Promise<PairedBucket> {
    const bytes = groups.bytes.length;
    return this.learn(bytes, await pairBucket(groups, side, this.o, this.log, this.shelf, this.sizeHint(bytes)));
  }

  /** About the bytes the pairs of `bytes` of sessions will take, as the last ones took. */
  private sizeHint(bytes: number): number {
    return Math.ceil(1.1 * bytes * this.pairBytesPerByte) + (64 << 10);
  }

  /** `made`, the pairs of `bytes` of sessions, its ratio kept for the next sizeHint. */
  private learn<P extends PairedBucket>(bytes: number, made: P): P {
    if (bytes > 0) this.pairBytesPerByte = made.pairs.length / bytes;
    return made;
  }

  private async pairPiece(job: BucketJob, piece: BucketPiece): Promise<PairedJob> {
    const { path, ingest, side } = job;
    // An outcome piece comes made with its bucket's plan, and run.ts answers it with that.
    if (piece.part === 'outcome')
      throw new Error(
        `pairs: ${path}: the outcome pairs of task ${piece.task} were made as its bucket was planned, and are not paired again`,
      );
    if (piece.part === 'negatives') {
      const read = this.reader.readTaskRange(
        path,
        ingest,
        piece.alone ? null : piece.task,
        piece.range,
        job.bucketBlock,
      );
      return this.negatives(read.bytes, piece.task, read.offsets, side, piece.endsTask);
    }
    const { bytes, at } = this.reader.readSpans(path, ingest, piece, piece.spans);
    const tasks: [string, number[]][] = piece.tasks.map(({ task, from, to }) => {
      const offsets: number[] = [];
      for (let start = at[from]!; start < at[to]!;) {
        const nl = bytes.indexOf(10, start);
        offsets.push(start, nl);
        start = nl + 1;
      }
      return [task, offsets];
    });
    return this.pairGroups({ bytes, tasks }, side);
  }

  /** The hard negatives of a large task's sessions read for a piece (`offsets`: where each lies in `bytes`). */
  private negatives(bytes: Buffer, task: string, offsets: number[], side: Split, endsTask: boolean): PairedPiece {
    const w = bucketWork(this.o, this.shelf, this.sizeHint(bytes.length));
    const made = writeTaskHardNegatives(w, storedSessions({ bytes, tasks: [[task, offsets]] }, offsets));
    w.counts[side]! += made;
    return this.learn(bytes.length, { ...paired(w), ofTask: { made, endsTask } });
  }

  /** The successes and failures a large task's plan holds at first, each. */
  private held(job: BucketJob): number {
    const cap = this.o.outcome.max_pairs_per_task;
    return cap === null ? Infinity : (job.outcomeHeld ?? Math.max(OUTCOME_HELD, 4 * cap));
  }

  /** What makes a large task's plan as the bucket is read. */
  private largeTasks(job: BucketJob, held: number) {
    return (_task: string, sources: SpanSource[]) => new LargeTaskPlan(this.o, sources, job.pieceBytes, held);
  }

  /**
   * A large task's outcome pairs, chosen from the successes and failures its plan holds, and only the
   * sessions they take read back, each once. Where drops reach past those, the bucket is read again for
   * that task's candidates, all of them, and the pairs chosen again.
   */
  private pairOutcome(
    job: BucketJob,
    task: string,
    sources: SpanSource[],
    plan: LargeTaskPlan,
    endsTask: boolean,
  ): PairedPiece {
    const { path, ingest, side } = job;
    const w = bucketWork(this.o, this.shelf, 64 << 10);
    w.counts.tasks!++;
    // A step pair's prefix tree wants all of a task's sessions at once: a task past the limit gets none.
    if (this.o.steps.enabled) w.counts.step_tasks_too_large!++;
    let made = 0;
    if (this.o.outcome.enabled) {
      // A session taken is read into a buffer of its own: the reader's is filled again for the next.
      const pairFrom = (plan: LargeTaskPlan, sources: SpanSource[]) => {
        const taken = new Map<Head, StoredSession>();
        const session = (h: Head): StoredSession => {
          let found = taken.get(h);
          if (!found) {
            const { bytes } = this.reader.readSpans(path, ingest, { sources }, [...h.at, 1]);
            taken.set(h, (found = readStoredSession(Buffer.from(bytes.subarray(0, bytes.length - 1)))));
          }
          return found;
        };
        return writeOutcomePairs(w, { successes: plan.successes.ranked(), failures: plan.failures.ranked() }, session);
      };
      try {
        made = pairFrom(plan, sources);
      } catch (error) {
        if (error !== DEEPER) throw error;
        const all = this.reader.plan(path, ingest, job.limit, this.largeTasks(job, Infinity), job.bucketBlock, task);
        made = pairFrom(all.tasks[0]!.large!, all.sources);
      }
    }
    w.counts[side]! += made;
    return { ...paired(w), ofTask: { made, endsTask } };
  }
}

/** Successes and failures a large task's outcome pairs are first chosen from, each side's first in order (at least). */
const OUTCOME_HELD = 64;
