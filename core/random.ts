// Seeded randomness for the simulator: the same seed always gives the same world, tasks and episodes.
import { sha256Bytes, uint32LE } from '../pipeline/hash.ts';

export type Random = () => number;

/** A generator seeded by any strings: each (seed, "company", 7) names its own independent stream. */
export function seeded(...parts: (string | number)[]): Random {
  const digest = sha256Bytes(parts.join('\u0000'));
  return sfc32(uint32LE(digest, 0), uint32LE(digest, 4), uint32LE(digest, 8), uint32LE(digest, 12));
}

/** sfc32 from four unsigned 32-bit words: small, fast, and good enough for simulation. */
export function sfc32(a: number, b: number, c: number, d: number): Random {
  return () => {
    a >>>= 0;
    b >>>= 0;
    c >>>= 0;
    d >>>= 0;
    const t = (a + b) | 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) | 0;
    c = (c << 21) | (c >>> 11);
    d = (d + 1) | 0;
    const r = (t + d) | 0;
    c = (c + r) | 0;
    return (r >>> 0) / 4294967296;
  };
}

export function pick<T>(rand: Random, items: readonly T[]): T {
  return items[Math.floor(rand() * items.length)]!;
}

export function int(rand: Random, lo: number, hi: number): number {
  return lo + Math.floor(rand() * (hi - lo + 1));
}

/** k distinct items, in a random order. */
export function sample<T>(rand: Random, items: readonly T[], k: number): T[] {
  const pool = [...items];
  for (let i = pool.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [pool[i], pool[j]] = [pool[j]!, pool[i]!];
  }
  return pool.slice(0, k);
}
