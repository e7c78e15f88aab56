// Buffers kept to be filled again rather than allocated afresh (BufferShelf), in size classes.

/**
 * Buffers done with, kept to be filled again: writing to memory a process has written before costs a
 * fraction of writing to memory it has just been given (each new page is mapped on first touch, 0.5 s a GB
 * here). A stage reading and writing gigabytes through blocks of a MiB or a bucket's lines keeps a few.
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
      if (b.byteLength >= bytes && b.byteLength <= 4 * Math.max(bytes, 1 << 16) && (best < 0 || b.byteLength < this.spare[best]!.byteLength)) best = i;
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
