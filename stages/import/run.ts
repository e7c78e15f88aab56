// The import stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { join } from 'node:path';
import { hashJson } from '../../pipeline/hash.ts';
import { JsonlWriter } from '../../pipeline/jsonl.ts';
import { every, safePoint } from '../../pipeline/interrupt.ts';
import {
  detectFormat,
  quarantineText,
  readRecords,
  recordLimit,
  type InputFormat,
  type QuarantineRecord,
} from '../../pipeline/records.ts';
import { UsageError } from '../../pipeline/errors.ts';
import { SPLITS, pairId, type CandidatePair } from '../../core/records.ts';
import { ImportError, detectImport, readPairs, type ImportFormat } from './formats.ts';

import type { StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

export async function run({ config: cfg, out, external, log, signal }: StageContext<Config>): Promise<StageReport> {
  const writers = Object.fromEntries(SPLITS.map((s) => [s, new JsonlWriter(join(out, `${s}.jsonl`))]));
  const quarantine = new JsonlWriter(join(out, 'quarantine.jsonl'));
  const counts: Record<string, number> = {
    train: 0,
    test: 0,
    records: 0,
    quarantined: 0,
    duplicates: 0,
    files: external.length,
    hh: 0,
    trl: 0,
    ultrafeedback: 0,
  };
  // A pair met before (the same prompt and sides, in this file or another) is counted, not written again.
  const seen = new Set<string>();
  const due = every(1000);
  for (const file of external) {
    const fileFormat: InputFormat | null = cfg.file_format === 'auto' ? detectFormat(file.path) : cfg.file_format;
    if (!fileFormat)
      throw new UsageError(
        `${file.name}: cannot tell its format from the name; use .jsonl, .json or .parquet, or set import.file_format`,
      );
    const limit = recordLimit(cfg.max_record_bytes, 'import.max_record_bytes', signal);
    for await (const record of readRecords(file.path, fileFormat, limit)) {
      if (due())
        await safePoint(
          signal,
          () => `import: stopped while reading ${file.name}; the next run reads every file again`,
        );
      if (!record.damaged) counts.records!++;
      let read;
      let format: ImportFormat | null = null;
      try {
        if (record.error !== undefined) throw new ImportError(record.error);
        format = cfg.format === 'auto' ? detectImport(record.value, cfg.mapping) : cfg.format;
        read = readPairs(record.value, format, cfg.mapping);
      } catch (error) {
        if (!(error instanceof ImportError))
          throw new Error(`import: ${file.name} ${record.where}: ${(error as Error).message}`, { cause: error });
        counts.quarantined!++;
        await quarantine.write({
          file: file.name,
          where: record.where,
          reason: `${format ? `${format}: ` : ''}${error.message}`,
          raw: quarantineText(record.raw),
        } satisfies QuarantineRecord);
        continue;
      }
      counts[format]!++;
      for (const [k, p] of read.entries()) {
        const id = pairId('imported', hashJson(p.chosen), hashJson(p.rejected), hashJson(p.prompt));
        if (seen.has(id)) {
          counts.duplicates!++;
          continue;
        }
        seen.add(id);
        const promptKey = hashJson({ seed: cfg.seed, prompt: p.prompt });
        const split = parseInt(promptKey.slice(0, 8), 16) / 0xffffffff < cfg.test_ratio ? 'test' : 'train';
        // Each side's id names where it came from: file, place, and which pair of the record.
        const sideId = (side: string) => `${file.name}#${record.where}#${k}:${side}`;
        const pair: CandidatePair = {
          pair_id: id,
          prompt: p.prompt,
          chosen: p.chosen,
          rejected: p.rejected,
          chosen_reward: p.chosenRating,
          rejected_reward: p.rejectedRating,
          margin: p.chosenRating !== null && p.rejectedRating !== null ? p.chosenRating - p.rejectedRating : null,
          confidence: 1,
          source: 'imported',
          negative_type: null,
          judge: 'imported',
          task_id: `imported-${promptKey.slice(0, 16)}`,
          chosen_session_id: sideId('chosen'),
          rejected_session_id: sideId('rejected'),
          split,
          metadata: JSON.stringify({ imported_from: file.name, where: record.where, format }),
        };
        await writers[split]!.write(pair);
        counts[split]!++;
      }
    }
    log.info('imported', { file: file.name, train: counts.train, test: counts.test, quarantined: counts.quarantined });
  }
  for (const w of Object.values(writers)) await w.close();
  await quarantine.close();
  return {
    counts,
    summary: external.length
      ? `${counts.train} train / ${counts.test} test pairs from ${counts.records} records of ${external.length} file(s) (${counts.hh} HH-RLHF, ${counts.trl} TRL, ${counts.ultrafeedback} UltraFeedback), ${counts.quarantined} quarantined, ${counts.duplicates} duplicates dropped`
      : 'nothing to import (import.inputs is empty)',
  };
}
