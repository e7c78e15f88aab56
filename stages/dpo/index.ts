// dpo: preference optimisation of the SFT model on the exported pairs (DPO and its sigmoid, robust, hinge
// and IPO losses; SimPO; ORPO: train/dpo.ts) or on the KTO rows (train/kto.ts). The SFT model is the starting
// point and, for the losses that need one, the frozen reference, whose log-probabilities are cached here.
import { join } from 'node:path';
import { z } from 'zod';
import { hashJson } from '../../pipeline/hash.ts';
import { defineStage } from '../../pipeline/stage.ts';
import type { KtoRow, Pair } from '../../core/records.ts';
import { stageBackend } from '../../train/backend.ts';
import { loadCheckpoint } from '../../train/checkpoint.ts';
import { readParquet, subset } from '../../train/data.ts';
import { dpoTrainer, lossOf, pairExamples, referenceScores, type PreferenceTraining } from '../../train/dpo.ts';
import { ktoExamples, ktoTrainer } from '../../train/kto.ts';
import { LOSS_NAMES } from '../../train/losses/index.ts';
import { trainingConfig, trainingRun } from '../../train/run.ts';
import { TextTokenizer } from '../../train/tokenizer.ts';

const config = z.strictObject({
  loss: z.enum(LOSS_NAMES).default('dpo').describe("dpo is DPO's sigmoid loss; robust and hinge are its variants; simpo and orpo need no reference; kto trains on the KTO rows."),
  beta: z.number().positive().nullable().default(null).describe("β (ORPO: λ); null takes the loss's paper default: 0.1, SimPO 2.0."),
  label_smoothing: z.number().min(0).max(0.5).default(0).describe('cDPO / robust DPO: the chance a label is wrong.'),
  gamma_beta_ratio: z.number().min(0).default(0.5).describe("SimPO's margin γ as a share of β."),
  desirable_weight: z.number().positive().default(1).describe("KTO's weight on the loss of desirable rows."),
  undesirable_weight: z.number().positive().default(1).describe("KTO's weight on the loss of undesirable rows."),
  /** batch_size counts pairs (KTO: rows). */
  ...trainingConfig(1e-4),
  max_examples: z.number().int().min(1).nullable().default(null).describe('Train on at most this many pairs or rows (null: all), drawn by a seeded shuffle.'),
  max_length: z.number().int().min(16).nullable().default(null).describe("Tokens of prompt and completion together (null: the model's context): the prompt keeps its head and latest messages, a long completion is cut at its end (TRL's max_length)."),
});

export const dpo = defineStage({
  name: 'dpo',
  description: 'preference optimisation (DPO, IPO, SimPO, ORPO, KTO) of the SFT model on the exported pairs',
  version: 2,
  inputs: ['sft', 'export'],
  outputs: ['model', 'metrics.jsonl'],
  config,

  async run({ config: cfg, out, input, cache, key, lineage, log, options, signal }) {
    const backend = await stageBackend(options, log);
    const sft = loadCheckpoint(join(input('sft'), 'model'));
    const tokenizer = new TextTokenizer(sft.tokenizerJson);
    const length = Math.min(sft.model.config.contextLength, cfg.max_length ?? Infinity) + 1;
    const pad = tokenizer.special['<|pad|>'];
    const loss = lossOf(cfg.loss, cfg.beta);
    const kto = loss.name === 'kto';
    const path = join(input('export'), kto ? 'kto' : 'pairs', 'train.parquet');
    const used = subset(await readParquet<Pair & KtoRow>(path), cfg.max_examples, cfg.seed);
    if (used.length === 0) throw new Error(`${path} has no rows: nothing to train ${cfg.loss} on`);
    if (kto && !used.some((r) => r.label)) throw new Error(`${path}: no desirable rows (label true); KTO needs both kinds`);
    const examples = kto ? await ktoExamples(tokenizer, used, length, sft.placeholders) : await pairExamples(tokenizer, used, length, sft.placeholders);
    const fingerprints = lineage.filter((l) => l.stage === 'sft' || l.stage === 'export').map((l) => l.fingerprint);
    const referenceKey = hashJson({ fingerprints, kto, examples: used.length, length, version: 1 });
    const reference = loss.reference ? await referenceScores(sft.model, examples, pad, cfg.micro_batch_tokens, join(cache, `reference-${referenceKey.slice(0, 16)}.json`), signal, log) : null;
    const start = () => loadCheckpoint(join(input('sft'), 'model')).model;
    const trainer = kto ? ktoTrainer(examples, reference!, loss, cfg, pad, start, signal) : dpoTrainer(examples, reference, loss, cfg, pad, start);
    log.info('training', { loss: loss.name, beta: loss.beta, examples: examples.length, steps: trainer.steps, backend: backend.name });

    const result = await trainingRun({ config: cfg, cache, key, tokenizerJson: sft.tokenizerJson, placeholders: sft.placeholders, signal, log }, trainer);
    sft.model.dispose();
    const last = await result.save(out, { stage: 'dpo', loss: loss.name, beta: loss.beta, max_length: length - 1 } satisfies PreferenceTraining);
    const accuracy = last['rewards/accuracies'];
    return {
      counts: { examples: examples.length, steps: trainer.steps, resumed_from: result.resumedFrom },
      summary:
        `${cfg.loss} (β ${loss.beta}): ${trainer.steps} steps on ${examples.length} ${kto ? 'rows' : 'pairs'}; last 10 steps: loss ${last.loss?.toFixed(3)}, ` +
        `margin ${last['rewards/margins']?.toFixed(3)}${accuracy === undefined ? '' : `, accuracy ${accuracy.toFixed(2)}`}`,
    };
  },
});
