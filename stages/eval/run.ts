// The eval stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../../pipeline/log.ts';
import { seeded } from '../../core/random.ts';
import { TOOLS } from '../../env/env.ts';
import { figuresOf, validationEpisodes, type EpisodeRecord } from '../../env/evaluate.ts';
import { pairedLine, pairedSuccess, type PairedSuccess } from '../../core/paired-success.ts';
import { pairKind, type Message, type Pair } from '../../core/records.ts';
import { deviceFor, engineName, mainEngine, type Device } from '../../runtime/device.ts';
import { scorerOn, withScorer } from '../../runtime/engines.ts';
import { openChat, type Chat } from '../../model/chat.ts';
import { loadCheckpoint } from '../../model/checkpoint.ts';
import {
  heldOutPairFigures,
  pairExamples,
  pairWins,
  readPreferenceTraining,
  shorterChosen,
} from '../../trainers/dpo.ts';
import { readParquet, readPreferencePairs, sftSequences, subset } from '../../trainers/data.ts';
import { Llama } from '../../model/llama.ts';
import type { Placeholders } from '../../model/placeholders.ts';
import { decodingEngine } from '../../runtime/placement.ts';
import { EpisodePlayers } from '../../runtime/policy.ts';
import type { StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';
import { meanNll, scoreSequences, type BlockScorer, type Scores } from '../../runtime/scoring.ts';

type ModelRow = Record<string, number | null>;

interface Model {
  name: string;
  model: Llama;
}

interface TypeRow {
  pairs: number;
  /** The mean of shorterChosen: what preferring the shorter side scores. */
  shorter_chosen: number;
  /** Each model's pairs/accuracy on this type. */
  accuracy: Record<string, number>;
}

/** eval.json: each model's figures, pair accuracy by type, and what they were measured on (the registry and the report read it). */
export interface EvalReport {
  models: Record<string, ModelRow>;
  /** Each model trained after SFT against SFT on the same validation episodes (the same tasks, tries and draws). */
  against_sft: Record<string, PairedSuccess>;
  pairs_by_type: Record<string, TypeRow>;
  held_out: { pairs: number; pairs_too_long: number; sft_windows: number; val_tasks: number; k: number };
  preference_loss: { loss: string; beta: number; reference: 'sft' | null };
  sampling: { temperature: number; top_p: number; max_tokens: number; max_turns: number; constrained: boolean };
  /** The engine the device runs on unless auto placed a phase elsewhere: webgpu, cpu or wasm. */
  backend: string;
}

/** What the models play in the simulator with, and where. */
interface Playing {
  chat: Chat;
  context: number;
  placeholders: Placeholders;
  simulator: Config['simulator'];
  seed: string;
  signal: AbortSignal;
  log: Logger;
  device: Device;
}

/**
 * The model acting in the simulator on the validation tasks, each episode's sampler seeded by the task and try
 * alone: every model meets the same draws, so two models' episodes are twins (pairedSuccess).
 */
async function simulate(m: Model, o: Playing): Promise<EpisodeRecord[]> {
  const { simulator: s, seed, signal, log } = o;
  if (s.tasks === 0) return [];
  const sampling = {
    maxTokens: s.max_tokens,
    temperature: s.temperature,
    topP: s.top_p,
    tools: s.constrained ? TOOLS : undefined,
    signal,
    engine: await decodingEngine(o.device, m.model, s.tasks * s.k, log), // every episode side by side
  };
  const { chat, context, placeholders } = o;
  const players = new EpisodePlayers({ name: m.name, model: m.model, context, chat, placeholders, sampling });
  const progress = log.progress(`simulator: ${m.name}`, s.tasks * s.k);
  const started = performance.now();
  const options = {
    worldSeed: s.world_seed,
    companies: s.companies,
    tasks: s.tasks,
    k: s.k,
    maxTurns: s.max_turns,
    maxCalls: s.max_calls,
  };
  const records = await validationEpisodes(
    (taskId, trial) => players.player(seeded(seed, 'eval', taskId, trial)),
    { ...options, together: true },
    () => progress.tick(),
  ).finally(() => {
    progress.done();
    players.dispose();
  });
  log.info('simulated', {
    model: m.name,
    episodes: s.tasks * s.k,
    generated: players.generated,
    'tokens/s': Math.round(players.generated / ((performance.now() - started) / 1000)),
  });
  return records;
}

/** Held-out pairs per type (and all together): how many, the length baseline, and each model's accuracy. */
function pairsByType(types: string[], shorter: number[], wins: Record<string, number[]>): Record<string, TypeRow> {
  const out: Record<string, TypeRow> = {};
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
  for (const type of ['all', ...[...new Set(types)].sort()]) {
    const idx = types.flatMap((t, i) => (type === 'all' || t === type ? [i] : []));
    out[type] = {
      pairs: idx.length,
      shorter_chosen: mean(idx.map((i) => shorter[i]!)),
      accuracy: Object.fromEntries(Object.entries(wins).map(([m, w]) => [m, mean(idx.map((i) => w[i]!))])),
    };
  }
  return out;
}

/** The breakdown as text: a row per pair type, the length baseline beside each model's accuracy. */
function formatByType(rows: Record<string, TypeRow>, models: string[]): string {
  const width = Math.max(...Object.keys(rows).map((k) => k.length), 'pairs/accuracy by type'.length);
  const lines = [
    [
      'pairs/accuracy by type'.padEnd(width),
      'pairs'.padStart(6),
      'shorter'.padStart(10),
      ...models.map((m) => m.padStart(10)),
    ].join('  '),
  ];
  for (const [type, r] of Object.entries(rows))
    lines.push(
      [
        type.padEnd(width),
        String(r.pairs).padStart(6),
        r.shorter_chosen.toFixed(3).padStart(10),
        ...models.map((m) => r.accuracy[m]!.toFixed(3).padStart(10)),
      ].join('  '),
    );
  return lines.join('\n');
}

/** The table as text: one column per model. */
function formatTable(rows: Record<string, ModelRow>): string {
  const models = Object.keys(rows);
  const metrics = [...new Set(models.flatMap((m) => Object.keys(rows[m]!)))];
  const cell = (v: number | null | undefined) =>
    v === null || v === undefined ? '—' : Number.isInteger(v) ? String(v) : v.toFixed(3);
  const width = Math.max(...metrics.map((k) => k.length));
  const lines = [[''.padEnd(width), ...models.map((m) => m.padStart(10))].join('  ')];
  for (const k of metrics)
    lines.push([k.padEnd(width), ...models.map((m) => cell(rows[m]![k]).padStart(10))].join('  '));
  return lines.join('\n');
}

export async function run({
  config: cfg,
  out,
  input,
  log,
  options,
  signal,
}: StageContext<Config>): Promise<StageReport> {
  const device = await deviceFor(options, log);
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
    {
      name: typeof from === 'string' ? 'base' : 'untrained',
      model:
        typeof from === 'string'
          ? loadCheckpoint(from).model
          : Llama.create(sft.model.config, sft.state?.seed ?? 'prefab'),
    },
    { name: 'sft', model: sft.model },
    { name: lossName === 'sigmoid' ? 'dpo' : lossName, model: tuned.model },
  ];
  // The dapo stage's model when it trained one (off, it passes the dpo model on, which is not evaluated twice).
  const rl = loadCheckpoint(join(input('dapo'), 'model'));
  if (rl.state?.info?.stage === 'dapo') models.push({ name: 'dapo', model: rl.model });
  else rl.model.dispose();

  const pairs = await readPreferencePairs<Pair>(input('export'), 'test');
  // Pairs cut as the preference stage cut them for training.
  const pairLength = Math.min(length, tuning.max_length + 1);
  const heldOut = subset(pairs, cfg.max_pairs, cfg.seed);
  const made = await pairExamples(chat, heldOut, pairLength, sft.placeholders);
  const examples = made.examples;
  if (made.dropped.length)
    log.warn(
      `${made.dropped.length} of ${heldOut.length} held-out pairs left out: a side does not fit in ${pairLength - 1} tokens`,
    );
  const types = made.rows.map((r) => pairKind(heldOut[r]!));
  const wins: Record<string, number[]> = {};
  const sessions = await readParquet<{ messages: Message[] }>(join(input('export'), 'sft', 'test.parquet'));
  const nllSequences = await sftSequences(
    chat,
    subset(sessions, cfg.max_sessions, cfg.seed).map((s) => s.messages),
    length,
    join(input('export'), 'sft', 'test.parquet'),
    sft.placeholders,
  );

  const scores = async (m: Model, score: Llama | BlockScorer): Promise<Scores[]> => {
    const sides: Scores[] = [];
    for (const k of examples.length ? [0, 1] : [])
      sides.push(
        await scoreSequences(
          score,
          examples.map((e) => e.sequences[k]!),
          { maxTokens: cfg.micro_batch_tokens, pad, signal, log, label: `held-out pairs: ${m.name}` },
        ),
      );
    return sides;
  };
  // With the GPU it scores (a copy of each model's weights there) and generates, under auto where faster.
  const reference = await withScorer(device, models[1]!.model, log, (score) => scores(models[1]!, score));
  const rows: Record<string, ModelRow> = {};
  const episodes: Record<string, EpisodeRecord[]> = {};
  for (const m of models) {
    const row: ModelRow = {};
    const scorer = await scorerOn(device, m.model, log);
    if (examples.length) {
      const own = m === models[1] ? reference : await scores(m, scorer.score);
      Object.assign(row, heldOutPairFigures(own, reference, training, m === models[1]));
      wins[m.name] = pairWins(own, training.average);
    }
    if (nllSequences.length) {
      const s = await scoreSequences(scorer.score, nllSequences, {
        maxTokens: cfg.micro_batch_tokens,
        pad,
        signal,
        log,
        label: `held-out NLL: ${m.name}`,
      });
      row.nll = meanNll(s);
    }
    scorer.dispose();
    const { context, placeholders } = sft;
    const playing = { chat, context, placeholders, simulator: cfg.simulator, seed: cfg.seed, signal, log, device };
    episodes[m.name] = await simulate(m, playing);
    if (cfg.simulator.tasks) Object.assign(row, figuresOf(episodes[m.name]!, cfg.simulator.k));
    rows[m.name] = row;
    log.info('evaluated', { model: m.name, ...row });
  }
  for (const m of models) m.model.dispose();

  // What training after SFT changed, twin episode by twin episode.
  const paired: Record<string, PairedSuccess> = {};
  if (cfg.simulator.tasks)
    for (const m of models.slice(2))
      paired[m.name] = pairedSuccess(episodes.sft!, episodes[m.name]!, { samples: 2000, alpha: 0.05, seed: cfg.seed });
  const byType = pairsByType(types, shorterChosen(examples), wins);
  const table =
    formatTable(rows) +
    Object.entries(paired)
      .map(([name, p]) => `\n${pairedLine(name, 'sft', p)}`)
      .join('') +
    (examples.length ? `\n\n${formatByType(byType, Object.keys(wins))}` : '');
  const report: EvalReport = {
    models: rows,
    against_sft: paired,
    pairs_by_type: byType,
    held_out: {
      pairs: examples.length,
      pairs_too_long: made.dropped.length,
      sft_windows: nllSequences.length,
      val_tasks: cfg.simulator.tasks,
      k: cfg.simulator.k,
    },
    preference_loss: { loss: lossName, beta: training.beta, reference: training.reference ? 'sft' : null },
    sampling: {
      temperature: cfg.simulator.temperature,
      top_p: cfg.simulator.top_p,
      max_tokens: cfg.simulator.max_tokens,
      max_turns: cfg.simulator.max_turns,
      constrained: cfg.simulator.constrained,
    },
    backend: engineName(mainEngine(device)),
  };
  await writeFile(join(out, 'eval.json'), JSON.stringify(report, null, 2) + '\n');
  await writeFile(join(out, 'table.txt'), table + '\n');
  const counts: Record<string, number> = {
    pairs: examples.length,
    sft_windows: nllSequences.length,
    val_tasks: cfg.simulator.tasks,
  };
  return {
    counts,
    summary: `${models.map((m) => m.name).join(' / ')} on ${examples.length} held-out pairs, ${cfg.simulator.tasks}×${cfg.simulator.k} validation episodes (eval.json):\n${table}`,
  };
}
