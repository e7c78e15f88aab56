// Readers of input records (logged sessions, imported pairs): JSONL, a JSON array, or Parquet, each streamed record by record.
import { closeSync, fstatSync, openSync, read, readSync } from 'node:fs';
import { openText } from './jsonl.ts';
import { BufferShelf, SMALL_FILE } from './buffers.ts';
import { Interrupted } from './interrupt.ts';

export type InputFormat = 'jsonl' | 'json' | 'parquet';

/** One input record, or the reason it could not be read; `where` names its line, element or row. */
export interface RawRecord {
  where: string;
  value?: unknown;
  raw: string;
  error?: string;
  /** The file broke off here (a truncated .gz, a corrupt Parquet, an array cut short): this is its last record, and `error` says why. */
  damaged?: boolean;
}

/** Each dotted path's keys, split once: a mapping reads the same few paths of every record. */
const pathKeys = new Map<string, string[]>();

/** The value at a dotted path of a record ("data.turns"), or undefined where the path leaves the objects. */
export function getPath(record: unknown, path: string): unknown {
  let value: unknown = record;
  let keys = pathKeys.get(path);
  if (!keys) pathKeys.set(path, (keys = path.split('.')));
  for (const key of keys) {
    if (value === null || typeof value !== 'object' || Array.isArray(value)) return undefined;
    value = (value as Record<string, unknown>)[key];
  }
  return value;
}

/**
 * How deep a parsed JSON value nests, counted without recursion (code that walks it recursively, as
 * JSON.stringify does, overflows the stack on a value nested tens of thousands deep); stops past `limit`.
 */
export function jsonDepth(value: unknown, limit: number): number {
  let deepest = 0;
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length) {
    const [v, d] = stack.pop()!;
    if (v === null || typeof v !== 'object') continue;
    deepest = Math.max(deepest, d);
    if (deepest > limit) return deepest;
    for (const child of Array.isArray(v) ? v : Object.values(v))
      if (child !== null && typeof child === 'object') stack.push([child, d + 1]);
  }
  return deepest;
}

export function detectFormat(path: string): InputFormat | null {
  const name = path.toLowerCase().replace(/\.gz$/, '');
  if (name.endsWith('.jsonl') || name.endsWith('.ndjson')) return 'jsonl';
  if (name.endsWith('.json')) return 'json';
  if (name.endsWith('.parquet')) return 'parquet';
  return null;
}

/** A line of a stage's quarantine.jsonl (ingest's, import's): a record that could not be read, where it was and why. */
export interface QuarantineRecord {
  file: string;
  where: string;
  reason: string;
  raw: string;
}

/** A quarantine reason with its numbers and quoted values blanked (at most 200 characters), so alike reasons count together. */
export function reasonKind(reason: string): string {
  const alike = reason.replace(/\d+/g, '#').replace(/'[^']*'/g, "'…'");
  return alike.length > 200 ? `${alike.slice(0, 200)}…` : alike;
}

/** A raw record's text as a quarantine keeps it: at most `max` characters (64 K), so one huge record cannot swell the file. */
export const quarantineText = (raw: string, max = 65536) =>
  raw.length > max ? `${raw.slice(0, max)}… (${raw.length} characters in all)` : raw;

/**
 * The records of a file, one at a time. A file that cannot be read to its end yields what came before the
 * damage, then one last record (`damaged`) that says where reading stopped and why, instead of throwing:
 * one bad file never stops the others. Parquet is read on a thread of its own (readParquetRecords), where a
 * row group too large for memory ends that thread, not the process.
 */
export async function* readRecords(
  path: string,
  format: InputFormat,
  limit: LineLimit = NO_LIMIT,
): AsyncGenerator<RawRecord> {
  if (format === 'parquet') return yield* (await import('./parquet.ts')).readParquetRecords(path); // the Parquet libraries only when a file is Parquet
  yield* untilDamaged(path, format === 'jsonl' ? readJsonlRecords(path, limit) : readJsonArray(path, limit));
}

/**
 * The longest record a reader holds, `bytes`, set by the config key `key`: a longer JSONL line is a record that
 * says so (recordLimit's reason), its rest passed over; `signal` stops that passing when the run is stopped.
 */
export function recordLimit(bytes: number, key: string, signal?: AbortSignal): LineLimit {
  return {
    bytes,
    key,
    signal,
    reason: (n) =>
      `the record is ${n.toLocaleString('en-US')} bytes, more than ${key} (${bytes.toLocaleString('en-US')}): passed over unread from there to its newline, its first 64 KiB kept here; raise the limit if records are this long`,
  };
}

/** A Parquet file's records read on this thread, as readRecords gives records: on the thread readParquetRecords reads it on. */
export const readParquetHere = (path: string) => untilDamaged(path, parquetRecords(path));

/**
 * Why reading `path` stopped, for the record of its damage (which names the file, so a reader's message is
 * taken without the path it may start with).
 */
export function damageReason(path: string, error: unknown): string {
  const message = error instanceof Error ? error.message : String(error);
  return `${message.startsWith(`${path}: `) ? message.slice(path.length + 2) : message} (the rest of the file is unread)`;
}

/** `records` up to a failure, which becomes a last record, `damaged`, saying where and why. */
async function* untilDamaged(path: string, records: AsyncIterable<RawRecord>): AsyncGenerator<RawRecord> {
  let reached = 'before the first record';
  try {
    for await (const record of records) {
      reached = `after ${record.where}`;
      yield record;
    }
  } catch (error) {
    yield { where: reached, raw: '', error: damageReason(path, error), damaged: true };
  }
}

/** Records in batches of about 1 MiB of text, or 1,024 records. */
export async function* recordBatches(records: AsyncIterable<RawRecord>): AsyncGenerator<RawRecord[]> {
  let batch: RawRecord[] = [];
  let chars = 0;
  for await (const record of records) {
    batch.push(record);
    chars += record.raw.length;
    if (chars >= 1 << 20 || batch.length >= 1024) {
      yield batch;
      [batch, chars] = [[], 0];
    }
  }
  if (batch.length) yield batch;
}

/** A record's value, or why its text is not JSON. */
export function parseRecord(where: string, raw: string): RawRecord {
  try {
    return { where, value: JSON.parse(raw), raw };
  } catch (error) {
    return { where, raw, error: `not valid JSON (${(error as Error).message})` };
  }
}

/** A JSONL file's records, a line at a time: read in blocks, so a line past `limit` is never held whole. */
async function* readJsonlRecords(path: string, limit: LineLimit): AsyncGenerator<RawRecord> {
  for await (const block of readLineBlocks(path, 1 << 20, new BufferShelf(0), limit)) {
    if ('damaged' in block) throw new Error(block.damaged);
    if ('records' in block) {
      yield* block.records;
      continue;
    }
    const bytes = Buffer.from(block.bytes.buffer, block.bytes.byteOffset, block.bytes.byteLength);
    const records: RawRecord[] = [];
    let line = block.firstLine;
    forEachLine(bytes, (start, end) => {
      const text = bytes.toString('utf8', start, end);
      if (text.trim() !== '') records.push(parseRecord(`line ${line}`, text));
      line++;
    });
    yield* records;
  }
}

/**
 * Calls `line(start, end, n)` for the n-th line (from 1) of a block of UTF-8 bytes, as readline splits lines:
 * at "\n", "\r\n" and a lone "\r"; a break at the block's end is not followed by an empty line. The offsets
 * are bytes, so a line's text is `block.toString('utf8', start, end)`. `skipEmpty`: lines empty between two
 * "\n"s are counted but not called. Returns how many lines there were.
 */
export function forEachLine(
  block: Buffer,
  line: (start: number, end: number, n: number) => void,
  skipEmpty = false,
): number {
  let n = 0;
  const emit = (start: number, end: number) => {
    n++;
    line(start, end, n);
  };
  // Lone "\r"s are rare: only a block that has a "\r" is searched for them, a "\n"-line at a time.
  const crs = block.indexOf(13) >= 0;
  for (let from = 0; from < block.length;) {
    if (skipEmpty && block[from] === 10) {
      // A run of "\n"s is that many empty lines, counted without a call each: a file of nothing but
      // newlines (a tiny gzip can hold gigabytes of them) is read at the speed of this loop.
      let run = from;
      while (run < block.length && block[run] === 10) run++;
      n += run - from;
      from = run;
      continue;
    }
    const nl = block.indexOf(10, from);
    const stop = nl < 0 ? block.length : nl;
    let start = from;
    if (crs) {
      const text = block.subarray(from, stop);
      for (let cr = text.indexOf(13); cr >= 0; cr = text.indexOf(13, cr + 1)) {
        if (from + cr + 1 === stop && nl >= 0) break; // "\r\n": one break, the "\n"'s
        emit(start, from + cr);
        start = from + cr + 1;
      }
    }
    const end = nl >= 0 && block[stop - 1] === 13 && stop - 1 >= start ? stop - 1 : stop;
    if (nl >= 0 || start < end) emit(start, end);
    from = stop + 1;
  }
  return n;
}

/** The end (just past its closing quote) of the JSON string whose opening quote is at `at` of `bytes`, or -1: escapes skipped, nothing else checked. */
export function jsonStringEnd(bytes: Uint8Array, at: number, end = bytes.length): number {
  for (let i = at + 1; i < end; i++) {
    if (bytes[i] === 0x5c)
      i++; // a backslash: the next byte is escaped
    else if (bytes[i] === 0x22) return i + 1;
  }
  return -1;
}

/** Whether `bytes` holds `literal` at `at`. */
export function holdsAt(bytes: Uint8Array, at: number, literal: Uint8Array): boolean {
  if (at < 0 || at + literal.length > bytes.length) return false;
  for (let i = 0; i < literal.length; i++) if (bytes[at + i] !== literal[i]) return false;
  return true;
}

/** Whether a block starts with a UTF-8 byte order mark. */
const hasBom = (bytes: Uint8Array) => bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf;

/**
 * A block of whole lines of a JSONL file, numbered from `firstLine`; a line too long to read (LineLimit), as a
 * record that says so; or where the file broke off.
 */
export type LineBlock = WholeLines | { records: [RawRecord] } | { damaged: string };

/** Whole lines of a file, numbered from `firstLine`. */
type WholeLines = { bytes: Uint8Array; firstLine: number };

/**
 * The longest line a reader holds (`bytes`), and what to say of a longer one (`reason`, given its length);
 * `signal`: an aborted run stops a reader passing over such a line, however long.
 */
export interface LineLimit {
  bytes: number;
  /** The config key that sets `bytes`, for the messages. */
  key?: string;
  reason: (bytes: number) => string;
  signal?: AbortSignal;
}

/** No line too long to hold: the engine's own files. */
const NO_LIMIT: LineLimit = { bytes: Infinity, reason: () => '' };

/** Stops a reader passing over a long line when the run was asked to stop (its reads give signals their turn). */
function throwIfAborted(limit: LineLimit): void {
  if (limit.signal?.aborted)
    throw new Interrupted('stopped while passing over a line too long to read; the next run reads the file again');
}

/** The record of a line longer than the limit: its reason, its first 64 KiB as its text. */
const tooLong = (limit: LineLimit, line: number, bytes: number, head: Uint8Array): { records: [RawRecord] } => ({
  records: [
    {
      where: `line ${line}`,
      raw: Buffer.from(head.buffer, head.byteOffset, Math.min(head.length, 65536)).toString('utf8'),
      error: limit.reason(bytes),
    },
  ],
});

/**
 * A JSONL file (gzip when the name ends in .gz) as blocks of `size` bytes or more of whole lines, each in
 * a buffer of its own (so it can go to a worker thread as it is). A file that breaks off (a truncated .gz)
 * yields its whole lines before the damage, then `damaged`; the cut line is not read, as readLines does.
 * A byte order mark at the start is dropped, as readLines drops it. A line longer than `limit.bytes` is not
 * held: its first bytes are kept, the rest passed over to its newline, and it comes as a record with the
 * limit's reason, so that memory stays bounded whatever the file holds.
 */
export function readLineBlocks(
  path: string,
  size?: number,
  shelf?: BufferShelf,
): AsyncGenerator<Exclude<LineBlock, { records: [RawRecord] }>>;
export function readLineBlocks(
  path: string,
  size: number,
  shelf: BufferShelf,
  limit: LineLimit,
): AsyncGenerator<LineBlock>;
export async function* readLineBlocks(
  path: string,
  size = 1 << 20,
  shelf?: BufferShelf,
  limit: LineLimit = NO_LIMIT,
): AsyncGenerator<LineBlock> {
  if (!path.endsWith('.gz')) return yield* readPlainLineBlocks(path, size, shelf, limit);
  let pieces: Buffer[] = [];
  let held = 0;
  let firstLine = 1;
  // A line past the limit: its first bytes, and how many of it have come; null while reading lines.
  let passing: { head: Uint8Array; bytes: number } | null = null;
  // The held pieces and the first `cut` bytes of `last`, copied once into a block of their own.
  const take = (last: Buffer, cut: number): LineBlock => {
    const bytes = new Uint8Array(held - last.length + cut);
    let at = 0;
    for (const p of pieces.slice(0, -1)) {
      bytes.set(p, at);
      at += p.length;
    }
    bytes.set(last.subarray(0, cut), at);
    // A byte order mark is not part of the first record (it is whole in the first block: no newline comes before it).
    const bom = firstLine === 1 && hasBom(bytes);
    const block = { bytes: bom ? bytes.slice(3) : bytes, firstLine };
    firstLine += forEachLine(Buffer.from(block.bytes.buffer), () => {}, true);
    pieces = cut < last.length ? [last.subarray(cut)] : [];
    held = last.length - cut;
    return block;
  };
  try {
    // openText reads the compressed bytes the same way whatever the block size (where a file is damaged,
    // what is kept before the damage depends on it).
    for await (const raw of openText(path) as AsyncIterable<Buffer>) {
      let chunk = raw;
      if (passing) {
        throwIfAborted(limit);
        const newline = chunk.indexOf(10);
        passing.bytes += newline < 0 ? chunk.length : newline;
        if (newline < 0) continue;
        yield tooLong(limit, firstLine++, passing.bytes, passing.head);
        passing = null;
        chunk = chunk.subarray(newline + 1);
      }
      pieces.push(chunk);
      held += chunk.length;
      // A line longer than a block grows until a newline arrives, up to the limit.
      const cut = held < size ? -1 : chunk.lastIndexOf(10);
      if (cut >= 0) yield take(chunk, cut + 1);
      if (held > limit.bytes) {
        // The whole lines before the long one go first; then the long one is passed over.
        let rest = Buffer.concat(pieces, held);
        const newline = rest.lastIndexOf(10);
        if (newline >= 0) {
          pieces = [rest];
          yield take(rest, newline + 1);
          rest = Buffer.concat(pieces, held);
        }
        if (held > limit.bytes) {
          passing = { head: Buffer.from(rest.subarray(0, 65536)), bytes: held };
          [pieces, held] = [[], 0];
        }
      }
    }
    if (passing) yield tooLong(limit, firstLine++, passing.bytes, passing.head);
  } catch (error) {
    const last = Buffer.concat(pieces, held);
    const cut = last.lastIndexOf(10) + 1;
    pieces = [last];
    if (cut > 0) yield take(last, cut);
    yield { damaged: damageReason(path, error) };
    return;
  }
  if (held > 0) yield take(pieces.at(-1)!, pieces.at(-1)!.length);
}

/**
 * readLineBlocks of a file that is not compressed: each block read straight into a buffer of its own (no
 * stream chunks to gather and copy), taken from `shelf` where the caller puts blocks it is done with; the
 * start of a line a block cuts is carried over to the next.
 */
async function* readPlainLineBlocks(
  path: string,
  size: number,
  shelf = new BufferShelf(0),
  limit: LineLimit,
): AsyncGenerator<LineBlock> {
  const file = openSync(path, 'r');
  let carried: Uint8Array = new Uint8Array(0);
  let firstLine = 1;
  try {
    const read = readerOf(file);
    for (;;) {
      if (carried.length > limit.bytes) {
        // A line past the limit: its first bytes kept, the rest read into one block and passed over.
        const head = carried.slice(0, 65536);
        let bytes = carried.length;
        const block = shelf.take(size);
        for (let got = -1; ;) {
          throwIfAborted(limit);
          got = await read(block, 0, size);
          const newline = block.subarray(0, got).indexOf(10);
          bytes += newline < 0 ? got : newline;
          if (newline >= 0 || got === 0) {
            carried = Buffer.from(block.subarray(newline + 1, newline < 0 ? 0 : got));
            break;
          }
        }
        yield tooLong(limit, firstLine++, bytes, head);
      }
      const block = shelf.take(carried.length + size);
      block.set(carried);
      // `size` bytes read, whatever room the block has past them (a shelf's buffer may be larger).
      const bytesRead = await read(block, carried.length, size);
      const filled = carried.length + bytesRead;
      // A line longer than a block is carried on until its newline comes.
      const cut = bytesRead === 0 ? filled : block.lastIndexOf(10, filled - 1) + 1;
      // Copied out before the block is handed on (to a thread, which takes its memory with it).
      carried = Buffer.from(block.subarray(cut, filled));
      if (cut > 0) {
        const bom = firstLine === 1 && hasBom(block);
        const bytes = block.subarray(bom ? 3 : 0, cut);
        const lines = forEachLine(bytes, () => {}, true);
        yield { bytes, firstLine };
        firstLine += lines;
      }
      if (bytesRead === 0) return;
    }
  } finally {
    closeSync(file);
  }
}

/**
 * Reads of an open file at its position, each as `fs.read` makes it on the thread pool, or, for a file of a
 * MiB or less, at once on this thread: where a night brings hundreds of small files, each read's round trip
 * to the pool and back (on two busy cores) would add up to most of the time.
 */
function readerOf(fd: number): (into: Uint8Array, at: number, length: number) => Promise<number> {
  if (fstatSync(fd).size <= SMALL_FILE)
    return (into, at, length) => Promise.resolve(readSync(fd, into, at, length, null));
  return (into, at, length) =>
    new Promise((resolve, reject) =>
      read(fd, into, at, length, null, (error, bytesRead) => (error ? reject(error) : resolve(bytesRead))),
    );
}

/** The elements of a JSON array, one at a time (readElementBlocks cuts them out). */
export async function* readJsonArray(path: string, limit: LineLimit = NO_LIMIT): AsyncGenerator<RawRecord> {
  for await (const { bytes, elements } of readElementBlocks(path, 1 << 20, undefined, limit.bytes, limit.key)) {
    const block = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    for (let e = 0; e < elements.length; e += ELEMENT_FIELDS) {
      const where = elementWhere(elements, e);
      const raw = block.toString('utf8', elements[e]!, elements[e + 1]!);
      yield parseRecord(where, raw);
    }
  }
}

/**
 * Whole elements of a JSON array in a block of its bytes: per element, ELEMENT_FIELDS numbers: where its
 * text starts and ends in the block (the blank around it left out), its number, and the line it starts on.
 */
export interface ElementBlock {
  bytes: Uint8Array;
  elements: Uint32Array;
}

export const ELEMENT_FIELDS = 4;

/** How a record names element `e` (its first number's index) of an ElementBlock's. */
export const elementWhere = (elements: Uint32Array, e: number) =>
  `element ${elements[e + 2]} (line ${elements[e + 3]})`;

/**
 * A top-level JSON array (gzip when the name ends in .gz) as blocks of `size` bytes or more of whole
 * elements, each in a buffer of its own (so it can go to a worker thread as it is, as a JSONL file's lines
 * go), taken from `shelf` where the caller puts blocks it is done with. The elements are cut out by a scanner
 * of the bytes that tracks strings and nesting (ArrayScanner), so a file larger than memory still streams;
 * blank elements (`[1,,2]`) are left out. A file that is not an array, has more after it, breaks off, or
 * holds an element longer than `maxElement` bytes (set by the config key `key`) throws, once the whole elements
 * before that are given.
 */
export async function* readElementBlocks(
  path: string,
  size = 1 << 20,
  shelf = new BufferShelf(0),
  maxElement = Infinity,
  key = 'max_record_bytes',
): AsyncGenerator<ElementBlock> {
  const scanner = new ArrayScanner(path);
  let pending = shelf.take(2 * size);
  let filled = 0;
  // The whole elements scanned, in a block of their own; what follows them is carried on into the next.
  const cut = (): ElementBlock => {
    const at = scanner.cutAt;
    const next = shelf.take(Math.max(2 * size, filled - at + size));
    next.set(pending.subarray(at, filled));
    const block = { bytes: pending.subarray(0, at), elements: scanner.take(pending.subarray(0, at)) };
    [pending, filled] = [next, filled - at];
    return block;
  };
  let failure: unknown = null;
  try {
    for await (const chunk of openText(path, size) as AsyncIterable<Buffer>) {
      if (filled + chunk.length > pending.length) {
        // An element larger than the buffer: it grows until the element ends.
        const larger = shelf.take(2 * (filled + chunk.length));
        larger.set(pending.subarray(0, filled));
        shelf.put(pending.buffer as ArrayBuffer);
        pending = larger;
      }
      pending.set(chunk, filled);
      filled += chunk.length;
      scanner.scan(pending.subarray(0, filled), false);
      if (filled >= size && scanner.whole > 0) yield cut();
      // An element is not held past the limit: unlike a line, where it ends is only known by reading it.
      if (scanner.whole === 0 && filled - scanner.cutAt > maxElement)
        throw new Error(
          `an element of more than ${maxElement} bytes, longer than a record may be (${key}): it and the elements after it are not read; raise the limit, or write the records as JSONL`,
        );
    }
    scanner.scan(pending.subarray(0, filled), true);
  } catch (error) {
    failure = error;
  }
  if (scanner.whole > 0) yield cut();
  if (failure) throw failure;
}

/**
 * Finds the elements of a top-level JSON array in its bytes as they come, a scan at a time: strings (their
 * escapes), nesting and the array's own brackets and commas, nothing else checked (an element is parsed
 * later, and reported if it is not JSON). Blank is what JavaScript's \s is (the byte order mark included),
 * as before the array, after it and around an element. Lines count every newline, inside strings too.
 */
class ArrayScanner {
  /** Where the next scan starts. */
  private at = 0;
  private started = false;
  private ended = false;
  private depth = 0;
  private inString = false;
  /** In a string, the byte at `at` is escaped (the scan before stopped on its backslash). */
  private escaped = false;
  /** The element being scanned: its first byte that is not blank (-1 while there is none), and just past its last. */
  private elementStart = -1;
  private elementEnd = 0;
  private element = 0;
  /** `line` is the line of byte `counted`. */
  private line = 1;
  private counted = 0;
  private readonly found: number[] = [];
  /** Just past the array's last bracket or comma scanned: the block of whole elements ends there. */
  cutAt = 0;

  constructor(private readonly path: string) {}

  /** Elements found and not yet taken. */
  get whole(): number {
    return this.found.length / ELEMENT_FIELDS;
  }

  /** The elements found, for a block of the bytes up to cutAt; positions from here on are counted from there. */
  take(block: Uint8Array): Uint32Array {
    const elements = Uint32Array.from(this.found);
    this.found.length = 0;
    const at = this.cutAt;
    this.lineAt(block, at);
    this.at -= at;
    this.counted -= at;
    if (this.elementStart >= 0) [this.elementStart, this.elementEnd] = [this.elementStart - at, this.elementEnd - at];
    this.cutAt = 0;
    return elements;
  }

  /** Scans `b` (every byte so far, from where the last block was cut) from where the last scan stopped; `last`: nothing more comes. */
  scan(b: Buffer, last: boolean): void {
    let i = this.at;
    const n = b.length;
    while (i < n) {
      if (this.inString) {
        const end = this.stringEnd(b, i);
        if (end < 0) {
          i = n;
          break;
        }
        this.inString = false;
        this.elementEnd = i = end;
        continue;
      }
      const c = b[i]!;
      if (c === 0x20 || (c >= 0x09 && c <= 0x0d)) {
        i++;
        continue;
      }
      // A character past ASCII outside a string: blank (as U+00A0 is) or part of an element.
      if (c >= 0x80) {
        const length = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        if (i + length > n && !last) break; // the rest of it comes with the next scan
        if (!/^\s$/u.test(b.toString('utf8', i, i + length))) this.notBlank(b, i, i + length);
        i += length;
        continue;
      }
      if (!this.started) {
        if (c !== 0x5b)
          throw this.error(
            b,
            i,
            `expected a JSON array of records ('[' first), found '${b.toString('utf8', i, i + 1)}'; use .jsonl for one record a line`,
          );
        this.started = true;
        this.cutAt = ++i;
        continue;
      }
      if (this.ended)
        throw this.error(b, i, `unexpected '${b.toString('utf8', i, i + 1)}' after the closing ']' of the array`);
      if (this.depth === 0 && (c === 0x2c || c === 0x5d)) {
        if (this.elementStart >= 0) {
          this.found.push(this.elementStart, this.elementEnd, ++this.element, this.lineAt(b, this.elementStart));
          this.elementStart = -1;
        }
        if (c === 0x5d) this.ended = true;
        this.cutAt = ++i;
        continue;
      }
      this.notBlank(b, i, i + 1);
      if (c === 0x22) this.inString = true;
      else if (c === 0x7b || c === 0x5b) this.depth++;
      else if ((c === 0x7d || c === 0x5d) && this.depth > 0) this.depth--;
      i++;
    }
    this.at = i;
    if (!last) return;
    if (!this.started) throw new Error(`${this.path}: empty file; expected a JSON array of records`);
    if (!this.ended)
      throw this.error(b, n, `the JSON array is not closed (the file ends inside element ${this.element + 1})`);
  }

  /** Bytes `from` to `to` are part of what is scanned, not blank: before or after the array, an error. */
  private notBlank(b: Buffer, from: number, to: number): void {
    const found = () => b.toString('utf8', from, to);
    if (!this.started)
      throw this.error(
        b,
        from,
        `expected a JSON array of records ('[' first), found '${found()}'; use .jsonl for one record a line`,
      );
    if (this.ended) throw this.error(b, from, `unexpected '${found()}' after the closing ']' of the array`);
    if (this.elementStart < 0) this.elementStart = from;
    this.elementEnd = to;
  }

  /**
   * Where the string being scanned ends (just past its closing quote), from `i`; -1 where it runs on past
   * the bytes so far. A few bytes are looked at one by one (most strings are short), then the quotes are
   * looked for, each taken when the backslashes before it are even in number.
   */
  private stringEnd(b: Buffer, i: number): number {
    const n = b.length;
    if (this.escaped) {
      if (i >= n) return -1;
      [i, this.escaped] = [i + 1, false];
    }
    for (const quick = Math.min(n, i + 32); i < quick; i++) {
      const c = b[i]!;
      if (c === 0x22) return i + 1;
      if (c === 0x5c && ++i >= n) {
        this.escaped = true;
        return -1;
      }
    }
    for (;;) {
      const quote = b.indexOf(0x22, i);
      const stop = quote < 0 ? n : quote;
      let k = stop - 1;
      while (k >= i && b[k] === 0x5c) k--;
      const odd = ((stop - 1 - k) & 1) === 1;
      if (quote < 0) {
        this.escaped = odd;
        return -1;
      }
      if (!odd) return quote + 1;
      i = quote + 1;
    }
  }

  /** The line of byte `at` (which never goes back from one call to the next). */
  private lineAt(b: Uint8Array, at: number): number {
    for (let nl = b.indexOf(0x0a, this.counted); nl >= 0 && nl < at; nl = b.indexOf(0x0a, nl + 1)) this.line++;
    this.counted = at;
    return this.line;
  }

  private error(b: Uint8Array, at: number, what: string): Error {
    return new Error(`${this.path}: line ${this.lineAt(b, at)}: ${what}`);
  }
}

/** A Parquet file's records: each row's text, and its value only where the text does not give it back. */
async function* parquetRecords(path: string): AsyncGenerator<RawRecord> {
  const { readParquetTexts } = await import('./parquet.ts');
  for await (const { row, raw, value } of readParquetTexts(path))
    yield value === undefined ? { where: `row ${row}`, raw } : { where: `row ${row}`, raw, value };
}
