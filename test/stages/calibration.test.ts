// A judge earns its weight: measured where the truth is known, a coin-flipping judge that reports 0.96
// confidence decides nothing, an accurate one decides with its measured accuracy, and accuracy on one kind of
// pair is never lent to another.
import { describe, expect, it } from 'vitest';
import type { JudgedPair, Verdict } from '../../core/records.ts';
import { seeded } from '../../core/random.ts';
import { Calibration, truthOf, wilson } from '../../stages/gate/calibration.ts';
import { gateReason } from '../../stages/gate/report.ts';

const options = { minVotes: 20, z: 1.96, minRewardGap: 0.1 };

/** A judged pair: `better` is the side that is truly better where known (`rewards` say it), `vote` the judge's. */
function pair(
  i: number,
  o: {
    source?: JudgedPair['source'];
    negative_type?: string | null;
    rewards?: [number, number];
    votes: Record<string, Verdict['winner']>;
    confidence?: number;
  },
): JudgedPair {
  const verdicts: Record<string, Verdict> = Object.fromEntries(
    Object.entries(o.votes).map(([j, w]) => [
      j,
      { winner: w, confidence: w === 'a' || w === 'b' ? (o.confidence ?? 0.96) : 0 },
    ]),
  );
  const verdict: Verdict = { winner: Object.values(o.votes)[0] ?? 'abstain', confidence: o.confidence ?? 0.96 };
  return {
    pair_id: `p${i}`,
    prompt: [],
    chosen: [],
    rejected: [],
    chosen_reward: o.rewards?.[0] ?? null,
    rejected_reward: o.rewards?.[1] ?? null,
    margin: null,
    confidence: verdict.winner === 'a' ? verdict.confidence : 0,
    source: o.source ?? 'best_of_n',
    negative_type: o.negative_type ?? null,
    judge: Object.keys(o.votes).join('+'),
    task_id: 't',
    chosen_session_id: `c${i}`,
    rejected_session_id: `r${i}`,
    split: 'train',
    metadata: '{}',
    verdict,
    verdicts,
    judge_stats: {
      requests: 0,
      cached: 0,
      retries: 0,
      errors: 0,
      parse_failures: 0,
      flipped: false,
      over_budget: false,
    },
  } as JudgedPair;
}

const gate = {
  minConfidence: 0.5,
  minMargin: null,
  sources: ['outcome', 'hard_negative', 'best_of_n'] as JudgedPair['source'][],
};

/**
 * Best-of-N pairs judged by `judge` that is right with probability `accuracy`: 300 whose rewards differ (the
 * truth is known) and 300 of equal rewards, where the chosen side (a) is truly better in half of them, unknown
 * to the gate but known here. Returns how many of the equal-reward pairs the gate keeps, and how many of those are wrong.
 */
function gateWith(
  accuracy: number,
  seed: string,
): { kept: number; wrong: number; row: ReturnType<Calibration['rows']>[number] } {
  const rand = seeded(seed);
  const calibration = new Calibration(options);
  const vote = (truth: 'a' | 'b') => (rand() < accuracy ? truth : truth === 'a' ? 'b' : 'a');
  const known = Array.from({ length: 300 }, (_, i) => {
    const truth = rand() < 0.5 ? 'a' : 'b';
    return pair(i, { rewards: truth === 'a' ? [1, 0] : [0, 1], votes: { 'llm:x': vote(truth) } });
  });
  const hidden = Array.from({ length: 300 }, (_, i) => {
    const truth: 'a' | 'b' = rand() < 0.5 ? 'a' : 'b';
    return { truth, p: pair(1000 + i, { rewards: [0.5, 0.5], votes: { 'llm:x': vote(truth) } }) };
  });
  for (const p of [...known, ...hidden.map((h) => h.p)]) calibration.add(p);
  let kept = 0;
  let wrong = 0;
  for (const h of hidden) {
    const decided = calibration.decide(h.p);
    if (gateReason(decided, gate) === null) {
      kept++;
      if (h.truth !== 'a') wrong++;
    }
  }
  return { kept, wrong, row: calibration.rows().find((r) => r.group === 'best_of_n')! };
}

describe('judge calibration', () => {
  it('computes the Wilson interval', () => {
    const { low, high } = wilson(90, 100, 1.96);
    expect(low).toBeCloseTo(0.8256, 3);
    expect(high).toBeCloseTo(0.9448, 3);
    expect(wilson(0, 0, 1.96)).toEqual({ low: 0, high: 1 });
  });

  it('knows the truth from a decisive verifier, a reward gap, or a hard negative’s construction, and nowhere else', () => {
    expect(truthOf(pair(1, { votes: { verifier: 'b' }, confidence: 1 }), 0.1)).toBe('b');
    expect(truthOf(pair(2, { rewards: [0.2, 0.9], votes: { rules: 'a' } }), 0.1)).toBe('b');
    expect(truthOf(pair(3, { source: 'hard_negative', negative_type: 'refusal', votes: { rules: 'a' } }), 0.1)).toBe(
      'a',
    );
    expect(truthOf(pair(4, { rewards: [0.5, 0.55], votes: { rules: 'a' } }), 0.1)).toBeNull();
  });

  it('lets a coin-flipping judge that reports 0.96 confidence decide nothing, and keeps no wrong pair', () => {
    const noisy = gateWith(0.5, 'coin');
    expect(noisy.row.trusted).toBe(false);
    expect(noisy.kept).toBe(0);
    expect(noisy.wrong).toBe(0);
  });

  it('lets an accurate judge keep most of its pairs, at its measured accuracy', () => {
    const accurate = gateWith(0.95, 'accurate');
    expect(accurate.row.trusted).toBe(true);
    expect(accurate.row.accuracy).toBeGreaterThan(0.9);
    // It says 'a' on about half of the 300 hidden pairs: those are kept, wrong about 1 in 20.
    expect(accurate.kept).toBeGreaterThan(120);
    expect(accurate.wrong / accurate.kept).toBeLessThan(0.1);
  });

  it('shows a group of fewer votes than min_votes untrusted, as it decides nothing there, however right the judge was', () => {
    const calibration = new Calibration(options);
    for (let i = 0; i < options.minVotes - 1; i++)
      calibration.add(pair(i, { source: 'hard_negative', negative_type: 'refusal', votes: { rules: 'a' } }));
    const row = calibration.rows().find((r) => r.group === 'hard_negative/refusal')!;
    expect(row.accuracy).toBe(1);
    expect(row.low).toBeGreaterThan(0.5);
    expect(row).toMatchObject({ trusted: false, too_few: true });
    const decided = calibration.decide(
      pair(500, { source: 'hard_negative', negative_type: 'refusal', votes: { rules: 'a' } }),
    );
    expect(decided.verdict.winner).toBe('abstain');
    calibration.add(pair(501, { source: 'hard_negative', negative_type: 'refusal', votes: { rules: 'a' } }));
    expect(calibration.rows().find((r) => r.group === 'hard_negative/refusal')).toMatchObject({
      trusted: true,
      too_few: false,
    });
  });

  it('never lends a judge’s accuracy on hard negatives to best-of-N pairs among equal rewards', () => {
    const calibration = new Calibration(options);
    for (let i = 0; i < 100; i++)
      calibration.add(pair(i, { source: 'hard_negative', negative_type: 'refusal', votes: { rules: 'a' } }));
    const refusal = calibration.decide(
      pair(500, { source: 'hard_negative', negative_type: 'refusal', votes: { rules: 'a' } }),
    );
    expect(refusal.verdict.winner).toBe('a');
    expect(refusal.confidence).toBeGreaterThan(0.9);
    const equal = calibration.decide(pair(501, { rewards: [1, 1], votes: { rules: 'a' } }));
    expect(equal.verdict).toMatchObject({
      winner: 'abstain',
      rationale: expect.stringMatching(/rules has fewer than 20 votes of known truth on best_of_n/),
    });
  });

  it('leaves what the verifier decided as it is', () => {
    const calibration = new Calibration(options);
    const decided = pair(1, { votes: { verifier: 'a', rules: 'b' }, confidence: 1 });
    expect(calibration.decide(decided)).toBe(decided);
  });
});
