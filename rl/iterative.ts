// Iterative on-policy DPO (RLHFlow's online iterative DPO; Iterative RPO): rounds of the policy's own rollouts
// in the simulator, step pairs where they part (pairing/steps.ts: the turn that led to success more often
// against its sibling), and DPO with RPO's NLL anchor on them (trainers/preference.ts, the dpo stage's run),
// the reference reset to each round's starting policy or fixed at the start. Its control, method rft
// (rejection-sampling fine-tuning, expert iteration), trains on the same rollouts' successes by SFT instead.
// Each round's model is a folder of its own, so a killed run resumes at the round it was in; every round
// ends with the policy on the validation tasks, the same draws each time.
import { cp, mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { hashJson } from '../pipeline/hash.ts';
import type { Logger } from '../pipeline/log.ts';
import { sample, seeded } from '../core/random.ts';
import type { Policy, Session } from '../core/records.ts';
import { settled } from '../core/settled.ts';
import { TOOLS } from '../env/env.ts';
import { runEpisode } from '../env/rollout.ts';
import { DEFAULT_WORLD, generateWorld, taskPool, type Task, type World } from '../env/world.ts';
import { openChat } from '../model/chat.ts';
import { loadCheckpoint } from '../model/checkpoint.ts';
import { stepPairs } from '../pairing/steps.ts';
import type { Device } from '../runtime/device.ts';
import { decodingEngine } from '../runtime/placement.ts';
import { EpisodePlayers } from '../runtime/policy.ts';
import { sftSequences } from '../trainers/data.ts';
import { runPreference, type PreferenceKnobs } from '../trainers/preference.ts';
import { trainingRun } from '../trainers/run.ts';
import { sftTrainer } from '../trainers/sft.ts';
import { validation } from './rollouts.ts';
import type { IterativeSettings } from './settings.ts';

export interface IterativeRunOptions {
  /** The model to start from (a Hugging Face folder): the first round's policy, and the fixed reference. */
  from: string;
  /** Where the kept round's model (`knobs.keep`) and every round's figures go: `out/model`, `out/metrics.jsonl`. */
  out: string;
  /** The rounds' folders (their models, rollouts' figures and DPO runs), named by `key`. */
  cache: string;
  key: string;
  knobs: IterativeSettings;
  /** How each round's DPO trains (the dpo stage's knobs: loss, β, rpo_alpha, lr, batch_size, epochs, ...). */
  preference: PreferenceKnobs;
  device: Device;
  signal: AbortSignal;
  log: Logger;
  /**
   * What plays a round's rollouts where it gives a player; absent, or where it gives none: the policy itself.
   * Tests put a scripted agent here; the head-to-head's offline arms the logs' mix of agents.
   */
  actor?: (task: Task, round: number, trial: number) => Policy | undefined;
  /** How a round trains where it says (the head-to-head's RFT-then-DPO arm); absent: knobs.method every round. */
  method?: (round: number) => IterativeSettings['method'];
}

/** A round's figures: its rollouts' success, the step pairs they gave, and the policy on validation after it. */
type Figures = Record<string, number>;

/**
 * Runs the rounds (those already in `cache` are kept), then writes the kept round's model into `out`. Returns
 * each round's figures (the starting model's first) and each round's model folder.
 */
export async function runIterativeDpo(o: IterativeRunOptions): Promise<{ figures: Figures[]; models: string[] }> {
  const { knobs: k, log } = o;
  const world = generateWorld({ ...DEFAULT_WORLD, seed: k.simulator.world_seed, companies: k.simulator.companies });
  const pool = taskPool(world, 'train', k.task_pool, k.max_calls);
  const dir = join(o.cache, `iterative-${o.key.slice(0, 16)}`);
  await mkdir(dir, { recursive: true });
  const rows: Figures[] = [];
  const models: string[] = [];
  let current = o.from;
  // The starting policy on validation first: what every round is measured against.
  rows.push(await roundFigures(join(dir, 'start.json'), () => validate(o, world, o.from, { round: 0, episodes: 0 })));
  for (let round = 1; round <= k.rounds; round++) {
    const roundDir = join(dir, `round-${String(round).padStart(3, '0')}`);
    const model = join(roundDir, 'model');
    const figures = await roundFigures(join(roundDir, 'figures.json'), async () => {
      const tasks = sample(seeded(k.seed, 'iterative-tasks', round), pool, k.tasks_per_round);
      const rollouts = await play(o, world, current, tasks, round);
      const pairs = tasks.flatMap((t) =>
        stepPairs(
          rollouts.filter((r) => r.task_id === t.task_id),
          { margin: k.margin, successReward: 1, minVisits: k.min_visits },
        ),
      );
      const success = rollouts.filter((r) => r.reward >= 1).length / Math.max(1, rollouts.length);
      const method = o.method?.(round) ?? k.method;
      log.info('rollouts', { round, method, episodes: rollouts.length, success, step_pairs: pairs.length });
      const successes = rollouts.filter((r) => r.reward >= 1);
      if (method === 'rft') await fineTune(o, current, successes, roundDir, round);
      else if (pairs.length === 0)
        await cp(current, model, { recursive: true }); // nothing where they part: unchanged
      else
        await runPreference({
          from: current,
          reference: k.reference === 'fixed' ? o.from : undefined,
          rows: pairs,
          source: `iterative DPO, round ${round}: ${pairs.length} step pairs`,
          knobs: o.preference,
          remedy: 'raise the preference knobs’ max_length',
          cache: join(roundDir, '.cache'),
          key: hashJson({ key: o.key, round }),
          referenceKey: { key: o.key, round },
          out: roundDir,
          stage: 'iterative',
          info: { round },
          device: o.device,
          signal: o.signal,
          log,
        });
      const episodes = round * k.tasks_per_round * k.rollouts_per_task;
      const val = await validate(o, world, model, { round, episodes });
      return { ...val, 'rollouts/success': success, 'rollouts/step_pairs': pairs.length };
    });
    rows.push(figures);
    models.push(model);
    current = model;
  }
  await cp(keptModel(k.keep, rows, [o.from, ...models]), join(o.out, 'model'), { recursive: true });
  await writeFile(join(o.out, 'metrics.jsonl'), rows.map((r) => JSON.stringify(r) + '\n').join(''));
  return { figures: rows, models };
}

/**
 * The model a run writes: the last round's, or (best) the one of `folders` (the starting model's first, then a
 * round's each, as `rows`) with the highest validation first-try success, the earlier of equals.
 */
export function keptModel(keep: 'best' | 'last', rows: Figures[], folders: string[]): string {
  return folders[keptRound(keep, rows)]!;
}

/** Which of `rows` (0: the starting model, then a round each) a run keeps: see keptModel. */
export function keptRound(keep: 'best' | 'last', rows: Figures[]): number {
  if (keep === 'last') return rows.length - 1;
  let best = 0;
  for (let i = 1; i < rows.length; i++)
    if ((rows[i]!['val/success_first'] ?? -1) > (rows[best]!['val/success_first'] ?? -1)) best = i;
  return best;
}

/**
 * Rejection-sampling fine-tuning: the model in `folder` trained by SFT on `successes` (their assistant turns,
 * as the SFT stage trains) into `roundDir/model`, with the preference knobs' lr, batch size and epochs; no
 * success leaves it unchanged.
 */
async function fineTune(o: IterativeRunOptions, folder: string, successes: Session[], roundDir: string, round: number) {
  if (successes.length === 0) return cp(folder, join(roundDir, 'model'), { recursive: true });
  const ck = loadCheckpoint(folder);
  const chat = openChat(ck.tokenizer, ck.model.config.eosTokenId, folder);
  const conversations = successes.map((s) => s.messages);
  const sequences = await sftSequences(
    chat,
    conversations,
    ck.context + 1,
    `round ${round}'s successes`,
    ck.placeholders,
  );
  const trainer = sftTrainer(sequences, () => loadCheckpoint(folder).model, o.preference, chat.pad);
  o.log.info('training', { round, method: 'rft', successes: successes.length, steps: trainer.steps });
  const result = await trainingRun(
    {
      config: o.preference,
      cache: join(roundDir, '.cache'),
      key: hashJson({ key: o.key, round }),
      tokenizer: ck.tokenizer,
      context: ck.context,
      placeholders: ck.placeholders,
      signal: o.signal,
      log: o.log,
      device: o.device,
    },
    trainer,
  );
  ck.model.dispose();
  await result.save(roundDir, { stage: 'iterative', method: 'rft', round });
}

/** A round's figures from `path` where a run before this one got that far, else made by `make` and kept there. */
async function roundFigures(path: string, make: () => Promise<Figures>): Promise<Figures> {
  if (existsSync(path)) return JSON.parse(await readFile(path, 'utf8')) as Figures;
  const figures = await make();
  await writeFile(`${path}.tmp`, JSON.stringify(figures) + '\n');
  await rename(`${path}.tmp`, path);
  return figures;
}

/**
 * rollouts_per_task episodes of each task by the model in `folder`, all side by side, each seeded by (seed,
 * round, task, try): sessions whose reward is 1 for a success, else 0.
 */
async function play(o: IterativeRunOptions, world: World, folder: string, tasks: Task[], round: number) {
  const s = o.knobs.simulator;
  const ck = loadCheckpoint(folder);
  const chat = openChat(ck.tokenizer, ck.model.config.eosTokenId, folder);
  const episodes = tasks.length * o.knobs.rollouts_per_task;
  const sampling = {
    maxTokens: s.max_tokens,
    temperature: s.temperature,
    topP: s.top_p,
    tools: s.constrained ? TOOLS : undefined,
    signal: o.signal,
    engine: await decodingEngine(o.device, ck.model, episodes, o.log),
  };
  const { model, context, placeholders } = ck;
  const players = new EpisodePlayers({ name: `round ${round}`, model, context, chat, placeholders, sampling });
  const progress = o.log.progress(`iterative DPO, round ${round}: rollouts`, episodes);
  try {
    return await settled(
      tasks.flatMap((task) =>
        Array.from({ length: o.knobs.rollouts_per_task }, async (_, trial): Promise<Session> => {
          const random = seeded(o.knobs.seed, 'iterative', round, task.task_id, trial);
          const player = o.actor?.(task, round, trial) ?? players.player(random);
          const episode = await runEpisode(world, task, player, s.max_turns);
          progress.tick();
          return {
            session_id: `${task.task_id}:round-${round}:${trial}`,
            task_id: task.task_id,
            messages: episode.messages,
            reward: episode.success ? 1 : 0,
            feedback: null,
            model: `round ${round}`,
            source: 'iterative DPO rollouts',
            created_at: null,
            metadata: '{}',
          };
        }),
      ),
    );
  } finally {
    progress.done();
    players.dispose();
    ck.model.dispose();
  }
}

/** The model in `folder` on the validation tasks (the same tasks and draws every round), with `at` beside. */
async function validate(o: IterativeRunOptions, world: World, folder: string, at: Figures): Promise<Figures> {
  const { knobs: k, log } = o;
  const v = k.validation;
  const ck = loadCheckpoint(folder);
  const s = k.simulator;
  const figures = await validation(
    {
      world,
      chat: openChat(ck.tokenizer, ck.model.config.eosTokenId, folder),
      context: ck.context,
      placeholders: ck.placeholders,
      sampling: {
        maxTokens: s.max_tokens,
        temperature: v.temperature,
        topP: 1,
        tools: s.constrained ? TOOLS : undefined,
        signal: o.signal,
        engine: await decodingEngine(o.device, ck.model, v.tasks, log),
      },
      maxTurns: s.max_turns,
      seed: k.seed,
      tasks: taskPool(world, 'val', v.tasks, k.max_calls),
      tries: v.tries,
    },
    ck.model,
  );
  ck.model.dispose();
  log.info('validation', { ...at, ...figures });
  return { ...at, ...figures };
}
