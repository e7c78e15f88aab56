// Buffers kept to be filled again rather than allocated afresh (BufferShelf), in size classes; and how small a file
// is read at once (SMALL_FILE).

/** Files this small are read at once on the thread that wants them, not through the thread pool (readerOf; hash.ts's hashThrough). */
export const SMALL_FILE = 1 << 20;

/**
 * Buffers done with, kept to be filled again: writing to memory a process has written before costs a
 * fraction of writing to memory it has just been given (each new page is mapped on first touch). A stage
 * reading and writing gigabytes through blocks of a MiB or a bucket's lines keeps a few.
 */
export class BufferShelf {
  private readonly spare: ArrayBuffer[] = [];

  /** `most`: spares kept at once. */
  constructor(private most = 8) {}

  /** Keeps no more than `most` spares from now on (a worker module sets its thread's). */
  keepAtMost(most: number): void {
    this.most = most;
    this.spare.sort((a, b) => b.byteLength - a.byteLength).splice(most);
  }

  /**
   * A buffer of at least `bytes`: the smallest spare one large enough and not four times larger (a small
   * request does not take a large buffer that a large one will want), else a new one (never from Node's pool
   * of small buffers, so that it can move to another thread whole). A new one is rounded up to a size class
   * (a quarter of a power of two), so that a request a few bytes larger than the last, as a block with a
   * line carried over asks, finds the buffer that one was given: a miss costs fresh pages, and malloc keeps
   * what it freed.
   */
  take(bytes: number): Buffer {
    let best = -1;
    this.spare.forEach((b, i) => {
      if (
        b.byteLength >= bytes &&
        b.byteLength <= 4 * Math.max(bytes, 1 << 16) &&
        (best < 0 || b.byteLength < this.spare[best]!.byteLength)
      )
        best = i;
    });
    return best < 0 ? Buffer.allocUnsafeSlow(sizeClass(bytes)) : Buffer.from(this.spare.splice(best, 1)[0]!);
  }

  /**
   * Keeps `buffer` to be taken again. On a full shelf it takes the place of the smallest spare, if that is
   * smaller: a buffer too small for what is asked now would otherwise keep the shelf full for good.
   */
  put(buffer: ArrayBuffer): void {
    if (buffer.byteLength === 0 || this.most === 0) return;
    if (this.spare.length < this.most) {
      this.spare.push(buffer);
      return;
    }
    let smallest = 0;
    this.spare.forEach((b, i) => b.byteLength < this.spare[smallest]!.byteLength && (smallest = i));
    if (this.spare[smallest]!.byteLength < buffer.byteLength) this.spare[smallest] = buffer;
  }
}

/** `bytes` rounded up to a multiple of a quarter of the power of two below it (at most 25% more; 4 KiB at least). */
export function sizeClass(bytes: number): number {
  if (bytes <= 4096) return 4096;
  const quarter = 2 ** (Math.floor(Math.log2(bytes)) - 2);
  return Math.ceil(bytes / quarter) * quarter;
}

/** A typed array NumberList keeps its numbers in. */
type NumberArray = Float64Array<ArrayBuffer> | Int32Array<ArrayBuffer>;

/**
 * Numbers one after another in one growing typed array, a Float64Array unless `make` makes another (an
 * Int32Array holds integers in half the memory): a large task's plan keeps a few a session, which arrays of
 * JavaScript numbers would keep on the heap through its collections.
 */
export class NumberList<A extends NumberArray = Float64Array<ArrayBuffer>> {
  private values: A;
  length = 0;

  constructor(private readonly make: (length: number) => A = (length) => new Float64Array(length) as A) {
    this.values = make(64);
  }

  get(k: number): number {
    return this.values[k]!;
  }

  set(k: number, value: number): void {
    this.values[k] = value;
  }

  push(value: number): void {
    if (this.length === this.values.length) this.grow();
    this.values[this.length++] = value;
  }

  private grow(): void {
    const grown = this.make(2 * this.values.length);
    grown.set(this.values);
    this.values = grown;
  }

  /** The numbers pushed, a view of the list's array (no copy). */
  view(): A {
    return this.values.subarray(0, this.length) as A;
  }
}
