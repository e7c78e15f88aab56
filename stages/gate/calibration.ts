// A judge earns its weight: each judge other than the verifier is measured on the pairs whose truth is known
// (the verifier decided them, their rewards differ, or they are hard negatives, built worse), per source and
// negative type and per band of its own confidence, as an accuracy with a Wilson interval. A pair the verifier did not decide is then decided by
// the judges whose interval lies above chance where it belongs, each weighing by the interval's lower bound
// (log-odds added up), instead of by what the judges say of their own confidence.
import { chosenConfidence, type Verdict } from '../../core/verdict.ts';
import type { JudgedPair } from '../../core/records.ts';

/** The verifier's name in `verdicts`: its decisive verdicts are the truth, never calibrated. */
const VERIFIER = 'verifier';

export interface CalibrationOptions {
  /** Votes a group needs before its own accuracy is used; below it, the source's. */
  minVotes: number;
  /** The interval's z (1.96: 95%). */
  z: number;
  /** A reward gap at least this wide says which side is better. */
  minRewardGap: number;
}

export interface CalibrationRow {
  judge: string;
  /** `all`, a source (`best_of_n`), or a source and negative type (`hard_negative/refusal`). */
  group: string;
  votes: number;
  correct: number;
  accuracy: number;
  low: number;
  high: number;
  /** Enough votes (min_votes) and its lower bound above chance: it decides pairs of this group. */
  trusted: boolean;
  /** Fewer votes than min_votes: the group says nothing yet, whatever its interval (absent in older reports). */
  too_few?: boolean;
}

/** The Wilson score interval of `correct` successes in `n` trials. */
export function wilson(correct: number, n: number, z: number): { low: number; high: number } {
  if (n === 0) return { low: 0, high: 1 };
  const p = correct / n;
  const z2 = z * z;
  const centre = (p + z2 / (2 * n)) / (1 + z2 / n);
  const half = (z * Math.sqrt((p * (1 - p)) / n + z2 / (4 * n * n))) / (1 + z2 / n);
  return { low: Math.max(0, centre - half), high: Math.min(1, centre + half) };
}

/** Which side is truly better, when that is known: the verifier's decisive verdict, a reward gap, or a hard negative's construction. */
export function truthOf(p: JudgedPair<unknown>, minRewardGap: number): 'a' | 'b' | null {
  const v = p.verdicts[VERIFIER];
  if (v && (v.winner === 'a' || v.winner === 'b') && v.confidence >= 1) return v.winner;
  if (
    p.chosen_reward !== null &&
    p.rejected_reward !== null &&
    Math.abs(p.chosen_reward - p.rejected_reward) >= minRewardGap
  )
    return p.chosen_reward > p.rejected_reward ? 'a' : 'b';
  if (p.source === 'hard_negative') return 'a';
  return null;
}

/** The bands a judge's own confidence is read in: a judge whose confidence means something is right more often in the higher bands. */
const BANDS = [0.25, 0.5, 0.75];

/** The band of a confidence, as a group suffix: `@0.75` holds confidences of 0.75 and above. */
const bandOf = (confidence: number): string =>
  `@${[0, ...BANDS]
    .filter((b) => confidence >= b)
    .at(-1)!
    .toFixed(2)}`;

/** The groups a pair belongs to, the most specific first (source and negative type, then source; each first within the judge's confidence band). */
const groupsOf = (p: JudgedPair<unknown>): string[] => [
  ...(p.negative_type ? [`${p.source}/${p.negative_type}`] : []),
  p.source,
];
const bandedGroupsOf = (p: JudgedPair<unknown>, confidence: number): string[] =>
  groupsOf(p).flatMap((g) => [`${g}${bandOf(confidence)}`, g]);

export class Calibration {
  /** judge → group → [votes, correct] */
  private readonly tally = new Map<string, Map<string, [number, number]>>();

  constructor(private readonly o: CalibrationOptions) {}

  /** Counts each judge's a/b vote on `p` against the truth, when the truth is known. */
  add(p: JudgedPair<unknown>): void {
    const truth = truthOf(p, this.o.minRewardGap);
    if (truth === null) return;
    for (const [judge, v] of Object.entries(p.verdicts)) {
      if (judge === VERIFIER || (v.winner !== 'a' && v.winner !== 'b')) continue;
      let groups = this.tally.get(judge);
      if (!groups) this.tally.set(judge, (groups = new Map()));
      for (const g of [...bandedGroupsOf(p, v.confidence), 'all']) {
        const t = groups.get(g) ?? [0, 0];
        t[0]++;
        if (v.winner === truth) t[1]++;
        groups.set(g, t);
      }
    }
  }

  private row(judge: string, group: string): CalibrationRow {
    const [votes, correct] = this.tally.get(judge)?.get(group) ?? [0, 0];
    const { low, high } = wilson(correct, votes, this.o.z);
    return {
      judge,
      group,
      votes,
      correct,
      accuracy: votes ? correct / votes : 0,
      low,
      high,
      // A group of a few votes decides nothing (applies() skips it), so it is not shown trusted either.
      trusted: votes >= this.o.minVotes && votes > 0 && low > 0.5,
      too_few: votes < this.o.minVotes,
    };
  }

  /** Every judge's accuracy per group, as measured. */
  rows(): CalibrationRow[] {
    return [...this.tally]
      .sort(([a], [b]) => (a < b ? -1 : 1))
      .flatMap(([judge, groups]) => [...groups.keys()].sort().map((g) => this.row(judge, g)));
  }

  /**
   * The calibration that applies to `judge` on `p`: its most specific group with enough votes. There is no
   * falling back across sources: accuracy on hard negatives says nothing of best-of-N among equal rewards.
   */
  private applies(judge: string, p: JudgedPair<unknown>, confidence: number): CalibrationRow | null {
    for (const g of bandedGroupsOf(p, confidence)) {
      const r = this.row(judge, g);
      if (r.votes >= this.o.minVotes) return r;
    }
    return null;
  }

  /** The pair decided by the calibrated judges (the verifier's decisive verdict stands as it is). */
  decide<P extends JudgedPair<unknown>>(p: P): P {
    const v = p.verdicts[VERIFIER];
    if (v && (v.winner === 'a' || v.winner === 'b') && v.confidence >= 1) return p;
    if (p.judge === 'imported') return p; // kept as the data gives it (judge.imported: as_given)
    let logit = 0;
    const deciders: string[] = [];
    const why: string[] = [];
    for (const [judge, verdict] of Object.entries(p.verdicts)) {
      if (judge === VERIFIER || (verdict.winner !== 'a' && verdict.winner !== 'b')) continue;
      const c = this.applies(judge, p, verdict.confidence);
      if (!c) {
        why.push(`${judge} has fewer than ${this.o.minVotes} votes of known truth on ${groupsOf(p).join(' or ')}`);
        continue;
      }
      if (!c.trusted) {
        why.push(
          `${judge} is right ${c.correct} of ${c.votes} times on ${c.group} (${c.low.toFixed(2)}–${c.high.toFixed(2)}), not surely better than chance`,
        );
        continue;
      }
      logit += (verdict.winner === 'a' ? 1 : -1) * Math.log(c.low / (1 - c.low));
      deciders.push(judge);
    }
    let verdict: Verdict;
    if (deciders.length === 0)
      verdict = {
        winner: 'abstain',
        confidence: 0,
        rationale: why.length ? `no judge has earned its weight here: ${why.join('; ')}` : 'no judge voted',
      };
    else if (Math.abs(logit) < 1e-9)
      verdict = { winner: 'tie', confidence: 0, rationale: 'the calibrated votes cancel out' };
    else {
      const pa = 1 / (1 + Math.exp(-logit));
      verdict = {
        ...p.verdict,
        winner: pa > 0.5 ? 'a' : 'b',
        confidence: Math.abs(2 * pa - 1),
        rationale: `calibrated P(chosen better) ${pa.toFixed(3)} from ${deciders.join(', ')}`,
      };
    }
    return { ...p, verdict, confidence: chosenConfidence(verdict), judge: deciders.join('+') };
  }
}
