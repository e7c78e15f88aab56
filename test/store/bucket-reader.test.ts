// Past pairs, the stages read split's buckets without holding a large one whole (stages/layout.ts): export a
// bucket's sessions a MiB at a time (readBucketSessions), best-of-N and sample a few sessions of each task
// (readTaskGroups), the judge and export a pair's sessions by id (SessionsById). A bucket of the usual size
// is read at once; the tests set that size to 0 to read every bucket as a large one. Each gives what reading
// the bucket whole gives.
import { readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { fnv1a } from '../../pipeline/hash.ts';
import { SessionsById } from '../../store/sessions-by-id.ts';
import { StoredBucketReader, readBucketSessions, readTaskGroups } from '../../store/bucket-reader.ts';
import type { SplitSession } from '../../core/records.ts';
import { engineFor, jsonl, session, tempDir } from '../fixtures/pipeline.ts';

/** Two ids whose hashes are the same, so that SessionsById's table must tell them apart by reading both. */
const SAME_HASH = ['s-1122789', 's-1339192'];

/**
 * Two tasks of 300 sessions of about 3 KB (the two ids of the same hash in one) (a bucket of each takes about a MiB, and their sessions lie apart
 * in ingest's segment), a few small tasks, and sessions without a task that split keeps whole in its buckets.
 */
async function workspace(): Promise<{ ingest: string; buckets: string[] }> {
  const dir = tempDir();
  const records: unknown[] = [];
  for (let i = 0; i < 600; i++)
    records.push(
      session(
        i === 0 || i === 2 ? SAME_HASH[i / 2] : `s-${i}`,
        i % 2 === 0 ? 'alpha' : 'beta',
        i % 3 === 0 ? 1 : 0,
        `answer ${i} ${'x'.repeat(3200 + (i % 7) * 100)}`,
      ),
    );
  for (let i = 0; i < 60; i++) records.push(session(`small-${i}`, `T${i % 20}`, i % 2, `reply ${i}`));
  for (let i = 0; i < 20; i++) records.push(session(`untasked-${i}`, null, i % 2, `untasked ${i}`));
  writeFileSync(join(dir, 'logs.jsonl'), jsonl(records));
  await engineFor(dir, 'ingest:\n  inputs: [logs.jsonl]\nsplit:\n  bucket_size: 64\n  test_ratio: 0\n').run({
    until: 'split',
  });
  const folder = join(dir, 'workspace', 'split', 'sessions');
  return {
    ingest: join(dir, 'workspace', 'ingest'),
    buckets: readdirSync(folder)
      .sort()
      .map((f) => join(folder, f)),
  };
}

/** A bucket's sessions read whole, as `sessions` gives them. */
async function whole(path: string, ingest: string): Promise<SplitSession[]> {
  const bytes = await new StoredBucketReader().sessions(path, ingest);
  return bytes
    .toString('utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as SplitSession);
}

describe("split's buckets read a block at a time", () => {
  it('gives every session of a bucket in its order, across more than a MiB, as reading it whole does', async () => {
    const { ingest, buckets } = await workspace();
    let largest = 0;
    const reader = new StoredBucketReader();
    for (const path of buckets) {
      const expected = await whole(path, ingest);
      // Read at once, and (a bucket held whole being none) where each lies first, then a MiB at a time.
      for (const held of [undefined, 0]) {
        const read: SplitSession[] = [];
        for await (const s of readBucketSessions(path, ingest, reader, held)) read.push(s);
        expect(read).toEqual(expected);
      }
      largest = Math.max(largest, JSON.stringify(expected).length);
    }
    expect(largest).toBeGreaterThan(1 << 20);
  });

  it("keeps of each task its first sessions in the bucket's order, or those whose ids come first", async () => {
    const { ingest, buckets } = await workspace();
    let cut = 0;
    for (const path of buckets) {
      const byTask = new Map<string, SplitSession[]>();
      for (const s of await whole(path, ingest)) byTask.set(s.task_id!, [...(byTask.get(s.task_id!) ?? []), s]);
      const tasks = [...byTask.keys()].sort();
      expect(readTaskGroups(path, ingest)).toEqual(tasks.map((t) => [t, byTask.get(t)]));
      expect(readTaskGroups(path, ingest, undefined, { most: 3 })).toEqual(
        tasks.map((t) => [t, byTask.get(t)!.slice(0, 3)]),
      );
      const firstIds = (t: string) =>
        [...byTask.get(t)!].sort((x, y) => (x.session_id < y.session_id ? -1 : 1)).slice(0, 3);
      expect(readTaskGroups(path, ingest, undefined, { most: 3, byId: true })).toEqual(
        tasks.map((t) => [t, firstIds(t)]),
      );
      for (const t of tasks) if (JSON.stringify(firstIds(t)) !== JSON.stringify(byTask.get(t)!.slice(0, 3))) cut++;
    }
    // Tasks whose first sessions in the bucket are not those whose ids come first: the two cuts differ there.
    expect(cut).toBeGreaterThanOrEqual(2);
  });

  it('finds each session by its id, two ids of the same hash included, again once forgotten, and none the bucket lacks', async () => {
    expect(fnv1a(SAME_HASH[0]!)).toBe(fnv1a(SAME_HASH[1]!));
    const { ingest, buckets } = await workspace();
    // Buckets held whole as they are indexed, and (none held) each session read as it is asked for.
    for (const held of [undefined, 0]) {
      const sessions = new SessionsById(ingest, undefined, held);
      let found = 0;
      try {
        // Twice: the first few hundred a bucket are no longer kept parsed when asked for again.
        for (let round = 0; round < 2; round++) {
          for (const path of buckets) {
            for (const s of await whole(path, ingest)) {
              const got = sessions.get(path, s.session_id)!;
              expect(got.session_id).toBe(s.session_id);
              expect(got.messages.slice(0, got.messages.length).all()).toEqual(s.messages);
              found++;
            }
            expect(sessions.get(path, 'no-such-session')).toBeUndefined();
          }
        }
        expect(found).toBe(2 * 680);
      } finally {
        sessions.close();
      }
    }
  });
});
