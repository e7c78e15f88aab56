import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';
import { useTf } from '../fixtures/tf.ts';
import { LOSSES, preferenceMetrics, sequenceLogps, sftLoss } from '../../trainers/losses/index.ts';
import { ktoLoss } from '../../trainers/losses/kto.ts';
import { nllAnchor, orpoOddsRatioLoss } from '../../trainers/losses/preference.ts';

// Expected values are worked out by hand (and checked in Python with math.log1p / math.exp), not by this code.
const t1 = (xs: number[]) => tf.tensor1d(xs);
const value = (t: tf.Tensor) => Array.from(t.dataSync());
const h = { beta: 0.1, label_smoothing: 0, gamma_beta_ratio: 0.5, desirable_weight: 1, undesirable_weight: 1 };

// One pair: π_c = −10, π_r = −12, ref_c = ref_r = −11, so the DPO logit is (1) − (−1) = 2 and β·logit = 0.2.
const pair = () => ({ chosen: t1([-10]), rejected: t1([-12]), refChosen: t1([-11]), refRejected: t1([-11]) });

beforeAll(async () => {
  await useTf('cpu');
});

describe('DPO family (sums of log-probs, with a reference)', () => {
  it('sigmoid: −log σ(0.2) = 0.598139, rewards ±0.1', () => {
    const out = LOSSES.sigmoid.fn(pair(), h);
    expect(value(out.losses)[0]).toBeCloseTo(0.5981389, 6);
    expect(value(out.chosenRewards)[0]).toBeCloseTo(0.1, 6);
    expect(value(out.rejectedRewards)[0]).toBeCloseTo(-0.1, 6);
  });

  it('sigmoid with label smoothing 0.1 (cDPO): 0.9·0.598139 + 0.1·0.798139 = 0.618139', () => {
    expect(value(LOSSES.sigmoid.fn(pair(), { ...h, label_smoothing: 0.1 }).losses)[0]).toBeCloseTo(0.6181389, 6);
  });

  it('robust with ε 0.1: (0.9·0.598139 − 0.1·0.798139) / 0.8 = 0.573139', () => {
    expect(value(LOSSES.robust.fn(pair(), { ...h, label_smoothing: 0.1 }).losses)[0]).toBeCloseTo(0.5731389, 6);
  });

  it('hinge: max(0, 1 − 0.2) = 0.8, and 0 once the margin passes 1/β', () => {
    expect(value(LOSSES.hinge.fn(pair(), h).losses)[0]).toBeCloseTo(0.8, 6);
    const far = { chosen: t1([0]), rejected: t1([-20]), refChosen: t1([-1]), refRejected: t1([-1]) };
    expect(value(LOSSES.hinge.fn(far, h).losses)[0]).toBe(0);
  });

  it('ipo: (2 − 1/(2·0.1))² = 9', () => {
    expect(value(LOSSES.ipo.fn(pair(), h).losses)[0]).toBeCloseTo(9, 5);
  });

  it('refuses to run without reference log-probabilities', () => {
    expect(() => LOSSES.sigmoid.fn({ chosen: t1([-1]), rejected: t1([-2]) }, h)).toThrow(/reference/);
  });

  it('the gradient pushes the chosen side up and the rejected side down', () => {
    const [gc, gr] = tf.grads((c: tf.Tensor, r: tf.Tensor) =>
      tf.sum(
        LOSSES.sigmoid.fn(
          { chosen: c as tf.Tensor1D, rejected: r as tf.Tensor1D, refChosen: t1([-11]), refRejected: t1([-11]) },
          h,
        ).losses,
      ),
    )([t1([-10]), t1([-12])]);
    // d/dπ_c of −log σ(β z) = −β·σ(−β z) = −0.1·σ(−0.2) = −0.0450166
    expect(value(gc!)[0]).toBeCloseTo(-0.0450166, 6);
    expect(value(gr!)[0]).toBeCloseTo(0.0450166, 6);
  });
});

describe('reference-free losses (means of log-probs)', () => {
  it('SimPO, β 2 and γ/β 0.5: avg −0.5 vs −0.8 gives −log σ(2·(0.3 − 0.5)) = 0.913015, rewards β·avg', () => {
    const out = LOSSES.simpo.fn(
      { chosen: t1([-0.5]), rejected: t1([-0.8]) },
      { beta: 2, label_smoothing: 0, gamma_beta_ratio: 0.5, desirable_weight: 1, undesirable_weight: 1 },
    );
    expect(value(out.losses)[0]).toBeCloseTo(0.9130153, 6);
    expect(value(out.chosenRewards)[0]).toBeCloseTo(-1, 6);
    expect(value(out.rejectedRewards)[0]).toBeCloseTo(-1.6, 6);
  });

  it('ORPO odds-ratio term, λ 0.1: −0.1·log σ(log odds(−0.5) − log odds(−0.8)) = 0.0424833', () => {
    const out = orpoOddsRatioLoss({ chosen: t1([-0.5]), rejected: t1([-0.8]) }, { lambda: 0.1 });
    expect(value(out.losses)[0]).toBeCloseTo(0.0424833, 6);
  });

  it("ORPO in the registry adds the chosen side's NLL: 0.0424833 + 0.5 = 0.5424833", () => {
    const out = LOSSES.orpo.fn({ chosen: t1([-0.5]), rejected: t1([-0.8]) }, h);
    expect(value(out.losses)[0]).toBeCloseTo(0.5424833, 6);
  });

  it('RPO, as TRL: α × the chosen sides’ NLL as one mean over all their tokens, added to the batch’s mean loss', () => {
    // Two pairs: chosen sides of 3 tokens summing to −3 and 1 token summing to −5: NLL = 8 / 4 = 2, α 0.5 → 1.
    expect(value(nllAnchor(t1([-3, -5]), 4, 0.5))[0]).toBeCloseTo(1, 6);
    // TRL: losses + rpo_alpha · nll_loss, then the mean: sigmoid's 0.598139 on both pairs, plus 1.
    const dpo = LOSSES.sigmoid.fn(
      { chosen: t1([-10, -10]), rejected: t1([-12, -12]), refChosen: t1([-11, -11]), refRejected: t1([-11, -11]) },
      h,
    );
    expect(value(tf.add(tf.mean(dpo.losses), nllAnchor(t1([-3, -5]), 4, 0.5)))[0]).toBeCloseTo(1.5981389, 6);
    // A batch in micro-batches: each adds its tokens' part of the one mean.
    const parts = tf.add(nllAnchor(t1([-3]), 4, 0.5), nllAnchor(t1([-5]), 4, 0.5));
    expect(value(parts)[0]).toBeCloseTo(1, 6);
  });

  it('the registry says which losses average and which need a reference', () => {
    expect(
      Object.entries(LOSSES).map(([k, v]) => `${k}:${v.average ? 'mean' : 'sum'}:${v.reference ? 'ref' : 'noref'}`),
    ).toEqual([
      'sigmoid:sum:ref',
      'robust:sum:ref',
      'hinge:sum:ref',
      'ipo:mean:ref',
      'simpo:mean:noref',
      'orpo:mean:noref',
      'kto:sum:ref',
    ]);
    expect(LOSSES.simpo.defaultBeta).toBe(2);
    expect(LOSSES.sigmoid.defaultBeta).toBe(0.1);
  });
});

describe('KTO', () => {
  it('desirable 1·(1 − σ(0.1·(1 − 0.5))) = 0.487503; undesirable 1.5·(1 − σ(0.1·(0.5 + 2))) = 0.656735', () => {
    const out = ktoLoss(
      { logps: t1([-10, -14]), refLogps: t1([-11, -12]), labels: t1([1, 0]), kl: 0.5 },
      { beta: 0.1, desirableWeight: 1, undesirableWeight: 1.5 },
    );
    const [d, u] = value(out.losses);
    expect(d).toBeCloseTo(0.4875026, 6);
    expect(u).toBeCloseTo(0.6567352, 6);
    expect(value(out.rewards)).toEqual([expect.closeTo(0.1, 6), expect.closeTo(-0.2, 6)]);
  });

  it('clamps a negative KL estimate at 0', () => {
    const a = ktoLoss(
      { logps: t1([-10]), refLogps: t1([-11]), labels: t1([1]), kl: -3 },
      { beta: 0.1, desirableWeight: 1, undesirableWeight: 1 },
    );
    const b = ktoLoss(
      { logps: t1([-10]), refLogps: t1([-11]), labels: t1([1]), kl: 0 },
      { beta: 0.1, desirableWeight: 1, undesirableWeight: 1 },
    );
    expect(value(a.losses)).toEqual(value(b.losses));
  });
});

describe('sequence log-probs and SFT', () => {
  const tokens = () =>
    tf.tensor2d([
      [-1, -2, -3, -4],
      [-0.5, -0.5, -9, -9],
    ]);
  const mask = () =>
    tf.tensor2d([
      [0, 1, 1, 0],
      [1, 1, 0, 0],
    ]);

  it('sums and means only the masked (assistant) tokens', () => {
    expect(value(sequenceLogps(tokens(), mask(), false))).toEqual([-5, -1]);
    expect(value(sequenceLogps(tokens(), mask(), true))).toEqual([-2.5, -0.5]);
  });

  it('SFT loss is the mean NLL over masked tokens: (2 + 3 + 0.5 + 0.5) / 4 = 1.5', () => {
    expect(value(sftLoss(tokens(), mask()))[0]).toBeCloseTo(1.5, 6);
  });

  it('metrics use TRL names: accuracies count pairs whose chosen reward is higher', () => {
    const x = {
      chosen: t1([-10, -10]),
      rejected: t1([-12, -8]),
      refChosen: t1([-11, -11]),
      refRejected: t1([-11, -11]),
    };
    const m = preferenceMetrics(LOSSES.sigmoid.fn(x, h), x);
    const read = Object.fromEntries(Object.entries(m).map(([k, v]) => [k, value(v)[0]]));
    expect(Object.keys(read)).toEqual([
      'rewards/chosen',
      'rewards/rejected',
      'rewards/accuracies',
      'rewards/margins',
      'logps/chosen',
      'logps/rejected',
    ]);
    expect(read['rewards/accuracies']).toBe(0.5);
    expect(read['rewards/margins']).toBeCloseTo((0.2 + -0.2) / 2, 6);
    expect(read['logps/rejected']).toBe(-10);
  });
});
