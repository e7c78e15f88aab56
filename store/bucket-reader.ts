// Reading split's bucket files: their sessions whole, grouped by task, or planned a block at a time where a
// bucket is too large to hold (spans.ts), each run of ingest's lines read from its segment (runs.ts).
import { closeSync, openSync, statSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { LineBuffer } from '../pipeline/jsonl.ts';
import { NumberList } from '../pipeline/buffers.ts';
import { PipelineError } from '../pipeline/errors.ts';
import { forEachLine } from '../pipeline/records.ts';
import { SPLITS, type SplitSession } from '../core/records.ts';
import type { StoredTaskGroups } from './messages.ts';
import { BucketParts, openSegment, pushSessionLine, readAll, readRun, segmentChanged } from './runs.ts';
import {
  SESSION_TAILS,
  SESSION_TAIL_TEXT,
  decodeString,
  leadingSessionId,
  readHead,
  taskOfLine,
} from './session-line.ts';
import {
  GatheredTask,
  sessionLineBytes,
  spanBytes,
  spansOf,
  type BucketSpans,
  type LargeTask,
  type SpanSource,
  type TaskRange,
  type TaskSpans,
} from './spans.ts';

/**
 * Which of a task's sessions readTaskGroups keeps: the first `most` in the bucket's order, or (`byId`) the
 * `most` whose ids come first.
 */
export interface TaskCut {
  most: number;
  byId?: boolean;
}

/**
 * Sessions of one bucket file grouped by task, tasks in a stable order, each task's cut to what `cut` keeps
 * (runs of ingest's sessions read from `ingestDir`, through `reader`: a stage reading bucket after bucket
 * passes the same one). The bucket is read a block at a time, and only the sessions kept are held (a task of
 * 500,000 sessions, parsed whole, took gigabytes).
 */
export function readTaskGroups(
  path: string,
  ingestDir: string,
  reader = new StoredBucketReader(),
  cut: TaskCut = { most: Infinity },
): [string, SplitSession[]][] {
  const groups = new Map<string, { id: string; text: string }[]>();
  const sources: SpanSource[] = [null];
  reader.eachSession(
    path,
    ingestDir,
    (bytes, start, end, source) => {
      const task = taskOfLine(bytes, start, end);
      let group = groups.get(task);
      if (!group) groups.set(task, (group = []));
      if (group.length >= cut.most && !cut.byId) return;
      const id = cut.byId ? leadingSessionId(bytes, start, end) : '';
      if (group.length >= cut.most && !(id < group.at(-1)!.id)) return;
      const s = sources[source];
      const text = s
        ? bytes.toString('utf8', start, end - 1) + SESSION_TAIL_TEXT[s.split]
        : bytes.toString('utf8', start, end);
      // Kept in the order of their ids (byId: ids are unique), or of the bucket.
      let at = group.length;
      if (cut.byId) while (at > 0 && id < group[at - 1]!.id) at--;
      group.splice(at, 0, { id, text });
      if (group.length > cut.most) group.pop();
    },
    sources,
  );
  return byTask(groups).map(([task, kept]) => [task, kept.map((k) => JSON.parse(k.text) as SplitSession)]);
}

/**
 * The sessions of one bucket file, parsed one at a time (runs of ingest's sessions read from `ingestDir`,
 * through `reader`, which is not to read anything else until they are all given): read at once where they
 * take at most `heldBytes` (HELD_BUCKET); otherwise where each lies is read first (three numbers a session),
 * then the sessions a MiB at a time.
 */
export async function* readBucketSessions(
  path: string,
  ingestDir: string,
  reader = new StoredBucketReader(),
  heldBytes = HELD_BUCKET,
): AsyncGenerator<SplitSession> {
  // Read at once: a few runs a bucket, not a read a MiB of sessions and their places first.
  if (reader.sessionBytes(path, ingestDir) <= heldBytes)
    return yield* parsedLines(await reader.sessions(path, ingestDir));
  const sources: SpanSource[] = [null];
  const at = new NumberList();
  reader.eachSession(
    path,
    ingestDir,
    (_bytes, _start, _end, source, from, to) => {
      at.push(source);
      at.push(from);
      at.push(to);
    },
    sources,
  );
  const spans = spansOf(sources, at.view(), BUCKET_BLOCK);
  for (let q = 0; q < spans.length / 4;) {
    let [r, size] = [q + 1, spanBytes(spans, q, sources)];
    while (r < spans.length / 4 && size + spanBytes(spans, r, sources) <= BUCKET_BLOCK)
      size += spanBytes(spans, r++, sources);
    yield* parsedLines(reader.readSpans(path, ingestDir, { sources }, spans, q, r).bytes);
    q = r;
  }
}

/** The sessions of lines a bucket's reader gave, parsed one at a time (the lines found first: the buffer is the reader's). */
function* parsedLines(bytes: Buffer): Generator<SplitSession> {
  const lines: number[] = [];
  forEachLine(bytes, (start, end) => end > start && lines.push(start, end));
  for (let k = 0; k < lines.length; k += 2)
    yield JSON.parse(bytes.toString('utf8', lines[k], lines[k + 1])) as SplitSession;
}

/** Groups' entries in a stable order: by task id. */
const byTask = <T>(groups: Map<string, T>): [string, T][] =>
  [...groups.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));

/**
 * Reads bucket files one after another into one buffer, so that its memory is not mapped afresh for each
 * (writing to new pages costs more than the copy itself): what a read gives is valid until the next read.
 */
export class StoredBucketReader {
  /** The bucket file as it is; its sessions, runs read in; the sessions readTaskRange keeps. */
  private file = Buffer.allocUnsafeSlow(0);
  private buffer = Buffer.allocUnsafeSlow(0);
  private kept = new LineBuffer(1 << 16);

  /** A whole file's bytes, valid until the next read. */
  private async bytes(path: string): Promise<Buffer> {
    const file = await open(path, 'r');
    try {
      const { size } = await file.stat();
      if (size > this.file.length) this.file = Buffer.allocUnsafeSlow(size + (size >> 3));
      for (let at = 0; at < size;) {
        const { bytesRead } = await file.read(this.file, at, size - at, at);
        if (bytesRead === 0) throw new Error(`${path}: ended at byte ${at} of ${size} while it was read`);
        at += bytesRead;
      }
      return this.file.subarray(0, size);
    } finally {
      await file.close();
    }
  }

  /**
   * A bucket file's lines as what is to be read for them: each run of ingest's sessions with its segment
   * (opened once; a run that reaches past its end is told before any is read), its other lines as they are.
   * `use` gets them with their bytes once read (tails added) and the file's bytes; the segments are closed after.
   */
  private async withParts<T>(
    path: string,
    ingestDir: string,
    use: (parts: BucketParts, size: number, file: Buffer) => T,
  ): Promise<T> {
    const file = await this.bytes(path);
    const parts = new BucketParts(path, ingestDir);
    try {
      let size = 0;
      let line = 0;
      forEachLine(file, (start, end) => {
        line++;
        if (end > start) size += parts.add(file, start, end, line);
      });
      return use(parts, size, file);
    } finally {
      parts.close();
    }
  }

  /**
   * A large bucket file's parts a block of its lines at a time (`size` bytes; a longer line grows it), each
   * block's given to `visit` with the block and where in the file it starts: what is held does not grow
   * with the file. From the line at byte `from` to the one at byte `until`; the segments are closed after.
   */
  private partsInBlocks(
    path: string,
    ingestDir: string,
    size: number,
    visit: (parts: BucketParts, block: Buffer, base: number) => void,
    from = 0,
    until = Infinity,
  ): void {
    // Line numbers count from `from`, and an error says so.
    const parts = new BucketParts(from > 0 ? `${path} from byte ${from},` : path, ingestDir);
    const fd = openSync(path, 'r');
    try {
      let line = 0;
      for (let base = from; base <= until;) {
        let block = this.fileRoom(size);
        let got = readAll(fd, block, size, base);
        if (got === 0) break;
        let last = block.lastIndexOf(10, got - 1);
        // A line longer than the block: the block grows to hold it (the file's last line may have no newline).
        for (let room = size; last < 0 && got === room;) {
          block = this.fileRoom((room *= 2));
          got = readAll(fd, block, room, base);
          last = block.lastIndexOf(10, got - 1);
        }
        // The file's end, or its block's last whole line; or the end of the line at `until`, where that comes first.
        let end = got < size || last < 0 ? got : last + 1;
        if (until - base < end) end = Math.min(end, block.indexOf(10, until - base) + 1 || end);
        parts.clear();
        forEachLine(block.subarray(0, end), (start, stop) => {
          line++;
          if (stop > start) parts.add(block, start, stop, line);
        });
        visit(parts, block, base);
        base += end;
      }
    } finally {
      closeSync(fd);
      parts.close();
    }
  }

  /** Room for `size` bytes in the buffer a bucket file is read into. */
  private fileRoom(size: number): Buffer {
    if (size > this.file.length) this.file = Buffer.allocUnsafeSlow(size);
    return this.file;
  }

  /** Room for `size` bytes in the buffer sessions are read into. */
  private room(size: number): Buffer {
    if (size > this.buffer.length) this.buffer = Buffer.allocUnsafeSlow(size + (size >> 3));
    return this.buffer;
  }

  /** The parts of a bucket file read into the buffer, a session a line. */
  private fill(parts: BucketParts, size: number, file: Buffer): Buffer {
    const out = this.room(size);
    let at = 0;
    for (let i = 0; i < parts.length; i++) {
      if (parts.isRun(i)) at = readRun(out, at, parts.fd(i), parts.run(i), parts.where(i));
      else {
        at += file.copy(out, at, parts.from(i), parts.to(i));
        out[at++] = 10;
      }
    }
    return out.subarray(0, at);
  }

  /**
   * A bucket file's sessions, a line each, as whole SplitSessions' JSON: each run of ingest's sessions it
   * points at read from its segment in `ingestDir` (synchronously: a bucket's runs are many small reads of
   * what the page cache mostly holds), its other lines as they are. Valid until the next read.
   */
  sessions(path: string, ingestDir: string): Promise<Buffer> {
    return this.withParts(path, ingestDir, (parts, size, file) => this.fill(parts, size, file));
  }

  /**
   * A bucket file's lines grouped by task (read from each line's head) where its sessions take at most `limit`
   * bytes; a larger bucket's plan (BucketSpans): its sessions read `limit` bytes at a time, a small task's
   * kept as where they lie, a task past the limit given to what `large` makes for it, so that what is paired
   * of it at once can be bounded (pairing/pairer.ts).
   */
  async readOrPlan<L extends LargeTask>(
    path: string,
    ingestDir: string,
    limit: number,
    large: (task: string, sources: SpanSource[]) => L,
    block = BUCKET_BLOCK,
  ): Promise<StoredTaskGroups | BucketSpans<L>> {
    // A bucket file within a block is read whole; a larger one (many runs: a task's sessions lie apart, a
    // line a session) a block at a time, its sessions' bytes counted first.
    if (statSync(path).size <= block)
      return this.withParts(path, ingestDir, (parts, size, file) =>
        size <= limit
          ? groupByTask(this.fill(parts, size, file))
          : this.spans(limit, large, (visit) => visit(parts, file, 0)),
      );
    if (this.sessionBytes(path, ingestDir, block) <= limit)
      return this.withParts(path, ingestDir, (parts, bytes, file) => groupByTask(this.fill(parts, bytes, file)));
    return this.plan(path, ingestDir, limit, large, block);
  }

  /** What a bucket file's sessions take once read (tails added), told by its lines alone, read a block at a time. */
  sessionBytes(path: string, ingestDir: string, block = BUCKET_BLOCK): number {
    let size = 0;
    this.partsInBlocks(path, ingestDir, block, (parts) => {
      for (let i = 0; i < parts.length; i++) size += parts.sessionBytes(i);
    });
    return size;
  }

  /**
   * A bucket file's plan (BucketSpans) whatever its size, its large tasks gathered by `large`; with `only`,
   * of that task alone (its other tasks' sessions read but not kept).
   */
  plan<L extends LargeTask>(
    path: string,
    ingestDir: string,
    limit: number,
    large: (task: string, sources: SpanSource[]) => L,
    block = BUCKET_BLOCK,
    only?: string,
  ): BucketSpans<L> {
    return this.spans(limit, large, (visit) => this.partsInBlocks(path, ingestDir, block, visit), only);
  }

  /**
   * Where the sessions of a bucket file's parts lie, by task: spans of consecutive lines of one source, each
   * of at most `limit` bytes. `blocks` gives the parts a block at a time, each with its block of the file and
   * where that starts.
   */
  private spans<L extends LargeTask>(
    limit: number,
    large: (task: string, sources: SpanSource[]) => L,
    blocks: PartBlocks,
    only?: string,
  ): BucketSpans<L> {
    const sources: SpanSource[] = [null];
    const tasks = new Map<string, GatheredTask<L>>();
    // The last session's task, whose string the next session's takes where its bytes are the same.
    let last: { json: Buffer; task: GatheredTask<L> | null } | null = null;
    // A session: its task, what it takes once read, where it lies; its id and reward, which choose outcome pairs.
    this.sessionsOf(blocks, sources, limit, (bytes, start, end, source, from, to, line) => {
      const head = readHead(bytes, start, end);
      let t: GatheredTask<L> | null | undefined;
      if (head.taskAt && last && bytes.compare(last.json, 0, last.json.length, head.taskAt[0], head.taskAt[1]) === 0)
        t = last.task;
      else {
        const task = head.taskAt ? decodeString(bytes, head.taskAt[0], head.taskAt[1]) : head.task!;
        t = only !== undefined && task !== only ? null : tasks.get(task);
        if (t === undefined) tasks.set(task, (t = new GatheredTask<L>(task)));
        last = head.taskAt ? { json: Buffer.from(bytes.subarray(head.taskAt[0], head.taskAt[1])), task: t } : null;
      }
      if (!t) return;
      t.bytes += sessionLineBytes(sources, source, from, to);
      const id = head.idAt
        ? { bytes, start: head.idAt[0], end: head.idAt[1] }
        : { bytes: head.idJson!, start: 0, end: head.idJson!.length };
      if (t.large) t.large.add(decodeString(id.bytes, id.start, id.end), head.reward, source, from, to, line);
      else {
        t.ids.push(id.bytes, id.start, id.end);
        t.rewards.push(head.reward);
        t.at.push(source);
        t.at.push(from);
        t.at.push(to);
        t.lines.push(line);
        // Larger than the limit: what it gathered goes to its LargeTask, which takes the rest as it comes.
        if (t.bytes > limit) t.toLarge(large(t.task, sources));
      }
    });
    // A task larger than the limit is paired from what its LargeTask kept (pairer.ts), on this thread; a
    // smaller one whole, its spans made anew (they go to the main thread with the plan's pieces).
    return {
      sources,
      tasks: byTask(tasks).map(([task, t]): TaskSpans<L> =>
        t.large
          ? { task, bytes: t.bytes, spans: null, large: t.large }
          : { task, bytes: t.bytes, spans: spansOf(sources, t.at.view(), limit), large: null },
      ),
    };
  }

  /**
   * Every session line of a bucket file, one after another, a block of the file and `BUCKET_BLOCK` bytes of
   * a run at a time (what is held does not grow with the bucket): `visit` gets its bytes (`start` to `end`
   * of `bytes`; a run's without its tail) and where it lies, as a span of one session (SpanSource: `source`,
   * its place in `sources`, which gains the segments the file's runs point into; `from`, `to`).
   */
  eachSession(path: string, ingestDir: string, visit: SessionVisit, sources: SpanSource[]): void {
    this.sessionsOf((v) => this.partsInBlocks(path, ingestDir, BUCKET_BLOCK, v), sources, BUCKET_BLOCK, visit);
  }

  /**
   * The session lines of the parts `blocks` gives (a block at a time, each with its block of the file and
   * where that starts), each given to `visit` with where it lies (a run's source added to `sources` the
   * first time its segment and side are met) and where its line starts in the bucket file; a run's read
   * `most` bytes at a time.
   */
  private sessionsOf(blocks: PartBlocks, sources: SpanSource[], most: number, visit: SessionVisit): void {
    // A run's source by its segment and side (2 × segment + side).
    const sourceOf = new Map<number, number>();
    blocks((parts, file, base) => {
      for (let i = 0; i < parts.length; i++) {
        const line = base + parts.lineStart(i);
        if (!parts.isRun(i)) {
          visit(file, parts.from(i), parts.to(i), 0, base + parts.from(i), base + parts.to(i), line);
          continue;
        }
        const run = parts.run(i);
        const key = 2 * parts.segment(i) + SPLITS.indexOf(run.split);
        let source = sourceOf.get(key);
        if (source === undefined)
          sourceOf.set(key, (source = sources.push({ ingest: run.ingest, split: run.split }) - 1));
        const lines = this.eachSessionOf(parts, i, run.bytes[0], run.bytes[1], most, (block, start, end, at) =>
          visit(block, start, end, source, at, at + end - start + 1, line),
        );
        if (lines !== run.sessions)
          throw segmentChanged(parts.where(i), run, `holds ${lines} line(s) there, not all sessions`);
      }
    });
  }

  /**
   * The session lines of part `i` (a run) from byte `from` to `to` of its segment, read `most` bytes at a
   * time (a longer line grows the block), each given to `visit` with its block, where it starts and ends
   * there (its newline), and where it starts in the segment; returns how many.
   */
  private eachSessionOf(
    parts: BucketParts,
    i: number,
    from: number,
    to: number,
    most: number,
    visit: (block: Buffer, start: number, end: number, at: number) => void,
  ): number {
    const [fd, run] = [parts.fd(i), parts.run(i)];
    let lines = 0;
    for (let at = from; at < to;) {
      let block = this.room(Math.min(most, to - at));
      let got = readAll(fd, block, Math.min(block.length, to - at), at);
      if (got === 0) throw segmentChanged(parts.where(i), run, `ended at byte ${at} while it was read`);
      let newline = block.lastIndexOf(10, got - 1);
      while (newline < 0 && at + got < to) {
        block = this.room(2 * block.length);
        got = readAll(fd, block, Math.min(block.length, to - at), at);
        newline = block.lastIndexOf(10, got - 1);
      }
      if (newline < 0) throw segmentChanged(parts.where(i), run, `holds a line there that does not end`);
      for (let start = 0; start <= newline;) {
        const nl = block.indexOf(10, start);
        if (block[start] !== 123 || block[nl - 1] !== 125)
          throw segmentChanged(parts.where(i), run, 'holds lines there that are not sessions');
        visit(block, start, nl, at + start);
        lines++;
        start = nl + 1;
      }
      at += newline + 1;
    }
    return lines;
  }

  /**
   * The sessions of task `task` (null: every one) among a bucket file's from `range`: from its
   * line at byte `range[0]` (a run's from byte `range[1]` of its segment; -1: the whole line) to its line at
   * byte `range[2]` (a run's up to byte `range[3]`; -1: not that line), a line each as `sessions` gives them,
   * with where each starts and ends. The bucket file is read a block at a time from the range's first line,
   * and its other tasks' sessions there are read but not kept. Valid until the next read.
   */
  readTaskRange(
    path: string,
    ingestDir: string,
    task: string | null,
    range: TaskRange,
    block = BUCKET_BLOCK,
  ): { bytes: Buffer; offsets: number[] } {
    const [first, firstFrom, last, lastTo] = range;
    const out = this.kept;
    out.clear();
    const offsets: number[] = [];
    // A session kept as `sessions` gives it, with where it starts and ends.
    const copy = (bytes: Buffer, start: number, end: number, tail: Buffer | null) => {
      offsets.push(out.length);
      pushSessionLine(out, bytes, start, end, tail);
      offsets.push(out.length - 1);
    };
    const ofTask = (bytes: Buffer, start: number, end: number) =>
      task === null || taskOfLine(bytes, start, end) === task;
    this.partsInBlocks(
      path,
      ingestDir,
      block,
      (parts, file, base) => {
        for (let i = 0; i < parts.length; i++) {
          const at = base + parts.lineStart(i);
          if (at > last || (at === last && lastTo < 0)) return;
          if (!parts.isRun(i)) {
            if (ofTask(file, parts.from(i), parts.to(i))) copy(file, parts.from(i), parts.to(i), null);
            continue;
          }
          const from = at === first && firstFrom >= 0 ? firstFrom : parts.from(i);
          const to = at === last ? lastTo : parts.to(i);
          const tail = SESSION_TAILS[parts.run(i).split];
          this.eachSessionOf(
            parts,
            i,
            from,
            to,
            BUCKET_BLOCK,
            (bytes, start, end) => ofTask(bytes, start, end) && copy(bytes, start, end, tail),
          );
        }
      },
      first,
      last,
    );
    return { bytes: out.view(), offsets };
  }

  /**
   * The sessions of spans `from` to `to` (quad indices) of a bucket's BucketSpans, a line each as `sessions`
   * gives them, read from `path` (the bucket file) and the segments of `ingestDir`; with where each span's
   * lines start (and, last, where they end). Valid until the next read.
   */
  readSpans(
    path: string,
    ingestDir: string,
    { sources }: Pick<BucketSpans, 'sources'>,
    spans: ArrayLike<number>,
    from = 0,
    to = spans.length / 4,
  ): { bytes: Buffer; at: number[] } {
    let size = 0;
    for (let q = from; q < to; q++) size += spanBytes(spans, q, sources);
    const out = this.room(size);
    const at: number[] = [];
    const fds = new Map<number, number>();
    const where = `${path} (a run of its lines)`;
    let end = 0;
    try {
      for (let q = from; q < to; q++) {
        const [source, start, stop, sessions] = [
          spans[4 * q]!,
          spans[4 * q + 1]!,
          spans[4 * q + 2]!,
          spans[4 * q + 3]!,
        ];
        const s = sources[source]!;
        let fd = fds.get(source);
        if (fd === undefined)
          fds.set(source, (fd = s ? openSegment(ingestDir, s.ingest, path).fd : openSync(path, 'r')));
        at.push(end);
        if (s) end = readRun(out, end, fd, { ingest: s.ingest, bytes: [start, stop], sessions, split: s.split }, where);
        else {
          if (readAll(fd, out.subarray(end), stop - start, start) !== stop - start)
            throw new PipelineError(
              `${path}: ended before byte ${stop} while it was read again; it has changed since pairing began: run \`prefab stage pairs\` again`,
            );
          end += stop - start;
          out[end++] = 10;
        }
      }
    } finally {
      for (const fd of fds.values()) closeSync(fd);
    }
    at.push(end);
    return { bytes: out.subarray(0, end), at };
  }
}

/** A bucket file's parts a block at a time, each given with its block of the file and where that starts. */
type PartBlocks = (visit: (parts: BucketParts, file: Buffer, base: number) => void) => void;

/**
 * A session line of a bucket (StoredBucketReader.eachSession): `start` to `end` of `bytes`, a run's without its
 * tail; where it lies, as a span of one session (its source's place in the reader's sources, from, to); and
 * where the bucket file's line that holds or points at it starts.
 */
type SessionVisit = (
  bytes: Buffer,
  start: number,
  end: number,
  source: number,
  from: number,
  to: number,
  line: number,
) => void;

/** The bytes of a large bucket file read at once (StoredBucketReader.partsInBlocks). */
const BUCKET_BLOCK = 1 << 20;

/** A bucket's session lines grouped by task (read from each line's head), tasks in a stable order. */
function groupByTask(bytes: Buffer): StoredTaskGroups {
  const tasks = new Map<string, number[]>();
  forEachLine(bytes, (start, end) => {
    if (end === start) return;
    const task = taskOfLine(bytes, start, end);
    const offsets = tasks.get(task);
    if (offsets) offsets.push(start, end);
    else tasks.set(task, [start, end]);
  });
  return { bytes, tasks: byTask(tasks) };
}

/**
 * The most bytes of a bucket's sessions SessionsById and readBucketSessions hold at once: about twice a
 * usual bucket, while one that a task of a million sessions fills takes gigabytes.
 */
export const HELD_BUCKET = 32 << 20;
