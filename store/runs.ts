// A line of split's bucket files: a run of ingest's session lines (a SessionRun), or a session written whole
// (split gave it a task, so it changed; sample's buckets hold every session whole). A bucket file so does not
// copy its sessions; the readers (bucket-reader.ts) give either as one line a whole SplitSession.
import { closeSync, fstatSync, openSync, readSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { PipelineError } from '../pipeline/errors.ts';
import type { LineBuffer } from '../pipeline/jsonl.ts';
import { holdsAt } from '../pipeline/records.ts';
import { SPLITS, type Split } from '../core/records.ts';
import { SESSION_TAILS } from './session-line.ts';

/**
 * A line of split's bucket file that stands for `sessions` lines of ingest's segment `ingest` (in its
 * sessions/ folder), bytes `bytes[0]` to `bytes[1]` of it (their newlines included): each read as the
 * session with `"split":<split>,"task_match":null` added, as a session with a task is (sessionTail).
 */
export interface SessionRun {
  ingest: string;
  bytes: [from: number, to: number];
  sessions: number;
  split: Split;
}

/** The line of a run: JSON.stringify of it, its fields in SessionRun's order (written out: split writes one every few sessions). */
export const sessionRunLine = (run: SessionRun): string =>
  `{"ingest":${JSON.stringify(run.ingest)},"bytes":[${run.bytes[0]},${run.bytes[1]}],"sessions":${run.sessions},"split":${JSON.stringify(run.split)}}`;

/** A session's line (`start` to `end` of `bytes`) as `sessions` gives it: a run's with its side's `tail` in place of its closing brace. */
export function pushSessionLine(out: LineBuffer, bytes: Buffer, start: number, end: number, tail: Buffer | null): void {
  if (tail) out.pushBytes(bytes.subarray(start, end - 1), tail);
  else out.pushBytes(bytes.subarray(start, end));
}

const RUN_HEAD = Buffer.from('{"ingest":');
const RUN_BYTES = Buffer.from('","bytes":[');
const RUN_SESSIONS = Buffer.from('],"sessions":');
const RUN_SPLIT = Buffer.from(',"split":"');
const RUN_ENDS = SPLITS.map((side) => Buffer.from(`${side}"}`));

/** The segment the last run read named, its bytes and its name: a bucket's runs name a few segments, mostly one. */
let lastSegment = { bytes: Buffer.alloc(0), name: '' };

/**
 * A run line as split writes it (sessionRunLine), read where its bytes lie, not made a string and matched:
 * a bucket may hold a million runs. Null for any other shape (then parsed).
 */
function runOfShape(bytes: Buffer, start: number, end: number): Partial<SessionRun> | null {
  let at = start + RUN_HEAD.length;
  if (bytes[at++] !== 34) return null;
  const nameStart = at;
  // A name ends at its quote, and holds no backslash (an escape) or slash.
  while (at < end && bytes[at] !== 34 && bytes[at] !== 92 && bytes[at] !== 47) at++;
  if (at === nameStart || !holdsAt(bytes, at, RUN_BYTES)) return null;
  const nameEnd = at;
  // A count: its digits, or -1 for none.
  const count = () => {
    const first = at;
    let n = 0;
    for (; at < end && bytes[at]! >= 48 && bytes[at]! <= 57; at++) n = 10 * n + bytes[at]! - 48;
    return at > first ? n : -1;
  };
  at += RUN_BYTES.length;
  const from = count();
  if (bytes[at++] !== 44) return null;
  const to = count();
  if (!holdsAt(bytes, at, RUN_SESSIONS)) return null;
  at += RUN_SESSIONS.length;
  const sessions = count();
  if (!holdsAt(bytes, at, RUN_SPLIT)) return null;
  at += RUN_SPLIT.length;
  const side = RUN_ENDS.findIndex((tail) => at + tail.length === end && holdsAt(bytes, at, tail));
  if (from < 0 || to < 0 || sessions < 0 || side < 0) return null;
  if (bytes.compare(lastSegment.bytes, 0, lastSegment.bytes.length, nameStart, nameEnd) !== 0) {
    lastSegment = {
      bytes: Buffer.from(bytes.subarray(nameStart, nameEnd)),
      name: bytes.toString('latin1', nameStart, nameEnd),
    };
  }
  return { ingest: lastSegment.name, bytes: [from, to], sessions, split: SPLITS[side] };
}

/** The SessionRun of a bucket line that starts as one (read by its fixed shape, or parsed); an error names the line. */
function readSessionRun(bytes: Buffer, start: number, end: number, path: string, line: number): SessionRun {
  let run = runOfShape(bytes, start, end);
  if (!run) {
    try {
      run = JSON.parse(bytes.toString('utf8', start, end)) as Partial<SessionRun>;
    } catch {
      run = {}; // reported below
    }
  }
  const [from, to] = Array.isArray(run.bytes) ? run.bytes : [];
  const count = (n: unknown): n is number => Number.isSafeInteger(n) && (n as number) >= 0;
  // A session's line is at least `{}` and its newline.
  const fits = count(from) && count(to) && count(run.sessions) && run.sessions > 0 && 3 * run.sessions <= to - from;
  if (
    typeof run.ingest === 'string' &&
    run.ingest !== '..' &&
    !/[/\\]/.test(run.ingest) &&
    fits &&
    (run.split === 'train' || run.split === 'test')
  ) {
    return { ingest: run.ingest, bytes: [from!, to!], sessions: run.sessions!, split: run.split };
  }
  throw new PipelineError(
    `${whereOf(path, line)}: not a run of ingest's sessions ({"ingest":<segment>,"bytes":[from,to],"sessions":n,"split":"train"|"test"}) nor a session; run \`prefab stage split\` to write split's buckets again`,
  );
}

/** A line of a file as an error names it (a concatenation V8 makes a string of only when an error reads it). */
const whereOf = (path: string, line: number) => `${path} line ${line}`;

/** Reads `length` bytes at `position` of `fd` into `into`, as many as there are; returns how many. */
export function readAll(fd: number, into: Buffer, length: number, position: number): number {
  let got = 0;
  while (got < length) {
    const n = readSync(fd, into, got, length - got, position + got);
    if (n === 0) break;
    got += n;
  }
  return got;
}

/** Ingest's segment `name`, opened; an error names `where` pointed at it. */
export function openSegment(ingestDir: string, name: string, where: string): { fd: number; size: number } {
  try {
    const fd = openSync(join(ingestDir, 'sessions', name), 'r');
    return { fd, size: fstatSync(fd).size };
  } catch (error) {
    throw new PipelineError(
      `${where}: points at ingest's segment ${name}, which ${join(ingestDir, 'sessions')} does not hold (${(error as Error).message}); these buckets were made from another ingest: run \`prefab stage split\``,
    );
  }
}

/** A run that does not find in its segment the sessions split saw there. */
export const segmentChanged = (where: string, run: SessionRun, what: string) =>
  new PipelineError(
    `${where}: split found ${run.sessions} session(s) at bytes ${run.bytes[0]} to ${run.bytes[1]} of ingest's segment ${run.ingest}, which ${what}; it has changed since: run \`prefab stage split\``,
  );

/**
 * Reads `run` from its segment (`fd`) into `out` at `at`, each of its lines given its session's tail in
 * place of its closing brace; returns where the next line goes. The lines are read where they will end and
 * moved up from the last, so no copy of the run is made: line i moves by i times what a tail adds.
 */
export function readRun(out: Buffer, at: number, fd: number, run: SessionRun, where: string): number {
  const [from, to] = run.bytes;
  const length = to - from;
  for (let got = 0; got < length;) {
    const n = readSync(fd, out, at + got, length - got, from + got);
    if (n === 0) throw segmentChanged(where, run, `ended at byte ${from + got} while it was read`);
    got += n;
  }
  const ends: number[] = [];
  const region = out.subarray(at, at + length);
  for (let nl = region.indexOf(10); nl >= 0; nl = region.indexOf(10, nl + 1)) ends.push(at + nl);
  const shaped =
    ends.length === run.sessions &&
    ends.at(-1) === at + length - 1 &&
    ends.every((nl, i) => out[nl - 1] === 125 && out[i === 0 ? at : ends[i - 1]! + 1] === 123);
  if (!shaped) throw segmentChanged(where, run, `holds ${ends.length} line(s) there, not all sessions`);
  const tail = SESSION_TAILS[run.split];
  const extra = tail.length - 1;
  for (let i = ends.length - 1; i >= 0; i--) {
    const start = i === 0 ? at : ends[i - 1]! + 1;
    const brace = ends[i]! - 1;
    const moved = start + i * extra;
    out.copyWithin(moved, start, brace);
    tail.copy(out, moved + brace - start);
    out[moved + brace - start + tail.length] = 10;
  }
  return at + length + ends.length * extra;
}

/** The segment files of an ingest folder, in ingestion order. */
export async function sessionSegments(ingestDir: string): Promise<string[]> {
  return (await readdir(join(ingestDir, 'sessions'))).sort().map((f) => join(ingestDir, 'sessions', f));
}

/** The numbers a BucketParts row holds. */
const W = 7;

/**
 * A bucket file's lines as what is to be read for them, seven numbers a line rather than an object (a bucket
 * may hold a million runs): a run of ingest's sessions, as its segment's place in `segments` (opened), the
 * bytes `from` to `to` of it, how many sessions and its side's place in SPLITS; or a line of the file itself,
 * segment -1, from `from` to `to` of the bytes it was read from. Then the line's number, which an error
 * names, and where the line starts in those bytes.
 */
export class BucketParts {
  readonly segments: { name: string; fd: number; size: number }[] = [];
  private readonly segmentOf = new Map<string, number>();
  private rows = new Float64Array(W * 256);
  length = 0;

  /** `path`: the bucket file as an error names it. */
  constructor(
    private readonly path: string,
    private readonly ingestDir: string,
  ) {}

  /**
   * The line `line` of the bucket file, at `start` to `end` of `bytes`, as a part (a run's segment opened
   * the first time it is named; a run that reaches past its end told before any is read); returns the bytes
   * its sessions take once read.
   */
  add(bytes: Buffer, start: number, end: number, line: number): number {
    if (!holdsAt(bytes, start, RUN_HEAD)) {
      this.push(-1, start, end, 0, 0, line, start);
      return this.sessionBytes(this.length - 1);
    }
    const run = readSessionRun(bytes, start, end, this.path, line);
    let segment = this.segmentOf.get(run.ingest);
    if (segment === undefined)
      this.segmentOf.set(
        run.ingest,
        (segment =
          this.segments.push({
            name: run.ingest,
            ...openSegment(this.ingestDir, run.ingest, whereOf(this.path, line)),
          }) - 1),
      );
    const { size } = this.segments[segment]!;
    if (run.bytes[1] > size) throw segmentChanged(whereOf(this.path, line), run, `ends at byte ${size}`);
    this.push(segment, run.bytes[0], run.bytes[1], run.sessions, SPLITS.indexOf(run.split), line, start);
    return this.sessionBytes(this.length - 1);
  }

  private push(
    segment: number,
    from: number,
    to: number,
    sessions: number,
    side: number,
    line: number,
    lineStart: number,
  ): void {
    if (W * (this.length + 1) > this.rows.length) {
      const grown = new Float64Array(2 * this.rows.length);
      grown.set(this.rows);
      this.rows = grown;
    }
    const [r, at] = [this.rows, W * this.length++];
    r[at] = segment;
    r[at + 1] = from;
    r[at + 2] = to;
    r[at + 3] = sessions;
    r[at + 4] = side;
    r[at + 5] = line;
    r[at + 6] = lineStart;
  }

  /** The parts forgotten (the segments stay open), for the next block of the file. */
  clear(): void {
    this.length = 0;
  }

  /** The segments closed. */
  close(): void {
    for (const { fd } of this.segments) closeSync(fd);
  }

  /** The bytes part `i`'s sessions take once read: a run's, each session's tail added; a line's, its newline. */
  sessionBytes(i: number): number {
    const r = this.rows;
    return (
      r[W * i + 2]! -
      r[W * i + 1]! +
      (r[W * i]! >= 0 ? r[W * i + 3]! * (SESSION_TAILS[SPLITS[r[W * i + 4]!]!].length - 1) : 1)
    );
  }

  isRun(i: number): boolean {
    return this.rows[W * i]! >= 0;
  }
  segment(i: number): number {
    return this.rows[W * i]!;
  }
  from(i: number): number {
    return this.rows[W * i + 1]!;
  }
  to(i: number): number {
    return this.rows[W * i + 2]!;
  }
  fd(i: number): number {
    return this.segments[this.rows[W * i]!]!.fd;
  }
  /** Part `i`, a run, as the SessionRun its line holds. */
  run(i: number): SessionRun {
    const r = this.rows;
    return {
      ingest: this.segments[r[W * i]!]!.name,
      bytes: [r[W * i + 1]!, r[W * i + 2]!],
      sessions: r[W * i + 3]!,
      split: SPLITS[r[W * i + 4]!]!,
    };
  }
  /** Where part `i`'s line starts in the bytes it was read from. */
  lineStart(i: number): number {
    return this.rows[W * i + 6]!;
  }
  where(i: number): string {
    return whereOf(this.path, this.rows[W * i + 5]!);
  }
}
