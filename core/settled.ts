// Work started side by side (episodes sharing one decoder), awaited to its end before a failure is passed on.

/**
 * Every promise's value, once all have settled; the first failure otherwise. Nothing is left running when the
 * caller gives up: episodes played side by side share a decoder, and an interrupt reaches each of them.
 */
export async function settled<T>(promises: Promise<T>[]): Promise<T[]> {
  const results = await Promise.allSettled(promises);
  const failed = results.find((r) => r.status === 'rejected');
  if (failed) throw failed.reason;
  return results.map((r) => (r as PromiseFulfilledResult<T>).value);
}
