// Giving a finished stage's memory back before the next one starts.
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/** V8's collector: Node's own where it was started with --expose-gc, else exposed here; a no-op where neither works. */
let gc: (() => void) | null = null;

/**
 * A full garbage collection now. A data stage ends holding buffers of tens of MB (split gathers a block per
 * bucket file) that are garbage from then on; but the next stage works on its threads and allocates little
 * on this one, so no collection comes to free them, and their memory stays with the process through that
 * stage's peak (about 35 MiB of malloc's heap at a million sessions). V8 offers no call for it without
 * `--expose-gc`, which is set here (as Jest does for its leak detector) rather than asking every user for a
 * Node option.
 */
export function collectGarbage(): void {
  gc ??= exposed();
  gc();
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
