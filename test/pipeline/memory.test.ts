// collectGarbage (pipeline/memory.ts): a full collection on demand, without a Node option; collectAfterStage,
// the engine's, when a stage leaves enough behind.
import { setImmediate as tick } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { collectAfterStage, collectGarbage } from '../../pipeline/memory.ts';

/** A buffer of `bytes` held by an object, both known only through WeakRefs. */
function made(bytes: number) {
  const buffer = Buffer.allocUnsafeSlow(bytes);
  return { buffer: new WeakRef(buffer.buffer), object: new WeakRef({ held: buffer }) };
}

describe('collectGarbage', () => {
  it('frees what nothing holds any more, a buffer included', async () => {
    const refs = made(8 << 20);
    expect(refs.buffer.deref()).toBeDefined(); // no collection has come yet: it is there to be freed
    await tick(); // a WeakRef made or read holds its target until the current job ends
    collectGarbage();
    expect(refs.object.deref()).toBeUndefined();
    expect(refs.buffer.deref()).toBeUndefined();
  });

  it('collects after a stage that leaves tens of MB behind', async () => {
    const refs = made(64 << 20);
    expect(refs.buffer.deref()).toBeDefined();
    await tick();
    collectAfterStage();
    expect(refs.object.deref()).toBeUndefined();
    expect(refs.buffer.deref()).toBeUndefined();
  });
});
