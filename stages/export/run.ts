// The export stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
// export: the sessions table and the SFT, preference-pair and KTO datasets as Parquet, each with a card.
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { hashJson } from '../../pipeline/hash.ts';
import { ParquetTableWriter, type Column, type Compression } from '../../pipeline/parquet.ts';
import { safePoint } from '../../pipeline/interrupt.ts';
import type { Pair, SftRow, Split } from '../../core/records.ts';
import { SPLITS, StoredBucketReader, bucketFile, readBucketSessions, readPairs, readSplitInfo, type PairSide } from '../layout.ts';
import { Redactor } from '../../core/redact.ts';
import { cardTexts, datasetCard } from './card.ts';
import { ktoRow, maskPair, maskSession } from './rows.ts';
import { DATASETS, KTO_COLUMNS, PAIR_COLUMNS, SESSION_COLUMNS, SFT_COLUMNS } from './schema.ts';

type Writers = Record<Split, ParquetTableWriter<object>>;

import type { StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

async function openPair(dir: string, columns: Record<string, Column>, cfg: Config): Promise<Writers> {
  await mkdir(dir, { recursive: true });
  const options = { rowGroupSize: cfg.row_group_size, compression: cfg.compression as Compression };
  return {
    train: await ParquetTableWriter.open(join(dir, 'train.parquet'), columns, options),
    test: await ParquetTableWriter.open(join(dir, 'test.parquet'), columns, options),
  };
}

export async function run({ config: cfg, out, input, lineage, log, signal }: StageContext<Config>): Promise<StageReport> {
  const folders = { split: input('split'), ingest: input('ingest') };
  const info = await readSplitInfo(folders.split);
  const r = cfg.redaction;
  // One Redactor per row: placeholders are consistent within a row and say nothing across rows.
  const mask = r.enabled ? () => new Redactor({ kinds: r.kinds, keys: r.keys, sessionValues: r.session_values }) : null;
  const w = {
    sessions: await openPair(join(out, 'sessions'), SESSION_COLUMNS, cfg),
    sft: await openPair(join(out, 'sft'), SFT_COLUMNS, cfg),
    pairs: await openPair(join(out, 'pairs'), PAIR_COLUMNS, cfg),
    kto: await openPair(join(out, 'kto'), KTO_COLUMNS, cfg),
  };
  let ktoSkipped = 0;
  // Every bucket's sessions are read into the same buffers.
  const reader = new StoredBucketReader();
  for (const side of SPLITS) {
    const progress = log.progress(`export ${side} sessions`, info.buckets);
    for (let b = 0; b < info.buckets; b++) {
      await safePoint(signal, () => `export: stopped at ${side} bucket ${b + 1} of ${info.buckets}; the next run exports again`);
      for await (const logged of readBucketSessions(bucketFile(folders.split, side, b), folders.ingest, reader)) {
        const s = mask ? maskSession(logged, mask()) : logged;
        await w.sessions[side].append(s);
        if (s.reward >= cfg.sft_min_reward) {
          await w.sft[side].append({ messages: s.messages, session_id: s.session_id, task_id: s.task_id, reward: s.reward } satisfies SftRow);
        }
        const label = s.reward >= cfg.kto_desirable_min ? true : s.reward <= cfg.kto_undesirable_max ? false : null;
        if (label !== null) {
          const row = ktoRow(s, label);
          if (row) await w.kto[side].append(row);
          else ktoSkipped++;
        }
      }
      progress.tick();
    }
    progress.done();
    // A file's footer describes every row group, and the writer holds it until the file closes: each file
    // closes once its last row is in, so that no more than one side's pairs footer is held at a time.
    for (const name of ['sessions', 'sft', 'kto'] as const) await w[name][side].close();
    // The gate's pairs point at their sessions' messages in split's buckets: made whole here, bucket by bucket.
    for await (const { whole } of readPairs<Pair<PairSide>>(join(input('gate'), `${side}.jsonl`), folders, info.buckets)) await w.pairs[side].append(mask ? maskPair(whole, mask()) : whole);
    await w.pairs[side].close();
  }
  const counts: Record<string, number> = {};
  for (const name of DATASETS) for (const side of SPLITS) counts[`${name}_${side}`] = w[name][side].rows;

  const configHash = hashJson([...lineage.map((l) => l.config_hash), hashJson(cfg)]);
  const madeAt = new Date().toISOString();
  const cards = cardTexts(cfg);
  if (r.enabled) for (const c of Object.values(cards)) c.howMade.push(`Personal data (${r.kinds.join(', ')}; keys ${r.keys.join(', ')}) masked with per-row placeholders such as [PHONE_1].`);
  for (const name of DATASETS) {
    const c = cards[name];
    const card = datasetCard({ name, ...c, counts: { train: counts[`${name}_train`]!, test: counts[`${name}_test`]! }, configHash, lineage, madeAt });
    await writeFile(join(out, name, 'README.md'), card);
  }
  return {
    counts: { ...counts, kto_without_assistant: ktoSkipped },
    summary: DATASETS.map((d) => `${d} ${counts[`${d}_train`]}/${counts[`${d}_test`]}`).join(', ') + ' rows (train/test)',
  };
}
