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

export class TaskMatcher {
  private readonly groups: { id: string; shingles: Set<string> }[] = [];
  private readonly index = new Map<string, number[]>();

  constructor(readonly threshold: number) {}

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
  }

  best(text: string): { id: string; score: number } | null {
    const set = shingles(text);
    const candidates = new Set<number>();
    for (const s of set) {
      const posting = this.index.get(s);
      if (posting && posting.length <= COMMON_SHINGLE_LIMIT) for (const g of posting) candidates.add(g);
    }
    let best: { id: string; score: number } | null = null;
    for (const g of [...candidates].sort((x, y) => x - y)) {
      const score = jaccard(set, this.groups[g]!.shingles);
      if (!best || score > best.score) best = { id: this.groups[g]!.id, score };
    }
    return best;
  }

  /** The task for an untasked session: the most alike group at or above the threshold, else a new group. */
  assign(text: string): GroupMatch {
    const found = this.best(text);
    if (found && found.score >= this.threshold) return { task_id: found.id, score: found.score, kind: 'matched_task' };
    const id = `group-${sha256(text).slice(0, 12)}`;
    this.add(id, text);
    return { task_id: id, score: 1, kind: 'new_group' };
  }
}
