// What the training stages read: the exported Parquet datasets, as token sequences cut to the context (the
// log-probabilities a model gives them are runtime/scoring.ts's).
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { readParquetRows } from '../pipeline/parquet.ts';
import type { Message } from '../core/records.ts';
import type { Chat } from '../model/chat.ts';
import { viewAll, type Placeholders } from '../model/placeholders.ts';
import { seeded } from '../core/random.ts';
import { headLength, startOf, trainingWindows, windowOf, type Sequence } from '../model/windows.ts';

/** Every row of an exported Parquet file, as plain objects. */
export async function readParquet<T>(path: string): Promise<T[]> {
  const rows: T[] = [];
  for await (const r of readParquetRows(path)) rows.push(r.value as T);
  return rows;
}

/**
 * The rows of the export's preference tables of one side, `pairs` then `trajectories` (the pairs TRL cannot
 * read right, which prefab's trainer, masking all but assistant tokens, trains on as well); an export made
 * before there was a trajectories table has none.
 */
export async function readPreferencePairs<T>(exportDir: string, side: 'train' | 'test'): Promise<T[]> {
  const rows = await readParquet<T>(join(exportDir, 'pairs', `${side}.parquet`));
  const trajectories = join(exportDir, 'trajectories', `${side}.parquet`);
  if (existsSync(trajectories)) rows.push(...(await readParquet<T>(trajectories)));
  return rows;
}

/** At most `n` of the rows (null: all), drawn by a seeded shuffle and kept in their order, so a subset mixes every kind of row. */
export function subset<T>(rows: T[], n: number | null, seed: string): T[] {
  if (n === null || n >= rows.length) return rows;
  const rand = seeded(seed, 'subset');
  const keys = rows.map((_, i) => ({ i, k: rand() }));
  return keys
    .sort((a, b) => a.k - b.k)
    .slice(0, n)
    .sort((a, b) => a.i - b.i)
    .map((x) => rows[x.i]!);
}

/** Messages as Parquet gives them back (absent optional fields as null) in the Message contract. */
export const fromParquet = (messages: Message[]): Message[] =>
  messages.map((m) => ({ ...m, tool_calls: m.tool_calls ?? undefined }));

/**
 * SFT sequences: each conversation's training windows (one when it fits), as the model reads it
 * (`placeholders`). Windows with nothing to learn (a head longer than the context leaves no room for an
 * assistant token) are left out.
 */
export async function sftSequences(
  chat: Chat,
  conversations: Message[][],
  length: number,
  source: string,
  placeholders: Placeholders,
): Promise<Sequence[]> {
  const cs = viewAll(conversations.map(fromParquet), placeholders);
  const encoded = await chat.encode(cs);
  const windows = encoded.flatMap((e, i) => trainingWindows(e, cs[i]!, length));
  const useful = windows.filter((w) => w.mask.some((m) => m === 1));
  if (useful.length === 0 && windows.length > 0) {
    const head = Math.min(...encoded.map((e, i) => e.starts[headLength(cs[i]!)]!));
    throw new Error(
      `${source}: no assistant token fits in a context of ${length - 1} tokens after the system prompt and user request (at least ${head} tokens): raise sft.model.context`,
    );
  }
  return useful;
}

/**
 * Prompt + completion sequences with the completion's assistant tokens masked in, for completions that share
 * a prompt (a pair's chosen and rejected): the prompt is cut the same way for all of them, keeping the head
 * and as many of its latest messages as leave room for the longest completion. When a completion does not
 * fit in `length` tokens even after the head alone, the answer is the reason, not a sequence cut short (a
 * pair whose rejected side lost its end would teach the wrong thing). Each prompt + completion is
 * masked as one conversation (`placeholders`), so a value a completion makes up gets a placeholder of its
 * own, as when the model writes it; the prompt reads the same in all of them.
 */
export async function completionSequences(
  chat: Chat,
  prompt: Message[],
  completions: Message[][],
  length: number,
  placeholders: Placeholders,
): Promise<Sequence[] | { tooLong: string }> {
  const cut = await promptCut(chat, prompt, completions, length, placeholders);
  return cut.tooLong === undefined ? cut.sequences() : { tooLong: cut.tooLong };
}

/** The same sequences, a completion that does not fit cut at its end instead of left out (KTO's, as TRL truncates). */
export async function truncatedSequences(
  chat: Chat,
  prompt: Message[],
  completions: Message[][],
  length: number,
  placeholders: Placeholders,
): Promise<Sequence[]> {
  return (await promptCut(chat, prompt, completions, length, placeholders)).sequences();
}

/** Where the prompt is cut for all the completions, and the sequences from there; `tooLong` says why one does not fit. */
async function promptCut(
  chat: Chat,
  prompt: Message[],
  completions: Message[][],
  length: number,
  placeholders: Placeholders,
): Promise<{ sequences: () => Sequence[]; tooLong?: string }> {
  const p = fromParquet(prompt);
  const cs = viewAll(
    completions.map((c) => [...p, ...fromParquet(c)]),
    placeholders,
  );
  const encoded = await chat.encode(cs);
  const head = Math.min(headLength(p), p.length);
  const starts = encoded.map((e, i) => startOf(e, head, cs[i]!.length, length));
  const longest = starts.indexOf(Math.max(...starts));
  const from = Math.max(head, Math.min(p.length, starts[longest]!));
  const sequences = () => encoded.map((e, i) => windowOf(e, head, from, cs[i]!.length, length, p.length));
  if (starts[longest]! <= p.length) return { sequences };
  // In positions, as the limit is given: a sequence of n ids (inputs and the last target) fills n − 1.
  const tokens = encoded[longest]!.ids.length - encoded[longest]!.starts[p.length]! + encoded[longest]!.starts[head]!;
  return {
    tooLong: `completion ${longest + 1} needs ${tokens - 1} tokens with the prompt's head, more than the ${length - 1} allowed`,
    sequences,
  };
}
