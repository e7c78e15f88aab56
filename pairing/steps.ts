// Step pairs (Step-DPO, IPR): rollouts of one task by one policy, a prefix tree over their turns, and each
// assistant turn valued by the success rate of the rollouts that took it after that prefix (a Monte Carlo
// estimate). Where sibling turns after the same prefix differ in value by at least a margin, the better and
// each worse one make a pair masked on that one turn, the prefix its prompt: the signal sits on the few tokens
// that decide an episode, in the states where the policy itself goes wrong. The pairs are TRL's format as
// every pair is: the prompt ends on a user or tool turn, each side is one assistant turn.
import { pairId, type Message, type Pair, type Session, type Split } from '../core/records.ts';

export interface StepPairOptions {
  /** Two sibling turns make a pair where their success rates differ by at least this (0 < margin ≤ 1). */
  margin: number;
  /** A rollout succeeded where its reward is at least this. */
  successReward: number;
  /** Rollouts a turn needs through it to be valued at all: below, its success rate says too little. */
  minVisits: number;
}

/** A branch point's turns as the pairs read them: each turn's message, its value, and the rollouts through it. */
interface Branch {
  message: Message;
  successes: number;
  visits: number;
  /** The first rollout (by id) that took it: the pair's session of that side. */
  session: string;
}

/**
 * A message as the tree compares turns: its role, text and calls (names and arguments), not the ids a sampler
 * or a log gave the calls, which differ between rollouts that did the same.
 */
function turnKey(m: Message): string {
  const calls = m.tool_calls?.map((c) => [c.function.name, c.function.arguments]) ?? null;
  return JSON.stringify([m.role, m.content ?? null, m.name ?? null, calls]);
}

/**
 * The step pairs of one task's rollouts (sessions that start alike, as a policy's rollouts in an environment
 * do): at every assistant turn where the rollouts part, the likeliest-to-succeed turn against each sibling at
 * least `margin` less likely. `split` is the pairs' side of the split.
 */
export function stepPairs(
  rollouts: Pick<Session, 'session_id' | 'task_id' | 'reward' | 'messages'>[],
  o: StepPairOptions,
  split: Split = 'train',
): Pair[] {
  // prefix key → turn key → the turn; a prefix is every message before an assistant turn.
  const tree = new Map<string, { prompt: Message[]; turns: Map<string, Branch> }>();
  const sorted = [...rollouts].sort((a, b) => (a.session_id < b.session_id ? -1 : 1));
  for (const s of sorted) {
    const success = s.reward >= o.successReward ? 1 : 0;
    let prefix = '';
    s.messages.forEach((m, i) => {
      if (m.role === 'assistant') {
        let node = tree.get(prefix);
        if (!node) tree.set(prefix, (node = { prompt: s.messages.slice(0, i), turns: new Map() }));
        const key = turnKey(m);
        let turn = node.turns.get(key);
        if (!turn) node.turns.set(key, (turn = { message: m, successes: 0, visits: 0, session: s.session_id }));
        turn.successes += success;
        turn.visits++;
      }
      prefix += turnKey(m) + '\n';
    });
  }
  const pairs: Pair[] = [];
  for (const { prompt, turns } of tree.values()) {
    const last = prompt.at(-1);
    // TRL's format: a prompt ends on a user or tool turn (an assistant turn right after another is not a branch of it).
    if (!last || (last.role !== 'user' && last.role !== 'tool')) continue;
    const valued = [...turns.values()].filter((t) => t.visits >= o.minVisits);
    if (valued.length < 2) continue;
    const value = (t: Branch) => t.successes / t.visits;
    valued.sort((a, b) => value(b) - value(a) || b.visits - a.visits || (a.session < b.session ? -1 : 1));
    const best = valued[0]!;
    for (const worse of valued.slice(1)) {
      const gap = value(best) - value(worse);
      if (gap < o.margin) continue;
      const [chosen, rejected] = [[best.message], [worse.message]];
      pairs.push({
        pair_id: pairId('step', JSON.stringify([prompt, chosen]), JSON.stringify(rejected)),
        prompt,
        chosen,
        rejected,
        chosen_reward: value(best),
        rejected_reward: value(worse),
        margin: gap,
        // The environment's outcomes decided it, as the verifier decides outcome pairs.
        confidence: 1,
        source: 'step',
        negative_type: null,
        judge: `rollouts:${best.visits}/${worse.visits}`,
        task_id: sorted[0]?.task_id ?? null,
        chosen_session_id: best.session,
        rejected_session_id: worse.session,
        split,
      });
    }
  }
  return pairs;
}
