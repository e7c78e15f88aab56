// Worker threads for work that splits into batches: a stage hands batches to a pool and reads the results
// back in the order it gave them, so what it writes is the same whatever the number of threads.
import { existsSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker, parentPort, workerData, type ResourceLimits } from 'node:worker_threads';
import { BufferShelf } from './buffers.ts';

/**
 * How many threads to use: `--workers N` as given (1: none besides the main thread), or by default one per
 * core (up to 4) when the work is large enough to pay for starting them and there are at least `cores`.
 */
export function workerCount(option: unknown, large: boolean, cores = 2): number {
  if (typeof option === 'number') return option;
  return large && availableParallelism() >= cores ? Math.min(4, availableParallelism()) : 1;
}

interface Reply<Out> {
  id: number;
  result?: Out;
  /** The buffers of `result` that moved rather than being copied (given back later to the thread that made them). */
  moved?: ArrayBuffer[];
  error?: string;
}

/** What the main thread sends a worker: a batch to work, or buffers it may fill again. */
type Message<In> = { id: number; batch: In } | { spare: ArrayBuffer[] };

/**
 * A worker thread's spare buffers, which the main thread gives back once it has written what they held
 * (WorkerPool.giveBack): a thread that makes lines takes its buffers from here. Empty on the main thread.
 * How many it keeps, its worker module tells `serveBatches`.
 */
export const threadShelf = new BufferShelf(4);

/** Batches a thread holds at most: the one it works and the next, so that it never waits for the main thread. */
const HELD = 2;

/**
 * Threads running one worker module. Batches wait here and go to a thread as it has room (HELD), so that a
 * thread held up by a large batch is not given more while another is free.
 */
export class WorkerPool<In, Out> {
  private readonly workers: Worker[];
  private readonly pending = new Map<number, { resolve: (out: Out) => void; reject: (e: Error) => void }>();
  /** Batches given to `run` and not yet sent to a thread, in order. */
  private readonly waiting: { id: number; batch: In }[] = [];
  /** Per thread, the batches sent to it and not yet answered. */
  private readonly inFlight: number[];
  /** Which thread made a buffer that came with a result: it goes back there (giveBack). */
  private readonly madeBy = new WeakMap<ArrayBuffer, number>();
  private next = 0;
  private nextSpare = 0;
  private failed: Error | null = null;

  /**
   * `entry` names the module in the executable's bundle (bin/bundle.js, which tells its folder in
   * PREFAB_BUNDLE_DIR); `module` is its source, run through tsx where there is no bundle. `init` is what
   * the module's `serveBatches` maker gets. `moves` names the buffers of a batch that move to its thread
   * rather than being copied (the thread may send them back with its result). `limits`: the threads' heap,
   * where not as the stages' threads have it.
   */
  constructor(
    entry: string,
    module: URL,
    size: number,
    init: unknown,
    private readonly moves: (batch: In) => ArrayBuffer[] = () => [],
    limits: ResourceLimits = {},
  ) {
    const bundle = process.env.PREFAB_BUNDLE_DIR ? join(process.env.PREFAB_BUNDLE_DIR, `${entry}.mjs`) : null;
    const script =
      bundle && existsSync(bundle) ? bundle : fileURLToPath(new URL('./worker-entry.mjs', import.meta.url));
    this.inFlight = new Array<number>(size).fill(0);
    this.workers = Array.from({ length: size }, (_, w) => {
      // A young generation of 16 MB (V8's default is 3 × 16): a thread's memory settles as soon as it starts.
      const worker = new Worker(script, {
        workerData: { module: module.href, init },
        resourceLimits: { maxYoungGenerationSizeMb: 16, ...limits },
      });
      worker.on('message', (reply: Reply<Out>) => {
        this.inFlight[w]!--;
        for (const buffer of reply.moved ?? []) this.madeBy.set(buffer, w);
        const answered = this.pending.get(reply.id)!;
        this.pending.delete(reply.id);
        this.send();
        if (reply.error !== undefined) answered.reject(new Error(reply.error));
        else answered.resolve(reply.result!);
      });
      worker.on('error', (error) => this.fail(error));
      worker.on('exit', (code) => code !== 0 && this.fail(new Error(`a worker thread exited with code ${code}`)));
      return worker;
    });
  }

  private fail(error: Error): void {
    this.failed ??= error;
    for (const { reject } of this.pending.values()) reject(error);
    this.pending.clear();
    this.waiting.length = 0;
  }

  run(batch: In): Promise<Out> {
    if (this.failed) return Promise.reject(this.failed);
    const id = this.next++;
    const answer = new Promise<Out>((resolve, reject) => this.pending.set(id, { resolve, reject }));
    this.waiting.push({ id, batch });
    this.send();
    return answer;
  }

  /** Sends waiting batches, in order, to the threads with room: which thread works a batch never changes its result. */
  private send(): void {
    while (this.waiting.length > 0) {
      const w = this.inFlight.indexOf(Math.min(...this.inFlight));
      if (this.inFlight[w]! >= HELD) return;
      const { id, batch } = this.waiting.shift()!;
      this.inFlight[w]!++;
      this.workers[w]!.postMessage({ id, batch } satisfies Message<In>, this.moves(batch));
    }
  }

  /** Buffers a thread sent with a result, given back to that thread to fill again (others to the threads in turn). */
  giveBack(buffers: ArrayBuffer[]): void {
    if (this.failed || buffers.length === 0) return;
    const w = this.madeBy.get(buffers[0]!) ?? this.nextSpare++ % this.workers.length;
    this.workers[w]!.postMessage({ spare: buffers } satisfies Message<In>, buffers);
  }

  get size(): number {
    return this.workers.length;
  }

  async close(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.terminate()));
  }
}

/**
 * In a worker module: answers each batch with `make(init)`'s result, moving the buffers `transfer` names
 * rather than copying them. Batches are worked one at a time, in the order they came, even where the work
 * waits (for a file): a batch may use what the one before it left. Spare buffers the main thread gives back
 * go to `threadShelf`, which keeps `spares` of them (four: a thread has three batches in flight, inOrder's
 * `perThread`, and makes a fourth). Does nothing on the main thread.
 */
export function serveBatches<In, Out>(
  make: (init: never) => (batch: In) => Out | Promise<Out>,
  transfer: (out: Out) => ArrayBuffer[] = () => [],
  spares = 4,
): void {
  if (!parentPort) return;
  threadShelf.keepAtMost(spares);
  const port = parentPort;
  const handle = make((workerData as { init: never }).init);
  let last = Promise.resolve();
  const answer = async ({ id, batch }: { id: number; batch: In }) => {
    try {
      const result = await handle(batch);
      const moved = transfer(result);
      port.postMessage({ id, result, moved } satisfies Reply<Out>, moved);
    } catch (error) {
      port.postMessage({ id, error: (error as Error).stack ?? String(error) } satisfies Reply<Out>);
    }
  };
  port.on('message', (message: Message<In>) => {
    if ('spare' in message) for (const buffer of message.spare) threadShelf.put(buffer);
    else last = last.then(() => answer(message));
  });
}

/**
 * What `inOrder` keeps in flight. `perThread`: batches a thread is given to work (memory grows with it).
 * `held`: what a result holds in memory, in bytes, and how much the results done out of turn may hold. With
 * it, a batch worked long does not stop the other threads: results done after it wait for it while they hold
 * under `budget` or are fewer than the threads (so that one large result waiting does not stop them), and
 * number under MAX_WAITING; only the batches still being worked count against `perThread`. Without it,
 * `perThread` counts every batch in flight, done or not: where a few batches are far larger than the rest
 * (the pairs of a few large tasks among many small ones), one thread then worked alone.
 */
export interface InOrderOptions<Out> {
  perThread?: number;
  held?: { bytes: (out: Out) => number; budget: number };
}

/** What works batches on threads: a WorkerPool, or one that answers some batches itself and hands it the others. */
export interface Threads<In, Out> {
  readonly size: number;
  run(batch: In): Promise<Out>;
}

/** Results done out of turn that `inOrder` keeps at most, whatever they hold. */
const MAX_WAITING = 64;

/**
 * Hands `batches` to a pool of threads (or to a function on this thread) and gives `use` every result in
 * the order of the batches, keeping in flight what `options` allows (InOrderOptions).
 */
export async function inOrder<In, Out>(
  batches: AsyncIterable<In>,
  work: Threads<In, Out> | ((batch: In) => Out | Promise<Out>),
  use: (out: Out, batch: In) => Promise<void>,
  options: InOrderOptions<Out> = {},
): Promise<void> {
  const { perThread = 3, held } = options;
  if (typeof work === 'function') {
    for await (const batch of batches) await use(await work(batch), batch);
    return;
  }
  const pool = work;
  const depth = perThread * pool.size;
  const flight: { out: Promise<Out>; batch: In; done: boolean; bytes: number }[] = [];
  let working = 0;
  let waitingBytes = 0;
  let waiting = 0;
  let wake = () => {};
  for await (const batch of batches) {
    const f = { out: pool.run(batch), batch, done: false, bytes: 0 };
    working++;
    // A failure is thrown where its result is awaited, in order.
    void f.out
      .then(
        (out) => void (waitingBytes += f.bytes = held ? held.bytes(out) : 0),
        () => {},
      )
      .finally(() => {
        f.done = true;
        working--;
        waiting++;
        wake();
      });
    flight.push(f);
    for (;;) {
      while (flight[0]?.done) {
        const { out, batch: given, bytes } = flight.shift()!;
        waitingBytes -= bytes;
        waiting--;
        await use(await out, given);
      }
      const room = held
        ? working < depth && (waitingBytes <= held.budget || waiting < pool.size) && flight.length < MAX_WAITING
        : flight.length <= depth;
      if (room) break;
      if (!held) {
        // As many in flight as the threads hold: the oldest is waited for.
        const { out, batch: given } = flight.shift()!;
        await use(await out, given);
        continue;
      }
      await new Promise<void>((resolve) => (wake = resolve));
    }
  }
  for (const { out, batch } of flight) await use(await out, batch);
}
