import { describe, expect, it } from 'vitest';
import { EnsembleJudge, combineVotes, type Vote } from '../../judges/ensemble.ts';
import { NO_COST, type Comparison, type Judge, type JudgeStats, type Verdict } from '../../core/verdict.ts';

const vote = (judge: string, weight: number, winner: Verdict['winner'], confidence = 1, margin?: number): Vote => ({
  judge,
  weight,
  verdict: {
    winner,
    confidence: winner === 'abstain' ? 0 : confidence,
    rationale: `${judge} says ${winner}`,
    ...(margin === undefined ? {} : { margin }),
  },
});

describe('combineVotes', () => {
  it('takes a single vote as it is', () => {
    const { verdict, deciders } = combineVotes([vote('rules', 1, 'b', 0.8)]);
    expect(verdict).toMatchObject({ winner: 'b', confidence: 0.8 });
    expect(deciders).toEqual(['rules']);
  });

  it('lets the heavier side win, as sure as its net pull over the weight that voted', () => {
    const { verdict, deciders } = combineVotes([vote('llm', 2, 'a', 0.9), vote('rules', 1, 'b', 0.6)]);
    expect(verdict.winner).toBe('a');
    expect(verdict.confidence).toBeCloseTo((2 * 0.9 - 1 * 0.6) / 3, 9);
    expect(deciders).toEqual(['llm']);
    expect(verdict.rationale).toBe('llm: llm says a');
  });

  it('calls a tie when votes cancel exactly, naming everyone who voted', () => {
    const { verdict, deciders } = combineVotes([
      vote('llm', 1, 'a', 0.7),
      vote('rules', 1, 'b', 0.7),
      vote('silent', 1, 'abstain'),
    ]);
    expect(verdict).toMatchObject({ winner: 'tie', confidence: 0 });
    expect(deciders).toEqual(['llm', 'rules']);
  });

  it('is barely sure when votes nearly cancel', () => {
    const { verdict } = combineVotes([vote('llm', 1, 'a', 0.9), vote('rules', 1, 'b', 0.8)]);
    expect(verdict.winner).toBe('a');
    expect(verdict.confidence).toBeCloseTo(0.05, 9);
  });

  it('lets a tie vote dilute confidence without pulling', () => {
    const { verdict, deciders } = combineVotes([vote('llm', 1, 'a', 1), vote('rules', 1, 'tie', 0.5)]);
    expect(verdict).toMatchObject({ winner: 'a', confidence: 0.5 });
    expect(deciders).toEqual(['llm']);
  });

  it('abstains when every judge abstains, or only judges of no weight vote', () => {
    expect(combineVotes([vote('llm', 1, 'abstain'), vote('rules', 1, 'abstain')])).toEqual({
      verdict: expect.objectContaining({ winner: 'abstain', confidence: 0 }),
      deciders: [],
    });
    expect(combineVotes([vote('muted', 0, 'a')])).toEqual({
      verdict: expect.objectContaining({ winner: 'abstain' }),
      deciders: [],
    });
    expect(combineVotes([])).toEqual({ verdict: expect.objectContaining({ winner: 'abstain' }), deciders: [] });
  });

  it('leaves judges of no weight out of the deciders', () => {
    expect(combineVotes([vote('llm', 1, 'a'), vote('muted', 0, 'a')]).deciders).toEqual(['llm']);
    expect(combineVotes([vote('llm', 1, 'a'), vote('rules', 1, 'b'), vote('muted', 0, 'a')]).deciders).toEqual([
      'llm',
      'rules',
    ]);
  });

  it('keeps the largest margin of the judges on the winning side, none of the losing side', () => {
    const { verdict } = combineVotes([
      vote('llm', 2, 'a', 1, 0.3),
      vote('rules', 1, 'a', 1, 0.6),
      vote('other', 1, 'b', 1, 0.9),
    ]);
    expect(verdict.margin).toBe(0.6);
    expect(combineVotes([vote('llm', 1, 'a')]).verdict.margin).toBeUndefined();
  });
});

/** A judge that always says the same and counts how often it was asked. */
class CountingJudge implements Judge {
  calls = 0;
  constructor(
    readonly name: string,
    private readonly verdict: Verdict,
    private readonly stats: JudgeStats = NO_COST,
  ) {}
  async judge(_: Comparison) {
    this.calls++;
    return { verdict: this.verdict, stats: this.stats };
  }
}

const COMPARISON: Comparison = {
  prompt: [{ role: 'user', content: 'Cancel my gym membership.' }],
  a: { id: 'a', messages: [{ role: 'assistant', content: 'Cancelled; reference REF-100200.' }], reward: null },
  b: { id: 'b', messages: [{ role: 'assistant', content: 'Done.' }], reward: null },
  task_id: null,
  metadata: '{}',
};

describe('EnsembleJudge', () => {
  it('does not consult the other judges when the verifier is decisive', async () => {
    const verifier = new CountingJudge('verifier', {
      winner: 'b',
      confidence: 1,
      margin: 0.4,
      rationale: 'outcome reward',
    });
    const llm = new CountingJudge('llm:m', { winner: 'a', confidence: 1 });
    const rules = new CountingJudge('rules', { winner: 'a', confidence: 1 });
    const result = await new EnsembleJudge(verifier, [
      { judge: llm, weight: 5 },
      { judge: rules, weight: 1 },
    ]).judge(COMPARISON);
    expect(result).toMatchObject({
      verdict: { winner: 'b', confidence: 1, margin: 0.4 },
      judge: 'verifier',
      stats: NO_COST,
    });
    expect(Object.keys(result.verdicts)).toEqual(['verifier']);
    expect([verifier.calls, llm.calls, rules.calls]).toEqual([1, 0, 0]);
  });

  it('asks the others when the verifier abstains, and names those who decided', async () => {
    const verifier = new CountingJudge('verifier', { winner: 'abstain', confidence: 0 });
    const cost: JudgeStats = { ...NO_COST, requests: 2, parse_failures: 1 };
    const llm = new CountingJudge('llm:m', { winner: 'a', confidence: 0.8 }, cost);
    const rules = new CountingJudge('rules', { winner: 'a', confidence: 0.6 });
    const against = new CountingJudge('other', { winner: 'abstain', confidence: 0 });
    const result = await new EnsembleJudge(verifier, [
      { judge: llm, weight: 1 },
      { judge: rules, weight: 1 },
      { judge: against, weight: 1 },
    ]).judge(COMPARISON);
    expect(result.verdict.winner).toBe('a');
    expect(result.verdict.confidence).toBeCloseTo(0.7, 9);
    expect(result.judge).toBe('llm:m+rules');
    expect(Object.keys(result.verdicts)).toEqual(['verifier', 'llm:m', 'rules', 'other']);
    expect(result.stats).toMatchObject({ requests: 2, parse_failures: 1 });
    expect([verifier.calls, llm.calls, rules.calls, against.calls]).toEqual([1, 1, 1, 1]);
  });

  it('does not treat a verifier verdict short of confidence 1 as decisive', async () => {
    const verifier = new CountingJudge('verifier', { winner: 'a', confidence: 0.9 });
    const rules = new CountingJudge('rules', { winner: 'b', confidence: 0.6 });
    const result = await new EnsembleJudge(verifier, [{ judge: rules, weight: 1 }]).judge(COMPARISON);
    expect(result).toMatchObject({ verdict: { winner: 'b', confidence: 0.6 }, judge: 'rules' });
    expect(rules.calls).toBe(1);
  });

  it('abstains, decided by no one, when every judge abstains', async () => {
    const nobody = (name: string) => new CountingJudge(name, { winner: 'abstain', confidence: 0 });
    const result = await new EnsembleJudge(nobody('verifier'), [{ judge: nobody('rules'), weight: 1 }]).judge(
      COMPARISON,
    );
    expect(result).toMatchObject({ verdict: { winner: 'abstain', confidence: 0 }, judge: '' });
  });

  it('works without a verifier', async () => {
    const rules = new CountingJudge('rules', { winner: 'a', confidence: 0.9 });
    const ensemble = new EnsembleJudge(null, [{ judge: rules, weight: 1 }]);
    expect(ensemble.names).toEqual(['rules']);
    expect(await ensemble.judge(COMPARISON)).toMatchObject({
      verdict: { winner: 'a', confidence: 0.9 },
      judge: 'rules',
    });
  });
});
