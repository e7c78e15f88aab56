// How many wrong preferences pass the gate with an LLM judge of known bias and noise, next to a naive judge
// measured on the same requests (one order, no abstention). The judge is a scripted chat-completions server
// on 127.0.0.1 that knows, for every best-of-N comparison of the bundled sample, which side has the higher
// reward (the truth), and answers P(first is better) = truth strength, plus a pull toward the first
// position, plus logit noise. Only the LLM judges (verifier and rules off), so its errors are what is measured.
// Then the judge stage runs again, to count the requests a rerun makes (it should be zero).
//
//   npx tsx bench/judge.ts                       # bias 0, 0.15, 0.3 × noise 0.5, 1.5
//   npx tsx bench/judge.ts --bias 0.2 --noise 1
// It ends with two judges that report 0.96 confidence whatever they know: one flipping a coin, one right 90% of
// the time, and what the gate keeps of each once it has measured them.
import { writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { loadPrompt, renderPrompt } from '../judges/llm.ts';
import { loadConfig } from '../pipeline/config.ts';
import { Engine, configSchema } from '../pipeline/engine.ts';
import { readJsonl } from '../pipeline/jsonl.ts';
import { Logger } from '../pipeline/log.ts';
import { seeded } from '../core/random.ts';
import { DEFAULT_PROMPT } from '../judges/panel.ts';
import { STAGES } from '../stages/index.ts';
import type { PairSide } from '../store/messages.ts';
import { commonPrefixLength, type JudgedPair, type Session } from '../core/records.ts';
import { Redactor } from '../core/redact.ts';
import { completion, startChatServer } from '../test/fixtures/chat-server.ts';

const { values } = parseArgs({
  options: { bias: { type: 'string' }, noise: { type: 'string' }, tasks: { type: 'string', default: '200' } },
});
const biases = values.bias ? [Number(values.bias)] : [0, 0.15, 0.3];
const noises = values.noise ? [Number(values.noise)] : [0.5, 1.5];
const STRENGTH = 0.75; // P(first better) an unbiased, noiseless judge gives when the first is better
const SAMPLE = join(import.meta.dirname, '../data/sample/sessions.jsonl.gz');

const sessions: Session[] = [];
for await (const s of readJsonl<Session>(SAMPLE)) {
  if (sessions.length >= Number(values.tasks) * 4) break;
  sessions.push(s);
}

// Every request the judge stage can send for a best-of-N couple, in either orientation and either order,
// exactly as it leaves the machine (rendered, then redacted), mapped to the position that is truly better.
const prompt = loadPrompt(DEFAULT_PROMPT);
const truth = new Map<string, 'A' | 'B' | null>();
const byTask = new Map<string | null, Session[]>();
for (const s of sessions) byTask.set(s.task_id, [...(byTask.get(s.task_id) ?? []), s]);
for (const group of byTask.values()) {
  for (const x of group) {
    for (const y of group) {
      if (x === y) continue;
      const n = commonPrefixLength(x.messages, y.messages);
      const a = { id: x.session_id, messages: x.messages.slice(n), reward: x.reward };
      const b = { id: y.session_id, messages: y.messages.slice(n), reward: y.reward };
      // As the endpoint sends it: the request's messages redacted together (core/redact.ts learns what they reveal).
      const text = new Redactor().messages([
        { role: 'user', content: renderPrompt(prompt, x.messages.slice(0, n), a, b) },
      ])[0]!.content!;
      truth.set(text, x.reward === y.reward ? null : x.reward > y.reward ? 'A' : 'B');
    }
  }
}

const logit = (p: number) => Math.log(p / (1 - p));
const sigmoid = (z: number) => 1 / (1 + Math.exp(-z));

interface Row {
  bias: number;
  noise: number;
  judged: number;
  kept: number;
  wrong_kept: number;
  abstained: number;
  naive_kept: number;
  naive_wrong: number;
  requests: number;
  rerun_requests: number;
  seconds: number;
}

/** The judge of a bias and a noise: P(first better) = truth strength, pulled toward the first position, with logit noise. */
function scripted(bias: number, noise: number): (t: 'A' | 'B' | null | undefined) => number {
  const rand = seeded('bench-judge', String(bias), String(noise));
  const gauss = () => Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand());
  return (t) => {
    const base = t === 'A' ? STRENGTH : t === 'B' ? 1 - STRENGTH : 0.5;
    return Math.min(0.999, Math.max(0.001, sigmoid(logit(base) + noise * gauss()) + bias));
  };
}

/** A judge right with probability `accuracy` whatever it is shown, always reporting P = `reported` for the side it picks. */
function sure(accuracy: number, reported: number, seed: string): (t: 'A' | 'B' | null | undefined) => number {
  const rand = seeded('bench-judge', seed);
  return (t) => {
    const right = t === 'A' || t === 'B' ? (rand() < accuracy ? t : t === 'A' ? 'B' : 'A') : rand() < 0.5 ? 'A' : 'B';
    return right === 'A' ? reported : 1 - reported;
  };
}

async function measure(bias: number, noise: number, answer = scripted(bias, noise)): Promise<Row> {
  // What a naive judge would have said: each request's answer alone, taken as a verdict.
  const firstOrder = new Map<string, number>();
  const server = await startChatServer((req) => {
    const text = req.body.messages.at(-1)?.content ?? '';
    const p = answer(truth.get(text));
    firstOrder.set(text, p);
    return {
      json: completion(p >= 0.5 ? 'A' : 'B', {
        top: [
          ['A', p],
          ['B', 1 - p],
        ],
      }),
    };
  });
  const dir = await mkdtemp(join(tmpdir(), 'prefab-bench-judge-'));
  writeFileSync(join(dir, 'sessions.jsonl'), sessions.map((s) => JSON.stringify(s)).join('\n') + '\n');
  const yaml = [
    'ingest: { inputs: [sessions.jsonl] }',
    'split: { test_ratio: 0 }',
    'pairs: { outcome: { enabled: false }, hard_negatives: { enabled: false } }',
    'judge:',
    '  verifier: { enabled: false }',
    '  rules: { enabled: false }',
    `  llm: { enabled: true, endpoint: { base_url: "${server.url}", model: scripted, concurrency: 16 } }`,
    'gate: { min_confidence: 0.5 }',
  ].join('\n');
  writeFileSync(join(dir, 'config.yaml'), yaml + '\n');
  const loaded = loadConfig(join(dir, 'config.yaml'), configSchema(STAGES));
  const engine = () =>
    new Engine(
      STAGES,
      join(dir, 'workspace'),
      loaded.value as Record<string, unknown>,
      loaded.dir,
      new Logger('json', process.stderr, {}, true),
      'bench',
    );
  const started = performance.now();
  await engine().run({ until: 'gate' });
  const seconds = (performance.now() - started) / 1000;
  const requests = server.requests.length;

  const reward = new Map(sessions.map((s) => [s.session_id, s.reward]));
  const wrong = (chosen: string, rejected: string) => reward.get(chosen)! < reward.get(rejected)!;
  // Ids and verdicts only: the sides, as stored, point at their sessions' messages.
  const judged: JudgedPair<PairSide>[] = [];
  for await (const p of readJsonl<JudgedPair<PairSide>>(join(dir, 'workspace', 'judge', 'train.jsonl'))) judged.push(p);
  const kept: JudgedPair<PairSide>[] = [];
  for await (const p of readJsonl<JudgedPair<PairSide>>(join(dir, 'workspace', 'gate', 'train.jsonl'))) kept.push(p);

  // The naive judge: one order only, confidence |2p − 1|, no abstention; the same threshold.
  let naiveKept = 0;
  let naiveWrong = 0;
  for (const [text, p] of firstOrder) {
    const t = truth.get(text);
    if (t === undefined || Math.abs(2 * p - 1) < 0.5) continue;
    naiveKept++;
    if (t !== null && (p >= 0.5 ? 'A' : 'B') !== t) naiveWrong++;
  }

  await engine().run({ force: 'judge' });
  const rerun = server.requests.length - requests;
  await server.close();
  await rm(dir, { recursive: true, force: true });
  return {
    bias,
    noise,
    judged: judged.length,
    kept: kept.length,
    wrong_kept: kept.filter((p) => wrong(p.chosen_session_id, p.rejected_session_id)).length,
    abstained: judged.filter((p) => p.verdict.winner === 'abstain').length,
    naive_kept: naiveKept,
    naive_wrong: naiveWrong,
    requests,
    rerun_requests: rerun,
    seconds,
  };
}

console.log(`best-of-N over ${byTask.size} tasks of the sample; judge strength ${STRENGTH}; gate min_confidence 0.5`);
console.log(
  'bias  noise  judged  kept  wrong kept  abstained | naive kept  naive wrong | wrong-rate gate/naive | requests  rerun  seconds',
);
for (const bias of biases) {
  for (const noise of noises) {
    const r = await measure(bias, noise);
    const rate = (w: number, k: number) => (k ? w / k : 0);
    const ratio = rate(r.naive_wrong, r.naive_kept)
      ? rate(r.wrong_kept, r.kept) / rate(r.naive_wrong, r.naive_kept)
      : 0;
    console.log(
      `${r.bias.toFixed(2).padStart(4)}  ${r.noise.toFixed(1).padStart(5)}  ${String(r.judged).padStart(6)}  ${String(r.kept).padStart(4)}  ${String(r.wrong_kept).padStart(10)}  ${String(r.abstained).padStart(9)} | ` +
        `${String(r.naive_kept).padStart(10)}  ${String(r.naive_wrong).padStart(11)} | ${(100 * rate(r.wrong_kept, r.kept)).toFixed(1).padStart(5)}% / ${(100 * rate(r.naive_wrong, r.naive_kept)).toFixed(1).padStart(5)}% = ${ratio.toFixed(2)} | ` +
        `${String(r.requests).padStart(8)}  ${String(r.rerun_requests).padStart(5)}  ${r.seconds.toFixed(1).padStart(7)}`,
    );
  }
}

// Judges that report what they do not know: the gate measures each on the pairs whose rewards differ and lets
// one decide only where its measured accuracy is surely above chance (stages/gate/calibration.ts).
console.log('');
console.log('judge                               judged  kept  wrong kept  wrong rate | naive kept  naive wrong rate');
for (const [name, answer] of [
  ['coin flip, reports 0.96', sure(0.5, 0.98, 'coin')],
  ['right 90%, reports 0.96', sure(0.9, 0.98, 'accurate')],
] as const) {
  const r = await measure(0, 0, answer);
  const rate = (w: number, k: number) => (k ? (100 * w) / k : 0);
  console.log(
    `${name.padEnd(34)}  ${String(r.judged).padStart(6)}  ${String(r.kept).padStart(4)}  ${String(r.wrong_kept).padStart(10)}  ${rate(r.wrong_kept, r.kept).toFixed(1).padStart(9)}% | ${String(r.naive_kept).padStart(10)}  ${rate(r.naive_wrong, r.naive_kept).toFixed(1).padStart(15)}%`,
  );
}
