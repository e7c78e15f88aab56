// Can DAPO learn from this model? Plays groups of episodes of training tasks in the simulator, as the dapo
// stage's first step would, and prints how often the model succeeds, how many groups have rewards that differ
// (the only ones DAPO learns from), and what an episode costs here.
//   npx tsx bench/dapo-start.ts workspace/dpo/model [--tasks 8 --group 8 --reward success|partial --max-calls 1 --mode feedback]
import { Command } from 'commander';
import { Logger } from '../pipeline/log.ts';
import { TOOLS } from '../env/env.ts';
import { DEFAULT_WORLD, generateWorld } from '../env/world.ts';
import { simulatorRollouts } from '../rl/rollouts.ts';
import { mainEngine, openDevice } from '../runtime/device.ts';
import { openChat } from '../model/chat.ts';
import { loadCheckpoint } from '../model/checkpoint.ts';
import { NEVER } from '../pipeline/interrupt.ts';

const cli = new Command()
  .argument('<model>', 'a model folder (the dpo stage writes workspace/dpo/model)')
  .option('--tasks <n>', 'training tasks', '8')
  .option('--group <n>', 'episodes per task', '8')
  .option('--reward <kind>', 'success or partial', 'success')
  .option('--max-tokens <n>', 'most tokens in one assistant message', '160')
  .option('--max-calls <n>', 'tasks with at most this many calls only')
  .option(
    '--mode <mode>',
    'standard or feedback (a group in order, each episode reading the notes of the failed ones before it)',
    'standard',
  )
  .parse();
const opts = cli.opts<{
  tasks: string;
  group: string;
  reward: 'success' | 'partial';
  maxTokens: string;
  maxCalls?: string;
  mode: 'standard' | 'feedback';
}>();

const device = await openDevice();
const dir = cli.args[0]!;
const start = loadCheckpoint(dir);
const chat = openChat(start.tokenizer, start.model.config.eosTokenId, dir);
const world = generateWorld({ ...DEFAULT_WORLD });
const rollouts = simulatorRollouts({
  world,
  chat,
  context: start.context,
  placeholders: start.placeholders,
  sampling: {
    maxTokens: Number(opts.maxTokens),
    temperature: 1,
    topP: 1,
    tools: TOOLS,
    signal: NEVER,
    engine: mainEngine(device),
  },
  maxTurns: 12,
  seed: 'prefab',
  groupSize: Number(opts.group),
  tasksPerStep: Number(opts.tasks),
  maxGenerationBatches: 1,
  taskPool: 500,
  maxCalls: opts.maxCalls ? Number(opts.maxCalls) : null,
  mode: opts.mode,
  reward: opts.reward,
  overlongBuffer: 32,
  log: new Logger('json', process.stderr, {}, true),
});
const t0 = performance.now();
const { metrics } = await rollouts(0, start.model);
const seconds = (performance.now() - t0) / 1000;
console.log(`model            ${dir}`);
console.log(
  `episodes         ${metrics.episodes} (${opts.tasks} training tasks${opts.maxCalls ? ` of ≤ ${opts.maxCalls} calls` : ''} × ${opts.group}, ${opts.mode}), temperature 1, ${opts.reward} reward`,
);
console.log(
  `success          ${(100 * metrics.success!).toFixed(1)}% of episodes${metrics.success_guided !== undefined ? ` (${(100 * metrics.success_plain!).toFixed(1)}% without notes, ${(100 * metrics.success_guided).toFixed(1)}% of the ${(100 * metrics.guided!).toFixed(0)}% that read notes)` : ''}`,
);
console.log(`reward           mean ${metrics.reward_mean!.toFixed(3)}, std ${metrics.reward_std!.toFixed(3)}`);
console.log(
  `informative      ${metrics.kept_groups} of ${metrics.groups} groups have rewards that differ (DAPO learns from these only)`,
);
console.log(
  `turns            ${metrics.response_length!.toFixed(1)} tokens a turn on average, ${(100 * metrics.overlong!).toFixed(1)}% of turns cut at max_tokens`,
);
console.log(`time             ${seconds.toFixed(1)} s, ${(seconds / metrics.episodes!).toFixed(2)} s an episode`);
