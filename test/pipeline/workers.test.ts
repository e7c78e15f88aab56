// Worker threads (pipeline/workers.ts): a thread works its batches one at a time and in order, even where
// a batch waits; results come back in the order of the batches; buffers given back are filled again; a
// thread held up by a long batch is not given more while another is free.
import { describe, expect, it } from 'vitest';
import { WorkerPool, inOrder } from '../../pipeline/workers.ts';

describe('a pool of worker threads', () => {
  it("works a thread's batches one after another, in order, however long each waits, and fills given-back buffers again", async () => {
    const pool = new WorkerPool<
      { wait: number; bytes: number },
      { started: number; ended: number; overlapped: boolean; reused: boolean; buffer: Uint8Array }
    >('none', new URL('../fixtures/slow-worker.ts', import.meta.url), 1, null);
    try {
      const batches = [60, 1, 40, 1, 1, 30].map((wait) => ({ wait, bytes: 1000 }));
      const results: { started: number; ended: number; overlapped: boolean; reused: boolean }[] = [];
      async function* each() {
        yield* batches;
      }
      await inOrder(
        each(),
        pool,
        async (out) => {
          results.push(out);
          // A larger buffer than the batch asks for (8 KiB; a new one is 4): the thread takes it from its shelf for the next batch.
          pool.giveBack([new ArrayBuffer(8192)]);
        },
        { perThread: 6 },
      );
      expect(results.map((r) => r.started)).toEqual([0, 2, 4, 6, 8, 10]);
      expect(results.map((r) => r.ended)).toEqual([1, 3, 5, 7, 9, 11]);
      expect(results.some((r) => r.overlapped)).toBe(false);
      // All six were sent before any came back; later ones found a spare given back after the first.
      expect(results[0]!.reused).toBe(false);
      expect(results.slice(1).some((r) => r.reused)).toBe(true);
    } finally {
      await pool.close();
    }
  });

  it('gives waiting batches to the thread that is free, not in turn, and results still come in order', async () => {
    const pool = new WorkerPool<{ wait: number; bytes: number }, { started: number; thread: number }>(
      'none',
      new URL('../fixtures/slow-worker.ts', import.meta.url),
      2,
      null,
    );
    try {
      // The first batch holds its thread for most of the run; the other eight are short.
      const waits = [400, 10, 10, 10, 10, 10, 10, 10, 10];
      async function* each() {
        yield* waits.map((wait) => ({ wait, bytes: 16 }));
      }
      const results: { wait: number; started: number; thread: number }[] = [];
      await inOrder(each(), pool, async (out, batch) => void results.push({ wait: batch.wait, ...out }), {
        perThread: 6,
      });
      expect(results.map((r) => r.wait)).toEqual(waits);
      const slow = results[0]!.thread;
      // The slow thread took one more batch before it was full (a thread holds two); the free one took the rest.
      expect(results.filter((r) => r.thread === slow)).toHaveLength(2);
      expect(results.filter((r) => r.thread !== slow).map((r) => r.started)).toEqual([0, 2, 4, 6, 8, 10, 12]);
    } finally {
      await pool.close();
    }
  });

  it('keeps the other threads working past a long batch while the results done out of turn hold under the budget', async () => {
    const pool = new WorkerPool<
      { wait: number; bytes: number },
      { started: number; thread: number; buffer: Uint8Array }
    >('none', new URL('../fixtures/slow-worker.ts', import.meta.url), 2, null);
    try {
      // One long batch first, then twelve short ones; a thread works one batch at a time (perThread 1).
      const waits = [400, ...Array<number>(12).fill(10)];
      const run = async (budget: number) => {
        async function* each() {
          yield* waits.map((wait) => ({ wait, bytes: 16 }));
        }
        const results: { wait: number; thread: number }[] = [];
        await inOrder(each(), pool, async (out, batch) => void results.push({ wait: batch.wait, thread: out.thread }), {
          perThread: 1,
          held: { bytes: (out) => out.buffer.length, budget },
        });
        expect(results.map((r) => r.wait)).toEqual(waits);
        const slow = results[0]!.thread;
        return results.slice(1).filter((r) => r.thread === slow).length;
      };
      // Room for every result: the other thread works all twelve while the long one runs.
      expect(await run(1 << 20)).toBe(0);
      // Room for one (16 bytes; one result may wait whatever it holds while fewer wait than there are threads):
      // the other thread stops after two, and the long batch's thread works some of the rest once it is done.
      expect(await run(16)).toBeGreaterThan(0);
    } finally {
      await pool.close();
    }
  });
});
