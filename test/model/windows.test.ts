import { describe, expect, it } from 'vitest';
import type { Message } from '../../core/records.ts';
import type { Encoded } from '../../model/chat-template.ts';
import { batchAt, epochBatches, microBatches, padBatch, recentWindow, trainingWindows } from '../../model/windows.ts';

/** A conversation of the given roles and token lengths; message i's tokens are 100·i + 0, 1, …, assistant tokens masked in. */
function conversation(parts: [Message['role'], number][]): { messages: Message[]; encoded: Encoded } {
  const messages = parts.map(([role]) => ({ role, content: role }) as Message);
  const encoded: Encoded = { ids: [], mask: [], starts: [] };
  parts.forEach(([role, n], i) => {
    encoded.starts.push(encoded.ids.length);
    for (let t = 0; t < n; t++) {
      encoded.ids.push(100 * i + t);
      encoded.mask.push(role === 'assistant' ? 1 : 0);
    }
  });
  encoded.starts.push(encoded.ids.length);
  return { messages, encoded };
}

const messageOf = (id: number) => Math.floor(id / 100);

describe('context windows', () => {
  const long = conversation([
    ['system', 10],
    ['user', 5],
    ['assistant', 4],
    ['tool', 12],
    ['assistant', 4],
    ['tool', 12],
    ['assistant', 4],
    ['tool', 12],
    ['assistant', 6],
  ]);

  it('keeps a conversation that fits whole, in one window', () => {
    const windows = trainingWindows(long.encoded, long.messages, 1000);
    expect(windows).toEqual([{ ids: long.encoded.ids, mask: long.encoded.mask }]);
  });

  it('cuts a long one into windows that each start with the system prompt and the request, and trains every assistant token once', () => {
    const windows = trainingWindows(long.encoded, long.messages, 40);
    expect(windows.length).toBeGreaterThan(1);
    const trained = new Map<number, number>();
    for (const w of windows) {
      expect(w.ids.length).toBeLessThanOrEqual(40);
      expect(w.ids.slice(0, 15).map(messageOf)).toEqual([...Array(10).fill(0), ...Array(5).fill(1)]);
      // Messages after the head are contiguous and in order: only whole middle messages are dropped.
      const after = [...new Set(w.ids.slice(15).map(messageOf))];
      expect(after).toEqual(after.map((_, i) => after[0]! + i));
      w.ids.forEach((id, t) => w.mask[t] && trained.set(id, (trained.get(id) ?? 0) + 1));
    }
    const assistantTokens = long.encoded.ids.filter((_, t) => long.encoded.mask[t]);
    expect([...trained.keys()].sort((a, b) => a - b)).toEqual(assistantTokens);
    expect([...trained.values()].every((n) => n === 1)).toBe(true);
  });

  it('gives the policy the head and the latest messages that fit, then the open assistant header', () => {
    const e = { ...long.encoded, ids: [...long.encoded.ids, 999], mask: [...long.encoded.mask, 0] };
    const w = recentWindow(e, 2, long.messages.length, 40);
    expect(w.ids.at(-1)).toBe(999);
    expect(w.ids.length).toBeLessThanOrEqual(40);
    expect(new Set(w.ids.slice(15, -1).map(messageOf))).toEqual(new Set([6, 7, 8])); // 15 + 4 + 12 + 6 + 1 = 38; message 5 would not fit
  });
});

describe('batches', () => {
  const lengths = Array.from({ length: 50 }, (_, i) => 10 + ((i * 37) % 23));

  it('visits every example once an epoch, in an order fixed by the seed and the epoch', () => {
    const epoch = epochBatches(lengths, 8, 'seed', 0);
    expect(epoch.flat().sort((a, b) => a - b)).toEqual(lengths.map((_, i) => i));
    expect(epochBatches(lengths, 8, 'seed', 0)).toEqual(epoch);
    expect(epochBatches(lengths, 8, 'seed', 1)).not.toEqual(epoch);
    expect(epochBatches(lengths, 8, 'other', 0)).not.toEqual(epoch);
    expect(batchAt(lengths, 8, 'seed', 7 + 2)).toEqual(epochBatches(lengths, 8, 'seed', 1)[2]);
  });

  it('splits a batch into micro-batches under the token budget, keeping each group whole', () => {
    const groups = [
      [0, 1],
      [2, 3],
      [4, 5],
      [6, 7],
    ];
    const size = (i: number) => 100 + i * 10;
    const micro = microBatches(groups, size, 450);
    expect(micro.flat().sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    for (const m of micro) {
      expect(m.length * Math.max(...m.map(size))).toBeLessThanOrEqual(450);
      for (const g of groups) expect(g.every((i) => m.includes(i)) || g.every((i) => !m.includes(i))).toBe(true);
    }
    // A group over the budget still gets through, alone.
    expect(microBatches([[0, 1, 2, 3, 4, 5]], size, 100)).toEqual([[0, 1, 2, 3, 4, 5]]);
  });

  it('pads a batch and shifts targets by one, masking what the loss does not count', () => {
    const b = padBatch(
      [
        { ids: [1, 2, 3], mask: [0, 1, 1] },
        { ids: [4, 5], mask: [0, 1] },
      ],
      0,
    );
    expect(b.length).toBe(2);
    expect(Array.from(b.ids)).toEqual([1, 2, 4, 0]);
    expect(Array.from(b.targets)).toEqual([2, 3, 5, 0]);
    expect(Array.from(b.mask)).toEqual([1, 1, 1, 0]);
    expect(b.tokens).toBe(5);
  });
});
