// A row of the recipe's curve (issue 53; docs/experiments.md, "A recipe that learns"): simulated sessions of
// one scripted agent (or their mix), configs/recipe.yaml with the model and steps asked for, the run through
// eval, and a line appended to curve.jsonl with the data, the model's size, the time and the eval figures.
//
//   npx tsx bench/recipe.ts --tasks 5000 --agent mix                        # the recipe as shipped
//   npx tsx bench/recipe.ts --tasks 5000 --agent mix --hidden 192 --heads 6 # a wider model
//   npx tsx bench/recipe.ts --table                                         # the curve so far, as Markdown
//   npx tsx bench/recipe.ts --agents                                        # what the scripted agents reach
//
// A row keeps its workspace under --work, so a DPO variant can start from its SFT model: change the dpo
// section of <work>/recipe.yaml, then `prefab run --config <work>/recipe.yaml --workdir <work>/workspace
// --switch-config --from dpo`.
import { spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Command } from 'commander';
import { parse, stringify } from 'yaml';
import { ScriptedAgent } from '../env/agents.ts';
import { figuresOf, validationEpisodes } from '../env/evaluate.ts';
import { DEFAULT_WORLD, findTask, generateWorld } from '../env/world.ts';

const cli = new Command()
  .option('--tasks <n>', 'simulated training tasks', '5000')
  .option('--trials <k>', 'sessions a task', '4')
  .option('--agent <name>', 'the scripted agent: oracle, prior, noisy, random or mix', 'mix')
  .option('--notes', 'later trials read the notes of the failed ones')
  .option('--layers <n>', 'transformer blocks')
  .option('--hidden <n>', 'hidden size')
  .option('--heads <n>', 'attention heads')
  .option('--epochs <x>', 'SFT epochs')
  .option('--dpo-examples <n>', 'dpo.max_examples')
  .option('--work <dir>', 'where the row’s sessions, config and workspace go', '.scratch/recipe')
  .option('--out <file>', 'the curve', 'bench/results/recipe/curve.jsonl')
  .option('--workspace <dir>', 'no run: the row of a workspace this recipe already ran in (the options say its data)')
  .option('--table', 'no run: print the curve as a Markdown table')
  .option('--agents', 'no run: the scripted agents on the eval’s validation tasks, what a policy can reach')
  .parse();
const o = cli.opts<Record<string, string | boolean | undefined>>();
const REPO = resolve(import.meta.dirname, '..');

interface Row {
  label: string;
  tasks: number;
  trials: number;
  agent: string;
  notes: boolean;
  sft_rows: number;
  parameters: number;
  model: string;
  sft_steps: number;
  sft_seconds: number;
  /** The whole run's wall time (null: a row taken from a workspace). */
  run_seconds: number | null;
  /** eval.json's models, and DPO against SFT on twin episodes. */
  models: Record<string, Record<string, number | null>>;
  against_sft: Record<string, { difference: number; better: number; worse: number; p: number }> | null;
}

if (o.table) printTable();
else if (o.agents) await printAgents();
else run();

function run(): void {
  const shape = [
    o.layers && `L${o.layers}`,
    o.hidden && `H${o.hidden}`,
    o.heads && `h${o.heads}`,
    o.epochs && `e${o.epochs}`,
    o.dpoExamples && `dpo${o.dpoExamples}`,
  ];
  const label = [`${o.agent}${o.notes ? '+notes' : ''}`, `${o.tasks}x${o.trials}`, ...shape.filter(Boolean)].join('-');
  const work = resolve(String(o.work), label);
  let workspace = join(work, 'workspace');
  const began = performance.now();
  if (o.workspace) workspace = resolve(String(o.workspace));
  else {
    mkdirSync(join(work, 'data'), { recursive: true });
    const sessions = join(work, 'data', 'sessions.jsonl.gz');
    const agent = ['--tasks', String(o.tasks), '--trials', String(o.trials), '--agent', String(o.agent)];
    if (!existsSync(sessions)) prefab(['simulate', ...agent, ...(o.notes ? ['--notes'] : []), '--out', sessions]);
    const config = parse(readFileSync(join(REPO, 'configs', 'recipe.yaml'), 'utf8'));
    config.ingest.inputs = [join(work, 'data')];
    if (o.layers) config.sft.model.layers = Number(o.layers);
    if (o.hidden) config.sft.model.hidden_size = Number(o.hidden);
    if (o.heads) config.sft.model.heads = Number(o.heads);
    if (o.epochs) config.sft.epochs = Number(o.epochs);
    if (o.dpoExamples) config.dpo.max_examples = Number(o.dpoExamples);
    writeFileSync(join(work, 'recipe.yaml'), stringify(config));
    prefab(['--config', join(work, 'recipe.yaml'), '--workdir', workspace, '--log-format', 'json', 'run']);
  }
  const json = (path: string) => JSON.parse(readFileSync(join(workspace, path), 'utf8'));
  const sft = json('sft/manifest.json');
  const shapeOf = json('sft/model/config.json');
  const evaluation = json('eval/eval.json');
  const row: Row = {
    label,
    tasks: Number(o.tasks),
    trials: Number(o.trials),
    agent: String(o.agent),
    notes: Boolean(o.notes),
    sft_rows: json('export/manifest.json').counts.sft_train,
    parameters: sft.counts.parameters,
    model: `${shapeOf.num_hidden_layers}×${shapeOf.hidden_size}, ${shapeOf.num_attention_heads} heads`,
    sft_steps: sft.counts.steps,
    sft_seconds: sft.seconds,
    run_seconds: o.workspace ? null : (performance.now() - began) / 1000,
    models: evaluation.models,
    against_sft: evaluation.against_sft ?? null,
  };
  mkdirSync(join(String(o.out), '..'), { recursive: true });
  appendFileSync(String(o.out), JSON.stringify(row) + '\n');
  console.log(JSON.stringify(row, null, 2));
}

function prefab(args: string[]): void {
  const r = spawnSync(process.execPath, [join(REPO, 'bin', 'prefab.js'), ...args], { stdio: 'inherit' });
  if (r.status !== 0) throw new Error(`prefab ${args.join(' ')}: exit ${r.status}`);
}

function printTable(): void {
  const rows = readFileSync(String(o.out), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Row);
  const f = (x: number | null | undefined) => (typeof x === 'number' ? x.toFixed(3) : '—');
  const k = (m: Record<string, number | null>) =>
    Object.keys(m).find((x) => x.startsWith('success/mean@')) ?? 'success/mean@k';
  console.log(
    '| data | SFT rows | model (parameters) | SFT steps, time | SFT first-try success | pass@k | preference training | its − SFT (p) |',
  );
  console.log('|---|---|---|---|---|---|---|---|');
  for (const r of rows) {
    const sft = r.models.sft!;
    // The preference stage's column is named by its loss (dpo, orpo, ...).
    const loss = Object.keys(r.models).find((m) => !['untrained', 'base', 'sft', 'dapo'].includes(m))!;
    const dpo = r.models[loss]!;
    const vs = r.against_sft?.[loss];
    console.log(
      `| ${r.agent}${r.notes ? ' + notes' : ''}, ${r.tasks} tasks × ${r.trials} | ${r.sft_rows} | ${r.model} (${(r.parameters / 1e6).toFixed(2)}M) | ` +
        `${r.sft_steps}, ${Math.round(r.sft_seconds / 60)} min | ${f(sft[k(sft)])} | ${f(sft[k(sft).replace('mean', 'pass')])} | ` +
        `${loss} ${f(dpo[k(dpo)])} | ${vs ? `${vs.difference >= 0 ? '+' : ''}${vs.difference.toFixed(3)} (${vs.p.toPrecision(2)})` : '—'} |`,
    );
  }
}

/** The scripted agents on the validation tasks the recipe's eval plays (its tasks, tries and max_calls). */
async function printAgents(): Promise<void> {
  const sim = parse(readFileSync(join(REPO, 'configs', 'recipe.yaml'), 'utf8')).eval.simulator;
  const world = generateWorld({ ...DEFAULT_WORLD });
  const options = { worldSeed: 1, companies: 100, tasks: sim.tasks, k: sim.k, maxTurns: 12, maxCalls: sim.max_calls };
  console.log('| agent | first-try success | one call | two calls |');
  console.log('|---|---|---|---|');
  for (const name of ['oracle', 'prior', 'noisy'] as const) {
    const episodes = await validationEpisodes(
      (id, trial) => new ScriptedAgent(name, world, findTask(world, id), `agents:${id}:${trial}`),
      options,
    );
    const success = (calls: number | null) => {
      const some = episodes.filter((e) => calls === null || findTask(world, e.task).calls.length === calls);
      return `${figuresOf(some, sim.k)[`success/mean@${sim.k}`]!.toFixed(3)} (${some.length / sim.k} tasks)`;
    };
    console.log(`| ${name} | ${success(null)} | ${success(1)} | ${success(2)} |`);
  }
}
