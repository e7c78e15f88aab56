// Best-of-N: the judges pick the best of a task's N candidates, and the best against
// each other candidate gives up to N−1 pairs. Ties and abstentions give none (the gate drops them).
import { existsSync } from 'node:fs';
import {
  commonPrefixLength,
  pairId,
  type JudgedPair,
  type Message,
  type Split,
  type SplitSession,
} from '../../core/records.ts';
import {
  NO_COST,
  abstain,
  addStats,
  chosenConfidence,
  swapped,
  type Comparison,
  type Completion,
  type JudgeStats,
} from '../../core/verdict.ts';
import type { EnsembleVerdict } from '../../judges/ensemble.ts';
import { readTaskGroups, type StoredBucketReader } from '../../store/bucket-reader.ts';
import type { PairSide } from '../../store/messages.ts';
import type { SplitFolders } from '../layout.ts';
import { coupleKey, type Tally } from './constructed.ts';

export interface Candidate {
  id: string;
  messages: Message[];
  reward: number | null;
  metadata: string;
  /** A logged session, in split's bucket: a pair's side may point at its messages (a sampled one is written whole). */
  logged?: boolean;
}

/** Messages `from` to `to` - 1 of a candidate as a pair's side: where they lie in its session when it is logged. */
const sideOf = (c: Candidate, from: number, to: number): PairSide =>
  c.logged && to > from ? { session_id: c.id, messages: [from, to] } : c.messages.slice(from, to);

export interface Group {
  task_id: string | null;
  split: Split;
  candidates: Candidate[];
}

export type Decide = (c: Comparison) => Promise<EnsembleVerdict>;

const hasAssistant = (ms: Message[]) => ms.some((m) => m.role === 'assistant');

/**
 * Judges a group: a knockout pass finds a champion (a challenger replaces it only by winning), then the
 * champion is compared with every other candidate; each comparison becomes a judged record, the
 * champion as `chosen`. As for outcome pairs, a couple's prompt is the longest prefix the two share.
 * Candidates with the same messages as another are left out (`duplicates`).
 */
export async function judgeGroup(
  group: Group,
  decide: Decide,
): Promise<{ judged: JudgedPair<PairSide>[]; duplicates: string[]; offRecord: JudgeStats }> {
  // Rewards first, so that the verifier settles most of the knockout at once.
  const all = [...group.candidates].sort(
    (x, y) => (y.reward ?? -1) - (x.reward ?? -1) || (x.id < y.id ? -1 : x.id > y.id ? 1 : 0),
  );
  const candidates: Candidate[] = [];
  const duplicates: string[] = [];
  for (const c of all) {
    if (
      candidates.some(
        (k) =>
          k.messages.length === c.messages.length && commonPrefixLength(k.messages, c.messages) === c.messages.length,
      )
    )
      duplicates.push(c.id);
    else candidates.push(c);
  }
  if (candidates.length < 2) return { judged: [], duplicates, offRecord: NO_COST };

  const couple = (x: Candidate, y: Candidate) => commonPrefixLength(x.messages, y.messages);
  const decideCouple = (x: Candidate, y: Candidate): Promise<EnsembleVerdict> => {
    const n = couple(x, y);
    const a: Completion = { id: x.id, messages: x.messages.slice(n), reward: x.reward };
    const b: Completion = { id: y.id, messages: y.messages.slice(n), reward: y.reward };
    if (!hasAssistant(a.messages) || !hasAssistant(b.messages)) {
      return Promise.resolve({
        verdict: abstain('a side has no assistant turn after the shared prompt'),
        judge: '',
        verdicts: {},
        stats: NO_COST,
      });
    }
    return decide({ prompt: x.messages.slice(0, n), a, b, task_id: group.task_id, metadata: x.metadata });
  };
  // Each unordered couple is judged once; seen the other way round, its verdict is swapped.
  const seen = new Map<string, Promise<EnsembleVerdict>>();
  const compare = async (x: Candidate, y: Candidate): Promise<EnsembleVerdict> => {
    const back = seen.get(`${y.id}\u0000${x.id}`);
    if (back) {
      const v = await back;
      return {
        ...v,
        verdict: swapped(v.verdict),
        verdicts: Object.fromEntries(Object.entries(v.verdicts).map(([k, w]) => [k, swapped(w)])),
      };
    }
    const key = `${x.id}\u0000${y.id}`;
    let v = seen.get(key);
    if (!v) seen.set(key, (v = decideCouple(x, y)));
    return v;
  };

  let champion = candidates[0]!;
  for (const challenger of candidates.slice(1)) {
    if ((await compare(champion, challenger)).verdict.winner === 'b') champion = challenger;
  }
  const others = candidates.filter((c) => c !== champion);
  const verdicts = await Promise.all(others.map((other) => compare(champion, other)));
  // What the knockout spent on couples that are not in the output still belongs in the report.
  const recorded = new Set(others.flatMap((o) => [`${champion.id}\u0000${o.id}`, `${o.id}\u0000${champion.id}`]));
  let offRecord = NO_COST;
  for (const [key, v] of seen) if (!recorded.has(key)) offRecord = addStats(offRecord, (await v).stats);
  const judged = others.map((other, i): JudgedPair<PairSide> => {
    const v = verdicts[i]!;
    const gap = champion.reward !== null && other.reward !== null ? champion.reward - other.reward : null;
    const n = couple(champion, other);
    return {
      pair_id: pairId('best_of_n', champion.id, other.id),
      // The shared prompt points at whichever of the two sessions is logged.
      prompt: sideOf(champion.logged || !other.logged ? champion : other, 0, n),
      chosen: sideOf(champion, n, champion.messages.length),
      rejected: sideOf(other, n, other.messages.length),
      chosen_reward: champion.reward,
      rejected_reward: other.reward,
      margin: gap ?? v.verdict.margin ?? null,
      confidence: chosenConfidence(v.verdict),
      source: 'best_of_n',
      negative_type: null,
      judge: v.judge,
      task_id: group.task_id,
      chosen_session_id: champion.id,
      rejected_session_id: other.id,
      split: group.split,
      metadata: champion.metadata,
      verdict: v.verdict,
      verdicts: v.verdicts,
      judge_stats: v.stats,
    };
  });
  return { judged, duplicates, offRecord };
}

/**
 * A bucket's tasks with their candidates: logged sessions (split's bucket file, in `folders`) and sampled
 * ones (sample's), at most `max` each, by id; both read through `reader`.
 */
function candidateGroups(
  splitFile: string,
  sampleFile: string,
  folders: SplitFolders,
  reader: StoredBucketReader,
  max: number,
) {
  // Of either file, the `max` sessions of a task whose ids come first are all the cut can take.
  const cut = { most: max, byId: true };
  const sampled = new Map<string, SplitSession[]>(
    existsSync(sampleFile) ? readTaskGroups(sampleFile, folders.ingest, reader, cut) : [],
  );
  return readTaskGroups(splitFile, folders.ingest, reader, cut).map(([taskId, sessions]) => {
    const logged = new Set(sessions);
    const all = [...sessions, ...(sampled.get(taskId) ?? [])].sort((x, y) =>
      x.session_id < y.session_id ? -1 : x.session_id > y.session_id ? 1 : 0,
    );
    const candidates: Candidate[] = all.slice(0, max).map((s) => ({
      id: s.session_id,
      messages: s.messages,
      reward: s.reward,
      metadata: s.metadata,
      logged: logged.has(s),
    }));
    return { task_id: taskId, split: sessions[0]!.split, candidates };
  });
}

/** Where one bucket's best-of-N groups are, and how they are cut. */
export interface BestOfNBucket {
  splitFile: string;
  sampleFile: string;
  min: number;
  max: number;
}

/**
 * One bucket's best-of-N: its groups of at least `min` candidates judged, each group's pairs handed to
 * `write` without the couples the outcome pairs took (`outcomeKeys`: they would only be duplicate rows),
 * and counted in `tally` (what the knockout spent off the record included).
 */
export async function judgeBestOfN(
  where: BestOfNBucket,
  outcomeKeys: Set<string>,
  folders: SplitFolders,
  reader: StoredBucketReader,
  decide: Decide,
  tally: Tally,
  write: (pairs: JudgedPair<PairSide>[]) => Promise<void>,
): Promise<void> {
  const groups = candidateGroups(where.splitFile, where.sampleFile, folders, reader, where.max);
  const results = await Promise.all(
    groups.filter((g) => g.candidates.length >= where.min).map((g) => judgeGroup(g, decide)),
  );
  for (const r of results) {
    tally.counts.best_of_n_groups!++;
    tally.counts.best_of_n_duplicates! += r.duplicates.length;
    tally.stats = addStats(tally.stats, r.offRecord);
    const fresh = r.judged.filter((p) => !outcomeKeys.has(coupleKey(p)));
    tally.counts.best_of_n_same_as_outcome! += r.judged.length - fresh.length;
    await write(fresh);
  }
}
