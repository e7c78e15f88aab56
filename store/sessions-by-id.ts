// The sessions of a bucket file by id, for the stages that read pairs back (a pair's sides point into them).
import { closeSync, openSync } from 'node:fs';
import { fnv1a } from '../pipeline/hash.ts';
import { NumberList } from '../pipeline/buffers.ts';
import { PipelineError } from '../pipeline/errors.ts';
import { LineBuffer } from '../pipeline/jsonl.ts';
import { readStoredSession, type StoredSession } from './messages.ts';
import { HELD_BUCKET, StoredBucketReader } from './bucket-reader.ts';
import { openSegment, pushSessionLine, readAll, segmentChanged } from './runs.ts';
import { SESSION_TAILS, leadingSessionId } from './session-line.ts';
import { sessionLineBytes, type SpanSource } from './spans.ts';

/** How many parsed sessions SessionsById keeps: a pair's sides mostly come from one or two, and a task's pairs from a few at a time. */
const RECENT_SESSIONS = 256;

/**
 * The sessions of one bucket file at a time, by id. When a file is first asked of, where each of its
 * sessions lies is read from their heads (a block at a time), and a bucket of the usual size is kept as they
 * are read; a larger bucket's session is read when asked for. The last few asked for are kept parsed. What
 * a large bucket holds is five numbers a session, not its sessions, nor a Map from their ids.
 */
export class SessionsById {
  private path: string | null = null;
  private sources: SpanSource[] = [null];
  private fds: number[] = [];
  /** Each session in the bucket's order: its id's hash (fnv1a), then where it lies (a span of one session: source, from, to). */
  private at = new NumberList();
  /** An open-addressed table of the sessions by their ids' hashes: a session's place in `at`, plus one (0: an empty slot). */
  private table = new Uint32Array(0);
  /** The sessions last asked for, the latest last. */
  private recent = new Map<string, StoredSession>();
  /** What was last read: `bytes` from byte `from` of source `source` (a view into `aheadRoom`). */
  private ahead = { source: -1, from: 0, bytes: Buffer.alloc(0) };
  private aheadRoom = Buffer.allocUnsafeSlow(READ_AHEAD);
  /** A bucket of at most `heldBytes` of sessions, held as `sessions` gives it (`heldLines`), with where each session's line starts; null for a larger one. */
  private held: NumberList | null = null;
  private readonly heldLines = new LineBuffer(0);

  /** `heldBytes`: the largest bucket held whole (HELD_BUCKET; a test's 0 reads every session as asked). */
  constructor(
    private readonly ingestDir: string,
    private readonly reader = new StoredBucketReader(),
    private readonly heldBytes = HELD_BUCKET,
  ) {}

  /** Session `id` of bucket file `path`, or undefined where the file has none; the file is indexed when it is not the last one asked of. */
  get(path: string, id: string): StoredSession | undefined {
    if (path !== this.path) this.index(path);
    const kept = this.recent.get(id);
    if (kept) {
      this.recent.delete(id);
      this.recent.set(id, kept);
      return kept;
    }
    const [h, mask] = [fnv1a(id), this.table.length - 1];
    // Sessions whose ids have the same hash are read in turn until one has the id.
    for (let slot = h & mask; this.table[slot] !== 0; slot = (slot + 1) & mask) {
      const n = this.table[slot]! - 1;
      if (this.at.get(4 * n) !== h) continue;
      const session = readStoredSession(this.line(path, n));
      if (session.session_id !== id) continue;
      this.recent.set(id, session);
      if (this.recent.size > RECENT_SESSIONS) this.recent.delete(this.recent.keys().next().value!);
      return session;
    }
    return undefined;
  }

  /** The segments and bucket file read from, closed; the bucket stays indexed, and they open again when a session is read. */
  close(): void {
    for (const fd of this.fds) if (fd !== undefined) closeSync(fd);
    this.fds = [];
  }

  private index(path: string): void {
    this.close();
    this.path = null;
    [this.sources, this.at, this.recent, this.ahead] = [
      [null],
      new NumberList(),
      new Map(),
      { source: -1, from: 0, bytes: Buffer.alloc(0) },
    ];
    // A bucket of the usual size is held as its heads are read (its sessions are then read at once, not each
    // on its own); a larger one is read as pairs ask.
    const size = this.reader.sessionBytes(path, this.ingestDir);
    const held = (this.held = size <= this.heldBytes ? new NumberList() : null);
    this.heldLines.clear();
    if (held) this.heldLines.reserve(size);
    this.reader.eachSession(
      path,
      this.ingestDir,
      (bytes, start, end, source, from, to) => {
        this.at.push(fnv1a(leadingSessionId(bytes, start, end)));
        this.at.push(source);
        this.at.push(from);
        this.at.push(to);
        if (!held) return;
        const s = this.sources[source];
        held.push(this.heldLines.length);
        pushSessionLine(this.heldLines, bytes, start, end, s ? SESSION_TAILS[s.split] : null);
      },
      this.sources,
    );
    // At most half the slots taken, so that a search meets an empty one soon.
    const n = this.at.length / 4;
    let slots = 16;
    while (slots < 2 * n) slots *= 2;
    this.table = new Uint32Array(slots);
    for (let k = 0; k < n; k++) {
      let slot = this.at.get(4 * k) & (slots - 1);
      while (this.table[slot] !== 0) slot = (slot + 1) & (slots - 1);
      this.table[slot] = k + 1;
    }
    this.path = path;
  }

  /**
   * Session `n`'s line as `sessions` gives it (its tail added), without its newline: a view of the held
   * bucket, or a buffer of its own, read with what follows it in its segment or the bucket file, READ_AHEAD
   * bytes at once (the next pairs mostly ask for the sessions after it).
   */
  private line(path: string, n: number): Buffer {
    const [source, from, to] = [this.at.get(4 * n + 1), this.at.get(4 * n + 2), this.at.get(4 * n + 3)];
    if (this.held) {
      // Valid until the next bucket is indexed, as `sessions` gives them.
      const start = this.held.get(n);
      return this.heldLines.view().subarray(start, start + sessionLineBytes(this.sources, source, from, to) - 1);
    }
    const s = this.sources[source]!;
    let a = this.ahead;
    if (a.source !== source || from < a.from || to > a.from + a.bytes.length) {
      const fd = (this.fds[source] ??= s ? openSegment(this.ingestDir, s.ingest, path).fd : openSync(path, 'r'));
      if (to - from > this.aheadRoom.length) this.aheadRoom = Buffer.allocUnsafeSlow(to - from);
      const got = readAll(fd, this.aheadRoom, this.aheadRoom.length, from);
      const run = s && { ingest: s.ingest, bytes: [from, to] as [number, number], sessions: 1, split: s.split };
      if (got < to - from)
        throw run
          ? segmentChanged(`${path} (a run of its lines)`, run, `ended at byte ${from + got} while it was read`)
          : new PipelineError(
              `${path}: ended before byte ${to} while it was read again; it changed while this stage ran: run it again`,
            );
      a = this.ahead = { source, from, bytes: this.aheadRoom.subarray(0, got) };
    }
    const line = a.bytes.subarray(from - a.from, to - a.from);
    if (!s) return Buffer.from(line);
    // A run's line ends with its closing brace and newline, which its session's tail replaces.
    if (line[0] !== 123 || line[line.length - 2] !== 125 || line[line.length - 1] !== 10)
      throw segmentChanged(
        `${path} (a run of its lines)`,
        { ingest: s.ingest, bytes: [from, to], sessions: 1, split: s.split },
        'holds no session there',
      );
    return Buffer.concat([line.subarray(0, line.length - 2), SESSION_TAILS[s.split]]);
  }
}

/** What SessionsById reads of a segment or a bucket file at once. */
const READ_AHEAD = 256 << 10;
