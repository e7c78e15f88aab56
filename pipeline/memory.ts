// Giving a finished stage's memory back before the next one starts.
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

let gc: (() => void) | null = null;

/**
 * A full garbage collection now. A data stage ends holding buffers of tens of MB (split gathers a block per
 * bucket file) that are garbage from then on; but the next stage works on its threads and allocates little
 * on this one, so no collection comes to free them, and their memory stays with the process through that
 * stage's peak (40 MiB at a million sessions). V8 offers no call for it without `--expose-gc`, which is set
 * here (as Jest does for its leak detector) rather than asking every user for a Node option.
 */
export function collectGarbage(): void {
  if (!gc) {
    setFlagsFromString('--expose-gc');
    gc = runInNewContext('gc') as () => void;
  }
  gc();
}
