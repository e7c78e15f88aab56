// Line-oriented files: the workspace's own record format, and the reader of JSONL inputs.
import { createReadStream, createWriteStream, type WriteStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { createGunzip } from 'node:zlib';
import type { Readable } from 'node:stream';
import { BufferShelf } from './buffers.ts';
import { PipelineError } from './errors.ts';
import { checksum, rememberChecksum, type Checksum } from './hash.ts';

/**
 * The compressed bytes of a .gz file read at once, whatever `chunk` a reader asks for: where a file is damaged,
 * zlib drops what the failing read inflated, so what comes before the damage would depend on where reads end,
 * and so on the thread count.
 */
const GZ_READ = 1 << 20;

/** A file's bytes, gunzipped when the name ends in .gz; `chunk`: bytes a read of a plain file (the stream's default: 64 KiB). */
export function openText(path: string, chunk?: number): Readable {
  if (!path.endsWith('.gz')) return createReadStream(path, { highWaterMark: chunk });
  const raw = createReadStream(path, { highWaterMark: GZ_READ });
  const gunzip = createGunzip();
  raw.on('error', (error) => gunzip.destroy(error)); // pipe() does not pass errors on
  return raw.pipe(gunzip);
}

/** Lines of a text file (gzip when the name ends in .gz), numbered from 1, without their newline or a byte order mark. */
export async function* readLines(path: string): AsyncGenerator<{ line: number; text: string }> {
  const lines = createInterface({ input: openText(path), crlfDelay: Infinity });
  let line = 0;
  for await (const text of lines) {
    line++;
    yield { line, text: line === 1 && text.startsWith('\uFEFF') ? text.slice(1) : text };
  }
}

/** Records of a JSONL file this program wrote itself: trusted, so no validation. */
export async function* readJsonl<T>(path: string): AsyncGenerator<T> {
  for await (const { text } of readLines(path)) {
    if (text.length > 0) yield JSON.parse(text) as T;
  }
}

/**
 * Appends JSON records, one a line, honouring back-pressure so memory stays bounded. Each line goes to the
 * file at once (a record written is on its way to disk, as an answer cache needs); the writer waits for the
 * disk only past 1 MiB in flight, so making records and writing them overlap (the stream's default, 16 KiB,
 * waits every few records). A file it makes anew is checksummed as it is written, so the engine need not
 * read a stage's output again (pipeline/hash.ts `outputChecksum`).
 */
export class JsonlWriter {
  private readonly stream: WriteStream;
  private readonly sum: Checksum | null;
  count = 0;

  /** `buffer`: bytes in flight past which a write waits for the disk. */
  constructor(
    readonly path: string,
    flags: 'w' | 'a' = 'w',
    buffer = 1 << 20,
  ) {
    this.stream = createWriteStream(path, { flags, highWaterMark: buffer });
    this.sum = flags === 'w' ? checksum() : null;
    // A write that fails (a full disk) is kept and thrown at the next write or the close, naming the file,
    // rather than left to end the process as an error event no one listens to.
    this.stream.on('error', (error) => (this.failure ??= error));
  }

  private failure: Error | null = null;

  /** Throws the failure a write met, naming the file. */
  private check(): void {
    if (this.failure)
      throw new PipelineError(
        `${this.path} could not be written (${this.failure.message}); the stage stops, and what it made before stays as it was`,
      );
  }

  async write(record: unknown): Promise<void> {
    await this.writeLine(JSON.stringify(record));
  }

  /** One record already made into its line, as UTF-8 with the newline (on a worker thread). */
  async writeBytes(line: Uint8Array): Promise<void> {
    this.count++;
    await this.put(line);
  }

  /**
   * `lines` records already made into lines, as UTF-8 with their newlines (on a worker thread). `written` is
   * called once the block is on its way to disk and its buffer may be filled again.
   */
  async writeBlock(block: Uint8Array, lines: number, written?: () => void): Promise<void> {
    this.count += lines;
    await this.put(block, written);
  }

  /** A record already made into its JSON text, without the newline. */
  async writeLine(json: string): Promise<void> {
    this.count++;
    await this.put(this.sum ? Buffer.from(json + '\n') : json + '\n');
  }

  private async put(data: Uint8Array | string, written?: () => void): Promise<void> {
    this.check();
    // A string comes only where there is no checksum (writeLine).
    this.sum?.update(data as Uint8Array);
    if (!this.stream.write(data, written)) await once(this.stream, 'drain').catch(() => {}); // the failure: below
    this.check();
  }

  /**
   * Bytes written so far through this writer: where the next record starts (a shard's chunk index). The
   * stream turns a string into bytes as it takes it, so what it has written plus what it holds is exact.
   */
  get bytes(): number {
    return this.stream.bytesWritten + this.stream.writableLength;
  }

  async close(): Promise<void> {
    this.check();
    this.stream.end();
    await once(this.stream, 'finish').catch(() => {}); // the failure: below
    this.check();
    if (!this.sum) return;
    const s = await stat(this.path);
    rememberChecksum(this.path, this.sum.digest(), s.size, s.mtimeMs);
  }

  /** Closes the file without writing what is still held (a stage that failed: its folder is discarded). */
  async abort(): Promise<void> {
    if (this.stream.closed) return;
    const closed = once(this.stream, 'close');
    this.stream.destroy();
    await closed;
  }
}

/**
 * Lines of JSON gathered as UTF-8 in one growing buffer, each encoded as it comes (its string dies young, and
 * there is no joining): what a worker thread hands the main thread to write as one block, or what a stage
 * gathers per output file to write in large blocks. Its buffers come from `shelf`, and go back to it as it grows.
 */
export class LineBuffer {
  private buffer: Buffer;
  /** Bytes so far: where the next line starts. */
  length = 0;
  count = 0;

  constructor(
    private readonly initial = 1 << 20,
    private readonly shelf = new BufferShelf(0),
  ) {
    this.buffer = shelf.take(initial);
  }

  private room(bytes: number): void {
    if (this.length + bytes <= this.buffer.length) return;
    const grown = this.shelf.take(Math.max(this.length + bytes, 2 * this.buffer.length, this.initial));
    this.buffer.copy(grown, 0, 0, this.length);
    this.shelf.put(this.buffer.buffer as ArrayBuffer);
    this.buffer = grown;
  }

  push(json: string): void {
    this.write(json);
    this.end();
  }

  /** A line already made into bytes (without its newline), followed by `tail`. */
  pushBytes(line: Uint8Array, tail?: Uint8Array): void {
    this.writeBytes(line);
    if (tail) this.writeBytes(tail);
    this.end();
  }

  /** Part of a line, as text. */
  write(text: string): void {
    this.room(3 * text.length); // a UTF-16 code unit is at most 3 bytes of UTF-8
    this.length += this.buffer.write(text, this.length);
  }

  /** Part of a line, as bytes. */
  writeBytes(bytes: Uint8Array): void {
    this.room(bytes.length);
    this.buffer.set(bytes, this.length);
    this.length += bytes.length;
  }

  /** Part of a line, one byte (a bracket). */
  writeByte(byte: number): void {
    this.room(1);
    this.buffer[this.length++] = byte;
  }

  /** Ends the line. */
  end(): void {
    this.writeByte(10);
    this.count++;
  }

  /** Room for `bytes` more, taken at once. */
  reserve(bytes: number): void {
    this.room(bytes);
  }

  /** The lines so far, a view valid until the buffer is written again. */
  view(): Buffer {
    return this.buffer.subarray(0, this.length);
  }

  /** Empty again, its buffer kept for the next lines. */
  clear(): void {
    this.length = 0;
    this.count = 0;
  }

  /** The lines so far, without a copy (the buffer is handed over), and the buffer empty again (taken anew when next written). */
  take(): Uint8Array {
    const lines = this.buffer.subarray(0, this.length);
    this.buffer = Buffer.allocUnsafeSlow(0);
    this.length = 0;
    this.count = 0;
    return lines;
  }
}
