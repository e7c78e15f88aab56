// Groups sessions that have no task_id with the task (or the group) whose request reads most alike.
//
// Method: a session's request text is its first user message (else all text before the first
// assistant turn), lowercased and cut into words [a-z0-9]+. Its shingles are the set of words and
// adjacent word pairs. Two requests are alike with the Jaccard similarity of their shingle sets,
// |A ∩ B| / |A ∪ B|. A session joins the most alike known group when that similarity reaches the
// threshold, else it starts a group of its own. Candidates come from an inverted index over the
// shingles, skipping shingles shared by too many groups to tell them apart.
import { fnv1aNumbers, sha256 } from '../../pipeline/hash.ts';
import { NumberList } from '../../pipeline/buffers.ts';
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
 * more than `commonLimit` groups, the candidates are every group holding a shingle held by at most
 * `commonLimit`, counted the same way, as before. A group of the very same shingles (none is more alike) is found by a hash of them.
 * Shingles are kept as numbers, a group's one after another in one array (Sets of strings would take
 * several times the memory). The groups are those comparing every candidate's shingles whole would make
 * (docs/stages.md, split).
 */
export class TaskMatcher {
  private readonly ids: string[] = [];
  /** Each shingle's number, and per number the groups that hold it, in the order they were made. */
  private readonly numbers = new Map<string, number>();
  private readonly postings: number[][] = [];
  /** Every group's shingles' numbers, group g's from `starts[g]` to `starts[g + 1]`. */
  private readonly members = new NumberList((length) => new Int32Array(length));
  private readonly starts = new NumberList((length) => new Int32Array(length));
  /** The first group of each set of shingles, by a hash of their numbers (where two sets share a hash, the first made). */
  private readonly byShingles = new Map<number, number>();
  /** Per group, the last request it was a candidate for (the request's number), and the shingles it was counted sharing. */
  private seen = new Int32Array(1024);
  private shared = new Int32Array(1024);
  /** Per shingle number, the last request that looks it up in its candidates. */
  private looking = new Int32Array(1024);
  private requests = 0;

  constructor(
    readonly threshold: number,
    private readonly commonLimit = COMMON_SHINGLE_LIMIT,
  ) {
    this.starts.push(0);
  }

  get size(): number {
    return this.ids.length;
  }

  add(id: string, text: string): void {
    const g = this.ids.length;
    this.ids.push(id);
    const numbers: number[] = [];
    for (const s of shingles(text)) {
      let k = this.numbers.get(s);
      if (k === undefined) {
        this.numbers.set(s, (k = this.postings.length));
        this.postings.push([]);
        if (k >= this.looking.length) this.looking = grown(this.looking);
      }
      this.postings[k]!.push(g);
      numbers.push(k);
    }
    numbers.sort((x, y) => x - y);
    for (const k of numbers) this.members.push(k);
    this.starts.push(this.members.length);
    const hash = fnv1aNumbers(numbers); // the set's key in byShingles (its numbers ascending)
    if (!this.byShingles.has(hash)) this.byShingles.set(hash, g);
    if (g >= this.seen.length) [this.seen, this.shared] = [grown(this.seen), new Int32Array(2 * this.shared.length)];
  }

  /** The first group whose shingles are `numbers` (ascending), or -1. */
  private same(numbers: number[]): number {
    const g = this.byShingles.get(fnv1aNumbers(numbers)) ?? -1;
    if (g < 0 || this.starts.get(g + 1) - this.starts.get(g) !== numbers.length) return -1;
    const from = this.starts.get(g);
    return numbers.every((k, i) => this.members.get(from + i) === k) ? g : -1;
  }

  /** The group most alike to `text` at or above the threshold (the first made among equals), or null. */
  best(text: string): { id: string; score: number } | null {
    const set = shingles(text);
    const a = set.size;
    if (a === 0) return null;
    const { counted, looked, numbers } = this.lookups(set);
    // A group of the same shingles (Jaccard 1: none is more alike), where the request has a shingle that is
    // not common (else no group is a candidate).
    const same = numbers.length === a && counted.length > 0 ? this.same(numbers.sort((x, y) => x - y)) : -1;
    if (same >= 0) return { id: this.ids[same]!, score: 1 };
    const request = ++this.requests;
    const { seen, shared, looking } = this;
    const members = this.members.view();
    for (const k of looked) looking[k] = request;
    // The candidates, each with the counted shingles it holds.
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
    const c = counted.length;
    const at = new Int32Array(c + 1);
    for (const g of candidates) at[c - shared[g]! + 1]!++;
    for (let i = 1; i <= c; i++) at[i]! += at[i - 1]!;
    const order = new Int32Array(candidates.length);
    for (const g of candidates) order[at[c - shared[g]!]!++] = g;
    // Jaccard as `jaccard` works it out, from the shingles shared (it grows with them).
    const starting = this.starts.view();
    const score = (g: number, n: number) => n / (a + starting[g + 1]! - starting[g]! - n);
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
      // The rest looked up: each of the group's shingles not yet read may be one.
      const end = starting[g + 1]!;
      for (let i = starting[g]!; i < end; i++) {
        if (looking[members[i]!] === request) n++;
        else if (beaten(g, n + Math.min(looked.length, end - i - 1))) break;
      }
      if (!beaten(g, n)) [best, bestScore] = [g, score(g, n)];
    }
    return best >= 0 ? { id: this.ids[best]!, score: bestScore } : null;
  }

  /**
   * The postings of a request's shingles whose groups are counted as candidates, and the numbers of the
   * shingles looked up in each candidate's: the |A| − ⌊t·|A|⌋ + 1 held by the fewest groups and the others,
   * or, where some of those are common, every shingle not common and the common ones. A shingle no group
   * holds is neither.
   */
  private lookups(set: Set<string>): { counted: number[][]; looked: number[]; numbers: number[] } {
    const held = [...set].map((s) => this.numbers.get(s) ?? -1).sort((x, y) => this.held(x) - this.held(y));
    const probed = Math.min(held.length, held.length - Math.floor(this.threshold * held.length) + 1);
    const common = (k: number) => this.held(k) > this.commonLimit;
    const [counted, looked] = common(held[probed - 1]!)
      ? [held.filter((k) => !common(k)), held.filter(common)]
      : [held.slice(0, probed), held.slice(probed)];
    const numbers = held.filter((k) => k >= 0);
    return {
      counted: counted.filter((k) => k >= 0).map((k) => this.postings[k]!),
      looked: looked.filter((k) => k >= 0),
      numbers,
    };
  }

  /** How many groups hold shingle number k (none where k is -1). */
  private held(k: number): number {
    return k < 0 ? 0 : this.postings[k]!.length;
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

/** A copy of `values` twice as long. */
function grown(values: Int32Array): Int32Array<ArrayBuffer> {
  const copy = new Int32Array(2 * values.length);
  copy.set(values);
  return copy;
}
