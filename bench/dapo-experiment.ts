// The seeds' research question (seed 004), measured: does feeding the representatives' feedback from failed
// rollouts into the later rollouts of the same group make DAPO more sample-efficient, and does the policy
// internalise it (first-try success, no notes in context)? Standard DAPO against feedback-guided DAPO from the
// same starting model, on the same training tasks, run seeds and budget of episodes (one generation batch a
// step, so every step plays exactly tasks × group episodes), each validated on the same validation tasks and
// draws; the starting model's validation is the no-RL control.
//
//   npx tsx bench/dapo-experiment.ts workspace/dpo/model                      # 3 seeds × standard, feedback
//   npx tsx bench/dapo-experiment.ts workspace/dpo/model --methods standard,feedback:context,feedback:base
//
// Writes curves.jsonl (a line per validation point) and table.md to --out, and prints the table.
//   npx tsx bench/dapo-experiment.ts --curves bench/results/dapo/curves.jsonl,bench/results/dapo-base/curves.jsonl --levels 0.1,0.3
// prints the table of finished runs again, together, at other levels.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { Logger } from '../pipeline/log.ts';
import { NEVER } from '../pipeline/interrupt.ts';
import { TOOLS } from '../env/env.ts';
import { DEFAULT_WORLD, generateWorld, taskPool } from '../env/world.ts';
import { simulatorRollouts, validation, type RolloutMode } from '../rl/rollouts.ts';
import { mainEngine, openDevice, type BackendChoice } from '../runtime/device.ts';
import { openChat } from '../model/chat.ts';
import { loadCheckpoint } from '../model/checkpoint.ts';
import { dapoTrainer, type FeedbackTraining } from '../rl/trainer.ts';
import { DAPO_CLIP } from '../trainers/losses/index.ts';
import type { Llama } from '../model/llama.ts';
import { trainingRun } from '../trainers/run.ts';

const cli = new Command()
  .argument('[model]', 'the starting model folder (the dpo stage writes workspace/dpo/model)')
  .option('--curves <files>', 'no runs: the table of these curves.jsonl files (comma-separated)')
  .option('--methods <list>', 'standard, feedback:context, feedback:base, feedback:both', 'standard,feedback:context')
  .option('--seeds <n>', 'run seeds per method', '3')
  .option('--steps <n>', 'DAPO steps per run', '8')
  .option('--tasks <n>', 'training tasks (groups) a step', '4')
  .option('--group <n>', 'episodes per task', '8')
  .option('--max-calls <n>', 'tasks with at most this many calls (the curriculum)', '1')
  .option('--lr <x>', 'learning rate', '5e-5')
  .option('--epochs <n>', 'passes over each batch of rollouts', '2')
  .option('--mini-batches <n>', 'updates per pass', '2')
  .option('--val-tasks <n>', 'validation tasks (companies never trained on)', '20')
  .option('--val-every <n>', 'steps between validations', '4')
  .option('--tries <n>', 'attempts per validation task for with-feedback success', '3')
  .option('--levels <list>', 'first-try validation success levels to report episodes to', '0.3,0.5,0.7')
  .option('--out <dir>', 'where curves.jsonl and table.md go', 'bench/results/dapo')
  .option('--backend <name>', 'auto, cpu, webgpu or wasm (the curves of sessions up to 61 ran on wasm)', 'auto')
  .parse();
const o = cli.opts<Record<string, string>>();
const num = (k: string) => Number(o[k]);
const dir = cli.args[0]!;

interface Point {
  method: string;
  seed: number;
  step: number;
  episodes: number;
  seconds: number;
  [metric: string]: number | string;
}
const points: Point[] = [];
const t0 = performance.now();
if (o.curves)
  for (const file of o.curves.split(','))
    points.push(
      ...readFileSync(file, 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as Point),
    );
else await experiment();
const control = points.find((p) => p.method === 'no RL (start)')!;

async function experiment(): Promise<void> {
  const device = await openDevice({ backend: o.backend as BackendChoice });
  const start = loadCheckpoint(dir);
  const chat = openChat(start.tokenizer, start.model.config.eosTokenId, dir);
  const world = generateWorld({ ...DEFAULT_WORLD });
  const maxCalls = num('maxCalls');
  const log = new Logger('json', process.stderr, {}, true);
  const sampling = { maxTokens: 160, temperature: 1, topP: 1, tools: TOOLS, signal: NEVER, engine: mainEngine(device) };
  const episode = { world, chat, context: start.context, placeholders: start.placeholders, maxTurns: 12 };
  // The same validation tasks and draws for every method, seed and step: paired comparisons.
  const validate = {
    ...episode,
    sampling: { ...sampling, temperature: 0.5 },
    seed: 'validation',
    tasks: taskPool(world, 'val', num('valTasks'), maxCalls),
    tries: num('tries'),
  };
  const perStep = num('tasks') * num('group');
  mkdirSync(o.out!, { recursive: true });
  const save = () => writeFileSync(join(o.out!, 'curves.jsonl'), points.map((p) => JSON.stringify(p) + '\n').join(''));

  const control = await validation(validate, start.model);
  points.push({
    method: 'no RL (start)',
    seed: 0,
    step: 0,
    episodes: 0,
    seconds: (performance.now() - t0) / 1000,
    ...control,
  });
  console.error(`start: ${JSON.stringify(control)}`);

  for (const method of o.methods!.split(',')) {
    const [mode, training] = method.split(':') as [RolloutMode, FeedbackTraining | undefined];
    for (let seed = 1; seed <= num('seeds'); seed++) {
      const runSeed = `experiment-${seed}`;
      const began = performance.now();
      const rollouts = simulatorRollouts({
        ...episode,
        sampling,
        seed: runSeed,
        groupSize: num('group'),
        tasksPerStep: num('tasks'),
        maxGenerationBatches: 1,
        taskPool: 500,
        maxCalls,
        mode,
        reward: 'success',
        overlongBuffer: 32,
        log,
      });
      points.push({ method, seed, step: 0, episodes: 0, seconds: 0, ...control });
      const trainer = dapoTrainer({
        steps: num('steps'),
        start: () => loadCheckpoint(dir).model,
        rollouts,
        pad: chat.pad,
        microBatchTokens: 2048,
        clip: DAPO_CLIP,
        ppoEpochs: num('epochs'),
        miniBatches: num('miniBatches'),
        seed: runSeed,
        feedbackTraining: training ?? 'context',
        after: async (step: number, model: Llama) => {
          if ((step + 1) % num('valEvery') !== 0 && step + 1 !== num('steps')) return {};
          const figures = await validation(validate, model);
          points.push({
            method,
            seed,
            step: step + 1,
            episodes: (step + 1) * perStep,
            seconds: (performance.now() - began) / 1000,
            ...figures,
          });
          console.error(`${method} seed ${seed} step ${step + 1}: ${JSON.stringify(points.at(-1))}`);
          save();
          return figures;
        },
        signal: NEVER,
      });
      const cache = await mkdtemp(join(tmpdir(), 'prefab-dapo-'));
      const settings = {
        seed: runSeed,
        batch_size: num('tasks'),
        epochs: 1,
        max_steps: num('steps'),
        lr: num('lr'),
        warmup: 0,
        min_lr_ratio: 1,
        weight_decay: 0,
        max_grad_norm: 1,
        checkpoint_every: num('steps'),
        micro_batch_tokens: 2048,
      };
      const result = await trainingRun(
        {
          config: settings,
          cache,
          key: method,
          tokenizer: start.tokenizer,
          context: start.context,
          placeholders: start.placeholders,
          signal: NEVER,
          log,
          device,
        },
        trainer,
      );
      // Each validation point gets the means of the training steps since the one before.
      const mine = points.filter((p) => p.method === method && p.seed === seed);
      mine.forEach((p, i) => {
        const rows = result.metrics.filter((m) => m.step! > (mine[i - 1]?.step ?? Infinity) && m.step! <= p.step);
        for (const k of [
          'success',
          'success_plain',
          'success_guided',
          'kept_groups',
          'entropy',
          'clip_low',
          'clip_high',
        ]) {
          const has = rows.filter((m) => m[k] !== undefined);
          if (has.length) p[`train/${k}`] = has.reduce((a, m) => a + m[k]!, 0) / has.length;
        }
      });
      result.model.dispose();
      await rm(cache, { recursive: true, force: true });
    }
  }
  save();
}

// The table: per method, the final validation figures over seeds (mean and a 95% t-interval), the episodes
// each seed took to first reach each level of first-try success, and the wall-clock of a run.
const T95: Record<number, number> = {
  1: 12.71,
  2: 4.303,
  3: 3.182,
  4: 2.776,
  5: 2.571,
  6: 2.447,
  7: 2.365,
  8: 2.306,
  9: 2.262,
};
const interval = (xs: number[], digits = 3) => {
  const m = xs.reduce((a, x) => a + x, 0) / xs.length;
  if (xs.length < 2) return `${m.toFixed(digits)}`;
  const sd = Math.sqrt(xs.reduce((a, x) => a + (x - m) ** 2, 0) / (xs.length - 1));
  return `${m.toFixed(digits)} ± ${(((T95[xs.length - 1] ?? 1.96) * sd) / Math.sqrt(xs.length)).toFixed(digits)}`;
};
const levels = o.levels!.split(',').map(Number);
const methods = [...new Set(points.map((p) => p.method))].filter((m) => m !== 'no RL (start)');
const lines = [
  `| method | first-try success | with-feedback success (≤ ${o.tries} tries) | retries without notes (≤ ${o.tries} tries) | ${levels.map((l) => `episodes to ${l}`).join(' | ')} | wall-clock a run |`,
  `|---|---|---|---|${levels.map(() => '---').join('|')}|---|`,
  `| no RL (start) | ${(control['val/success_first'] as number).toFixed(3)} | ${(control['val/success_feedback'] as number).toFixed(3)} | ${(control['val/success_retry'] as number).toFixed(3)} | ${levels.map(() => '').join(' | ')} | |`,
];
for (const method of methods) {
  const runs = [...new Set(points.filter((p) => p.method === method).map((p) => p.seed))].map((seed) =>
    points.filter((p) => p.method === method && p.seed === seed),
  );
  const last = runs.map((r) => r.at(-1)!);
  const reach = (level: number) => {
    const at = runs.map((r) => r.find((p) => (p['val/success_first'] as number) >= level)?.episodes);
    const reached = at.filter((x): x is number => x !== undefined);
    return reached.length === 0
      ? `not reached`
      : `${interval(reached, 0)}${reached.length < runs.length ? ` (${reached.length} of ${runs.length} seeds)` : ''}`;
  };
  lines.push(
    `| ${method} | ${interval(last.map((p) => p['val/success_first'] as number))} | ${interval(last.map((p) => p['val/success_feedback'] as number))} | ${interval(last.map((p) => p['val/success_retry'] as number))} | ${levels.map(reach).join(' | ')} | ${interval(
      last.map((p) => p.seconds),
      0,
    )} s |`,
  );
}
const header = o.curves
  ? `from ${o.curves}`
  : `${num('seeds')} seeds a method; ${num('steps')} steps × ${num('tasks')} tasks × ${num('group')} episodes = ${num('steps') * num('tasks') * num('group')} training episodes a run on tasks of ≤ ${num('maxCalls')} calls; validation: ${num('valTasks')} validation tasks at temperature 0.5, first try without notes and up to ${o.tries} tries reading notes; lr ${o.lr}; total ${((performance.now() - t0) / 60000).toFixed(1)} min.`;
if (!o.curves) writeFileSync(join(o.out!, 'table.md'), `${header}\n\n${lines.join('\n')}\n`);
console.log(header);
console.log(lines.join('\n'));
