// The preference head-to-head from one SFT model (issue 63; docs/experiments.md, "Preference training that
// makes the agent better"): one command per arm and seed, its checkpoints (every per_round episodes) played
// on the same validation tasks and draws as the SFT model, twin by twin, and a line a checkpoint appended to
// curves.jsonl, so that the next session goes on where this one stopped.
//
//   npx tsx bench/iterative.ts --from <sft model folder> --arm iterative --seed 1
//   npx tsx bench/iterative.ts --table                                      # the table so far
//   npx tsx bench/iterative.ts --from <sft model> --arm iterative --seed 1 --nll <export>/sft/test.parquet
//                                                     # held-out NLL of SFT and the arm's checkpoints (nll.jsonl)
//
// The arms (ARMS), each --episodes episodes in rounds of --per-round:
//   offline            DPO+NLL on step pairs of the logs' mix of scripted agents (the sessions `prefab simulate`
//                      logs: pairs cut where a success and a failure part), the reference fixed at SFT
//   iterative          DPO+NLL on step pairs of the policy's own rollouts, the reference reset every round
//   iterative-fixed    the same, the reference fixed at SFT
//   offline-iterative  the first half of the rounds offline, the rest iterative (reference reset)
//   rft                SFT on the policy's own successful rollouts (rejection sampling): the control
//   rft-iterative      the first half of the rounds RFT, the rest iterative DPO from its model (reference
//                      reset): whether the negatives add to what RFT's positives teach
//   dapo               standard DAPO (group_size = --k, one batch of rollouts a step: no extra draws)
//   dapo-feedback      feedback-guided DAPO, the same budget
//
// First-try success on --val-tasks validation tasks × --tries tries (at most --max-calls calls), the same
// draws for every arm and checkpoint; against SFT: the difference, the one-sided sign test, a 90% bootstrap
// interval resampling companies whole, and Holm's correction across the arms' last checkpoints.
import { appendFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Command } from 'commander';
import { z } from 'zod';
import { hashJson } from '../pipeline/hash.ts';
import { NEVER } from '../pipeline/interrupt.ts';
import { Logger } from '../pipeline/log.ts';
import { holm, pairedSuccess, type Twin } from '../core/paired-success.ts';
import { seeded } from '../core/random.ts';
import { ScriptedAgent } from '../env/agents.ts';
import { TOOLS } from '../env/env.ts';
import { validationEpisodes, type EpisodeRecord } from '../env/evaluate.ts';
import { mixAgent } from '../env/simulate.ts';
import { DEFAULT_WORLD, generateWorld, taskPool, type Task } from '../env/world.ts';
import { openChat } from '../model/chat.ts';
import { loadCheckpoint } from '../model/checkpoint.ts';
import { openDevice, type BackendChoice, type Device } from '../runtime/device.ts';
import { decodingEngine } from '../runtime/placement.ts';
import { EpisodePlayers } from '../runtime/policy.ts';
import { runDapo } from '../rl/dapo.ts';
import { runIterativeDpo } from '../rl/iterative.ts';
import { validationTasks, type TaskOutcome } from '../rl/rollouts.ts';
import { scorerOn } from '../runtime/engines.ts';
import { meanNll, scoreSequences } from '../runtime/scoring.ts';
import { readParquet, sftSequences, subset } from '../trainers/data.ts';
import type { Message } from '../core/records.ts';
import { dapoKnobs, iterativeKnobs } from '../rl/settings.ts';
import { PAIRWISE_LOSSES, preferenceKnobs } from '../trainers/settings.ts';

const ARMS = [
  'offline',
  'iterative',
  'iterative-fixed',
  'offline-iterative',
  'rft',
  'rft-iterative',
  'dapo',
  'dapo-feedback',
];
const ARMS_HELP = ARMS.join(', ');

const o = new Command()
  .option('--from <folder>', 'the SFT model every arm starts from')
  .option('--arm <name>', ARMS_HELP, 'iterative')
  .option('--seed <n>', 'the run’s seed (1, 2, 3)', '1')
  .option('--episodes <n>', 'rollouts in all', '1024')
  .option('--per-round <n>', 'rollouts a round: a checkpoint each', '256')
  .option('--k <n>', 'rollouts a task', '8')
  .option('--max-calls <n>', 'tasks with at most this many calls', '2')
  .option('--min-visits <n>', 'rollouts a turn needs through it to be valued', '1')
  .option('--max-tokens <n>', 'most tokens in one assistant message', '160')
  .option('--rpo-alpha <x>', 'RPO’s α on the chosen side’s NLL', '1')
  .option('--lr <x>', 'each round’s learning rate (DPO, RFT)', '2e-5')
  .option('--dapo-lr <x>', 'DAPO’s learning rate', '5e-5')
  .option('--epochs <x>', 'passes over a round’s pairs', '2')
  .option('--val-tasks <n>', 'validation tasks', '200')
  .option('--tries <n>', 'tries a task', '2')
  .option('--backend <name>', 'auto, cpu, webgpu or wasm', 'auto')
  .option('--work <dir>', 'the rounds’ models', '.scratch/iterative')
  .option('--out <dir>', 'curves.jsonl, and each checkpoint’s episodes', 'bench/results/iterative')
  .option('--notes-tries <n>', 'tries a task for with-feedback and retry-without-notes success', '3')
  .option('--notes', 'no run: does the SFT model (--from) read notes? With-feedback against retry success, paired')
  .option('--table', 'no run: the head-to-head so far, as Markdown')
  .option(
    '--nll <sessions.parquet>',
    'no run: held-out NLL of SFT (--from) and of each checkpoint of --arm/--seed (trained already) on these sessions (an export’s sft/test.parquet)',
  )
  .option('--nll-sessions <n>', 'sessions of --nll scored', '200')
  .parse()
  .opts<Record<string, string | boolean | undefined>>();
const num = (k: string) => Number(o[k]);
const out = String(o.out);
const world = generateWorld({ ...DEFAULT_WORLD });
const companyOf = new Map(taskPool(world, 'val', num('valTasks'), num('maxCalls')).map((t) => [t.task_id, t.company]));
const twins = (records: EpisodeRecord[]): Twin[] => records.map((r) => ({ ...r, cluster: companyOf.get(r.task) }));

/** The knobs that make an arm's run what it is: a run of other knobs is another run, in folders of its own. */
const knobsOf = (name: string): Record<string, number> =>
  name.startsWith('dapo')
    ? { k: num('k'), per_round: num('perRound'), lr: num('dapoLr') }
    : {
        k: num('k'),
        per_round: num('perRound'),
        lr: num('lr'),
        rpo_alpha: num('rpoAlpha'),
        epochs: num('epochs'),
        min_visits: num('minVisits'),
      };

/** An arm's run as its folders and files are named: arm, seed and a hash of its knobs (these options' by default). */
const runName = (name: string, seed: number, knobs = knobsOf(name)) => `${name}-${seed}-${hashJson(knobs).slice(0, 8)}`;

/** A task's number of calls, by id: the table splits first-try success by one and two. */
const callsOf = new Map(
  taskPool(world, 'val', num('valTasks'), num('maxCalls')).map((t) => [t.task_id, t.calls.length]),
);

/** First-try success on the tasks of one call and of two, and the share of tool calls the environment accepted. */
function split(records: EpisodeRecord[]): { one: number; two: number; accepted: number } {
  const rate = (rs: EpisodeRecord[]) => rs.reduce((a, r) => a + r.success, 0) / Math.max(1, rs.length);
  const calls = records.reduce((a, r) => a + r.calls, 0);
  return {
    one: rate(records.filter((r) => callsOf.get(r.task) === 1)),
    two: rate(records.filter((r) => callsOf.get(r.task) === 2)),
    accepted: records.reduce((a, r) => a + r.calls_ok, 0) / Math.max(1, calls),
  };
}

interface Point {
  arm: string;
  seed: number;
  knobs: Record<string, number>;
  episodes: number;
  success_first: number;
  difference: number;
  p: number;
  interval: [number, number];
  better: number;
  worse: number;
  seconds: number;
  /** The last checkpoint's: success within --notes-tries tries reading the notes of the failed ones, and without. */
  with_notes?: number;
  retry?: number;
}

/** The model in `folder` on the validation tasks: every try a twin of every other model's (seeded by task and try). */
async function episodesOf(device: Device, folder: string, log: Logger): Promise<EpisodeRecord[]> {
  const ck = loadCheckpoint(folder);
  const chat = openChat(ck.tokenizer, ck.model.config.eosTokenId, folder);
  const episodes = num('valTasks') * num('tries');
  const sampling = {
    maxTokens: num('maxTokens'),
    temperature: 0.5,
    topP: 1,
    tools: TOOLS,
    engine: await decodingEngine(device, ck.model, episodes, log),
  };
  const { model, context, placeholders } = ck;
  const players = new EpisodePlayers({ name: 'validation', model, context, chat, placeholders, sampling });
  const records = await validationEpisodes((task, trial) => players.player(seeded('head-to-head', task, trial)), {
    worldSeed: DEFAULT_WORLD.seed,
    companies: DEFAULT_WORLD.companies,
    tasks: num('valTasks'),
    k: num('tries'),
    maxTurns: 12,
    maxCalls: num('maxCalls'),
    together: true,
  }).finally(() => players.dispose());
  ck.model.dispose();
  return records;
}

/** The model in `folder` task by task: its first try, then within --notes-tries tries with notes and without. */
async function notesOf(device: Device, folder: string, log: Logger): Promise<TaskOutcome[]> {
  const ck = loadCheckpoint(folder);
  const tasks = taskPool(world, 'val', num('valTasks'), num('maxCalls'));
  const sampling = {
    maxTokens: num('maxTokens'),
    temperature: 0.5,
    topP: 1,
    tools: TOOLS,
    engine: await decodingEngine(device, ck.model, tasks.length * 2, log),
  };
  const chat = openChat(ck.tokenizer, ck.model.config.eosTokenId, folder);
  const { context, placeholders } = ck;
  const options = { world, chat, context, placeholders, sampling, maxTurns: 12, seed: 'head-to-head' };
  const outcomes = await validationTasks({ ...options, tasks, tries: num('notesTries') }, ck.model);
  ck.model.dispose();
  return outcomes;
}

/** With-feedback against retry-without-notes success on the same tasks: the paired test says whether notes are read. */
function notesAgainstRetry(outcomes: TaskOutcome[], seed: string) {
  const twin = (success: boolean, t: TaskOutcome): Twin => ({
    task: t.task,
    trial: 0,
    success: +success,
    cluster: t.company,
  });
  const retry = outcomes.map((t) => twin(t.without, t));
  const notes = outcomes.map((t) => twin(t.withNotes, t));
  return pairedSuccess(retry, notes, { samples: 2000, alpha: 0.05, seed });
}

/** Episodes of `folder`, kept in `path` (a rerun, or another arm's, reads them back). */
async function kept<T>(path: string, make: () => Promise<T[]>): Promise<T[]> {
  if (existsSync(path)) return JSON.parse(readFileSync(path, 'utf8')) as T[];
  const records = await make();
  mkdirSync(join(out, 'episodes'), { recursive: true });
  writeFileSync(path, JSON.stringify(records));
  return records;
}

/**
 * DAPO's checkpoints: one run (group_size = --k, 4 tasks a step, one batch of rollouts a step so that
 * episodes are the budget), stopped at each round's step and resumed from its checkpoint: the same updates
 * as one long run.
 */
async function dapoRounds(name: string, seed: number, from: string, device: Device, log: Logger): Promise<string[]> {
  const k = num('k');
  const work = join(String(o.work), runName(name, seed));
  const tasksPerStep = 4;
  const stepsPerRound = Math.max(1, Math.round(num('perRound') / (tasksPerStep * k)));
  const models: string[] = [];
  for (let round = 1; round <= Math.ceil(num('episodes') / num('perRound')); round++) {
    const out = join(work, `round-${String(round).padStart(3, '0')}`);
    const knobs = z.strictObject(dapoKnobs).parse({
      seed: `head-to-head-${seed}`,
      steps: round * stepsPerRound,
      tasks_per_step: tasksPerStep,
      group_size: k,
      max_generation_batches: 1,
      max_calls: num('maxCalls'),
      mode: name === 'dapo' ? 'standard' : 'feedback',
      lr: num('dapoLr'),
      simulator: { max_tokens: num('maxTokens') },
    });
    const key = runName(name, seed);
    if (!existsSync(join(out, 'model')))
      await runDapo({ from, out, cache: work, key, knobs, info: {}, device, signal: NEVER, log });
    models.push(join(out, 'model'));
  }
  return models;
}

/** Each round's model folder, the arm trained from `from`: the iterative trainer's rounds, or DAPO's. */
async function trained(name: string, seed: number, from: string, device: Device, log: Logger): Promise<string[]> {
  if (name === 'dapo' || name === 'dapo-feedback') return dapoRounds(name, seed, from, device, log);
  const k = num('k');
  const rounds = Math.ceil(num('episodes') / num('perRound'));
  const work = join(String(o.work), runName(name, seed));
  const offline = name === 'offline' ? rounds : name === 'offline-iterative' ? Math.floor(rounds / 2) : 0;
  const knobs = z.strictObject(iterativeKnobs).parse({
    seed: `head-to-head-${seed}`,
    rounds,
    tasks_per_round: Math.max(1, Math.floor(num('perRound') / k)),
    rollouts_per_task: k,
    max_calls: num('maxCalls'),
    min_visits: num('minVisits'),
    method: name === 'rft' ? 'rft' : 'dpo',
    reference: name === 'iterative-fixed' || name === 'offline' ? 'fixed' : 'reset',
    simulator: { max_tokens: num('maxTokens') },
    validation: { tasks: 20, tries: 1 },
    // Every round is evaluated here; the run's own model folder is its last round's, as before keep existed.
    keep: 'last',
  });
  const preference = z.strictObject(preferenceKnobs({ lr: 2e-5, losses: PAIRWISE_LOSSES })).parse({
    rpo_alpha: num('rpoAlpha'),
    lr: num('lr'),
    epochs: num('epochs'),
    batch_size: 8,
    warmup: 0,
    seed: `${seed}`,
  });
  // The logs' agents: the mix `prefab simulate` logs (its noise 0.3), each try's agent drawn by (round, task, try).
  const actor = (task: Task, round: number, trial: number) =>
    round <= offline
      ? new ScriptedAgent(
          mixAgent(seeded(`head-to-head-${seed}`, 'mix', round, task.task_id, trial)()),
          world,
          task,
          `${seed}:${round}:${trial}`,
          0.3,
        )
      : undefined;
  const key = runName(name, seed);
  const rftRounds = name === 'rft-iterative' ? Math.floor(rounds / 2) : 0;
  const run = await runIterativeDpo({
    ...{ from, out: work, cache: work, key, knobs, preference, device, signal: NEVER, log },
    actor,
    method: (round) => (round <= rftRounds ? 'rft' : knobs.method),
  });
  return run.models;
}

async function arm(): Promise<void> {
  const log = new Logger('json', process.stderr);
  const device = await openDevice({ backend: o.backend as BackendChoice });
  const from = String(o.from);
  const [name, seed] = [String(o.arm), num('seed')];
  if (!ARMS.includes(name)) throw new Error(`--arm ${name}: expected one of ${ARMS_HELP}`);
  const sft = await kept(join(out, 'episodes', 'sft.json'), () => episodesOf(device, from, log));
  await kept(join(out, 'episodes', `sft-notes-${num('notesTries')}.json`), () => notesOf(device, from, log));
  const began = performance.now();
  const models = await trained(name, seed, from, device, log);
  for (const [i, folder] of models.entries()) {
    const episodes = Math.min(num('episodes'), (i + 1) * num('perRound'));
    const records = await kept(join(out, 'episodes', `${runName(name, seed)}-${episodes}.json`), () =>
      episodesOf(device, folder, log),
    );
    const against = pairedSuccess(twins(sft), twins(records), { samples: 2000, alpha: 0.05, seed: `${name}-${seed}` });
    const point: Point = {
      arm: name,
      seed,
      knobs: knobsOf(name),
      episodes,
      success_first: against.candidate,
      difference: against.difference,
      p: against.p,
      interval: against.interval,
      better: against.better,
      worse: against.worse,
      seconds: (performance.now() - began) / 1000,
    };
    if (i === models.length - 1) {
      const notes = await kept(join(out, 'episodes', `${runName(name, seed)}-${episodes}-notes.json`), () =>
        notesOf(device, folder, log),
      );
      const n = notesAgainstRetry(notes, `${name}-${seed}`);
      Object.assign(point, {
        with_notes: n.candidate,
        retry: n.baseline,
        seconds: (performance.now() - began) / 1000,
      });
    }
    // A rerun of an arm that got this far finds its point already written.
    const same = (p: Point) => p.arm === name && p.seed === seed && hashJson(p.knobs) === hashJson(point.knobs);
    if (!points().some((p) => same(p) && p.episodes === episodes))
      appendFileSync(join(out, 'curves.jsonl'), JSON.stringify(point) + '\n');
    console.error(JSON.stringify(point));
  }
}

/** Held-out NLL of the model in `folder`: mean over the assistant tokens of --nll-sessions sessions of `file`. */
async function nllOf(device: Device, folder: string, file: string, log: Logger): Promise<number> {
  const ck = loadCheckpoint(folder);
  const chat = openChat(ck.tokenizer, ck.model.config.eosTokenId, folder);
  const sessions = subset(await readParquet<{ messages: Message[] }>(file), num('nllSessions'), 'head-to-head');
  const sequences = await sftSequences(
    chat,
    sessions.map((s) => s.messages),
    ck.context,
    file,
    ck.placeholders,
  );
  const scorer = await scorerOn(device, ck.model, log);
  const s = await scoreSequences(scorer.score, sequences, {
    maxTokens: 16384,
    pad: chat.pad,
    signal: NEVER,
    log,
    label: `held-out NLL: ${folder}`,
  });
  scorer.dispose();
  ck.model.dispose();
  return meanNll(s);
}

/** NLL of SFT and of each checkpoint of --arm/--seed on --nll's sessions, a line each in nll.jsonl (kept: done once). */
async function nll(): Promise<void> {
  const log = new Logger('json', process.stderr);
  const device = await openDevice({ backend: o.backend as BackendChoice });
  const [from, file] = [String(o.from), String(o.nll)];
  const [name, seed] = [String(o.arm), num('seed')];
  const path = join(out, 'nll.jsonl');
  const done = existsSync(path)
    ? readFileSync(path, 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as NllPoint)
    : [];
  const write = async (point: Omit<NllPoint, 'nll'>, folder: string) => {
    const same = (p: NllPoint) =>
      p.arm === point.arm &&
      p.seed === point.seed &&
      p.episodes === point.episodes &&
      hashJson(p.knobs) === hashJson(point.knobs);
    if (done.some(same)) return;
    const line = { ...point, nll: await nllOf(device, folder, file, log) };
    appendFileSync(path, JSON.stringify(line) + '\n');
    console.log(JSON.stringify(line));
  };
  mkdirSync(out, { recursive: true });
  await write({ arm: 'SFT', seed: 0, knobs: {}, episodes: 0 }, from);
  const models = await trained(name, seed, from, device, log);
  for (const [i, folder] of models.entries())
    await write(
      { arm: name, seed, knobs: knobsOf(name), episodes: Math.min(num('episodes'), (i + 1) * num('perRound')) },
      folder,
    );
}

interface NllPoint {
  arm: string;
  seed: number;
  knobs: Record<string, number>;
  episodes: number;
  nll: number;
}

/** The points so far. */
function points(): Point[] {
  const path = join(out, 'curves.jsonl');
  if (!existsSync(path)) return [];
  return readFileSync(path, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Point);
}

/** The table: each arm's checkpoints, the last ones' p corrected by Holm across the arms. */
function table(): void {
  const all = points();
  const last = new Map<string, Point>();
  for (const p of all) {
    const key = `${p.arm} ${p.seed} ${hashJson(p.knobs)}`;
    if ((last.get(key)?.episodes ?? -1) < p.episodes) last.set(key, p);
  }
  const finals = [...last.values()];
  const adjusted = new Map(holm(finals.map((p) => p.p)).map((q, i) => [finals[i]!, q]));
  const f = (x: number) => (x >= 0 ? '+' : '') + x.toFixed(3);
  console.log(
    '| arm | knobs | seed | episodes | first-try success | one call / two | against SFT [90%, companies] | better / worse | p (Holm) | with notes / retry | calls accepted | held-out NLL | minutes |',
  );
  console.log('|---|---|---|---|---|---|---|---|---|---|---|---|---|');
  const nllPath = join(out, 'nll.jsonl');
  const nlls = new Map(
    (existsSync(nllPath) ? readFileSync(nllPath, 'utf8').split('\n').filter(Boolean) : [])
      .map((l) => JSON.parse(l) as NllPoint)
      .map((p) => [`${p.arm} ${p.seed} ${hashJson(p.knobs)} ${p.episodes}`, p.nll]),
  );
  const nllCell = (arm: string, seed: number, knobs: Record<string, number>, episodes: number) =>
    nlls.get(`${arm} ${seed} ${hashJson(knobs)} ${episodes}`)?.toFixed(3) ?? '';
  const episodesFile = (p: Point) => join(out, 'episodes', `${runName(p.arm, p.seed, p.knobs)}-${p.episodes}.json`);
  const splitOf = (path: string) =>
    existsSync(path) ? split(JSON.parse(readFileSync(path, 'utf8')) as EpisodeRecord[]) : null;
  const splitCells = (s: ReturnType<typeof splitOf>) =>
    s ? [`${s.one.toFixed(3)} / ${s.two.toFixed(3)}`, s.accepted.toFixed(3)] : ['', ''];
  const pair = (a?: number, b?: number) =>
    a === undefined || b === undefined ? '' : `${a.toFixed(3)} / ${b.toFixed(3)}`;
  const sft = JSON.parse(readFileSync(join(out, 'episodes', 'sft.json'), 'utf8')) as EpisodeRecord[];
  const first = sft.reduce((a, r) => a + r.success, 0) / sft.length;
  const notesPath = join(out, 'episodes', `sft-notes-${num('notesTries')}.json`);
  const n = existsSync(notesPath)
    ? notesAgainstRetry(JSON.parse(readFileSync(notesPath, 'utf8')) as TaskOutcome[], 'sft')
    : null;
  const [sftSplit, sftAccepted] = splitCells(split(sft));
  console.log(
    `| SFT | | – | 0 | ${first.toFixed(3)} | ${sftSplit} | | | | ${pair(n?.candidate, n?.baseline)} | ${sftAccepted} | ${nllCell('SFT', 0, {}, 0)} | |`,
  );
  const knobs = (p: Point) =>
    Object.entries(p.knobs)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ');
  for (const p of all) {
    const [oneTwo, accepted] = splitCells(splitOf(episodesFile(p)));
    console.log(
      `| ${p.arm} | ${knobs(p)} | ${p.seed} | ${p.episodes} | ${p.success_first.toFixed(3)} | ${oneTwo} | ${f(p.difference)} [${f(p.interval[0])}, ${f(p.interval[1])}] | ${p.better} / ${p.worse} | ${p.p.toPrecision(2)}${adjusted.has(p) ? ` (${adjusted.get(p)!.toPrecision(2)})` : ''} | ${pair(p.with_notes, p.retry)} | ${accepted} | ${nllCell(p.arm, p.seed, p.knobs, p.episodes)} | ${(p.seconds / 60).toFixed(0)} |`,
    );
  }
  // Episodes to +0.10: each run's first checkpoint that far above SFT (seed 004's measure of sample efficiency).
  console.log('\n| arm | knobs | seed | episodes to +0.10 first-try |\n|---|---|---|---|');
  for (const p of finals) {
    const run = all.filter((q) => q.arm === p.arm && q.seed === p.seed && hashJson(q.knobs) === hashJson(p.knobs));
    const reached = run.filter((q) => q.difference >= 0.1).sort((a, b) => a.episodes - b.episodes)[0];
    console.log(`| ${p.arm} | ${knobs(p)} | ${p.seed} | ${reached ? reached.episodes : `not within ${p.episodes}`} |`);
  }
}

/** Does the --from model read notes: with-feedback success against as many tries without, paired by task. */
async function notes(): Promise<void> {
  const log = new Logger('json', process.stderr);
  const device = await openDevice({ backend: o.backend as BackendChoice });
  const from = String(o.from);
  // The head-to-head's SFT model: its outcomes are kept beside its episodes (an --out holds one SFT model's).
  const outcomes = await kept(join(out, 'episodes', `sft-notes-${num('notesTries')}.json`), () =>
    notesOf(device, from, log),
  );
  const n = notesAgainstRetry(outcomes, 'sft');
  const mean = (f: (t: TaskOutcome) => boolean) => outcomes.filter(f).length / outcomes.length;
  const line = {
    from,
    tasks: outcomes.length,
    tries: num('notesTries'),
    max_calls: num('maxCalls'),
    first: mean((t) => t.first),
    with_notes: n.candidate,
    retry: n.baseline,
    difference: n.difference,
    p: n.p,
    interval: n.interval,
    better: n.better,
    worse: n.worse,
  };
  mkdirSync(out, { recursive: true });
  appendFileSync(join(out, 'notes.jsonl'), JSON.stringify(line) + '\n');
  console.log(JSON.stringify(line));
}

if (o.table) table();
else if (o.notes) await notes();
else if (o.nll) await nll();
else await arm();
