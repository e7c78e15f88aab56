// collectGarbage (pipeline/memory.ts): a full collection on demand, without a Node option.
import { setImmediate as tick } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { collectGarbage } from '../../pipeline/memory.ts';

describe('collectGarbage', () => {
  it('frees what nothing holds any more, a buffer included', async () => {
    const made = () => {
      const buffer = Buffer.allocUnsafeSlow(8 << 20);
      return { buffer: new WeakRef(buffer.buffer), object: new WeakRef({ held: buffer }) };
    };
    const refs = made();
    expect(refs.buffer.deref()).toBeDefined(); // no collection has come yet: it is there to be freed
    await tick(); // a WeakRef made or read holds its target until the current job ends
    collectGarbage();
    expect(refs.object.deref()).toBeUndefined();
    expect(refs.buffer.deref()).toBeUndefined();
  });
});
