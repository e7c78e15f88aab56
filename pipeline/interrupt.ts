// Stopping a run when asked: Ctrl+C (SIGINT), a scheduler's SIGTERM or a closed terminal's SIGHUP aborts the
// run's signal, and every long loop stops at its next safe point (a training step, a scored batch, an
// assistant turn). A loop that never gives the event loop a turn never sees a signal at all, so a safe point
// first yields, then looks.

/** The run was interrupted at a safe point; the message says where, and what the next run will do. */
export class Interrupted extends Error {
  override name = 'Interrupted';
}

/**
 * The signals that stop a run or a server the same orderly way. SIGHUP is among them: a closed terminal or
 * ssh session would otherwise kill the process at once, leaving its lock and half-made folders.
 */
export const STOP_SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const satisfies readonly NodeJS.Signals[];

/** The shell's exit code for a process stopped by `signal`: 128 + its number (130 SIGINT, 143 SIGTERM, 129 SIGHUP). */
export function signalExitCode(signal: NodeJS.Signals): number {
  return signal === 'SIGINT' ? 130 : signal === 'SIGHUP' ? 129 : 143;
}

/** A signal that is never aborted: for code run outside a stage (tests, benches). */
export const NEVER: AbortSignal = new AbortController().signal;

/** Lets the event loop run (timers, signal handlers), then says whether `signal` was aborted. */
export async function interrupted(signal: AbortSignal): Promise<boolean> {
  await new Promise<void>((resolve) => setImmediate(resolve));
  return signal.aborted;
}

/** A safe point: yields, and throws Interrupted with `what` (where it stopped, what happens next) if asked to stop. */
export async function safePoint(signal: AbortSignal, what: () => string): Promise<void> {
  if (await interrupted(signal)) throw new Interrupted(what());
}

/**
 * For loops over records: true every `every` calls, when the loop should pass a safe point. A plain counter,
 * so a record costs no promise: `if (due()) await safePoint(signal, what)`.
 */
export function every(n: number): () => boolean {
  let calls = 0;
  return () => ++calls % n === 0;
}
