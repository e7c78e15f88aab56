// The dpo stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs): the
// rows it trains on, then the preference run (trainers/preference.ts) from the SFT model.
import { join } from 'node:path';
import { pairKind, type KtoRow, type Pair } from '../../core/records.ts';
import { deviceFor } from '../../runtime/device.ts';
import { keptRound, runIterativeDpo } from '../../rl/iterative.ts';
import { readParquet, readPreferencePairs, subset } from '../../trainers/data.ts';
import { runPreference } from '../../trainers/preference.ts';
import { loraOf } from '../../trainers/settings.ts';
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
  if (cfg.iterative.enabled) {
    const { enabled: _, ...knobs } = cfg.iterative;
    const { figures } = await runIterativeDpo({
      from: join(input('sft'), 'model'),
      out,
      cache,
      key,
      knobs,
      preference: cfg,
      device,
      signal,
      log,
    });
    // figures[0] is the starting model's validation; one row a round after it.
    const kept = keptRound(knobs.keep, figures);
    const first = (i: number) => figures[i]?.['val/success_first']?.toFixed(3) ?? '?';
    const pairs = figures.reduce((n, f) => n + (f['rollouts/step_pairs'] ?? 0), 0);
    return {
      counts: { rounds: figures.length - 1, pairs, kept_round: kept },
      summary:
        `iterative ${knobs.method} (reference ${knobs.reference}): ${figures.length - 1} rounds, ${pairs} step pairs; ` +
        `validation first-try ${first(0)} at the start, ${first(kept)} ` +
        (kept === 0
          ? 'there: the SFT model is kept (no round did better)'
          : `at round ${kept}, kept (keep: ${knobs.keep})`),
    };
  }
  const kto = cfg.loss === 'kto';
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
  const fingerprints = lineage.filter((l) => l.stage === 'sft' || l.stage === 'export').map((l) => l.fingerprint);
  const run = await runPreference({
    from: join(input('sft'), 'model'),
    rows: used,
    source: path,
    knobs: cfg,
    remedy: 'raise dpo.max_length or sft.model.context',
    lora: cfg.lora ? loraOf(cfg.lora) : undefined,
    base: '../../sft/model',
    cache,
    key,
    // The rows used depend on the seed, max_examples and pair_kinds.
    referenceKey: { fingerprints, seed: cfg.seed, max_examples: cfg.max_examples, pair_kinds: cfg.pair_kinds },
    out,
    stage: 'dpo',
    device,
    signal,
    log,
  });
  const { last } = run;
  const accuracy = last['rewards/accuracies'];
  return {
    counts: { examples: run.examples, too_long: run.tooLong, steps: run.steps, resumed_from: run.resumedFrom },
    summary:
      `${cfg.loss} (β ${run.loss.beta}): ${run.steps} steps on ${run.examples} ${kto ? 'rows' : 'pairs'}${run.tooLong ? ` (${run.tooLong} too long, left out)` : ''}; last 10 steps: loss ${last.loss?.toFixed(3)}, ` +
      `margin ${last['rewards/margins']?.toFixed(3)}${accuracy === undefined ? '' : `, accuracy ${accuracy.toFixed(2)}`}`,
  };
}
