// DAPO's pieces on fixed inputs, against values worked by hand (and verl's definitions).
import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';
import { openDevice } from '../../runtime/device.ts';
import {
  DAPO_CLIP,
  dapoLoss,
  groupAdvantages,
  informativeGroups,
  overlongPenalty,
  tokenEntropy,
} from '../../trainers/losses/index.ts';

beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
});

const row = (xs: number[]) => tf.tensor2d(xs, [1, xs.length]);

describe('GRPO advantages', () => {
  it('are (r − mean) / (unbiased std + ε) within each group', () => {
    const a = groupAdvantages([1, 0, 0, 1, 0.5, 0.7], ['t1', 't1', 't1', 't1', 't2', 't2']);
    // t1: mean 0.5, unbiased std √(1/3); t2: mean 0.6, unbiased std √0.02.
    [0.866025, -0.866025, -0.866025, 0.866025].forEach((v, i) => expect(a[i]).toBeCloseTo(v, 5));
    expect(a[4]).toBeCloseTo(-0.1 / Math.sqrt(0.02), 4);
    expect(a[5]).toBeCloseTo(0.1 / Math.sqrt(0.02), 4);
  });

  it('give a group of one its reward (mean 0, std 1), and a group of equal rewards zero', () => {
    expect(groupAdvantages([0.7], ['solo'])[0]).toBeCloseTo(0.7, 5);
    expect(groupAdvantages([1, 1, 1], ['g', 'g', 'g'])).toEqual([0, 0, 0]);
  });
});

describe('overlong reward shaping', () => {
  it('is 0 within max − buffer, falls linearly to −1 at max, and is −1 beyond', () => {
    expect([70, 80, 90, 100, 101].map((n) => overlongPenalty(n, 100, 20))).toEqual([0, 0, -0.5, -1, -1]);
  });
});

describe('dynamic sampling', () => {
  it('keeps the groups whose rewards differ, and drops all-equal and single ones', () => {
    expect(informativeGroups([[1, 1, 1], [0, 1, 0], [0, 0], [1], [0.5, 0.50001]])).toEqual([1, 4]);
  });
});

describe('DAPO policy loss', () => {
  // ratios 1.5, 0.5, 1.1, 20 against advantages 1, −1, −1, −1 (ε_low 0.2, ε_high 0.28, c 10):
  // token 1: max(−1.5, −1.28) = −1.28 (clipped high); token 2: max(0.5, 0.8) = 0.8 (clipped low);
  // token 3: 1.1 (inside); token 4: min(max(20, 1.28), 10) = 10 (dual clip).
  const old = [0, 0, 0, 0];
  const logps = [Math.log(1.5), Math.log(0.5), Math.log(1.1), Math.log(20)];
  const advantages = [1, -1, -1, -1];

  it('clips the ratio at 1 − ε_low and 1 + ε_high, bounds negative advantages by c, and takes the token mean', () => {
    const out = dapoLoss({
      logps: row(logps),
      oldLogps: row(old),
      advantages: row(advantages),
      mask: row([1, 1, 1, 1]),
    });
    expect(out.loss.dataSync()[0]).toBeCloseTo((-1.28 + 0.8 + 1.1 + 10) / 4, 5);
    expect(out.clipHigh.dataSync()[0]).toBeCloseTo(0.25, 6);
    expect(out.clipLow.dataSync()[0]).toBeCloseTo(0.25, 6);
    expect(out.dualClipped.dataSync()[0]).toBeCloseTo(0.25, 6);
    expect(out.kl.dataSync()[0]).toBe(0);
    const masked = dapoLoss({
      logps: row(logps),
      oldLogps: row(old),
      advantages: row(advantages),
      mask: row([1, 1, 1, 0]),
    });
    expect(masked.loss.dataSync()[0]).toBeCloseTo((-1.28 + 0.8 + 1.1) / 3, 5);
  });

  it('passes gradient only through unclipped tokens: −A·ratio / tokens', () => {
    const x = row(logps);
    const g = tf.grad(
      (l: tf.Tensor) =>
        dapoLoss({ logps: l as tf.Tensor2D, oldLogps: row(old), advantages: row(advantages), mask: row([1, 1, 1, 1]) })
          .loss,
    )(x);
    const grads = Array.from(g.dataSync());
    expect(grads[0]).toBeCloseTo(0, 6);
    expect(grads[1]).toBeCloseTo(0, 6);
    expect(grads[2]).toBeCloseTo(1.1 / 4, 5);
    expect(grads[3]).toBeCloseTo(0, 6);
  });

  it('adds β times the k3 KL to the reference when asked', () => {
    const out = dapoLoss(
      {
        logps: row([0, 0]),
        oldLogps: row([0, 0]),
        advantages: row([0, 0]),
        mask: row([1, 1]),
        refLogps: row([0.5, 0]),
      },
      { ...DAPO_CLIP, klCoef: 0.1 },
    );
    const k3 = Math.exp(0.5) - 0.5 - 1;
    expect(out.kl.dataSync()[0]).toBeCloseTo(k3 / 2, 6);
    expect(out.loss.dataSync()[0]).toBeCloseTo((0.1 * k3) / 2, 6);
    expect(() =>
      dapoLoss(
        { logps: row([0]), oldLogps: row([0]), advantages: row([0]), mask: row([1]) },
        { ...DAPO_CLIP, klCoef: 0.1 },
      ),
    ).toThrow(/needs reference/);
  });
});

describe('token entropy', () => {
  it('is ln V for uniform logits and 0 for a certain token, over the masked positions', () => {
    const logits = tf.tensor2d(
      [
        [0, 0, 0, 0],
        [100, 0, 0, 0],
      ],
      [2, 4],
    );
    expect(tokenEntropy(logits, tf.tensor2d([[1, 0]])).dataSync()[0]).toBeCloseTo(Math.log(4), 5);
    expect(tokenEntropy(logits, tf.tensor2d([[0, 1]])).dataSync()[0]).toBeCloseTo(0, 5);
  });
});
