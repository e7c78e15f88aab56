// A stage's memory: what a finished stage held given back before the next one starts, and V8's heap held near
// what is live while one runs.
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/** V8's collector: Node's own where it was started with --expose-gc, else exposed here; a no-op where neither works. */
let gc: (() => void) | null = null;

/**
 * A full garbage collection now. A data stage ends holding buffers of tens of MB (split gathers a block per
 * bucket file) that are garbage from then on; but the next stage works on its threads and allocates little
 * on this one, so no collection comes to free them, and their memory stays with the process through that
 * stage's peak. V8 offers no call for it without
 * `--expose-gc`, which is set here (as Jest does for its leak detector) rather than asking every user for a
 * Node option.
 */
export function collectGarbage(): void {
  gc ??= exposed();
  gc();
}

/**
 * Below this much in V8's heap and in buffers together, a collection after a stage is not worth its time:
 * a small run's stages end holding little, and less of it garbage.
 */
const WORTH_COLLECTING = 48 << 20;

/** collectGarbage after a stage, where the process holds enough for it to be worth its time. */
export function collectAfterStage(): void {
  const { heapUsed, arrayBuffers } = process.memoryUsage();
  if (heapUsed + arrayBuffers >= WORTH_COLLECTING) collectGarbage();
}

function exposed(): () => void {
  const given = (globalThis as { gc?: unknown }).gc;
  if (typeof given === 'function') return given as () => void;
  try {
    setFlagsFromString('--expose-gc');
    const made: unknown = runInNewContext('gc');
    if (typeof made === 'function') return made as () => void;
  } catch {
    // A Node that refuses the flag: the stages' memory is then V8's to collect when it will.
  }
  return () => {};
}

/** How far V8's heap may grow past what survived the last full collection, in percent (V8's own: up to 300). */
const HEAP_GROWING_PERCENT = 50;

/**
 * Holds V8's heap to 1.5 times what survived its last full collection. V8 picks that factor itself, up to 4
 * where a program allocates fast, and a stage that keeps a growing structure (export's Parquet footers) then
 * keeps up to four times it. Process-wide, threads included. Node warns that a V8 flag set after start may
 * do nothing; on Node 20 this one takes effect (docs/experiments.md), and a Node that refuses it keeps V8's
 * factor.
 */
export function holdHeapGrowth(): void {
  try {
    setFlagsFromString(`--heap-growing-percent=${HEAP_GROWING_PERCENT}`);
  } catch {
    // V8's own factor, then.
  }
}

/**
 * `s` as one flat string, the same characters. A string built by joining (`+`, templates, path.join) is a tree
 * of V8's pieces, an object each: kept by the ten thousand (a name or a hash a file), the trees take several
 * times their text.
 */
export function flatString(s: string): string {
  return JSON.parse(JSON.stringify(s)) as string;
}
