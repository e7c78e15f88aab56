// The export stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { hashJson } from '../../pipeline/hash.ts';
import { safePoint } from '../../pipeline/interrupt.ts';
import { WorkerPool, workerCount } from '../../pipeline/workers.ts';
import { MANY_BUCKETS, readSplitInfo } from '../layout.ts';
import { cardTexts, datasetCard } from './card.ts';
import { DATASETS } from './schema.ts';
import { writePairTable, writeSessionTables, type TableSource, type TablesWritten } from './tables.ts';
import type { TableJob } from './worker.ts';
import { SPLITS, type Split } from '../../core/records.ts';

import type { StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

/**
 * On one thread, each side's sessions, SFT and KTO tables from one read of its buckets, then its pairs. On
 * more (`--workers`), each side's sessions table, its SFT and KTO tables (the buckets read again) and its
 * pairs table are jobs of their own, the largest first, each thread taking the next as it is free: each
 * file is written by one thread, the same bytes.
 */
export async function run({
  config: cfg,
  out,
  input,
  lineage,
  log,
  signal,
  options,
}: StageContext<Config>): Promise<StageReport> {
  const folders = { split: input('split'), ingest: input('ingest') };
  const info = await readSplitInfo(folders.split);
  const source: TableSource = { cfg, out, folders, gate: input('gate'), buckets: info.buckets };
  // Rows a table and side (`sessions_train`), and the KTO rows left out.
  const rows: Record<string, number> = {};
  let ktoSkipped = 0;
  const add = (side: Split, made: TablesWritten) => {
    for (const [table, n] of Object.entries(made.rows)) rows[`${table}_${side}`] = n;
    ktoSkipped += made.ktoSkipped;
  };
  const threads = workerCount(options.workers, info.buckets >= MANY_BUCKETS);
  if (threads > 1) {
    const jobs: TableJob[] = SPLITS.flatMap(
      (side) =>
        [
          { side, tables: ['sessions'] },
          { side, tables: ['sft', 'kto'] },
          { side, pairs: true },
        ] satisfies TableJob[],
    );
    const pool = new WorkerPool<TableJob, TablesWritten>(
      'export-worker',
      new URL('./worker.ts', import.meta.url),
      Math.min(threads, jobs.length),
      source,
    );
    const progress = log.progress('export tables', jobs.length);
    try {
      const lane = async () => {
        for (let job = jobs.shift(); job; job = jobs.shift()) {
          await safePoint(
            signal,
            () => 'export: stopped before it had written every table; the next run exports again',
          );
          add(job.side, await pool.run(job));
          progress.tick();
        }
      };
      await Promise.all(Array.from({ length: pool.size }, lane));
    } finally {
      await pool.close();
    }
    progress.done();
  } else {
    for (const side of SPLITS) {
      const progress = log.progress(`export ${side} sessions`, info.buckets);
      const made = await writeSessionTables(source, side, ['sessions', 'sft', 'kto'], async (b) => {
        if (b > 0) progress.tick();
        await safePoint(
          signal,
          () => `export: stopped at ${side} bucket ${b + 1} of ${info.buckets}; the next run exports again`,
        );
      });
      progress.done();
      add(side, made);
      add(side, await writePairTable(source, side));
    }
  }

  const counts: Record<string, number> = {};
  for (const name of DATASETS) for (const side of SPLITS) counts[`${name}_${side}`] = rows[`${name}_${side}`]!;
  if (counts.pairs_train! + counts.trajectories_train! === 0)
    log.warn(
      'no preference pair was exported for training: the gate kept none. Pairs need tasks with both a success (reward ≥ pairs.outcome.success_min) and a failure (≤ pairs.outcome.failure_max), or successful sessions to make hard negatives from, or pairs to import; the pairs, judge and gate stages’ summaries say where they went (prefab status)',
    );

  const configHash = hashJson([...lineage.map((l) => l.config_hash), hashJson(cfg)]);
  const madeAt = new Date().toISOString();
  const cards = cardTexts(cfg);
  const r = cfg.redaction;
  if (r.enabled)
    for (const c of Object.values(cards))
      c.howMade.push(
        `Personal data (${r.kinds.join(', ')}; keys ${r.keys.join(', ')}) masked with per-row placeholders such as [PHONE_1].`,
      );
  for (const name of DATASETS) {
    const c = cards[name];
    const card = datasetCard({
      name,
      ...c,
      counts: { train: counts[`${name}_train`]!, test: counts[`${name}_test`]! },
      configHash,
      lineage,
      madeAt,
    });
    await writeFile(join(out, name, 'README.md'), card);
  }
  return {
    counts: { ...counts, kto_without_assistant: ktoSkipped },
    summary:
      DATASETS.map((d) => `${d} ${counts[`${d}_train`]}/${counts[`${d}_test`]}`).join(', ') + ' rows (train/test)',
  };
}
