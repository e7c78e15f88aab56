// What a head-to-head's statistics do on hand-made numbers: Holm's correction across planned contrasts, and a
// bootstrap that resamples whole clusters (a company's tasks) rather than single tasks.
import { describe, expect, it } from 'vitest';
import { holm, pairedSuccess, type Twin } from '../../core/paired-success.ts';

describe('a head-to-head’s statistics', () => {
  it('Holm: the smallest p times the number of contrasts, the next times one fewer, never below the one before', () => {
    // Sorted 0.01, 0.03, 0.04 → 0.03, 0.06, max(0.06, 0.04) = 0.06; given back in the order asked.
    const adjusted = holm([0.01, 0.04, 0.03]);
    expect(adjusted[0]).toBeCloseTo(0.03, 12);
    expect(adjusted[1]).toBeCloseTo(0.06, 12);
    expect(adjusted[2]).toBeCloseTo(0.06, 12);
    expect(holm([0.5, 0.6])).toEqual([1, 1]);
    expect(holm([])).toEqual([]);
  });

  it('resamples clusters whole: tasks all in one cluster give no spread, the same tasks apart give some', () => {
    // Twenty tasks, the candidate better on the first ten and alike on the rest.
    const twins = (side: 'base' | 'cand', cluster?: (t: number) => string): Twin[] =>
      Array.from({ length: 20 }, (_, t) => ({
        task: `t${t}`,
        trial: 0,
        success: side === 'cand' && t < 10 ? 1 : 0,
        ...(cluster ? { cluster: cluster(t) } : {}),
      }));
    const o = { samples: 400, alpha: 0.05, seed: 'clusters' };
    const one = pairedSuccess(
      twins('base', () => 'c'),
      twins('cand', () => 'c'),
      o,
    );
    expect(one.interval).toEqual([0.5, 0.5]);
    const apart = pairedSuccess(twins('base'), twins('cand'), o);
    expect(apart.difference).toBe(0.5);
    expect(apart.interval[0]).toBeLessThan(0.5);
    expect(apart.interval[1]).toBeGreaterThan(0.5);
    // Two companies, one where it is better and one where it is not: the spread of two clusters is wider.
    const two = pairedSuccess(
      twins('base', (t) => (t < 10 ? 'a' : 'b')),
      twins('cand', (t) => (t < 10 ? 'a' : 'b')),
      o,
    );
    expect(two.interval[1] - two.interval[0]).toBeGreaterThan(apart.interval[1] - apart.interval[0]);
  });
});
