// The judges against the hard negatives: every transform makes the rejected side worse in a way the
// verifier or the rules judge can see, so the ensemble should side with the chosen turn, never against it.
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { EnsembleJudge, type EnsembleVerdict } from '../../judges/ensemble.ts';
import { DEFAULT_WEIGHTS, RulesJudge, mustDeclineTest } from '../../judges/rules.ts';
import type { Comparison } from '../../core/verdict.ts';
import { VerifierJudge } from '../../judges/verifier.ts';
import { readJsonl } from '../../pipeline/jsonl.ts';
import { isRefusal } from '../../core/refusal.ts';
import { PREFAB_TEMPLATES, readTemplates } from '../../pairing/templates.ts';
import { buildHardNegatives } from '../../pairing/hard-negatives.ts';
import { plainPair, stored } from '../fixtures/pipeline.ts';
import { NEGATIVE_TYPES, type Pair, type Session, type SplitSession } from '../../core/records.ts';

const SAMPLE = join(import.meta.dirname, '..', '..', 'data', 'sample', 'sessions.jsonl.gz');
const SESSIONS = 300;
const MIN_RATE = 0.95;
const MIN_CONFIDENCE = 0.5;
const ALL_TYPES = Object.fromEntries(NEGATIVE_TYPES.map((t) => [t, 1]));
/** Requests the tests treat as ones to decline: the refusal is then the chosen side. */
const DECLINE_PATTERNS = ['fraudulent charge', 'freeze my card'];

interface Judged {
  pair: Pair;
  result: EnsembleVerdict;
}

function ensemble(mustDecline: (c: Comparison) => boolean): EnsembleJudge {
  return new EnsembleJudge(new VerifierJudge({ minRewardGap: 0.1, replay: true }), [
    { judge: new RulesJudge({ weights: DEFAULT_WEIGHTS, mustDecline }), weight: 1 },
  ]);
}

function comparison(pair: Pair, session: SplitSession): Comparison {
  return {
    prompt: pair.prompt,
    a: { id: pair.chosen_session_id, messages: pair.chosen, reward: pair.chosen_reward },
    b: { id: pair.rejected_session_id, messages: pair.rejected, reward: pair.rejected_reward },
    task_id: pair.task_id,
    metadata: session.metadata,
  };
}

async function judgeAll(
  sessions: SplitSession[],
  mustDecline: (s: SplitSession) => boolean,
  judge: EnsembleJudge,
): Promise<Judged[]> {
  const judged: Judged[] = [];
  for (const session of sessions) {
    for (const pair of buildHardNegatives(stored(session), {
      ratios: ALL_TYPES,
      salt: 'test',
      mustDecline: () => mustDecline(session),
      templates: readTemplates(PREFAB_TEMPLATES),
    }).pairs.map(plainPair)) {
      judged.push({ pair, result: await judge.judge(comparison(pair, session)) });
    }
  }
  return judged;
}

const chosenWins = (j: Judged) => j.result.verdict.winner === 'a' && j.result.verdict.confidence >= MIN_CONFIDENCE;
const explain = (j: Judged) =>
  `${j.pair.pair_id} (${j.pair.negative_type}): ${j.result.judge} says ${j.result.verdict.winner} at ${j.result.verdict.confidence}: ${j.result.verdict.rationale}`;

let successes: SplitSession[] = [];
let ordinary: Judged[] = [];

beforeAll(async () => {
  const sample: Session[] = [];
  for await (const s of readJsonl<Session>(SAMPLE)) sample.push(s);
  successes = sample
    .filter((s) => s.reward >= 0.7)
    .slice(0, SESSIONS)
    .map((s) => ({ ...s, split: 'train', task_match: null }));
  ordinary = await judgeAll(
    successes,
    () => false,
    ensemble(() => false),
  );
});

describe('the ensemble on hard negatives of the sample', () => {
  it('has pairs of every type from the sample', () => {
    expect(successes.length).toBe(SESSIONS);
    // A repeated call needs a retry in the session (the oracle never retries): fewer sessions have one.
    for (const type of NEGATIVE_TYPES)
      expect(ordinary.filter((j) => j.pair.negative_type === type).length).toBeGreaterThan(
        SESSIONS * (type === 'repeated_call' ? 0.15 : 0.9),
      );
  });

  for (const type of NEGATIVE_TYPES) {
    it(`sides with the chosen turn, confidently, on at least ${MIN_RATE * 100}% of ${type} pairs`, () => {
      const ofType = ordinary.filter((j) => j.pair.negative_type === type);
      const missed = ofType.filter((j) => !chosenWins(j));
      expect(1 - missed.length / ofType.length, missed.slice(0, 3).map(explain).join('\n')).toBeGreaterThanOrEqual(
        MIN_RATE,
      );
    });
  }

  it('never prefers the rejected side', () => {
    expect(ordinary.filter((j) => j.result.verdict.winner === 'b').map(explain)).toEqual([]);
  });

  it('lets the verifier decide broken calls and hallucinated values in the environment', () => {
    // Not a rate to meet, but a sign the verifier is consulted: without it the rules judge would decide every pair.
    for (const type of ['hallucination', 'format'] as const) {
      const byVerifier = ordinary.filter((j) => j.pair.negative_type === type && j.result.judge === 'verifier');
      expect(byVerifier.length).toBeGreaterThan(SESSIONS / 2);
    }
  });
});

describe('the ensemble on refusals of requests that must be declined', () => {
  let declined: Judged[] = [];
  let declinedSessions = 0;

  beforeAll(async () => {
    const declines = mustDeclineTest(DECLINE_PATTERNS);
    const mustDecline = (s: SplitSession) => declines({ metadata: s.metadata, prompt: s.messages });
    const sessions = successes.filter(mustDecline);
    declinedSessions = sessions.length;
    declined = (await judgeAll(sessions, mustDecline, ensemble(declines))).filter(
      (j) => j.pair.negative_type === 'refusal',
    );
  });

  it('has a refusal as the chosen side of each such pair', () => {
    expect(declinedSessions).toBeGreaterThan(20);
    expect(declined.length).toBe(declinedSessions);
    for (const j of declined) expect(isRefusal(j.pair.chosen[0]!.content)).toBe(true);
  });

  it('sides with the refusal, confidently, and never with the compliance', () => {
    const missed = declined.filter((j) => !chosenWins(j));
    expect(1 - missed.length / declined.length, missed.slice(0, 3).map(explain).join('\n')).toBeGreaterThanOrEqual(
      MIN_RATE,
    );
    expect(declined.filter((j) => j.result.verdict.winner === 'b').map(explain)).toEqual([]);
  });

  it('also sides with the refusal when the metadata marks the request must_decline', async () => {
    const marked = successes
      .slice(0, 30)
      .map((s) => ({ ...s, metadata: JSON.stringify({ ...JSON.parse(s.metadata), must_decline: true }) }));
    const declines = mustDeclineTest([]);
    const judged = (
      await judgeAll(marked, (s) => declines({ metadata: s.metadata, prompt: s.messages }), ensemble(declines))
    ).filter((j) => j.pair.negative_type === 'refusal');
    expect(judged.length).toBe(30);
    expect(judged.filter((j) => !chosenWins(j)).map(explain)).toEqual([]);
  });
});
