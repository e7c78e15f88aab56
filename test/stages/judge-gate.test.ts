import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { EnsembleVerdict } from '../../judges/ensemble.ts';
import type { Comparison } from '../../core/verdict.ts';
import { readJsonl } from '../../pipeline/jsonl.ts';
import { judgeGroup, type Candidate } from '../../stages/judge/best-of-n.ts';
import type { JudgedPair, Pair, Session } from '../../core/records.ts';
import { completion, judgePrompt, startChatServer, type ChatServer, type Script } from '../fixtures/chat-server.ts';
import { collect, engineFor, jsonl, manifest, tempDir, wholePairs } from '../fixtures/pipeline.ts';
import type { PairSide } from '../../store/messages.ts';

const SAMPLE = join(import.meta.dirname, '../../data/sample/sessions.jsonl.gz');
let sessions: Session[] = [];

beforeAll(async () => {
  for await (const s of readJsonl<Session>(SAMPLE)) {
    if (sessions.length === 48) break; // 12 tasks, 4 trials each
    sessions.push(s);
  }
});

let server: ChatServer | null = null;
afterEach(async () => {
  await server?.close();
  server = null;
});

/** A workspace over the first sample tasks, with the judge section given. */
function pipeline(judge: string, gate = '', split = '') {
  const dir = tempDir();
  writeFileSync(join(dir, 'sessions.jsonl'), jsonl(sessions));
  const config =
    [
      'ingest:',
      '  inputs: [sessions.jsonl]',
      'split:',
      '  test_ratio: 0',
      ...(split ? [`  ${split}`] : []),
      'judge:',
      ...judge.split('\n').map((l) => `  ${l}`),
      gate,
    ].join('\n') + '\n';
  return { dir, engine: () => engineFor(dir, config) };
}

// Their sides as stored: most point at their sessions' messages (wholePairs reads them back whole).
const judged = (dir: string) => collect<JudgedPair<PairSide>>(join(dir, 'workspace', 'judge', 'train.jsonl'));
const kept = (dir: string) => collect<Pair<PairSide>>(join(dir, 'workspace', 'gate', 'train.jsonl'));

function llmOnly(url: string, extra = '') {
  return [
    'verifier: { enabled: false }',
    'rules: { enabled: false }',
    'llm:',
    '  enabled: true',
    `  endpoint: { base_url: "${url}", model: judge-under-test, backoff_ms: 5 }`,
    extra,
  ].join('\n');
}

describe('judge and gate stages', () => {
  it('with the default judges, confirms every constructed pair, keeps confident ones and says why it dropped the rest', async () => {
    const { dir, engine } = pipeline('{}');
    await engine().run({});
    const all = await judged(dir);
    const constructed = all.filter((p) => p.source !== 'best_of_n');
    expect(constructed.length).toBeGreaterThan(50);
    expect(constructed.every((p) => p.verdict.winner === 'a')).toBe(true);
    expect(all.some((p) => p.source === 'best_of_n' && p.verdict.winner === 'abstain')).toBe(true); // equal rewards, nothing to tell them apart

    const keep = await kept(dir);
    const dropped = await collect<{ pair_id: string; reason: string }>(join(dir, 'workspace', 'gate', 'dropped.jsonl'));
    expect(keep.length + dropped.length).toBe(all.length);
    expect(keep.every((p) => p.confidence >= 0.5)).toBe(true);
    expect(dropped.every((d) => d.reason.length > 0)).toBe(true);
    expect(Object.keys(keep[0]!).sort()).toEqual(
      [
        'pair_id',
        'prompt',
        'chosen',
        'rejected',
        'chosen_reward',
        'rejected_reward',
        'margin',
        'confidence',
        'source',
        'negative_type',
        'judge',
        'task_id',
        'chosen_session_id',
        'rejected_session_id',
        'split',
      ].sort(),
    );
    const report = JSON.parse(readFileSync(join(dir, 'workspace', 'gate', 'report.json'), 'utf8')) as {
      rows: { source: string; negative_type: string | null; judged: number; kept: number }[];
    };
    const types = new Set(report.rows.filter((r) => r.source === 'hard_negative').map((r) => r.negative_type));
    expect(types).toEqual(new Set(['refusal', 'hallucination', 'off_topic', 'format', 'verbose', 'under_explained']));
    expect(report.rows.at(-1)).toMatchObject({ source: 'total', judged: all.length, kept: keep.length });
  });

  it('reruns only the gate when its threshold changes: no judge is asked again', async () => {
    const { dir, engine } = pipeline('{}');
    await engine().run({});
    const before = (await kept(dir)).length;
    const stricter = engineFor(dir, readFileSync(join(dir, 'config.yaml'), 'utf8') + 'gate:\n  min_confidence: 0.95\n');
    const outcomes = await stricter.run({});
    expect(outcomes.filter((o) => o.action === 'ran').map((o) => o.stage)).toEqual(['gate', 'export']);
    const after = await kept(dir);
    expect(after.length).toBeLessThan(before);
    expect(after.every((p) => p.confidence >= 0.95)).toBe(true);
  });

  it('abstains on every comparison when the LLM judge always prefers the first position, so the gate keeps nothing', async () => {
    server = await startChatServer(() => ({
      json: completion('A', {
        top: [
          ['A', 0.9],
          ['B', 0.1],
        ],
      }),
    }));
    const { dir, engine } = pipeline(llmOnly(server.url));
    await engine().run({});
    const all = await judged(dir);
    expect(all.length).toBeGreaterThan(0);
    expect(all.every((p) => p.verdict.winner === 'abstain' && p.judge_stats.flipped)).toBe(true);
    expect(await kept(dir)).toHaveLength(0);
    const report = JSON.parse(readFileSync(join(dir, 'workspace', 'gate', 'report.json'), 'utf8')) as {
      rows: { source: string; flip_rate: number; abstain_rate: number; requests: number }[];
    };
    const total = report.rows.at(-1)!;
    expect(total).toMatchObject({ flip_rate: 1, abstain_rate: 1 });
    // The table counts requests for the comparisons it lists; the judge's own report adds best-of-N's knockout rounds.
    const judgeReport = JSON.parse(readFileSync(join(dir, 'workspace', 'judge', 'report.json'), 'utf8')) as {
      stats: { requests: number };
      endpoint: { requests: number };
    };
    expect(judgeReport.stats.requests).toBe(server.requests.length);
    expect(judgeReport.endpoint.requests).toBe(server.requests.length);
    expect(total.requests).toBeLessThanOrEqual(server.requests.length);
  });

  it('makes zero requests when the judge stage runs again: every answer comes from the cache', async () => {
    server = await startChatServer(() => ({
      json: completion('A', {
        top: [
          ['A', 0.9],
          ['B', 0.1],
        ],
      }),
    }));
    const { dir, engine } = pipeline(llmOnly(server.url));
    await engine().run({});
    const first = server.requests.length;
    expect(first).toBeGreaterThan(0);
    const asked = manifest(dir, 'judge').counts;
    expect(asked.requests).toBe(first);
    const verdicts = async () => (await judged(dir)).map((p) => [p.pair_id, p.verdict, p.verdicts, p.confidence]);
    const before = await verdicts();
    const gateRows = readFileSync(join(dir, 'workspace', 'gate', 'dropped.jsonl'), 'utf8');
    await engine().run({ force: 'judge' });
    expect(server.requests.length).toBe(first);
    expect(await verdicts()).toEqual(before);
    expect(readFileSync(join(dir, 'workspace', 'gate', 'dropped.jsonl'), 'utf8')).toBe(gateRows);
    // Identical requests within the first run were sent once and shared: they count as cached there too.
    expect(manifest(dir, 'judge').counts).toMatchObject({ requests: 0, cached: asked.requests! + asked.cached! });
  });

  it('makes the judge stage stale when the judge model named in the environment changes', async () => {
    server = await startChatServer(() => ({
      json: completion('A', {
        top: [
          ['A', 0.9],
          ['B', 0.1],
        ],
      }),
    }));
    const judge = [
      'verifier: { enabled: false }',
      'rules: { enabled: false }',
      'llm:',
      '  enabled: true',
      `  endpoint: { base_url: "${server.url}" }`,
    ].join('\n');
    const { engine } = pipeline(judge);
    try {
      process.env.PREFAB_JUDGE_MODEL = 'judge-one';
      await engine().run({});
      expect((await engine().status()).find((a) => a.stage === 'judge')!.reasons).toEqual([]);
      process.env.PREFAB_JUDGE_MODEL = 'judge-two';
      const stale = (await engine().status()).find((a) => a.stage === 'judge')!;
      expect(stale.reasons.join(' ')).toMatch(/config section 'judge' \(or an environment variable it reads\) changed/);
      const before = server.requests.length;
      await engine().run({});
      expect(server.requests.length).toBeGreaterThan(before);
      expect(server.requests.at(-1)!.body.model).toBe('judge-two');
    } finally {
      delete process.env.PREFAB_JUDGE_MODEL;
    }
  });

  it('asks the LLM only where the verifier is not decisive, and never sends personal data', async () => {
    // A judge that knows a refusal or an off-topic reply is worse, and otherwise prefers the longer reply.
    const script: Script = (req) => {
      const { first, second } = judgePrompt(req);
      const bad = (t: string) => /sorry|cannot|recipe|weather|kick-off|trivia/i.test(t);
      const firstBetter =
        bad(second) && !bad(first) ? true : bad(first) && !bad(second) ? false : first.length >= second.length;
      return {
        json: completion(firstBetter ? 'A' : 'B', {
          top: [
            ['A', firstBetter ? 0.85 : 0.15],
            ['B', firstBetter ? 0.15 : 0.85],
          ],
        }),
      };
    };
    server = await startChatServer(script);
    const { dir, engine } = pipeline(
      ['llm:', '  enabled: true', `  endpoint: { base_url: "${server.url}", model: judge-under-test }`].join('\n'),
    );
    await engine().run({});
    const all = await judged(dir);
    const byVerifier = all.filter((p) => p.judge === 'verifier');
    expect(byVerifier.length).toBeGreaterThan(0);
    // The verifier's verdict stands where it is decisive; the LLM is asked on a seeded quarter of those
    // comparisons only (judge.calibration_share), so that the gate can measure it where the truth is known.
    const measured = byVerifier.filter((p) => 'llm:judge-under-test' in p.verdicts);
    expect(measured.length / byVerifier.length).toBeGreaterThan(0.1);
    expect(measured.length / byVerifier.length).toBeLessThan(0.45);
    expect(
      byVerifier.filter((p) => !('llm:judge-under-test' in p.verdicts)).every((p) => p.judge_stats.requests === 0),
    ).toBe(true);
    expect(
      byVerifier.every((p) => p.verdict.winner === p.verdicts.verifier!.winner && p.verdict.confidence === 1),
    ).toBe(true);
    const report = JSON.parse(readFileSync(join(dir, 'workspace', 'gate', 'report.json'), 'utf8'));
    expect(report.calibration).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ judge: 'llm:judge-under-test', group: 'all', votes: expect.any(Number) }),
      ]),
    );
    const asked = all.filter((p) => 'llm:judge-under-test' in p.verdicts);
    expect(asked.length).toBeGreaterThan(0);
    expect(manifest(dir, 'judge').counts.requests).toBe(server.requests.length);
    expect(asked.reduce((n, p) => n + p.judge_stats.requests, 0)).toBeLessThanOrEqual(server.requests.length);

    // Every value of the users' profiles that the sessions carry must have been masked on the way out.
    const secrets = new Set<string>();
    for (const s of sessions) {
      for (const m of s.messages) {
        const form =
          m.role === 'tool' && m.content?.startsWith('{"')
            ? (JSON.parse(m.content.split(' (left blank')[0]!) as Record<string, unknown>)
            : {};
        for (const key of ['account_number', 'last_4_ssn', 'date_of_birth', 'email', 'pin', 'phone_number'])
          if (typeof form[key] === 'string') secrets.add(form[key] as string);
      }
    }
    expect(secrets.size).toBeGreaterThan(10);
    for (const { body } of server.requests) {
      const text = body.messages.map((m) => m.content ?? '').join('\n');
      for (const secret of secrets) {
        if (/^\d{4}$/.test(secret)) expect(text).not.toMatch(new RegExp(`"(last_4_ssn|pin)"\\s*:\\s*"${secret}"`));
        else expect(text, `a request carried ${secret}`).not.toContain(secret);
      }
    }
  });
});

describe('best-of-N', () => {
  const candidate = (id: string, reward: number | null, answer: string): Candidate => ({
    id,
    reward,
    metadata: '{}',
    messages: [
      { role: 'user', content: 'Cancel my gym membership.' },
      { role: 'assistant', content: answer },
    ],
  });
  /** A judge by hand: the side with the higher score wins; equal scores tie; a listed couple abstains. */
  const byScore = (score: Record<string, number>, abstainOn: string[] = []) => {
    const calls: string[] = [];
    const decide = async (c: Comparison): Promise<EnsembleVerdict> => {
      calls.push(`${c.a.id}-${c.b.id}`);
      const [x, y] = [score[c.a.id]!, score[c.b.id]!];
      const winner =
        abstainOn.includes(`${c.a.id}-${c.b.id}`) || abstainOn.includes(`${c.b.id}-${c.a.id}`)
          ? 'abstain'
          : x > y
            ? 'a'
            : x < y
              ? 'b'
              : 'tie';
      return {
        verdict: { winner, confidence: winner === 'a' || winner === 'b' ? 0.9 : 0 },
        judge: 'hand',
        verdicts: {},
        stats: { requests: 1, cached: 0, retries: 0, errors: 0, parse_failures: 0, flipped: false, over_budget: false },
      };
    };
    return { decide, calls };
  };

  it('leaves out of best-of-N the couples the outcome pairs took, bucket by bucket as with one bucket, and leaves no notes behind', async () => {
    const runs = [];
    for (const split of ['', 'bucket_size: 16']) {
      const { dir, engine } = pipeline('{}', '', split);
      await engine().run({ until: 'judge' });
      const all = await judged(dir);
      runs.push({
        dir,
        buckets: manifest(dir, 'split').counts.buckets,
        counts: manifest(dir, 'judge').counts,
        ids: all.map((p) => p.pair_id).sort(),
        all,
        files: readdirSync(join(dir, 'workspace', 'judge')).sort(),
      });
    }
    const [one, three] = runs;
    expect([one!.buckets, three!.buckets]).toEqual([1, 3]);
    const outcome = new Set(
      three!.all.filter((p) => p.source === 'outcome').map((p) => `${p.chosen_session_id} ${p.rejected_session_id}`),
    );
    const bestOfN = three!.all.filter((p) => p.source === 'best_of_n');
    expect(outcome.size).toBeGreaterThan(0);
    expect(bestOfN.length).toBeGreaterThan(0);
    expect(bestOfN.filter((p) => outcome.has(`${p.chosen_session_id} ${p.rejected_session_id}`))).toEqual([]);
    expect(three!.counts.best_of_n_same_as_outcome).toBeGreaterThan(0);
    expect(three!.counts.best_of_n_same_as_outcome).toBe(one!.counts.best_of_n_same_as_outcome);
    expect(three!.ids).toEqual(one!.ids);
    expect(three!.files).toEqual(['manifest.json', 'report.json', 'test.jsonl', 'train.jsonl']);
    // Every side points at a logged session's messages (or is a turn made anew), and reads back as them.
    const whole = await wholePairs<JudgedPair<PairSide>>(three!.dir, 'judge');
    const byId = new Map(sessions.map((s) => [s.session_id, s]));
    for (const [i, p] of three!.all.entries()) {
      if (p.source !== 'best_of_n') continue;
      expect([p.prompt, p.chosen, p.rejected].every((side) => !Array.isArray(side))).toBe(true);
      const w = whole[i]!;
      expect([...w.prompt, ...w.chosen]).toEqual(byId.get(p.chosen_session_id)!.messages);
      expect([...w.prompt, ...w.rejected]).toEqual(byId.get(p.rejected_session_id)!.messages);
    }
  });

  it("points the sides at a logged candidate's messages, and writes a sampled one's whole", async () => {
    const logged = (c: Candidate): Candidate => ({ ...c, logged: true });
    const answer = (text: string) => [{ role: 'assistant', content: text }];
    const sampledChampion = {
      task_id: 'T',
      split: 'train' as const,
      candidates: [
        logged(candidate('c1', null, 'answer 1')),
        candidate('c2', null, 'answer 2'),
        logged(candidate('c3', null, 'answer 3')),
      ],
    };
    const loggedChampion = {
      ...sampledChampion,
      candidates: [logged(candidate('c1', null, 'answer 1')), candidate('c2', null, 'answer 2')],
    };
    const sides = async (group: typeof sampledChampion, score: Record<string, number>) =>
      (await judgeGroup(group, byScore(score).decide)).judged.map((p) => [
        p.chosen_session_id,
        p.rejected_session_id,
        p.prompt,
        p.chosen,
        p.rejected,
      ]);
    expect(await sides(sampledChampion, { c1: 1, c2: 3, c3: 2 })).toEqual([
      ['c2', 'c1', { session_id: 'c1', messages: [0, 1] }, answer('answer 2'), { session_id: 'c1', messages: [1, 2] }],
      ['c2', 'c3', { session_id: 'c3', messages: [0, 1] }, answer('answer 2'), { session_id: 'c3', messages: [1, 2] }],
    ]);
    expect(await sides(loggedChampion, { c1: 3, c2: 1 })).toEqual([
      ['c1', 'c2', { session_id: 'c1', messages: [0, 1] }, { session_id: 'c1', messages: [1, 2] }, answer('answer 2')],
    ]);
  });

  it('picks the best of N and pairs it against each of the others: N−1 comparisons', async () => {
    const group = {
      task_id: 'T',
      split: 'train' as const,
      candidates: ['c1', 'c2', 'c3', 'c4'].map((id, i) => candidate(id, null, `answer ${i}`)),
    };
    const { decide } = byScore({ c1: 1, c2: 4, c3: 2, c4: 3 });
    const { judged } = await judgeGroup(group, decide);
    expect(judged.map((p) => [p.chosen_session_id, p.rejected_session_id, p.verdict.winner])).toEqual([
      ['c2', 'c1', 'a'],
      ['c2', 'c3', 'a'],
      ['c2', 'c4', 'a'],
    ]);
    expect(judged.every((p) => p.source === 'best_of_n' && p.confidence === 0.9)).toBe(true);
    expect(judged[0]!.prompt).toEqual([{ role: 'user', content: 'Cancel my gym membership.' }]);
  });

  it('gives no preference for a tie or an abstention: those comparisons carry confidence 0', async () => {
    const group = {
      task_id: 'T',
      split: 'train' as const,
      candidates: [candidate('a1', null, 'x'), candidate('a2', null, 'y'), candidate('a3', null, 'z')],
    };
    const { judged } = await judgeGroup(group, byScore({ a1: 2, a2: 2, a3: 1 }, ['a1-a3']).decide);
    expect(judged.map((p) => [p.rejected_session_id, p.verdict.winner, p.confidence])).toEqual([
      ['a2', 'tie', 0],
      ['a3', 'abstain', 0],
    ]);
  });

  it('judges each couple once, and leaves out a candidate identical to another', async () => {
    const group = {
      task_id: 'T',
      split: 'train' as const,
      candidates: [
        candidate('d1', 0.2, 'same'),
        candidate('d2', 0.2, 'same'),
        candidate('d3', 0.9, 'better'),
        candidate('d4', 0.5, 'other'),
      ],
    };
    const { decide, calls } = byScore({ d1: 1, d2: 1, d3: 3, d4: 2 });
    const { judged, duplicates } = await judgeGroup(group, decide);
    expect(duplicates).toEqual(['d2']);
    expect(judged.map((p) => p.rejected_session_id)).toEqual(['d4', 'd1']);
    expect(judged[0]!.margin).toBeCloseTo(0.4);
    const couples = calls.map((c) => c.split('-').sort().join('-'));
    expect(new Set(couples).size).toBe(couples.length);
  });
});
