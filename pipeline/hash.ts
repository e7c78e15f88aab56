// prefab's hashes. SHA-256 names and decides: ids, keys, configs, which side a task goes to, and an input
// file's identity. XXH64 checks the files the stages write (the manifests' `xxh64`): every byte a stage
// writes is hashed, so a rerun finds an output altered or the same as before, and at 433 MB of segments a
// run SHA-256 took a core for a quarter of a second that ingest's threads waited on; XXH64 (xxhash-wasm) is
// six times faster here. `xxhsum -H1 FILE` prints the same 16 hex digits.
import { createHash, hash } from 'node:crypto';
import { open, rename } from 'node:fs/promises';
import { resolve } from 'node:path';
import { Worker } from 'node:worker_threads';
import xxhash from 'xxhash-wasm';
import { BufferShelf } from './buffers.ts';

/** xxhash-wasm's functions, once its WebAssembly (a few KB) is instantiated: in each thread that imports this. */
const xxh = await xxhash();

/** Hashes the bytes of a written file as they come: XXH64, seed 0, 16 hex digits (xxhsum's canonical form). */
export interface Checksum {
  update(data: Uint8Array): void;
  digest(): string;
}

export function checksum(): Checksum {
  const state = xxh.create64();
  return {
    update: (data) => void state.update(data),
    digest: () => state.digest().toString(16).padStart(16, '0'),
  };
}

/** SHA-256 in hex; one call (no Hash object), as pairs and ids are hashed by the hundred thousand. */
export function sha256(data: string | Uint8Array): string {
  return hash('sha256', data, 'hex');
}

/** JSON with object keys sorted at every depth, so equal values always hash equally. */
function canonicalJson(value: unknown): string {
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
  written.set(resolve(path), { xxh64, bytes, mtimeMs });
}

/** Renames a file a writer checksummed as it wrote it, the checksum remembered going with it. */
export async function renameWritten(from: string, to: string): Promise<void> {
  await rename(from, to);
  const known = written.get(resolve(from));
  written.delete(resolve(from));
  if (known) written.set(resolve(to), known);
}

/** The checksum a writer remembered for a stage's output as it is now (same size and time), or the file read and checksummed. */
export async function outputChecksum(path: string, now: { size: number; mtimeMs: number }): Promise<string> {
  const known = written.get(resolve(path));
  written.delete(resolve(path));
  return known && known.bytes === now.size && known.mtimeMs === now.mtimeMs ? known.xxh64 : checksumFile(path);
}

/** Where files are hashed through: one buffer for the process, as a new MiB for every read is memory malloc keeps. */
const hashShelf = new BufferShelf(1);

async function hashThrough(path: string, hash: { update(data: Uint8Array): unknown }): Promise<void> {
  // 1 MiB reads: half the time of 64 KiB ones on a file of hundreds of MB.
  const file = await open(path, 'r');
  const buffer = hashShelf.take(1 << 20);
  try {
    for (let read; (read = (await file.read(buffer, 0, buffer.length, null)).bytesRead) > 0; ) hash.update(buffer.subarray(0, read));
  } finally {
    await file.close();
    hashShelf.put(buffer.buffer as ArrayBuffer);
  }
}

/** An input file's identity: the SHA-256 of its content, in hex. */
export async function hashFile(path: string): Promise<string> {
  const hash = createHash('sha256');
  await hashThrough(path, hash);
  return hash.digest('hex');
}

/** A written file's checksum, as `checksum` makes it. */
export async function checksumFile(path: string): Promise<string> {
  const sum = checksum();
  await hashThrough(path, sum);
  return sum.digest();
}

/**
 * hashFile on a thread of its own, so that this one (and a stage reading the file meanwhile) goes on: SHA-256
 * takes a core for about 0.2 s a 433 MB. The thread is a few lines of CommonJS, with nothing to load.
 */
export function hashFileOnThread(path: string): Promise<string> {
  return new Promise((done, fail) => {
    const thread = new Worker(HASH_THREAD, { eval: true, workerData: path });
    thread.once('message', (hex: string) => done(hex));
    thread.once('error', fail);
    thread.once('exit', (code) => fail(new Error(`${path}: the thread hashing it stopped (exit code ${code}) before it had`)));
  });
}

const HASH_THREAD = `
const { createHash } = require('node:crypto');
const { closeSync, openSync, readSync } = require('node:fs');
const { parentPort, workerData } = require('node:worker_threads');
const hash = createHash('sha256');
const file = openSync(workerData, 'r');
const buffer = Buffer.allocUnsafe(1 << 20);
for (let read; (read = readSync(file, buffer, 0, buffer.length, null)) > 0; ) hash.update(buffer.subarray(0, read));
closeSync(file);
parentPort.postMessage(hash.digest('hex'));
`;

/** A stable number in [0, 1) for a key: the same key and salt always land in the same place. */
export function unitHash(key: string, salt: string): number {
  const hex = hash('sha256', `${salt}\0${key}`, 'hex');
  return parseInt(hex.slice(0, 13), 16) / 2 ** 52;
}
