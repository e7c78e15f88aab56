// The set of session ids already ingested, at 16 bytes an id: the only ingest state that grows with input.
import { sha256Bytes, uint32LE } from '../../pipeline/hash.ts';
import { readFile, writeFile } from 'node:fs/promises';

/** An open-addressing hash set of 64-bit id hashes (a collision needs ~4e9 ids to be likely). */
export class SessionIdSet {
  private table: Uint32Array; // pairs (hi, lo); (0, 0) is empty
  size = 0;

  constructor(capacity = 1 << 12) {
    this.table = new Uint32Array(capacity * 2);
  }

  /** The id's 64 bits as the set keeps them (worked out on a worker thread, where ingest has some). */
  static key(id: string): [number, number] {
    const digest = sha256Bytes(id); // one call, no Hash object per id
    return [uint32LE(digest, 0), (uint32LE(digest, 4) | 1) >>> 0]; // lo is never 0: (0, 0) marks an empty slot
  }

  /** Adds the id; false when it was already there. */
  add(id: string): boolean {
    return this.addKey(...SessionIdSet.key(id));
  }

  /** Adds an id by its key (`SessionIdSet.key`); false when it was already there. */
  addKey(hi: number, lo: number): boolean {
    if ((this.size + 1) * 2 > this.table.length / 2) this.grow();
    return this.insert(hi, lo);
  }

  has(id: string): boolean {
    const [hi, lo] = SessionIdSet.key(id);
    const slots = this.table.length / 2;
    for (let i = hi % slots; ; i = (i + 1) % slots) {
      if (this.table[2 * i + 1] === 0) return false;
      if (this.table[2 * i] === hi && this.table[2 * i + 1] === lo) return true;
    }
  }

  private insert(hi: number, lo: number): boolean {
    const slots = this.table.length / 2;
    for (let i = hi % slots; ; i = (i + 1) % slots) {
      if (this.table[2 * i + 1] === 0) {
        this.table[2 * i] = hi;
        this.table[2 * i + 1] = lo;
        this.size++;
        return true;
      }
      if (this.table[2 * i] === hi && this.table[2 * i + 1] === lo) return false;
    }
  }

  private grow(): void {
    const old = this.table;
    this.table = new Uint32Array(old.length * 2);
    this.size = 0;
    for (let i = 0; i < old.length; i += 2) if (old[i + 1] !== 0) this.insert(old[i]!, old[i + 1]!);
  }

  async save(path: string): Promise<void> {
    await writeFile(path, new Uint8Array(this.table.buffer, this.table.byteOffset, this.table.byteLength));
  }

  static async load(path: string): Promise<SessionIdSet> {
    const bytes = await readFile(path);
    const set = new SessionIdSet(1);
    set.table = new Uint32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
    for (let i = 1; i < set.table.length; i += 2) if (set.table[i] !== 0) set.size++;
    return set;
  }
}
