// The one retry policy for calls that leave the machine: exponential backoff with jitter, and the server's
// Retry-After when it gives one.

export interface RetryPolicy {
  /** Tries in all, the first included. */
  attempts: number;
  /** Backoff before the second try; doubled for each try after it. */
  baseMs: number;
  /** No wait is longer, whatever the server asks. */
  maxMs: number;
}

export interface RetryDecision {
  retry: boolean;
  /** The server's Retry-After, in milliseconds, when it sent one. */
  afterMs?: number;
  /** Why, for the log: `429`, `503`, `timeout`. */
  reason: string;
}

/** The wait before try `attempt + 1` (attempt counts from 1): the server's word if given, else backoff with full jitter over its upper half. */
function backoffMs(
  policy: RetryPolicy,
  attempt: number,
  afterMs: number | undefined,
  random: () => number = Math.random,
): number {
  if (afterMs !== undefined && Number.isFinite(afterMs) && afterMs >= 0) return Math.min(afterMs, policy.maxMs);
  const ceiling = Math.min(policy.maxMs, policy.baseMs * 2 ** (attempt - 1));
  return ceiling * (0.5 + 0.5 * random());
}

/** A Retry-After header (seconds or an HTTP date), or retry-after-ms, in milliseconds. */
export function retryAfterMs(
  header: (name: string) => string | null | undefined,
  now = Date.now(),
): number | undefined {
  const ms = header('retry-after-ms');
  if (ms && Number.isFinite(Number(ms))) return Number(ms);
  const value = header('retry-after');
  if (!value) return undefined;
  if (/^\d+(\.\d+)?$/.test(value.trim())) return Number(value) * 1000;
  const date = Date.parse(value);
  return Number.isNaN(date) ? undefined : Math.max(0, date - now);
}

export interface RetryEvent {
  attempt: number;
  waitMs: number;
  reason: string;
}

/** Calls `fn` until it succeeds, the error is not worth retrying, or the tries run out (then the last error is thrown). */
export async function withRetry<T>(
  fn: (attempt: number) => Promise<T>,
  policy: RetryPolicy,
  classify: (error: unknown) => RetryDecision,
  onRetry: (event: RetryEvent) => void = () => {},
): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn(attempt);
    } catch (error) {
      const decision = classify(error);
      if (!decision.retry || attempt >= policy.attempts) throw error;
      const waitMs = backoffMs(policy, attempt, decision.afterMs);
      onRetry({ attempt, waitMs, reason: decision.reason });
      await new Promise((resolve) => setTimeout(resolve, waitMs));
    }
  }
}
