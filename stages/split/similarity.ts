// Groups sessions that have no task_id with the task (or the group) whose request reads most alike.
//
// Method: a session's request text is its first user message (else all text before the first
// assistant turn), lowercased and cut into words [a-z0-9]+. Its shingles are the set of words and
// adjacent word pairs. Two requests are alike with the Jaccard similarity of their shingle sets,
// |A ∩ B| / |A ∪ B|. A session joins the most alike known group when that similarity reaches the
// threshold, else it starts a group of its own. Candidates come from an inverted index over the
// shingles, skipping shingles shared by too many groups to tell them apart.
import { sha256 } from '../../pipeline/hash.ts';
import type { Message } from '../../core/records.ts';

const COMMON_SHINGLE_LIMIT = 2_000;

export function requestText(messages: Message[]): string {
  const user = messages.find((m) => m.role === 'user' && m.content);
  if (user) return user.content!;
  const before: string[] = [];
  for (const m of messages) {
    if (m.role === 'assistant') break;
    if (m.content) before.push(m.content);
  }
  return before.join('\n');
}

export function shingles(text: string): Set<string> {
  const words = text.toLowerCase().match(/[a-z0-9]+/g) ?? [];
  const out = new Set<string>(words);
  for (let i = 1; i < words.length; i++) out.add(`${words[i - 1]} ${words[i]}`);
  return out;
}

export function jaccard(a: Set<string>, b: Set<string>): number {
  if (a.size === 0 && b.size === 0) return 1;
  let shared = 0;
  for (const s of a) if (b.has(s)) shared++;
  return shared / (a.size + b.size - shared);
}

export interface GroupMatch {
  task_id: string;
  score: number;
  kind: 'matched_task' | 'new_group';
}

/**
 * The known groups and an inverted index over their shingles. A request joins the group `best` finds: of the
 * groups that share with it a shingle held by at most `commonLimit` groups (COMMON_SHINGLE_LIMIT), the one
 * most alike (the first made among equals), when that one reaches the threshold.
 *
 * Only groups that can reach the threshold are compared, and what they share is counted through the index
 * rather than looked up group by group. A group B alike to a request A by Jaccard t or more shares at least
 * ⌊t·|A|⌋ of A's shingles (J ≤ |A ∩ B| / |A|), so any |A| − ⌊t·|A|⌋ + 1 of A's shingles hold one of B's: the
 * groups holding those held by the fewest are the candidates, each counted as it comes. Those sharing most
 * are compared first; a candidate that could not reach t, or the best so far, with every other shingle of A
 * shared is passed over, and the others have the rest looked up. Where some of those few shingles are held by
 * more than `commonLimit` groups, the candidates are every group holding a shingle held by fewer, counted the
 * same way, as before. On the simulator's 100k sessions without their task ids (2,271 groups), split took
 * 255 s comparing every candidate's shingles whole, and takes 12 s so; the groups it makes are the same.
 */
export class TaskMatcher {
  private readonly groups: { id: string; shingles: Set<string> }[] = [];
  private readonly index = new Map<string, number[]>();
  /** Per group, the last request it was a candidate for (the request's number), and how many shingles it was counted sharing. */
  private seen = new Int32Array(1024);
  private shared = new Int32Array(1024);
  private requests = 0;

  constructor(
    readonly threshold: number,
    private readonly commonLimit = COMMON_SHINGLE_LIMIT,
  ) {}

  get size(): number {
    return this.groups.length;
  }

  add(id: string, text: string): void {
    const set = shingles(text);
    const g = this.groups.length;
    this.groups.push({ id, shingles: set });
    for (const s of set) {
      const posting = this.index.get(s);
      if (posting) posting.push(g);
      else this.index.set(s, [g]);
    }
    if (g >= this.seen.length) {
      const seen = new Int32Array(2 * this.seen.length);
      seen.set(this.seen);
      [this.seen, this.shared] = [seen, new Int32Array(seen.length)];
    }
  }

  /** The group most alike to `text` at or above the threshold (the first made among equals), or null. */
  best(text: string): { id: string; score: number } | null {
    const set = shingles(text);
    const a = set.size;
    if (a === 0) return null;
    const { counted, looked } = this.lookups(set);
    // The candidates, each with the counted shingles it holds.
    const request = ++this.requests;
    const { seen, shared } = this;
    const candidates: number[] = [];
    for (const posting of counted) {
      for (const g of posting) {
        if (seen[g] !== request) {
          seen[g] = request;
          shared[g] = 0;
          candidates.push(g);
        }
        shared[g]!++;
      }
    }
    // Those sharing most first (a counting sort).
    const k = counted.length;
    const starts = new Int32Array(k + 1);
    for (const g of candidates) starts[k - shared[g]! + 1]!++;
    for (let i = 1; i <= k; i++) starts[i]! += starts[i - 1]!;
    const order = new Int32Array(candidates.length);
    for (const g of candidates) order[starts[k - shared[g]!]!++] = g;
    // Jaccard as `jaccard` works it out, from the shingles shared (it grows with them).
    const score = (g: number, n: number) => n / (a + this.groups[g]!.shingles.size - n);
    let best = -1;
    let bestScore = -1;
    // Whether group g sharing `n` shingles misses the threshold, or loses to the best so far.
    const beaten = (g: number, n: number) => {
      const j = score(g, n);
      return j < this.threshold || j < bestScore || (j === bestScore && g > best);
    };
    for (const g of order) {
      let n = shared[g]!;
      if (beaten(g, n + looked.length)) continue;
      const of = this.groups[g]!.shingles;
      for (let i = 0; i < looked.length; i++) {
        if (of.has(looked[i]!)) n++;
        else if (beaten(g, n + looked.length - i - 1)) break;
      }
      if (!beaten(g, n)) [best, bestScore] = [g, score(g, n)];
    }
    return best >= 0 ? { id: this.groups[best]!.id, score: bestScore } : null;
  }

  /**
   * The postings of a request's shingles whose groups are counted as candidates, and the shingles looked up in
   * each candidate's: the |A| − ⌊t·|A|⌋ + 1 held by the fewest groups and the others, or, where some of those
   * are common, every shingle not common and the common ones.
   */
  private lookups(set: Set<string>): { counted: readonly number[][]; looked: string[] } {
    const held = [...set].map((s) => ({ s, posting: this.index.get(s) ?? NONE })).sort((x, y) => x.posting.length - y.posting.length);
    const probed = Math.min(held.length, held.length - Math.floor(this.threshold * held.length) + 1);
    const common = (h: (typeof held)[number]) => h.posting.length > this.commonLimit;
    const [counted, looked] = common(held[probed - 1]!) ? [held.filter((h) => !common(h)), held.filter(common)] : [held.slice(0, probed), held.slice(probed)];
    return { counted: counted.map((h) => h.posting), looked: looked.map((h) => h.s) };
  }

  /** The task for an untasked session: the most alike group at or above the threshold, else a new group. */
  assign(text: string): GroupMatch {
    const found = this.best(text);
    if (found) return { task_id: found.id, score: found.score, kind: 'matched_task' };
    const id = `group-${sha256(text).slice(0, 12)}`;
    this.add(id, text);
    return { task_id: id, score: 1, kind: 'new_group' };
  }
}

const NONE: number[] = [];
