// Readers of input records (logged sessions, imported pairs): JSONL, a JSON array, or Parquet, each streamed record by record.
import { open } from 'node:fs/promises';
import { readLines, openText } from './jsonl.ts';
import { BufferShelf } from './buffers.ts';

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

export function detectFormat(path: string): InputFormat | null {
  const name = path.toLowerCase().replace(/\.gz$/, '');
  if (name.endsWith('.jsonl') || name.endsWith('.ndjson')) return 'jsonl';
  if (name.endsWith('.json')) return 'json';
  if (name.endsWith('.parquet')) return 'parquet';
  return null;
}

/** A raw record's text as a quarantine keeps it: at most 64 KB of it, so one huge record cannot swell the file. */
export const quarantineText = (raw: string) => (raw.length > 65536 ? `${raw.slice(0, 65536)}… (${raw.length} characters in all)` : raw);

/**
 * The records of a file, one at a time. A file that cannot be read to its end yields what came before the
 * damage, then one last record (`damaged`) that says where reading stopped and why, instead of throwing:
 * one bad file never stops the others.
 */
export async function* readRecords(path: string, format: InputFormat, parse = true): AsyncGenerator<RawRecord> {
  const records = format === 'jsonl' ? readJsonlRecords(path, parse) : format === 'json' ? readJsonArray(path, parse) : parquetRecords(path);
  let reached = 'before the first record';
  try {
    for await (const record of records) {
      reached = `after ${record.where}`;
      yield record;
    }
  } catch (error) {
    yield { where: reached, raw: '', error: `${(error as Error).message} (the rest of the file is unread)`, damaged: true };
  }
}

/** A record's value, or why its text is not JSON. */
export function parseRecord(where: string, raw: string): RawRecord {
  try {
    return { where, value: JSON.parse(raw), raw };
  } catch (error) {
    return { where, raw, error: `not valid JSON (${(error as Error).message})` };
  }
}

/** With `parse` false, records of text formats come unparsed (no value): parseRecord, elsewhere, reads them. */
async function* readJsonlRecords(path: string, parse: boolean): AsyncGenerator<RawRecord> {
  for await (const { line, text } of readLines(path)) {
    if (text.trim() === '') continue;
    yield parse ? parseRecord(`line ${line}`, text) : { where: `line ${line}`, raw: text };
  }
}

/**
 * Calls `line(start, end)` for each line of a block of UTF-8 bytes, as readline splits lines: at "\n",
 * "\r\n" and a lone "\r"; a break at the block's end is not followed by an empty line. The offsets are
 * bytes, so a line's text is `block.toString('utf8', start, end)`. Returns how many lines there were.
 */
export function forEachLine(block: Buffer, line: (start: number, end: number) => void): number {
  let n = 0;
  const emit = (start: number, end: number) => {
    n++;
    line(start, end);
  };
  // Lone "\r"s are rare: only a block that has a "\r" is searched for them, a "\n"-line at a time.
  const crs = block.indexOf(13) >= 0;
  for (let from = 0; from < block.length; ) {
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
    if (bytes[i] === 0x5c) i++; // a backslash: the next byte is escaped
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

/** A block of whole lines of a JSONL file, numbered from `firstLine`; or where the file broke off. */
export type LineBlock = { bytes: Uint8Array; firstLine: number } | { damaged: string };

/**
 * A JSONL file (gzip when the name ends in .gz) as blocks of `size` bytes or more of whole lines, each in
 * a buffer of its own (so it can go to a worker thread as it is). A file that breaks off (a truncated .gz)
 * yields its whole lines before the damage, then `damaged`; the cut line is not read, as readLines does.
 * A byte order mark at the start is dropped, as readLines drops it.
 */
export async function* readLineBlocks(path: string, size = 1 << 20, shelf?: BufferShelf): AsyncGenerator<LineBlock> {
  if (!path.endsWith('.gz')) return yield* readPlainLineBlocks(path, size, shelf);
  let pieces: Buffer[] = [];
  let held = 0;
  let firstLine = 1;
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
    firstLine += forEachLine(Buffer.from(block.bytes.buffer), () => {});
    pieces = cut < last.length ? [last.subarray(cut)] : [];
    held = last.length - cut;
    return block;
  };
  try {
    // The compressed file is read a MiB at a time whatever the block size: where it is damaged, zlib drops
    // what the failing read inflated, so the lines kept before the damage depend on where reads end (two
    // files of 200 damaged midway kept other lines in blocks of 64 KiB).
    for await (const chunk of openText(path, GZ_READ) as AsyncIterable<Buffer>) {
      pieces.push(chunk);
      held += chunk.length;
      // A line longer than a block grows until a newline arrives.
      const cut = held < size ? -1 : chunk.lastIndexOf(10);
      if (cut >= 0) yield take(chunk, cut + 1);
    }
  } catch (error) {
    const last = Buffer.concat(pieces, held);
    const cut = last.lastIndexOf(10) + 1;
    pieces = [last];
    if (cut > 0) yield take(last, cut);
    yield { damaged: `${(error as Error).message} (the rest of the file is unread)` };
    return;
  }
  if (held > 0) yield take(pieces.at(-1)!, pieces.at(-1)!.length);
}

/** The bytes of a .gz file read at once (readLineBlocks). */
const GZ_READ = 1 << 20;

/**
 * readLineBlocks of a file that is not compressed: each block read straight into a buffer of its own (no
 * stream chunks to gather and copy), taken from `shelf` where the caller puts blocks it is done with; the
 * start of a line a block cuts is carried over to the next.
 */
async function* readPlainLineBlocks(path: string, size: number, shelf = new BufferShelf(0)): AsyncGenerator<LineBlock> {
  const file = await open(path, 'r');
  let carried: Uint8Array = new Uint8Array(0);
  let firstLine = 1;
  try {
    for (;;) {
      const block = shelf.take(carried.length + size);
      block.set(carried);
      // `size` bytes read, whatever room the block has past them (a shelf's buffer may be larger).
      const { bytesRead } = await file.read(block, carried.length, size, null);
      const filled = carried.length + bytesRead;
      // A line longer than a block is carried on until its newline comes.
      const cut = bytesRead === 0 ? filled : block.lastIndexOf(10, filled - 1) + 1;
      // Copied out before the block is handed on (to a thread, which takes its memory with it).
      carried = Buffer.from(block.subarray(cut, filled));
      if (cut > 0) {
        const bom = firstLine === 1 && hasBom(block);
        const bytes = block.subarray(bom ? 3 : 0, cut);
        const lines = forEachLine(bytes, () => {});
        yield { bytes, firstLine };
        firstLine += lines;
      }
      if (bytesRead === 0) return;
    }
  } finally {
    await file.close();
  }
}

/**
 * The elements of a top-level JSON array, cut out one at a time by a small scanner that tracks
 * strings and nesting, so a file larger than memory still streams.
 */
export async function* readJsonArray(path: string, parse = true): AsyncGenerator<RawRecord> {
  let line = 1;
  let started = false;
  let ended = false;
  let depth = 0; // nesting inside the current element
  let inString = false;
  let escaped = false;
  let parts: string[] = [];
  let from = -1; // start of the current element in this chunk, or -1
  let element = 0;
  let elementLine = 1;
  let awaitingElement = true; // after '[' or ',', until the element's first character

  const emit = (text: string): RawRecord | null => {
    const trimmed = text.trim();
    if (trimmed === '') return null;
    element++;
    const where = `element ${element} (line ${elementLine})`;
    return parse ? parseRecord(where, trimmed) : { where, raw: trimmed };
  };

  for await (const chunk of openText(path).setEncoding('utf8') as AsyncIterable<string>) {
    for (let i = 0; i < chunk.length; i++) {
      const c = chunk[i]!;
      if (c === '\n') line++;
      if (!started) {
        if (c === '[') {
          started = true;
          from = i + 1;
        } else if (!/\s/.test(c) && c !== '\uFEFF') {
          throw new Error(`${path}: line ${line}: expected a JSON array of records ('[' first), found '${c}'; use .jsonl for one record a line`);
        }
        continue;
      }
      if (ended) {
        if (!/\s/.test(c)) throw new Error(`${path}: line ${line}: unexpected '${c}' after the closing ']' of the array`);
        continue;
      }
      if (inString) {
        if (escaped) escaped = false;
        else if (c === '\\') escaped = true;
        else if (c === '"') inString = false;
        continue;
      }
      if (awaitingElement && !/\s/.test(c)) {
        awaitingElement = false;
        elementLine = line;
      }
      if (c === '"') inString = true;
      else if (c === '{' || c === '[') depth++;
      else if ((c === '}' || c === ']') && depth > 0) depth--;
      else if (depth === 0 && (c === ',' || c === ']')) {
        parts.push(chunk.slice(from, i));
        const record = emit(parts.join(''));
        if (record) yield record;
        parts = [];
        from = i + 1;
        awaitingElement = true;
        if (c === ']') ended = true;
      }
    }
    if (started && !ended) parts.push(chunk.slice(Math.max(from, 0)));
    from = 0;
  }
  if (!started) throw new Error(`${path}: empty file; expected a JSON array of records`);
  if (!ended) throw new Error(`${path}: line ${line}: the JSON array is not closed (the file ends inside element ${element + 1})`);
}

async function* parquetRecords(path: string): AsyncGenerator<RawRecord> {
  const { readParquetRows } = await import('./parquet.ts'); // the Parquet libraries only when a file is Parquet
  for await (const { row, value } of readParquetRows(path)) yield { where: `row ${row}`, value, raw: JSON.stringify(value) };
}
