// The numbers prefab draws from SHA-256 digests (pipeline/hash.ts: unitHash, sha256Bytes, uint32LE; seeded
// generators; ingest's id keys) are read from Latin-1 digests for speed: pinned here to be the numbers their
// definitions in hex and Buffer digests give, whatever the text hashed, so no split, draw or id set moves.
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { sha256Bytes, uint32LE, unitHash } from '../../pipeline/hash.ts';
import { seeded, sfc32 } from '../../core/random.ts';
import { SessionIdSet } from '../../stages/ingest/id-set.ts';

const digest = (text: string) => createHash('sha256').update(text, 'utf8').digest();
const TEXTS = [
  '',
  'a',
  'session-000017',
  'ünïcödé — ✓ 😀',
  'tab\tand\0nul',
  'x'.repeat(200),
  ...Array.from({ length: 300 }, (_, i) => `task-${i * 7919}`),
];

describe('numbers drawn from SHA-256 digests', () => {
  it('reads a digest as its bytes, one Latin-1 character each, and their 32-bit words as Buffer reads them', () => {
    for (const text of TEXTS) {
      const bytes = digest(text);
      expect(Buffer.from(sha256Bytes(text), 'latin1')).toEqual(bytes);
      for (let at = 0; at <= 28; at += 4) expect(uint32LE(sha256Bytes(text), at)).toBe(bytes.readUInt32LE(at));
    }
  });

  it('places a key in [0, 1) by the first 13 hex digits of the digest of salt, NUL and key', () => {
    for (const text of TEXTS) {
      for (const salt of ['bucket', 'split:', 'hard_negative:ü']) {
        const hex = digest(`${salt}\0${text}`).toString('hex');
        expect(unitHash(text, salt)).toBe(parseInt(hex.slice(0, 13), 16) / 2 ** 52);
      }
    }
  });

  it("seeds a generator with the digest's first four words, and keys an id by its first two", () => {
    for (const text of TEXTS) {
      const bytes = digest(`seed\0${text}\x007`);
      const rand = seeded('seed', text, 7);
      const words = sfc32(...([0, 4, 8, 12].map((at) => bytes.readUInt32LE(at)) as [number, number, number, number]));
      for (let k = 0; k < 3; k++) expect(rand()).toBe(words());
      const id = digest(text);
      expect(SessionIdSet.key(text)).toEqual([id.readUInt32LE(0), (id.readUInt32LE(4) | 1) >>> 0]);
    }
  });
});
