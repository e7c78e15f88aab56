// prefab's hashes. SHA-256 names and decides: ids, keys, configs, which side a task goes to. XXH64 tells
// files apart (the manifests' and ingest's `xxh64`): every byte of every input file and of everything a
// stage writes is hashed, so that a rerun knows what changed, and SHA-256 of them all would take the cores
// ingest's threads work on. `xxhsum -H1 FILE` prints the same 16 hex digits.
import { createHash, hash } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { resolve } from 'node:path';
import xxhash from 'xxhash-wasm';
import { BufferShelf, SMALL_FILE } from './buffers.ts';
import { flatString } from './memory.ts';

/** xxhash-wasm's functions, once its WebAssembly (a few KB) is instantiated: in each thread that imports this. */
const xxh = await xxhash();

/** Hashes a file's bytes as they come: XXH64, seed 0, 16 hex digits (xxhsum's canonical form). */
export interface Checksum {
  update(data: Uint8Array): void;
  digest(): string;
}

export function checksum(): Checksum {
  const state = xxh.create64();
  return { update: (data) => void state.update(data), digest: () => hex64(state.digest()) };
}

const hex64 = (value: bigint) => flatString(value.toString(16).padStart(16, '0'));

/** SHA-256 in hex; one call (no Hash object), as pairs and ids are hashed by the hundred thousand. */
export function sha256(data: string | Uint8Array): string {
  return hash('sha256', data, 'hex');
}

/** JSON with object keys sorted at every depth, so equal values always hash equally. */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(sortKeys(value));
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) {
      const v = (value as Record<string, unknown>)[key];
      if (v !== undefined) out[key] = sortKeys(v);
    }
    return out;
  }
  return value;
}

export function hashJson(value: unknown): string {
  return sha256(canonicalJson(value));
}

/**
 * Files whose every byte a writer of this process checksummed as it wrote them (JsonlWriter), with their size
 * and time once closed: a stage's outputs are then not read again to be checksummed.
 */
const written = new Map<string, { xxh64: string; bytes: number; mtimeMs: number }>();

export function rememberChecksum(path: string, xxh64: string, bytes: number, mtimeMs: number): void {
  written.set(flatString(resolve(path)), { xxh64, bytes, mtimeMs });
}

/** The checksum a writer remembered for a stage's output as it is now (same size and time), or the file read and checksummed. */
export async function outputChecksum(path: string, now: { size: number; mtimeMs: number }): Promise<string> {
  const known = written.get(resolve(path));
  written.delete(resolve(path));
  return known && known.bytes === now.size && known.mtimeMs === now.mtimeMs
    ? known.xxh64
    : checksumFile(path, now.size);
}

/** Reads of a file being hashed: this many in flight, of this many bytes each. */
const [AHEAD, READ] = [3, 2 << 20];

/**
 * Feeds a file's bytes to `hash` in order, the next reads already under way while one is hashed: the
 * kernel's copies of them then run on the thread pool beside each other and beside the hashing.
 */
async function hashThrough(path: string, hash: { update(data: Uint8Array): unknown }, size: number): Promise<void> {
  // A file of a MiB or less at once, on this thread: a night's hundreds of small files would each take a few
  // round trips to the thread pool.
  if (size <= SMALL_FILE) {
    hash.update(readFileSync(path));
    return;
  }
  const file = await open(path, 'r');
  const reads: Promise<{ buffer: Buffer; bytesRead: number }>[] = [];
  // A file's few buffers, each filled again once hashed; they go with the call (kept for good, every command
  // would hold them).
  const buffers = new BufferShelf(AHEAD);
  try {
    // Read to `size` (the file as its caller found it), then on until a read finds no more (a file that grew meanwhile).
    // A small file in one read of its size and a byte more (which finds its end).
    const length = Math.min(READ, size + 1);
    let at = 0;
    const readNext = () => {
      const read = file.read(buffers.take(length), 0, length, at);
      // A read that fails while an earlier one is awaited is reported when its turn comes, not as unhandled.
      read.catch(() => {});
      reads.push(read);
      at += length;
    };
    while (reads.length < AHEAD && at < size) readNext();
    for (;;) {
      if (reads.length === 0) readNext();
      const { buffer, bytesRead } = await reads.shift()!;
      hash.update(buffer.subarray(0, bytesRead));
      buffers.put(buffer.buffer as ArrayBuffer);
      if (bytesRead < length && reads.length === 0) break;
      if (at < size) readNext();
    }
  } finally {
    await Promise.allSettled(reads);
    await file.close();
  }
}

/** The SHA-256 of a file's content, in hex: how ingest knew its input files before XXH64. `size`: as the caller found it (else the file is stat'd). */
export async function sha256File(path: string, size = statSync(path).size): Promise<string> {
  const hash = createHash('sha256');
  await hashThrough(path, hash, size);
  return hash.digest('hex');
}

/** A file's checksum, as `checksum` makes it. `size`: as the caller found it (else the file is stat'd). */
export async function checksumFile(path: string, size = statSync(path).size): Promise<string> {
  const sum = checksum();
  await hashThrough(path, sum, size);
  return sum.digest();
}

/**
 * SHA-256 of `data` as its 32 bytes in a string, a Latin-1 character a byte: for numbers taken from digests
 * by the hundred thousand (draws, ids' keys), the cheapest form Node gives it in.
 */
export function sha256Bytes(data: string): string {
  return hash('sha256', data, 'binary'); // Node's name for Latin-1
}

/** Bytes `at` to `at + 3` of a digest from sha256Bytes as an unsigned integer, little-endian (Buffer's readUInt32LE). */
export function uint32LE(digest: string, at: number): number {
  return (
    (digest.charCodeAt(at) |
      (digest.charCodeAt(at + 1) << 8) |
      (digest.charCodeAt(at + 2) << 16) |
      (digest.charCodeAt(at + 3) << 24)) >>>
    0
  );
}

/** A stable number in [0, 1) for a key: the same key and salt always land in the same place. */
export function unitHash(key: string, salt: string): number {
  const digest = sha256Bytes(`${salt}\0${key}`);
  // The digest's first 52 bits (its first 13 hex digits) over 2^52: six bytes and the high half of the seventh.
  let bits = 0;
  for (let i = 0; i < 6; i++) bits = bits * 256 + digest.charCodeAt(i);
  return (bits * 16 + (digest.charCodeAt(6) >> 4)) / 2 ** 52;
}

/** FNV-1a of a string's UTF-16 code units, an unsigned 32-bit number: a quick hash for tables in memory, not for anything stored. */
export function fnv1a(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/** FNV-1a of 32-bit numbers, a byte at a time (low first), as fnv1a of a string: no string is made of them. */
export function fnv1aNumbers(numbers: ArrayLike<number>): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < numbers.length; i++) {
    const n = numbers[i]!;
    for (let shift = 0; shift < 32; shift += 8) h = Math.imul(h ^ ((n >>> shift) & 0xff), 0x01000193);
  }
  return h >>> 0;
}
