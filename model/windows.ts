// Conversations cut to the model's context, the same way in training and at generation: the messages up to
// the user's request always stay (they say what the task is), then as many of the latest messages as fit.
import type { Message } from '../core/records.ts';
import type { Encoded } from './chat-template.ts';
import { seeded } from '../core/random.ts';

export interface Sequence {
  ids: number[];
  /** 1 on the tokens the loss counts. */
  mask: number[];
}

/** The messages that always stay: up to and including the first user message. */
export function headLength(messages: Message[]): number {
  const user = messages.findIndex((m) => m.role === 'user');
  return user < 0 ? Math.min(1, messages.length) : user + 1;
}

const span = (e: Encoded, from: number, to: number) => e.starts[to]! - e.starts[from]!;

/** Tokens of messages [from, to), with the mask kept only for messages in [trainFrom, to). */
function take(e: Encoded, from: number, to: number, trainFrom: number, out: Sequence): void {
  for (let t = e.starts[from]!; t < e.starts[to]!; t++) {
    out.ids.push(e.ids[t]!);
    out.mask.push(t >= e.starts[trainFrom]! ? e.mask[t]! : 0);
  }
}

/**
 * The head, then messages [s, to) with s ≥ head the smallest that fits in `length` tokens, then the open
 * assistant header if `e` has one; the mask counts messages from `trainFrom` on. Cut at `length` when even
 * [to − 1, to) does not fit.
 */
export function recentWindow(e: Encoded, head: number, to: number, length: number, trainFrom = head): Sequence {
  const tail = e.ids.length - e.starts.at(-1)!;
  return windowOf(
    e,
    head,
    Math.min(startOf(e, head, to, length - tail), Math.max(head, to - 1)),
    to,
    length,
    trainFrom,
  );
}

/** The head, messages [from, to) and the open assistant header if any, cut at `length`; the mask from `trainFrom` on. */
export function windowOf(
  e: Encoded,
  head: number,
  from: number,
  to: number,
  length: number,
  trainFrom: number,
): Sequence {
  const out: Sequence = { ids: [], mask: [] };
  take(e, 0, head, trainFrom, out);
  take(e, from, to, Math.max(trainFrom, head), out);
  for (let t = e.starts.at(-1)!; t < e.ids.length; t++) {
    out.ids.push(e.ids[t]!);
    out.mask.push(0);
  }
  return { ids: out.ids.slice(0, length), mask: out.mask.slice(0, length) };
}

/** The first message s ≥ head such that the head and messages [s, to) fit in `length` tokens. */
export function startOf(e: Encoded, head: number, to: number, length: number): number {
  const room = length - span(e, 0, head);
  let s = to;
  while (s > head && span(e, s - 1, to) <= room) s--;
  return s;
}

/**
 * Training windows of a whole conversation: every assistant message is trained on once, in a window that
 * holds as much of what came before it as fits. A conversation that fits is one window.
 */
export function trainingWindows(e: Encoded, messages: Message[], length: number): Sequence[] {
  const head = headLength(messages);
  const windows: Sequence[] = [];
  let trained = head;
  for (;;) {
    const first = messages.findIndex((m, i) => i >= trained && m.role === 'assistant');
    if (first < 0) return windows;
    // The furthest end whose window still reaches back to `first`.
    let end = first + 1;
    while (end < messages.length && startOf(e, head, end + 1, length) <= first) end++;
    windows.push(recentWindow(e, head, end, length, trained));
    trained = end;
  }
}

/**
 * The batches of one pass over `count` examples, in a seeded order: shuffled, then sorted by length within
 * runs of 32 batches so a batch pads little, then the batches shuffled. A function of (seed, epoch) only,
 * so a resumed run sees the same batches.
 */
export function epochBatches(lengths: number[], batchSize: number, seed: string, epoch: number): number[][] {
  const rand = seeded(seed, 'epoch', String(epoch));
  const order = lengths.map((_, i) => i);
  shuffle(order, rand);
  const run = batchSize * 32;
  const batches: number[][] = [];
  for (let i = 0; i < order.length; i += run) {
    const chunk = order.slice(i, i + run).sort((a, b) => lengths[a]! - lengths[b]! || a - b);
    for (let j = 0; j < chunk.length; j += batchSize) batches.push(chunk.slice(j, j + batchSize));
  }
  shuffle(batches, rand);
  return batches;
}

function shuffle<T>(xs: T[], rand: () => number): void {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [xs[i], xs[j]] = [xs[j]!, xs[i]!];
  }
}

/** The batch for optimiser step `step` (0-based) when each epoch is `epochBatches` over the examples. */
export function batchAt(lengths: number[], batchSize: number, seed: string, step: number): number[] {
  const perEpoch = Math.ceil(lengths.length / batchSize);
  return epochBatches(lengths, batchSize, seed, Math.floor(step / perEpoch))[step % perEpoch]!;
}

/**
 * Splits a batch into micro-batches of whole groups (a pair's two sides stay together) with at most
 * `maxTokens` tokens each once padded, so a step's activations fit in memory; a group larger than that
 * is a micro-batch alone.
 */
export function microBatches<T>(groups: T[][], length: (x: T) => number, maxTokens: number): T[][] {
  const out: T[][] = [];
  let current: T[] = [];
  let longest = 0;
  for (const g of [...groups].sort((a, b) => Math.max(...a.map(length)) - Math.max(...b.map(length)))) {
    const l = Math.max(longest, ...g.map(length));
    if (current.length && (current.length + g.length) * l > maxTokens) {
      out.push(current);
      current = [];
      longest = 0;
    }
    current.push(...g);
    longest = Math.max(longest, ...g.map(length));
  }
  if (current.length) out.push(current);
  return out;
}

export interface Padded {
  ids: Int32Array;
  /** Next-token targets: ids shifted left by one. */
  targets: Int32Array;
  /** 1 where the target is counted. */
  mask: Float32Array;
  batch: number;
  length: number;
  /** Tokens that are not padding. */
  tokens: number;
}

/** B rows of T input tokens and each position's next token: what a model scores (its log p(target) at every position). */
export type TokenBlock = Pick<Padded, 'ids' | 'targets' | 'batch' | 'length'>;

/** Sequences as one (batch, length) block of inputs and next-token targets, padded with `pad`. */
export function padBatch(sequences: Sequence[], pad: number): Padded {
  const length = Math.max(...sequences.map((s) => s.ids.length - 1), 1);
  const batch = sequences.length;
  const ids = new Int32Array(batch * length).fill(pad);
  const targets = new Int32Array(batch * length).fill(pad);
  const mask = new Float32Array(batch * length);
  let tokens = 0;
  sequences.forEach((s, b) => {
    for (let t = 0; t + 1 < s.ids.length; t++) {
      ids[b * length + t] = s.ids[t]!;
      targets[b * length + t] = s.ids[t + 1]!;
      mask[b * length + t] = s.mask[t + 1]!;
    }
    tokens += s.ids.length;
  });
  return { ids, targets, mask, batch, length, tokens };
}

/** Targets counted in a padded batch. */
export function maskedIn(b: Padded): number {
  return b.mask.reduce((a, m) => a + m, 0);
}
