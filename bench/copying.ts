// Has a model learnt to copy? On validation tasks (companies never seen in training), the oracle acts; at each
// of its turns the model answers greedily from the oracle's prefix, and the answer is tried in the environment:
// a search is right if it finds the task's company, a form if it asks for every field the task needs, a call if
// it completes a department. Prints the counts per tool. Usage, on an sft or dpo model folder or a training
// checkpoint (workspace/.cache/sft/run-*/step-N):
//   npx tsx bench/copying.ts workspace/sft/model [--tasks 12]
import { Command } from 'commander';
import { ScriptedAgent } from '../env/agents.ts';
import { TOOLS, reset, step } from '../env/env.ts';
import { seeded } from '../core/random.ts';
import { runEpisode } from '../env/rollout.ts';
import { generateTask, generateWorld } from '../env/world.ts';
import { mainEngine, openDevice } from '../runtime/device.ts';
import { loadCheckpoint } from '../model/checkpoint.ts';
import { ModelPolicy } from '../runtime/policy.ts';
import { openChat } from '../model/chat.ts';

const cli = new Command()
  .argument('<model>', 'a model folder (config.json, model.safetensors, tokenizer.json)')
  .option('--tasks <n>', 'validation tasks', '12')
  .option('--world-seed <n>', 'the world of the sample', '1')
  .option('--free', "calls as free text (default: decoded under the tools' schemas, as eval does)")
  .parse();
const opts = cli.opts<{ tasks: string; worldSeed: string; free?: boolean }>();

const device = await openDevice();
const checkpoint = loadCheckpoint(cli.args[0]!);
const policy = new ModelPolicy(
  {
    name: 'model',
    model: checkpoint.model,
    context: checkpoint.context,
    chat: openChat(checkpoint.tokenizer, checkpoint.model.config.eosTokenId, cli.args[0]!),
    placeholders: checkpoint.placeholders,
    sampling: {
      maxTokens: 160,
      temperature: 0,
      topP: 1,
      tools: opts.free ? undefined : TOOLS,
      engine: mainEngine(device),
    },
  },
  seeded('copying'),
);
const world = generateWorld({ seed: Number(opts.worldSeed) });
const right: Record<string, { right: number; turns: number }> = {};
for (let i = 0; i < Number(opts.tasks); i++) {
  const task = generateTask(world, 'val', 1000 + i);
  const episode = await runEpisode(world, task, new ScriptedAgent('oracle', world, task, 'copying'));
  let state = reset(world, task);
  for (const [t, message] of episode.messages.entries()) {
    const want = message.role === 'assistant' ? message.tool_calls?.[0]?.function : undefined;
    if (!want) continue;
    const got = (await policy.respond(episode.messages.slice(0, t))).tool_calls?.[0]?.function;
    let ok = false;
    if (got?.name === want.name) {
      const r = step(world, state, { name: got.name, arguments: got.arguments });
      if (want.name === 'search_directory') ok = r.observation.startsWith(`{"company":${JSON.stringify(task.company)}`);
      else if (want.name === 'auth_info_form') ok = state.needed.every((f) => r.state.form?.[f] !== undefined);
      else if (want.name === 'call') ok = Object.keys(r.state.completed).length > Object.keys(state.completed).length;
      else ok = true;
    }
    const tally = (right[want.name] ??= { right: 0, turns: 0 });
    tally.right += ok ? 1 : 0;
    tally.turns++;
    state = step(world, state, { name: want.name, arguments: want.arguments }).state;
  }
}
console.log(
  `model            ${cli.args[0]} (${checkpoint.state ? `step ${checkpoint.state.step}` : 'no trainer state'})`,
);
for (const [tool, t] of Object.entries(right)) console.log(`${tool.padEnd(17)}${t.right} of ${t.turns} right`);
