// A preference run from a model folder: its pairs (or KTO rows) made into examples cut to the context, the
// frozen starting model's log-probabilities of them (the reference, computed once and kept), then the
// pairwise trainer (dpo.ts) or KTO's (kto.ts) in the shared run, saved as a model folder. The dpo stage runs
// it on the exported pairs, a refresh night on its replay buffer, as rl/dapo.ts runDapo serves both for DAPO.
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { PipelineError } from '../pipeline/errors.ts';
import { hashJson } from '../pipeline/hash.ts';
import type { Logger } from '../pipeline/log.ts';
import type { KtoRow, Pair } from '../core/records.ts';
import { openChat } from '../model/chat.ts';
import { loadCheckpoint } from '../model/checkpoint.ts';
import type { LoraConfig } from '../model/config.ts';
import { attachLora } from '../model/lora.ts';
import type { Device } from '../runtime/device.ts';
import { withScorer } from '../runtime/engines.ts';
import { dpoTrainer, lossOf, pairExamples, referenceScores, type PreferenceSettings } from './dpo.ts';
import { ktoExamples, ktoTrainer } from './kto.ts';
import { finalMetrics, trainingRun } from './run.ts';
import type { LossName } from './losses/index.ts';

/** A preference run's knobs: what trainers/settings.ts preferenceKnobs gives a config section, KTO's weights optional. */
export type PreferenceKnobs = Omit<PreferenceSettings, 'desirable_weight' | 'undesirable_weight'> &
  Partial<Pick<PreferenceSettings, 'desirable_weight' | 'undesirable_weight'>> & {
    loss: LossName | 'dpo';
    beta: number | null;
    max_length: number | null;
  };

export interface PreferenceRunOptions {
  /** The model folder to start from; for the losses that need one, its weights are the frozen reference too. */
  from: string;
  /** Another model folder as the frozen reference (iterative DPO's fixed reference); absent: `from`. */
  reference?: string;
  /** Pairs, or KTO rows where the loss is kto. */
  rows: Pair[] | KtoRow[];
  /** What the rows are, for the errors (a Parquet file, the night's buffer). */
  source: string;
  knobs: PreferenceKnobs;
  /** What to do where a side does not fit (which config key to raise), for the warnings and errors. */
  remedy: string;
  /** LoRA's settings: adapters on the starting model are trained, its base is the reference. */
  lora?: LoraConfig;
  /** The model the adapters sit on, as adapter_config.json names it. */
  base?: string;
  /** The run's checkpoints and the reference's scores are kept here; `key` names the run, `referenceKey` its reference. */
  cache: string;
  key: string;
  referenceKey: Record<string, unknown>;
  /** Where the model goes (`out/model`, `out/metrics.jsonl`), and what joins its trainer_state.json beside the loss. */
  out: string;
  stage: string;
  info?: Record<string, unknown>;
  device: Device;
  signal: AbortSignal;
  log: Logger;
}

export interface PreferenceRun {
  steps: number;
  examples: number;
  /** Rows left out: a side did not fit in the length. */
  tooLong: number;
  resumedFrom: number;
  /** Means of the last steps' metrics. */
  last: Record<string, number>;
  loss: { name: string; beta: number };
}

/** Trains the model in `o.from` on `o.rows` by the loss `o.knobs` names, into `o.out`, resuming from `o.cache`. */
export async function runPreference(o: PreferenceRunOptions): Promise<PreferenceRun> {
  const { knobs, log } = o;
  const start = loadCheckpoint(o.from);
  const chat = openChat(start.tokenizer, start.model.config.eosTokenId, o.from);
  const length = Math.min(start.context, knobs.max_length ?? Infinity) + 1;
  const loss = lossOf(knobs.loss, knobs.beta);
  const kto = loss.name === 'kto';
  const made = kto
    ? await ktoExamples(chat, o.rows as KtoRow[], length, start.placeholders)
    : await pairExamples(chat, o.rows as Pair[], length, start.placeholders);
  const what = kto ? 'rows' : 'pairs';
  for (const d of made.dropped.slice(0, 5)) {
    const row = o.rows[d.row]! as Partial<Pair & KtoRow>;
    log.warn('left out: does not fit', {
      pair_id: row.pair_id ?? null,
      session_id: row.session_id ?? null,
      reason: d.reason,
    });
  }
  if (made.dropped.length)
    log.warn(
      `${made.dropped.length} of ${o.rows.length} ${what} left out: a side does not fit in ${length - 1} tokens (${o.remedy})`,
    );
  if (made.examples.length === 0)
    throw new PipelineError(`${o.source}: no ${what.slice(0, -1)} fits in ${length - 1} tokens; ${o.remedy}`);

  const settings = { desirable_weight: 1, undesirable_weight: 1, ...knobs };
  mkdirSync(o.cache, { recursive: true });
  const referenceKey = hashJson({ ...o.referenceKey, kto, rows: made.rows, length, version: 2 });
  const referenceModel = o.reference ? loadCheckpoint(o.reference).model : start.model;
  const reference = loss.reference
    ? await withScorer(o.device, referenceModel, log, (score) =>
        referenceScores(score, made.examples, {
          pad: chat.pad,
          maxTokens: knobs.micro_batch_tokens,
          path: join(o.cache, `reference-${referenceKey.slice(0, 16)}.json`),
          signal: o.signal,
          log,
        }),
      )
    : null;
  if (referenceModel !== start.model) referenceModel.dispose();
  // With LoRA the model trained is the starting model itself with adapters on it: the reference is its base,
  // with no second copy of the weights.
  const { lora } = o;
  const begin = () => {
    const model = lora ? start.model : loadCheckpoint(o.from).model;
    if (lora) attachLora(model, lora, knobs.seed);
    return model;
  };
  const trained = { examples: made.examples, loss, cfg: settings, pad: chat.pad, start: begin };
  const trainer = kto ? ktoTrainer({ ...trained, reference: reference! }) : dpoTrainer({ ...trained, reference });
  log.info('training', {
    loss: loss.name,
    beta: loss.beta,
    examples: made.examples.length,
    steps: trainer.steps,
    backend: o.device.description,
  });
  const result = await trainingRun(
    {
      config: settings,
      cache: o.cache,
      key: o.key,
      tokenizer: start.tokenizer,
      context: start.context,
      placeholders: start.placeholders,
      lora,
      base: o.base,
      signal: o.signal,
      log,
      device: o.device,
    },
    trainer,
  );
  if (result.model !== start.model) start.model.dispose();
  const info = o.info ?? {};
  const last = await result.save(o.out, {
    stage: o.stage,
    loss: loss.name,
    beta: loss.beta,
    max_length: length - 1,
    ...info,
    ...(Object.keys(info).length ? { last: finalMetrics(result.metrics) } : {}),
  });
  return {
    steps: trainer.steps,
    examples: made.examples.length,
    tooLong: made.dropped.length,
    resumedFrom: result.resumedFrom,
    last,
    loss: { name: loss.name, beta: loss.beta },
  };
}
