// dpo: preference optimisation of the SFT model on the exported pairs (DPO and its sigmoid, robust, hinge
// and IPO losses; SimPO; ORPO) or on the KTO rows. The SFT model is the starting point and, for the losses
// that need one, the frozen reference, whose log-probabilities are computed once and cached in the workspace.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs-core';
import { z } from 'zod';
import { hashJson } from '../../pipeline/hash.ts';
import type { Logger } from '../../pipeline/log.ts';
import { defineStage } from '../../pipeline/stage.ts';
import type { KtoRow, Pair } from '../../core/records.ts';
import { stageBackend } from '../../train/backend.ts';
import { loadCheckpoint } from '../../train/checkpoint.ts';
import { completionSequences, readParquet, scoreSequences, sequenceValues, subset, type Scores } from '../../train/data.ts';
import { runFolder, stepsFor, train, trainingConfig, writeRun, type TrainingRun } from '../../train/run.ts';
import { LOSS_NAMES, PREFERENCE_LOSSES, ktoLoss, preferenceMetrics, sequenceLogps, type PreferenceLossName } from '../../train/losses/index.ts';
import type { GPT } from '../../train/model.ts';
import type { Placeholders } from '../../train/placeholders.ts';
import { TextTokenizer } from '../../train/tokenizer.ts';
import { batchAt, microBatches, padBatch, type Sequence } from '../../train/windows.ts';

const config = z.strictObject({
  /** dpo is DPO's sigmoid loss; robust and hinge are its variants; simpo and orpo need no reference. */
  loss: z.enum(LOSS_NAMES).default('dpo'),
  /** β (ORPO: λ); null takes the loss's paper default: 0.1, SimPO 2.0. */
  beta: z.number().positive().nullable().default(null),
  /** cDPO / robust DPO: the chance a label is wrong. */
  label_smoothing: z.number().min(0).max(0.5).default(0),
  /** SimPO's margin γ as a share of β. */
  gamma_beta_ratio: z.number().min(0).default(0.5),
  /** KTO's weights on desirable and undesirable examples. */
  desirable_weight: z.number().positive().default(1),
  undesirable_weight: z.number().positive().default(1),
  /** batch_size counts pairs (KTO: rows). */
  ...trainingConfig(1e-4),
  /** Train on at most this many pairs or rows (null: all), drawn by a seeded shuffle. */
  max_examples: z.number().int().min(1).nullable().default(null),
  /** Tokens of prompt and completion together (null: the model's context): the prompt keeps its head and latest messages, a long completion is cut at its end (TRL's max_length). */
  max_length: z.number().int().min(16).nullable().default(null),
});
type DpoConfig = z.infer<typeof config>;
export type DpoLoss = DpoConfig['loss'];

/** The loss family a config names, with its β. */
export function lossOf(cfg: Pick<DpoConfig, 'loss' | 'beta'>) {
  if (cfg.loss === 'kto') return { name: 'kto' as const, average: false, reference: true, beta: cfg.beta ?? 0.1 };
  const name = (cfg.loss === 'dpo' ? 'sigmoid' : cfg.loss) as PreferenceLossName;
  const spec = PREFERENCE_LOSSES[name];
  return { name, average: spec.average, reference: spec.reference, beta: cfg.beta ?? spec.defaultBeta };
}

/** One training example: a pair's [chosen, rejected], or a KTO row's [completion, the completion of another row after this prompt]. */
export interface Example {
  sequences: Sequence[];
  label?: boolean;
}

/** Pairs as [chosen, rejected] sequences sharing one cut of the prompt. */
export async function pairExamples(tokenizer: TextTokenizer, pairs: Pair[], length: number, placeholders: Placeholders): Promise<Example[]> {
  return Promise.all(pairs.map(async (p) => ({ sequences: await completionSequences(tokenizer, p.prompt, [p.chosen, p.rejected], length, placeholders) })));
}

/**
 * KTO rows; beside each, the next row's completion after this row's prompt: a mismatched pair whose
 * log-ratio estimates KL(π‖π_ref), KTO's reference point, as TRL does.
 */
async function ktoExamples(tokenizer: TextTokenizer, rows: KtoRow[], length: number, placeholders: Placeholders): Promise<Example[]> {
  return Promise.all(
    rows.map(async (r, i) => {
      const [own] = await completionSequences(tokenizer, r.prompt, [r.completion], length, placeholders);
      const [other] = await completionSequences(tokenizer, r.prompt, [rows[(i + 1) % rows.length]!.completion], length, placeholders);
      return { sequences: [own!, other!], label: r.label };
    }),
  );
}

/** The reference model's scores of every example's sequences, computed once per (reference, data) and kept in the cache. */
function referenceScores(model: GPT, examples: Example[], pad: number, maxTokens: number, path: string, log: Logger): Scores[] {
  if (existsSync(path)) {
    const saved = JSON.parse(readFileSync(path, 'utf8')) as { sum: number[]; count: number[] }[];
    if (saved.length === examples[0]?.sequences.length) {
      log.info('reference log-probabilities from the cache', { path });
      return saved.map((s) => ({ sum: Float64Array.from(s.sum), count: Int32Array.from(s.count) }));
    }
  }
  const sides = examples[0]?.sequences.length ?? 0;
  const scores = Array.from({ length: sides }, (_, k) => scoreSequences(model, examples.map((e) => e.sequences[k]!), maxTokens, pad, log, `reference log-probabilities ${k + 1}/${sides}`));
  writeFileSync(path, JSON.stringify(scores.map((s) => ({ sum: [...s.sum], count: [...s.count] }))));
  return scores;
}

/** The stage's version, also in its run folder's key: a new version trains afresh instead of resuming an old run. */
const VERSION = 2;

export const dpo = defineStage({
  name: 'dpo',
  description: 'preference optimisation (DPO, IPO, SimPO, ORPO, KTO) of the SFT model on the exported pairs',
  version: VERSION,
  inputs: ['sft', 'export'],
  outputs: ['model', 'metrics.jsonl'],
  config,

  async run({ config: cfg, out, input, cache, lineage, log }) {
    const backend = await stageBackend(log);
    const sft = loadCheckpoint(join(input('sft'), 'model'));
    const tokenizer = new TextTokenizer(sft.tokenizerJson);
    const length = Math.min(sft.model.config.contextLength, cfg.max_length ?? Infinity) + 1;
    const pad = tokenizer.special['<|pad|>'];
    const loss = lossOf(cfg);
    const kto = loss.name === 'kto';
    const path = join(input('export'), kto ? 'kto' : 'pairs', 'train.parquet');
    const rows = await readParquet<Pair & KtoRow>(path);
    const used = subset(rows, cfg.max_examples, cfg.seed);
    if (used.length === 0) throw new Error(`${path} has no rows: nothing to train ${cfg.loss} on`);
    if (kto && !used.some((r) => r.label)) throw new Error(`${path}: no desirable rows (label true); KTO needs both kinds`);
    const examples = kto ? await ktoExamples(tokenizer, used, length, sft.placeholders) : await pairExamples(tokenizer, used, length, sft.placeholders);
    const steps = stepsFor(cfg, examples.length);
    const fingerprints = lineage.filter((l) => l.stage === 'sft' || l.stage === 'export').map((l) => l.fingerprint);
    const referenceKey = hashJson({ fingerprints, kto, examples: used.length, length, version: 1 });
    const reference = loss.reference ? referenceScores(sft.model, examples, pad, cfg.micro_batch_tokens, join(cache, `reference-${referenceKey.slice(0, 16)}.json`), log) : null;
    log.info('training', { loss: loss.name, beta: loss.beta, examples: examples.length, steps, backend: backend.name });

    const lengths = examples.map((e) => Math.max(...e.sequences.map((s) => s.ids.length)));
    const refValues = reference?.map((r) => sequenceValues(r, loss.average));
    const refValue = (k: number, i: number) => refValues![k]![i]!;
    const refOf = (k: number, idx: number[]) => tf.tensor1d(idx.map((i) => refValue(k, i)));
    const hyper = { beta: loss.beta, label_smoothing: cfg.label_smoothing, gamma_beta_ratio: cfg.gamma_beta_ratio };
    const dir = runFolder(cache, hashJson({ cfg, fingerprints, version: VERSION }));
    const run: TrainingRun = {
      dir,
      seed: cfg.seed,
      steps,
      schedule: cfg,
      checkpointEvery: cfg.checkpoint_every,
      tokenizerJson: sft.tokenizerJson,
      placeholders: sft.placeholders,
      start: () => loadCheckpoint(join(input('sft'), 'model')).model,
      batch: (step, model) => {
        const idx = batchAt(lengths, cfg.batch_size, cfg.seed, step);
        const B = idx.length;
        // Micro-batches of whole examples; each adds its share (its size / B) of the batch's mean loss and metrics.
        const groups = microBatches(idx.map((i) => [i]), (i) => lengths[i]! * 2, cfg.micro_batch_tokens);
        const tokens = idx.reduce((n, i) => n + examples[i]!.sequences.reduce((m, s) => m + s.ids.length, 0), 0);
        const logps = (group: number[], side: number, m: GPT) => {
          const b = padBatch(group.map((i) => examples[i]!.sequences[side]!), pad);
          return sequenceLogps(m.tokenLogprobs(b.ids, b.targets, b.batch, b.length), tf.tensor2d(b.mask, [b.batch, b.length]), loss.average);
        };
        if (kto) {
          // KTO's reference point: the batch's mean log-ratio on mismatched completions, not differentiated, at least 0.
          const mismatched = sequenceValues(scoreSequences(model, idx.map((i) => examples[i]!.sequences[1]!), cfg.micro_batch_tokens, pad), loss.average);
          const kl = idx.reduce((sum, i, k) => sum + mismatched[k]! - refValue(1, i), 0) / B;
          const desirable = idx.filter((i) => examples[i]!.label).length;
          return {
            tokens,
            parts: groups.map((group) => () => {
              const labels = tf.tensor1d(group.map((i) => (examples[i]!.label ? 1 : 0)));
              const own = logps(group, 0, model);
              const out = ktoLoss({ logps: own, refLogps: refOf(0, group), labels, kl }, { beta: loss.beta, desirableWeight: cfg.desirable_weight, undesirableWeight: cfg.undesirable_weight });
              const share = (x: tf.Tensor, n: number) => tf.div(tf.sum(x), Math.max(1, n)) as tf.Scalar;
              const unlabels = tf.sub(1, labels);
              const chosen = share(tf.mul(out.rewards, labels), desirable);
              const rejected = share(tf.mul(out.rewards, unlabels), B - desirable);
              return {
                loss: share(out.losses, B),
                metrics: {
                  'rewards/chosen': chosen,
                  'rewards/rejected': rejected,
                  'rewards/margins': tf.sub(chosen, rejected) as tf.Scalar,
                  'logps/chosen': share(tf.mul(own, labels), desirable),
                  'logps/rejected': share(tf.mul(own, unlabels), B - desirable),
                  kl: tf.scalar(kl * (group.length / B)),
                },
              };
            }),
          };
        }
        const family = PREFERENCE_LOSSES[loss.name as PreferenceLossName];
        return {
          tokens,
          parts: groups.map((group) => () => {
            const x = { chosen: logps(group, 0, model), rejected: logps(group, 1, model), ...(reference ? { refChosen: refOf(0, group), refRejected: refOf(1, group) } : {}) };
            const o = family.fn(x, hyper);
            // ORPO adds the chosen side's NLL (its mean log-probability, negated).
            const losses = family.sft ? tf.sub(o.losses, x.chosen) : o.losses;
            const share = group.length / B;
            const metrics = Object.fromEntries(Object.entries(preferenceMetrics(o, x)).map(([k, v]) => [k, tf.mul(v, share) as tf.Scalar]));
            return { loss: tf.mul(tf.mean(losses), share) as tf.Scalar, metrics };
          }),
        };
      },
      log,
      label: `${cfg.loss} steps`,
    };
    const result = train(run);
    sft.model.dispose();
    const last = await writeRun(out, run, result, { stage: 'dpo', loss: loss.name, beta: loss.beta, max_length: length - 1 });
    const accuracy = last['rewards/accuracies'];
    return {
      counts: { examples: examples.length, steps, resumed_from: result.resumedFrom },
      summary:
        `${cfg.loss} (β ${loss.beta}): ${steps} steps on ${examples.length} ${kto ? 'rows' : 'pairs'}; last 10 steps: loss ${last.loss?.toFixed(3)}, ` +
        `margin ${last['rewards/margins']?.toFixed(3)}${accuracy === undefined ? '' : `, accuracy ${accuracy.toFixed(2)}`}`,
    };
  },
});
