// export: the sessions table and the SFT, preference-pair and KTO datasets as Parquet, each with a card.
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { hashJson } from '../../pipeline/hash.ts';
import { readJsonl } from '../../pipeline/jsonl.ts';
import { ParquetTableWriter, type Column, type Compression } from '../../pipeline/parquet.ts';
import { safePoint } from '../../pipeline/interrupt.ts';
import { defineStage } from '../../pipeline/stage.ts';
import type { Pair, SftRow, Split, SplitSession } from '../../core/records.ts';
import { SPLITS, bucketFile, readSplitInfo } from '../layout.ts';
import { Redactor, redactionConfig } from '../../core/redact.ts';
import { DATASETS, cardTexts, datasetCard } from './card.ts';
import { ktoRow, maskPair, maskSession } from './rows.ts';
import { KTO_COLUMNS, PAIR_COLUMNS, SESSION_COLUMNS, SFT_COLUMNS } from './schema.ts';

type Writers = Record<Split, ParquetTableWriter<object>>;

const config = z.strictObject({
  sft_min_reward: z.number().min(0).max(1).default(0.7).describe('Sessions with at least this reward are SFT examples.'),
  kto_desirable_min: z.number().min(0).max(1).default(0.7).describe('KTO: a session with at least this reward is a desirable row; sessions between the two thresholds are left out.'),
  kto_undesirable_max: z.number().min(0).max(1).default(0.3).describe('KTO: a session with at most this reward is an undesirable row; sessions between the two thresholds are left out.'),
  row_group_size: z.number().int().min(1).default(1000).describe('Parquet rows per row group: the unit a reader loads at once.'),
  redaction: redactionConfig.extend({ enabled: z.boolean().default(false).describe('Off by default: the datasets keep the values as logged.') }).prefault({}).describe("Mask personal data in every exported text (messages, feedback, metadata), as before a judge's request; off by default."),
  compression: z.enum(['snappy', 'gzip', 'uncompressed']).default('snappy').describe('Parquet compression: snappy is fast, gzip smaller.'),
});
type ExportConfig = z.infer<typeof config>;


async function openPair(dir: string, columns: Record<string, Column>, cfg: ExportConfig): Promise<Writers> {
  await mkdir(dir, { recursive: true });
  const options = { rowGroupSize: cfg.row_group_size, compression: cfg.compression as Compression };
  return {
    train: await ParquetTableWriter.open(join(dir, 'train.parquet'), columns, options),
    test: await ParquetTableWriter.open(join(dir, 'test.parquet'), columns, options),
  };
}

export const exportStage = defineStage({
  name: 'export',
  description: 'write sessions, SFT, pairs and KTO datasets as Parquet with dataset cards',
  version: 2,
  inputs: ['split', 'gate'],
  outputs: [...DATASETS],
  config,

  async run({ config: cfg, out, input, lineage, log, signal }) {
    const splitDir = input('split');
    const info = await readSplitInfo(splitDir);
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
    for (const side of SPLITS) {
      const progress = log.progress(`export ${side} sessions`, info.buckets);
      for (let b = 0; b < info.buckets; b++) {
        await safePoint(signal, () => `export: stopped at ${side} bucket ${b + 1} of ${info.buckets}; the next run exports again`);
        for await (const logged of readJsonl<SplitSession>(bucketFile(splitDir, side, b))) {
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
      for await (const pair of readJsonl<Pair>(join(input('gate'), `${side}.jsonl`))) await w.pairs[side].append(mask ? maskPair(pair, mask()) : pair);
    }
    const counts: Record<string, number> = {};
    for (const name of DATASETS) {
      for (const side of SPLITS) {
        await w[name][side].close();
        counts[`${name}_${side}`] = w[name][side].rows;
      }
    }

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
  },
});
