import { describe, expect, it } from 'vitest';
import { STAGES } from '../../stages/index.ts';
import { rank, rankedOutcomePairs, type OutcomeOptions } from '../../pairing/outcome.ts';
import { plainPair, stored } from '../fixtures/pipeline.ts';
import { pairId, type Message, type SplitSession } from '../../core/records.ts';
import { hashJson } from '../../pipeline/hash.ts';

const SYSTEM: Message = { role: 'system', content: 'You phone companies.' };

function trial(id: string, reward: number, request: string, answer: string): SplitSession {
  return {
    session_id: id,
    task_id: 'T',
    messages: [SYSTEM, { role: 'user', content: request }, { role: 'assistant', content: answer }],
    reward,
    feedback: null,
    model: null,
    source: 'test',
    created_at: null,
    metadata: '{}',
    split: 'train',
    task_match: null,
  };
}

/** A task's outcome pairs from its sessions as their bucket lines store them, the pairs' messages read back. */
function buildOutcomePairs(sessions: SplitSession[], o: OutcomeOptions) {
  const built = rankedOutcomePairs(rank(sessions.map(stored), o), (s) => s, o);
  return { pairs: built.made.map((m) => plainPair(m.pair)), dropped: built.dropped };
}

const options = { successMin: 0.7, failureMax: 0.3, maxPairsPerTask: 100 };

describe('outcome pairs', () => {
  it('pairs every success with every failure and leaves the middle out', () => {
    const sessions = [
      trial('s1', 1, 'q', 'a'),
      trial('s2', 0.8, 'q', 'b'),
      trial('m', 0.5, 'q', 'c'),
      trial('f1', 0, 'q', 'd'),
      trial('f2', 0.3, 'q', 'e'),
    ];
    const { pairs } = buildOutcomePairs(sessions, options);
    expect(pairs.map((p) => `${p.chosen_session_id}>${p.rejected_session_id}`).sort()).toEqual([
      's1>f1',
      's1>f2',
      's2>f1',
      's2>f2',
    ]);
    const widest = pairs.find((p) => p.chosen_session_id === 's1' && p.rejected_session_id === 'f1')!;
    expect(widest.margin).toBe(1);
    expect(pairs.find((p) => p.chosen_session_id === 's2' && p.rejected_session_id === 'f2')!.margin).toBeCloseTo(0.5);
    expect(widest).toMatchObject({
      source: 'outcome',
      judge: 'verifier:outcome',
      confidence: 1,
      negative_type: null,
      task_id: 'T',
      split: 'train',
    });
  });

  it('takes the longest common prefix as the prompt, even when trials part right after the system message', () => {
    const [p] = buildOutcomePairs(
      [trial('s', 1, 'Cancel my gym.', 'Done.'), trial('f', 0, 'Please cancel the gym membership.', 'Sorry.')],
      options,
    ).pairs;
    expect(p!.prompt).toEqual([SYSTEM]);
    expect(p!.chosen).toEqual([
      { role: 'user', content: 'Cancel my gym.' },
      { role: 'assistant', content: 'Done.' },
    ]);
    expect(p!.rejected).toEqual([
      { role: 'user', content: 'Please cancel the gym membership.' },
      { role: 'assistant', content: 'Sorry.' },
    ]);

    const [q] = buildOutcomePairs(
      [trial('s', 1, 'Same request', 'Done.'), trial('f', 0, 'Same request', 'Sorry.')],
      options,
    ).pairs;
    expect(q!.prompt.map((m) => m.content)).toEqual(['You phone companies.', 'Same request']);
    expect(q!.chosen).toEqual([{ role: 'assistant', content: 'Done.' }]);
  });

  it('gives an empty prompt when the two sides share no message', () => {
    const a = trial('s', 1, 'x', 'y');
    const b = trial('f', 0, 'x', 'z');
    b.messages[0] = { role: 'system', content: 'Another system prompt.' };
    const [p] = buildOutcomePairs([a, b], options).pairs;
    expect(p!.prompt).toEqual([]);
    expect(p!.chosen).toHaveLength(3);
  });

  it('caps pairs per task and spreads them over all sessions, widest margins first', () => {
    const sessions = [
      ...['s1', 's2', 's3'].map((id, i) => trial(id, 1 - i * 0.1, 'q', id)),
      ...['f1', 'f2', 'f3', 'f4'].map((id, i) => trial(id, i * 0.1, 'q', id)),
    ];
    const { pairs } = buildOutcomePairs(sessions, { ...options, maxPairsPerTask: 4 });
    expect(pairs).toHaveLength(4);
    expect(pairs.map((p) => `${p.chosen_session_id}>${p.rejected_session_id}`)).toEqual([
      's1>f1',
      's2>f2',
      's3>f3',
      's1>f2',
    ]);
    expect(new Set(pairs.map((p) => p.pair_id)).size).toBe(4);
  });

  it('takes a null cap as no cap: every success against every failure', () => {
    const sessions = [
      ...['s1', 's2', 's3'].map((id, i) => trial(id, 1 - i * 0.1, 'q', id)),
      ...['f1', 'f2', 'f3', 'f4'].map((id, i) => trial(id, [0, 0.1, 0.2, 0.25][i]!, 'q', id)),
    ];
    const parsed = STAGES.find((x) => x.name === 'pairs')!.config.safeParse({ outcome: { max_pairs_per_task: null } });
    expect(parsed.success, JSON.stringify(parsed.error?.issues)).toBe(true);
    expect((parsed.data as { outcome: { max_pairs_per_task: number | null } }).outcome.max_pairs_per_task).toBeNull();
    const { pairs } = buildOutcomePairs(sessions, { ...options, maxPairsPerTask: Infinity });
    expect(new Set(pairs.map((p) => `${p.chosen_session_id}>${p.rejected_session_id}`)).size).toBe(12);
  });

  it('drops, with a reason, pairs that have nothing to learn from', () => {
    const same = [trial('s', 1, 'q', 'same'), trial('f', 0, 'q', 'same')];
    const r1 = buildOutcomePairs(same, options);
    expect(r1.pairs).toEqual([]);
    expect(r1.dropped).toEqual([
      {
        task_id: 'T',
        chosen_session_id: 's',
        rejected_session_id: 'f',
        reason: 'identical messages with different rewards',
      },
    ]);

    const noAnswer = trial('f', 0, 'q', 'x');
    noAnswer.messages = noAnswer.messages.slice(0, 2);
    const r2 = buildOutcomePairs([trial('s', 1, 'q', 'a'), noAnswer], options);
    expect(r2.dropped[0]!.reason).toBe('rejected has no assistant turn after the shared prompt');
  });

  it('names a pair by hashJson of its source, sides and extra, whatever text they hold', () => {
    for (const [source, chosen, rejected, extra] of [
      ['outcome', 's1', 'f1', ''],
      ['hard_negative', 'ünï "q" \\ ✓', 'x~refusal', 'refusal:llm'],
      ['best_of_n', '\u2028', '{"a":1}', '\u0001'],
    ]) {
      expect(pairId(source!, chosen!, rejected!, extra)).toBe(
        hashJson({ source, chosen, rejected, extra }).slice(0, 32),
      );
    }
  });

  it('gives the same pair the same id every time', () => {
    const sessions = [trial('s', 1, 'q', 'a'), trial('f', 0, 'q', 'b')];
    expect(buildOutcomePairs(sessions, options).pairs[0]!.pair_id).toBe(
      buildOutcomePairs([...sessions].reverse(), options).pairs[0]!.pair_id,
    );
  });
});
