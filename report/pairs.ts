// The pairs the report's browser shows: every pair the judges saw (the judge stage's files, or the gate's where
// there are none), each with its sides made whole from the sessions, what each judge said, and whether the
// gate kept it. A workspace may hold millions of pairs and a page cannot, so at most `max` are picked: an
// equal share for each source, negative type and gate decision (a rare kind of pair is shown as often as a
// common one), within a share by the hash of the pair's id (the same pairs on every run).
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { Message, Pair } from '../core/records.ts';
import type { Engine } from '../pipeline/engine.ts';
import { fnv1a } from '../pipeline/hash.ts';
import { readLines } from '../pipeline/jsonl.ts';
import type { PairSide } from '../store/messages.ts';
import { readPairs, readSplitInfo } from '../stages/layout.ts';
import type { BrowserMessage, BrowserPair, PairBrowser, Verdict } from './data.ts';

/** A judge stage's record: the pair with each judge's verdict. */
type JudgedPair = Pair<PairSide> & { verdicts?: Record<string, Verdict>; verdict?: Verdict };

/** The pairs browser's data, or null where no stage has judged pairs yet. */
export async function browserPairs(engine: Engine, max: number): Promise<PairBrowser | null> {
  const dir = (stage: string) => engine.ws.stageDir(stage);
  const from = ['judge', 'gate'].find((s) => existsSync(join(dir(s), 'train.jsonl')));
  if (!from) return null;
  const files = ['train', 'test'].map((side) => join(dir(from), `${side}.jsonl`)).filter((f) => existsSync(f));
  const dropped = await droppedByGate(join(dir('gate'), 'dropped.jsonl'));

  // First pass: each pair's kind, from its line's fields (no whole parse).
  const seen: { file: number; line: number; hash: number; kind: string }[] = [];
  for (const [f, file] of files.entries())
    for await (const { line, text } of readLines(file)) {
      const id = field(text, 'pair_id');
      if (id === null) continue;
      const kind = `${field(text, 'source')}/${field(text, 'negative_type') ?? '—'}/${dropped.has(id) ? 'dropped' : 'kept'}`;
      seen.push({ file: f, line, hash: fnv1a(id), kind });
    }
  const picked = pick(seen, max);

  const store = new Messages();
  const pairs: BrowserPair[] = [];
  const folders = { split: dir('split'), ingest: dir('ingest') };
  const buckets = existsSync(join(folders.split, 'info.json')) ? (await readSplitInfo(folders.split)).buckets : 1;
  for (const [f, file] of files.entries()) {
    const lines = picked.get(f);
    if (!lines) continue;
    const only = async function* () {
      for await (const l of readLines(file)) if (lines.has(l.line)) yield l;
    };
    for await (const { stored, whole } of readPairs<JudgedPair>(file, folders, buckets, only()))
      pairs.push({
        id: stored.pair_id,
        split: stored.split,
        source: stored.source,
        type: stored.negative_type,
        task: stored.task_id,
        judge: stored.judge,
        confidence: stored.confidence,
        dropped: dropped.get(stored.pair_id) ?? null,
        prompt: whole.prompt.map((m) => store.add(m)),
        chosen: whole.chosen.map((m) => store.add(m)),
        rejected: whole.rejected.map((m) => store.add(m)),
        verdicts: stored.verdicts ?? (stored.verdict && stored.judge ? { [stored.judge]: stored.verdict } : {}),
      });
  }
  const kinds = new Set(seen.map((s) => s.kind)).size;
  return {
    total: seen.length,
    picked:
      pairs.length === seen.length
        ? `every pair of ${from}/`
        : `${pairs.length} of the ${seen.length} pairs of ${from}/: an equal share of each of the ${kinds} kinds (source, negative type, kept or dropped), by the hash of their ids`,
    texts: store.texts,
    messages: store.messages,
    pairs,
  };
}

/** A top-level string field of a pair's line (pair_id, source, negative_type: no message has such a key); null where absent or null. */
function field(line: string, name: string): string | null {
  const m = new RegExp(`"${name}":"((?:[^"\\\\]|\\\\.)*)"`).exec(line);
  return m ? (JSON.parse(`"${m[1]}"`) as string) : null;
}

/**
 * At most `max` of `seen`, as file → line numbers: each kind an equal share (a kind with fewer than its share
 * gives the rest to the others), and within a kind the pairs of the lowest hashes.
 */
export function pick(
  seen: { file: number; line: number; hash: number; kind: string }[],
  max: number,
): Map<number, Set<number>> {
  const byKind = new Map<string, typeof seen>();
  for (const s of seen) {
    const list = byKind.get(s.kind) ?? [];
    list.push(s);
    byKind.set(s.kind, list);
  }
  const kinds = [...byKind.values()].sort((a, b) => a.length - b.length);
  const out = new Map<number, Set<number>>();
  let left = max;
  kinds.forEach((list, i) => {
    const share = Math.min(list.length, Math.floor(left / (kinds.length - i)));
    left -= share;
    for (const s of [...list].sort((a, b) => a.hash - b.hash).slice(0, share)) {
      const lines = out.get(s.file) ?? new Set<number>();
      lines.add(s.line);
      out.set(s.file, lines);
    }
  });
  return out;
}

async function droppedByGate(file: string): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  if (!existsSync(file)) return out;
  for await (const { text } of readLines(file)) {
    if (!text) continue;
    const r = JSON.parse(text) as { pair_id: string; reason: string };
    out.set(r.pair_id, r.reason);
  }
  return out;
}

/** The pairs' messages and their texts, each stored once: the pairs of a session share its prompt, and often a side. */
class Messages {
  readonly texts: string[] = [];
  readonly messages: BrowserMessage[] = [];
  private readonly textIndex = new Map<string, number>();
  private readonly messageIndex = new Map<string, number>();

  /** The message's place in `messages`. */
  add(m: Message): number {
    const out: BrowserMessage = { role: m.role, text: m.content === null ? null : this.text(m.content) };
    if (m.tool_calls?.length)
      out.calls = m.tool_calls.map((c) => ({ name: c.function.name, arguments: c.function.arguments }));
    if (m.tool_call_id) out.callId = m.tool_call_id;
    return Messages.place(this.messageIndex, this.messages, JSON.stringify(out), out);
  }

  private text(text: string): number {
    return Messages.place(this.textIndex, this.texts, text, text);
  }

  private static place<T>(index: Map<string, number>, list: T[], key: string, value: T): number {
    let i = index.get(key);
    if (i === undefined) {
      i = list.push(value) - 1;
      index.set(key, i);
    }
    return i;
  }
}
