// The dpo stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { join } from 'node:path';
import { hashJson } from '../../pipeline/hash.ts';
import { pairKind, type KtoRow, type Pair } from '../../core/records.ts';
import { deviceFor } from '../../runtime/device.ts';
import { withScorer } from '../../runtime/engines.ts';
import { openChat } from '../../model/chat.ts';
import { loadCheckpoint } from '../../model/checkpoint.ts';
import { attachLora } from '../../model/lora.ts';
import { loraOf } from '../../trainers/settings.ts';
import { readParquet, readPreferencePairs, subset } from '../../trainers/data.ts';
import { dpoTrainer, lossOf, pairExamples, referenceScores, type PreferenceTraining } from '../../trainers/dpo.ts';
import { ktoExamples, ktoTrainer } from '../../trainers/kto.ts';
import { trainingRun } from '../../trainers/run.ts';
import type { StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

export async function run({
  config: cfg,
  out,
  input,
  cache,
  key,
  lineage,
  log,
  options,
  signal,
}: StageContext<Config>): Promise<StageReport> {
  const device = await deviceFor(options, log);
  const sft = loadCheckpoint(join(input('sft'), 'model'));
  const chat = openChat(sft.tokenizer, sft.model.config.eosTokenId, join(input('sft'), 'model'));
  const length = Math.min(sft.context, cfg.max_length ?? Infinity) + 1;
  const pad = chat.pad;
  const loss = lossOf(cfg.loss, cfg.beta);
  const kto = loss.name === 'kto';
  const path = join(input('export'), kto ? 'kto' : 'pairs', 'train.parquet');
  const rows = kto ? await readParquet<KtoRow>(path) : await readPreferencePairs<Pair>(input('export'), 'train');
  if (kto && cfg.pair_kinds) throw new Error('dpo.pair_kinds: KTO trains on rows, which have no kind; set it to null');
  const kinds = cfg.pair_kinds;
  const kept = kinds ? (rows as Pair[]).filter((p) => kinds.includes(p.source) || kinds.includes(pairKind(p))) : rows;
  if (kinds && kept.length === 0)
    throw new Error(
      `${path}: no pair of the kinds ${kinds.join(', ')} (dpo.pair_kinds); eval's breakdown lists the kinds`,
    );
  const used = subset<Pair & KtoRow>(kept as (Pair & KtoRow)[], cfg.max_examples, cfg.seed);
  if (used.length === 0) throw new Error(`${path} has no rows: nothing to train ${cfg.loss} on`);
  if (kto && !used.some((r) => r.label))
    throw new Error(`${path}: no desirable rows (label true); KTO needs both kinds`);
  const made = kto
    ? await ktoExamples(chat, used, length, sft.placeholders)
    : await pairExamples(chat, used, length, sft.placeholders);
  const examples = made.examples;
  for (const d of made.dropped.slice(0, 5))
    log.warn('left out: does not fit', {
      pair_id: used[d.row]!.pair_id ?? null,
      session_id: used[d.row]!.session_id ?? null,
      reason: d.reason,
    });
  if (made.dropped.length)
    log.warn(
      `${made.dropped.length} of ${used.length} ${kto ? 'rows' : 'pairs'} left out: a side does not fit in ${length - 1} tokens (raise dpo.max_length or sft.model.context)`,
    );
  if (examples.length === 0)
    throw new Error(
      `${path}: no ${kto ? 'row' : 'pair'} fits in ${length - 1} tokens; raise dpo.max_length or sft.model.context`,
    );
  const fingerprints = lineage.filter((l) => l.stage === 'sft' || l.stage === 'export').map((l) => l.fingerprint);
  // The rows used depend on the seed, max_examples and pair_kinds; the cut on the length.
  const referenceKey = hashJson({
    fingerprints,
    kto,
    seed: cfg.seed,
    max_examples: cfg.max_examples,
    pair_kinds: cfg.pair_kinds,
    rows: made.rows,
    length,
    version: 2,
  });
  const reference = loss.reference
    ? await withScorer(device, sft.model, log, (score) =>
        referenceScores(
          score,
          examples,
          pad,
          cfg.micro_batch_tokens,
          join(cache, `reference-${referenceKey.slice(0, 16)}.json`),
          signal,
          log,
        ),
      )
    : null;
  // With LoRA the model trained is the SFT model itself with adapters on it: the reference is its base, with no second copy of the weights.
  const lora = cfg.lora ? loraOf(cfg.lora) : undefined;
  const start = () => {
    const model = lora ? sft.model : loadCheckpoint(join(input('sft'), 'model')).model;
    if (lora) attachLora(model, lora, cfg.seed);
    return model;
  };
  const trainer = kto
    ? ktoTrainer(examples, reference!, loss, cfg, pad, start)
    : dpoTrainer(examples, reference, loss, cfg, pad, start);
  log.info('training', {
    loss: loss.name,
    beta: loss.beta,
    examples: examples.length,
    steps: trainer.steps,
    backend: device.description,
  });

  const result = await trainingRun(
    {
      config: cfg,
      cache,
      key,
      tokenizer: sft.tokenizer,
      context: sft.context,
      placeholders: sft.placeholders,
      lora,
      base: '../../sft/model',
      signal,
      log,
      device,
    },
    trainer,
  );
  if (result.model !== sft.model) sft.model.dispose();
  const last = await result.save(out, {
    stage: 'dpo',
    loss: loss.name,
    beta: loss.beta,
    max_length: length - 1,
  } satisfies PreferenceTraining);
  const accuracy = last['rewards/accuracies'];
  return {
    counts: {
      examples: examples.length,
      too_long: made.dropped.length,
      steps: trainer.steps,
      resumed_from: result.resumedFrom,
    },
    summary:
      `${cfg.loss} (β ${loss.beta}): ${trainer.steps} steps on ${examples.length} ${kto ? 'rows' : 'pairs'}${made.dropped.length ? ` (${made.dropped.length} too long, left out)` : ''}; last 10 steps: loss ${last.loss?.toFixed(3)}, ` +
      `margin ${last['rewards/margins']?.toFixed(3)}${accuracy === undefined ? '' : `, accuracy ${accuracy.toFixed(2)}`}`,
  };
}
