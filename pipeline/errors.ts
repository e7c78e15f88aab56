/** The user asked for something that cannot be done as asked (bad flag, unknown stage, bad config): exit code 2. */
export class UsageError extends Error {
  override name = 'UsageError';
}

/** A stage failed in a way the user can act on (a missing input, a lock held by another run): exit code 1. */
export class PipelineError extends Error {
  override name = 'PipelineError';
}

export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
