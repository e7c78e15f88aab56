// The ensemble: a decisive verifier first; otherwise the weighted votes of the other judges.
import { addStats, NO_COST, type Comparison, type Judge, type JudgeStats, type Verdict } from '../core/verdict.ts';

export interface Vote {
  judge: string;
  weight: number;
  verdict: Verdict;
}

/**
 * Combines votes: each a/b vote pulls by weight × confidence toward its side; ties weigh in without
 * pulling; abstentions do not count. Confidence is the net pull over the weight that voted, so judges
 * that disagree cancel out rather than one of them winning.
 */
export function combineVotes(votes: Vote[]): { verdict: Verdict; deciders: string[] } {
  let pull = 0;
  let weight = 0;
  for (const v of votes) {
    if (v.verdict.winner === 'abstain' || v.weight <= 0) continue;
    weight += v.weight;
    if (v.verdict.winner === 'a') pull += v.weight * v.verdict.confidence;
    if (v.verdict.winner === 'b') pull -= v.weight * v.verdict.confidence;
  }
  if (weight === 0)
    return { verdict: { winner: 'abstain', confidence: 0, rationale: 'every judge abstained' }, deciders: [] };
  if (Math.abs(pull) < 1e-9) {
    return {
      verdict: { winner: 'tie', confidence: 0, rationale: 'the votes cancel out' },
      deciders: votes.filter((v) => v.verdict.winner !== 'abstain' && v.weight > 0).map((v) => v.judge),
    };
  }
  const winner = pull > 0 ? 'a' : 'b';
  const agreeing = votes.filter((v) => v.verdict.winner === winner && v.weight > 0);
  const margins = agreeing.map((v) => v.verdict.margin).filter((m): m is number => m !== undefined);
  return {
    verdict: {
      winner,
      confidence: Math.min(1, Math.abs(pull) / weight),
      ...(margins.length ? { margin: Math.max(...margins) } : {}),
      rationale: agreeing.map((v) => `${v.judge}: ${v.verdict.rationale ?? v.verdict.winner}`).join(' | '),
    },
    deciders: agreeing.map((v) => v.judge),
  };
}

export interface EnsembleVerdict {
  verdict: Verdict;
  /** Who decided, e.g. `verifier` or `rules+llm:gpt-4o-mini`: the pair's `judge` column. */
  judge: string;
  /** Every consulted judge's own verdict, by name. */
  verdicts: Record<string, Verdict>;
  stats: JudgeStats;
}

export interface Member {
  judge: Judge;
  weight: number;
}

export class EnsembleJudge {
  constructor(
    private readonly verifier: Judge | null,
    private readonly members: Member[],
    /**
     * Which of the comparisons the verifier decides the other judges are asked too, so that the gate can
     * measure them where the truth is known (their verdicts are recorded, the verifier's stands).
     */
    private readonly calibrate: (c: Comparison) => boolean = () => false,
  ) {}

  get names(): string[] {
    return [...(this.verifier ? [this.verifier.name] : []), ...this.members.map((m) => m.judge.name)];
  }

  async judge(c: Comparison): Promise<EnsembleVerdict> {
    const verdicts: Record<string, Verdict> = {};
    if (this.verifier) {
      const { verdict } = await this.verifier.judge(c);
      verdicts[this.verifier.name] = verdict;
      if ((verdict.winner === 'a' || verdict.winner === 'b') && verdict.confidence >= 1) {
        const stats = this.calibrate(c) ? (await this.ask(c, verdicts)).stats : NO_COST;
        return { verdict, judge: this.verifier.name, verdicts, stats };
      }
    }
    const { votes, stats } = await this.ask(c, verdicts);
    const { verdict, deciders } = combineVotes(votes);
    return { verdict, judge: deciders.join('+'), verdicts, stats };
  }

  /** Every member's verdict on `c`, recorded in `verdicts`. */
  private async ask(c: Comparison, verdicts: Record<string, Verdict>): Promise<{ votes: Vote[]; stats: JudgeStats }> {
    let stats = NO_COST;
    const votes: Vote[] = [];
    for (const m of this.members) {
      const judged = await m.judge.judge(c);
      verdicts[m.judge.name] = judged.verdict;
      stats = addStats(stats, judged.stats);
      votes.push({ judge: m.judge.name, weight: m.weight, verdict: judged.verdict });
    }
    return { votes, stats };
  }
}
