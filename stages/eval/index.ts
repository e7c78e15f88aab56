// eval: the untrained model, the SFT model and the preference-tuned model side by side, on held-out pairs
// (accuracy, DPO's implicit rewards against the SFT reference), held-out NLL, and acting in the simulator on
// validation tasks (success mean@k, pass@k, reward, turns). Prints the table and writes it as JSON.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { defineStage } from '../../pipeline/stage.ts';
import type { Logger } from '../../pipeline/log.ts';
import { seeded } from '../../core/random.ts';
import { TOOLS } from '../../env/env.ts';
import { validationFigures } from '../../env/evaluate.ts';
import { DEFAULT_WORLD } from '../../env/world.ts';
import type { Message, Pair } from '../../core/records.ts';
import { stageBackend } from '../../train/backend.ts';
import { openChat, type Chat } from '../../train/chat.ts';
import { loadCheckpoint } from '../../train/checkpoint.ts';
import { heldOutPairFigures, pairExamples, pairWins, readPreferenceTraining, shorterChosen } from '../../train/dpo.ts';
import { readParquet, scoreSequences, sftSequences, subset, type Scores } from '../../train/data.ts';
import { Llama } from '../../train/model.ts';
import type { Placeholders } from '../../train/placeholders.ts';
import { ModelPolicy } from '../../train/policy.ts';

const config = z.strictObject({
  seed: z.string().default('prefab').describe("Which pairs and sessions the max_* draw, and the simulator's sampling."),
  max_pairs: z.number().int().min(1).nullable().default(100).describe('Held-out pairs to score (null: all), drawn by a seeded shuffle.'),
  max_sessions: z.number().int().min(1).nullable().default(50).describe('Held-out SFT sessions whose NLL is measured (null: all), drawn by a seeded shuffle.'),
  micro_batch_tokens: z.number().int().min(16).default(2048).describe('Largest micro-batch when scoring held-out pairs and sessions, in padded tokens.'),
  simulator: z
    .strictObject({
      world_seed: z.number().int().default(DEFAULT_WORLD.seed).describe("The world the sessions came from (the sample's: `prefab simulate`'s defaults)."),
      companies: z.number().int().min(1).default(DEFAULT_WORLD.companies).describe("Companies in that world, as the sessions were simulated (the sample's: `prefab simulate`'s default)."),
      tasks: z.number().int().min(0).default(20).describe('Validation tasks (their companies never appear in training), each tried k times.'),
      k: z.number().int().min(1).default(2).describe('Tries per validation task: success is reported as mean@k and pass@k.'),
      temperature: z.number().min(0).default(0.5).describe("The model's sampling temperature in the simulator; 0 always takes the likeliest token."),
      top_p: z.number().min(0).max(1).default(0.95).describe('Nucleus sampling: each token is drawn from the likeliest ones whose probabilities add up to top_p.'),
      max_tokens: z.number().int().min(1).default(160).describe('Most tokens in one assistant message.'),
      constrained: z.boolean().default(true).describe("Tool calls decoded under the tools' JSON schemas, as a serving stack's structured outputs (train/constrain.ts)."),
      max_turns: z.number().int().min(1).default(12).describe("Most assistant messages in one episode. The oracle needs 9 at most (search, form, five calls, finish, a closing line); a model that loops on failed calls would otherwise go on to the environment's 24 steps, each a full generation."),
    })
    .prefault({}).describe('Episodes in the simulator: each model acts as the agent on validation tasks.'),
});
type EvalConfig = z.infer<typeof config>;

export type ModelRow = Record<string, number | null>;

interface Model {
  name: string;
  model: Llama;
}

/** The model acting in the simulator on the validation tasks, each episode seeded by the model, task and try. */
async function simulate(m: Model, chat: Chat, context: number, placeholders: Placeholders, s: EvalConfig['simulator'], seed: string, signal: AbortSignal, log: Logger): Promise<ModelRow> {
  if (s.tasks === 0) return {};
  const policy = new ModelPolicy(m.name, m.model, context, chat, placeholders, { maxTokens: s.max_tokens, temperature: s.temperature, topP: s.top_p, tools: s.constrained ? TOOLS : undefined, signal }, Math.random);
  const progress = log.progress(`simulator: ${m.name}`, s.tasks * s.k);
  const started = performance.now();
  const options = { worldSeed: s.world_seed, companies: s.companies, tasks: s.tasks, k: s.k, maxTurns: s.max_turns };
  const figures = await validationFigures(policy, options, (taskId, trial) => (policy.random = seeded(seed, 'eval', m.name, taskId, trial)), () => progress.tick()).finally(() => progress.done());
  log.info('simulated', { model: m.name, episodes: s.tasks * s.k, generated: policy.generated, 'tokens/s': Math.round(policy.generated / ((performance.now() - started) / 1000)) });
  return figures;
}

/** A pair's kind for the breakdown: its source, and its negative type when it has one. */
const pairType = (p: Pair) => (p.negative_type ? `${p.source}/${p.negative_type}` : p.source);

interface TypeRow {
  pairs: number;
  /** The mean of shorterChosen: what preferring the shorter side scores. */
  shorter_chosen: number;
  /** Each model's pairs/accuracy on this type. */
  accuracy: Record<string, number>;
}

/** Held-out pairs per type (and all together): how many, the length baseline, and each model's accuracy. */
function pairsByType(types: string[], shorter: number[], wins: Record<string, number[]>): Record<string, TypeRow> {
  const out: Record<string, TypeRow> = {};
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
  for (const type of ['all', ...[...new Set(types)].sort()]) {
    const idx = types.flatMap((t, i) => (type === 'all' || t === type ? [i] : []));
    out[type] = { pairs: idx.length, shorter_chosen: mean(idx.map((i) => shorter[i]!)), accuracy: Object.fromEntries(Object.entries(wins).map(([m, w]) => [m, mean(idx.map((i) => w[i]!))])) };
  }
  return out;
}

/** The breakdown as text: a row per pair type, the length baseline beside each model's accuracy. */
function formatByType(rows: Record<string, TypeRow>, models: string[]): string {
  const width = Math.max(...Object.keys(rows).map((k) => k.length), 'pairs/accuracy by type'.length);
  const lines = [['pairs/accuracy by type'.padEnd(width), 'pairs'.padStart(6), 'shorter'.padStart(10), ...models.map((m) => m.padStart(10))].join('  ')];
  for (const [type, r] of Object.entries(rows)) lines.push([type.padEnd(width), String(r.pairs).padStart(6), r.shorter_chosen.toFixed(3).padStart(10), ...models.map((m) => r.accuracy[m]!.toFixed(3).padStart(10))].join('  '));
  return lines.join('\n');
}

/** The table as text: one column per model. */
function formatTable(rows: Record<string, ModelRow>): string {
  const models = Object.keys(rows);
  const metrics = [...new Set(models.flatMap((m) => Object.keys(rows[m]!)))];
  const cell = (v: number | null | undefined) => (v === null || v === undefined ? '—' : Number.isInteger(v) ? String(v) : v.toFixed(3));
  const width = Math.max(...metrics.map((k) => k.length));
  const lines = [[''.padEnd(width), ...models.map((m) => m.padStart(10))].join('  ')];
  for (const k of metrics) lines.push([k.padEnd(width), ...models.map((m) => cell(rows[m]![k]).padStart(10))].join('  '));
  return lines.join('\n');
}

export const evalStage = defineStage({
  name: 'eval',
  description: 'compare the untrained, SFT, preference-tuned and (when it ran) DAPO models: held-out pairs, NLL, simulator success',
  version: 5,
  inputs: ['sft', 'dpo', 'dapo', 'export'],
  outputs: ['eval.json', 'table.txt'],
  config,

  async run({ config: cfg, out, input, log, options, signal }) {
    const backend = await stageBackend(options, log);
    const sft = loadCheckpoint(join(input('sft'), 'model'));
    const tuned = loadCheckpoint(join(input('dpo'), 'model'));
    const tuning = readPreferenceTraining(tuned.state?.info, join(input('dpo'), 'model'));
    const lossName = tuning.loss;
    const training = tuning.choice;
    const chat = openChat(sft.tokenizer, sft.model.config.eosTokenId, join(input('sft'), 'model'));
    const pad = chat.pad;
    const length = sft.context + 1;
    // The untrained model is the SFT run's starting point: the pretrained folder it started from, or a new model of the same config and seed.
    const from = sft.state?.info?.from;
    const models: Model[] = [
      { name: typeof from === 'string' ? 'base' : 'untrained', model: typeof from === 'string' ? loadCheckpoint(from).model : Llama.create(sft.model.config, sft.state?.seed ?? 'prefab') },
      { name: 'sft', model: sft.model },
      { name: lossName === 'sigmoid' ? 'dpo' : lossName, model: tuned.model },
    ];
    // The dapo stage's model when it trained one (off, it passes the dpo model on, which is not evaluated twice).
    const rl = loadCheckpoint(join(input('dapo'), 'model'));
    if (rl.state?.info?.stage === 'dapo') models.push({ name: 'dapo', model: rl.model });
    else rl.model.dispose();

    const pairs = await readParquet<Pair>(join(input('export'), 'pairs', 'test.parquet'));
    // Pairs cut as the preference stage cut them for training.
    const pairLength = Math.min(length, tuning.max_length + 1);
    const heldOut = subset(pairs, cfg.max_pairs, cfg.seed);
    const made = await pairExamples(chat, heldOut, pairLength, sft.placeholders);
    const examples = made.examples;
    if (made.dropped.length) log.warn(`${made.dropped.length} of ${heldOut.length} held-out pairs left out: a side does not fit in ${pairLength - 1} tokens`);
    const types = made.rows.map((r) => pairType(heldOut[r]!));
    const wins: Record<string, number[]> = {};
    const sessions = await readParquet<{ messages: Message[] }>(join(input('export'), 'sft', 'test.parquet'));
    const nllSequences = await sftSequences(chat, subset(sessions, cfg.max_sessions, cfg.seed).map((s) => s.messages), length, join(input('export'), 'sft', 'test.parquet'), sft.placeholders);

    const scores = async (m: Model): Promise<Scores[]> => {
      const sides: Scores[] = [];
      for (const k of examples.length ? [0, 1] : []) sides.push(await scoreSequences(m.model, examples.map((e) => e.sequences[k]!), cfg.micro_batch_tokens, pad, signal, log, `held-out pairs: ${m.name}`));
      return sides;
    };
    const reference = await scores(models[1]!);
    const rows: Record<string, ModelRow> = {};
    for (const m of models) {
      const row: ModelRow = {};
      if (examples.length) {
        const own = m === models[1] ? reference : await scores(m);
        Object.assign(row, heldOutPairFigures(own, reference, training, m === models[1]));
        wins[m.name] = pairWins(own, training.average);
      }
      if (nllSequences.length) {
        const s = await scoreSequences(m.model, nllSequences, cfg.micro_batch_tokens, pad, signal, log, `held-out NLL: ${m.name}`);
        row.nll = -s.sum.reduce((a, b) => a + b, 0) / Math.max(1, s.count.reduce((a, b) => a + b, 0));
      }
      Object.assign(row, await simulate(m, chat, sft.context, sft.placeholders, cfg.simulator, cfg.seed, signal, log));
      rows[m.name] = row;
      log.info('evaluated', { model: m.name, ...row });
    }
    for (const m of models) m.model.dispose();

    const byType = pairsByType(types, shorterChosen(examples), wins);
    const table = formatTable(rows) + (examples.length ? `\n\n${formatByType(byType, Object.keys(wins))}` : '');
    const report = {
      models: rows,
      pairs_by_type: byType,
      held_out: { pairs: examples.length, pairs_too_long: made.dropped.length, sft_windows: nllSequences.length, val_tasks: cfg.simulator.tasks, k: cfg.simulator.k },
      preference_loss: { loss: lossName, beta: training.beta, reference: training.reference ? 'sft' : null },
      sampling: { temperature: cfg.simulator.temperature, top_p: cfg.simulator.top_p, max_tokens: cfg.simulator.max_tokens, max_turns: cfg.simulator.max_turns, constrained: cfg.simulator.constrained },
      backend: backend.name,
    };
    await writeFile(join(out, 'eval.json'), JSON.stringify(report, null, 2) + '\n');
    await writeFile(join(out, 'table.txt'), table + '\n');
    const counts: Record<string, number> = { pairs: examples.length, sft_windows: nllSequences.length, val_tasks: cfg.simulator.tasks };
    return { counts, summary: `${models.map((m) => m.name).join(' / ')} on ${examples.length} held-out pairs, ${cfg.simulator.tasks}×${cfg.simulator.k} validation episodes (eval.json):\n${table}` };
  },
});
