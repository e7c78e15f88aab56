// A bucket whose sessions take more than a thread may read at once is paired in pieces (pairing/pairer.ts):
// whole tasks several to a piece, a larger task's outcome pairs from its first few successes and failures,
// then its hard negatives a range of the bucket file at a time. What the pieces write is what pairing each
// bucket whole writes. The judge stage then takes a bucket's pairs in pieces too, each making its pairs whole
// from sessions read by id (SessionsById), and best-of-N keeps of a large task only the candidates it takes.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { JudgedPair, SplitSession } from '../../core/records.ts';
import { engineFor, jsonl, manifest, session, splitLines, tempDir } from '../fixtures/pipeline.ts';

/**
 * Two tasks of 200 sessions among 50 of three, and sessions without a task that split gives the task named
 * `gym` (so its bucket holds them whole, not as runs of ingest's lines); one file in task order (long runs),
 * one with the tasks' sessions apart (a run a session). Some successes and failures say the same thing.
 */
function inputs(dir: string): void {
  const records: unknown[] = [];
  for (let i = 0; i < 400; i++)
    records.push(session(`big-${i}`, i < 200 ? 'huge' : 'gym', [1, 0, 0.5][i % 3]!, `answer ${i % 7}`));
  for (let i = 0; i < 150; i++) records.push(session(`small-${i}`, `T${i % 50}`, Math.floor(i / 50) % 2, `reply ${i}`));
  for (let i = 0; i < 30; i++) records.push(session(`untasked-${i}`, null, i % 2, `untasked ${i % 5}`));
  const apart = records.filter((_, i) => i % 2 === 0);
  const inOrder = records.filter((_, i) => i % 2 === 1);
  writeFileSync(join(dir, 'a.jsonl'), jsonl(apart.map((_, i) => apart[(i * 7919) % apart.length])));
  writeFileSync(join(dir, 'b.jsonl'), jsonl(inOrder));
}

const PAIRS_FILES = ['train.jsonl', 'test.jsonl', 'dropped.jsonl'];

describe('pairs of a bucket too large to pair whole', () => {
  for (const [name, pairs] of [
    ['capped', ''],
    ['uncapped', 'pairs:\n  outcome:\n    max_pairs_per_task: null\n'],
  ] as const) {
    it(`writes in pieces, on one thread and on three, what pairing it whole writes (${name})`, async () => {
      const data = tempDir();
      inputs(data);
      const config = `ingest:\n  inputs: [${join(data, 'a.jsonl')}, ${join(data, 'b.jsonl')}]\nsplit:\n  bucket_size: 16\n${pairs}`;
      const [whole, one, three] = [tempDir(), tempDir(), tempDir()];
      await engineFor(whole, config, { workers: 1 }).run({ until: 'pairs' });
      // A few sessions a piece: the two large tasks go in many, and small tasks share their buckets. With
      // pieces smaller than the limit (sessions take about 550 bytes), a small task is a piece of its own
      // and the large tasks' hard negatives about a session a piece.
      // A large task's outcome pairs are chosen from the first few successes and failures held (all of
      // them chosen again where drops reach past those): 2 held, they always do; 24, not always.
      // A bucket file is read a block at a time where it is larger than one: here 300 bytes, about three
      // run lines, and less than a whole session's line (the block grows for it).
      await engineFor(one, config, { workers: 1, limitBytes: 6000, outcomeHeld: 2, bucketBlock: 300 }).run({
        until: 'pairs',
      });
      await engineFor(three, config, { workers: 3, limitBytes: 6000, pieceBytes: 1000, outcomeHeld: 24 }).run({
        until: 'pairs',
      });
      const counts = manifest(whole, 'pairs').counts;
      expect(manifest(whole, 'split').counts.matched_to_task).toBeGreaterThan(0);
      expect(counts.buckets_in_pieces).toBe(0);
      expect(counts.outcome).toBeGreaterThan(name === 'capped' ? 100 : 4000);
      expect(counts.dropped).toBeGreaterThan(0);
      for (const dir of [one, three]) {
        const { buckets_in_pieces: inPieces, ...rest } = manifest(dir, 'pairs').counts;
        // The two large tasks' buckets, and buckets of small tasks the small limit catches too.
        expect(inPieces).toBeGreaterThanOrEqual(3);
        expect({ ...rest, buckets_in_pieces: 0 }).toEqual(counts);
        for (const f of PAIRS_FILES)
          expect(
            readFileSync(join(dir, 'workspace', 'pairs', f)).equals(readFileSync(join(whole, 'workspace', 'pairs', f))),
            f,
          ).toBe(true);
      }
    });
  }

  it('marks a bucket paired in pieces as one chunk of a shard', async () => {
    const data = tempDir();
    inputs(data);
    const config = `ingest:\n  inputs: [${join(data, 'a.jsonl')}, ${join(data, 'b.jsonl')}]\nsplit:\n  bucket_size: 16\n`;
    const shard = { index: 1, count: 2 };
    const [whole, pieces] = [tempDir(), tempDir()];
    await engineFor(whole, config, { workers: 1 }).run({ until: 'pairs', shard });
    await engineFor(pieces, config, { workers: 2, limitBytes: 6000 }).run({ until: 'pairs', shard });
    expect(manifest(pieces, 'pairs').counts.buckets_in_pieces).toBeGreaterThan(0);
    for (const f of [...PAIRS_FILES, 'shard.json'])
      expect(
        readFileSync(join(pieces, 'workspace', 'pairs', f)).equals(readFileSync(join(whole, 'workspace', 'pairs', f))),
        f,
      ).toBe(true);
  });
});

describe('the judge stage on a bucket of large tasks', () => {
  it("judges a bucket's pairs in pieces on three threads as on one, on a shard too, and takes a large task's best-of-N candidates by id", async () => {
    const data = tempDir();
    inputs(data);
    const config = `ingest:\n  inputs: [${join(data, 'a.jsonl')}, ${join(data, 'b.jsonl')}]\nsplit:\n  bucket_size: 16\njudge:\n  best_of_n:\n    max_candidates: 5\n`;
    for (const shard of [null, { index: 0, count: 2 }]) {
      const [one, three] = [tempDir(), tempDir()];
      await engineFor(one, config, { workers: 1 }).run({ until: 'judge', shard });
      // Pieces of about 700 bytes of pairs: a pair or two each, so a large task's pairs go to every thread;
      // and no bucket held whole there (each session read as its pairs ask), as one is held on one thread.
      await engineFor(three, config, { workers: 3, judgePieceBytes: 700, heldBucketBytes: 0 }).run({
        until: 'judge',
        shard,
      });
      const counts = manifest(one, 'judge').counts;
      expect(counts.hard_negative).toBeGreaterThan(shard ? 10 : 100);
      expect(manifest(three, 'judge').counts).toEqual(counts);
      for (const f of ['train.jsonl', 'test.jsonl', 'report.json', ...(shard ? ['shard.json'] : [])])
        expect(
          readFileSync(join(three, 'workspace', 'judge', f)).equals(readFileSync(join(one, 'workspace', 'judge', f))),
          f,
        ).toBe(true);
      if (shard) continue;
      // Best-of-N's candidates for the large task: the five of its sessions whose ids come first (its sessions
      // lie in the bucket in another order, and those five are not its first five there).
      const sessions = (await splitLines(one))
        .map((l) => JSON.parse(l) as SplitSession)
        .filter((x) => x.task_id === 'huge');
      const side = sessions[0]!.split;
      const ids = sessions.map((x) => x.session_id);
      expect(ids.length).toBe(200);
      const first = [...ids].sort().slice(0, 5);
      expect(ids.slice(0, 5)).not.toEqual(first);
      const judged = readFileSync(join(one, 'workspace', 'judge', `${side}.jsonl`), 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as JudgedPair);
      const taken = new Set(
        judged
          .filter((p) => p.source === 'best_of_n' && p.task_id === 'huge')
          .flatMap((p) => [p.chosen_session_id, p.rejected_session_id]),
      );
      expect(taken.size).toBeGreaterThanOrEqual(2);
      for (const id of taken) expect(first).toContain(id);
    }
  });
});
