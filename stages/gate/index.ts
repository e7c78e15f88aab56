// gate: keeps the pairs the judges confirm with enough confidence (abstain > guess), drops the rest with
// the reason, and reports per source and negative type. Changing the threshold reruns this stage alone:
// no judge is asked again.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { JsonlWriter, readJsonl } from '../../pipeline/jsonl.ts';
import { readJsonFile } from '../../pipeline/workspace.ts';
import { defineStage } from '../../pipeline/stage.ts';
import { PAIR_SOURCES, type JudgedPair, type Pair, type PairSource } from '../../core/records.ts';
import { SPLITS } from '../layout.ts';
import { GateReport, gateReason, reportMarkdown, type GateOptions } from './report.ts';

const config = z.strictObject({
  min_confidence: z.number().min(0).max(1).default(0.5).describe('The least confidence a kept pair has.'),
  min_margin: z.number().min(0).nullable().default(null).describe('Drop pairs whose margin is known and below this; null: no margin filter.'),
  sources: z.array(z.enum(PAIR_SOURCES as [PairSource, ...PairSource[]])).default([...PAIR_SOURCES]).describe('Sources whose pairs may be kept.'),
});

/** The exported pair: the judged record without the judging details. */
function exported(p: JudgedPair): Pair {
  const { metadata: _m, verdict: _v, verdicts: _vs, judge_stats: _s, ...pair } = p;
  return pair;
}

export const gate = defineStage({
  name: 'gate',
  description: 'keep pairs the judges confirm with enough confidence; report per source and negative type',
  version: 1,
  inputs: ['judge'],
  outputs: ['train.jsonl', 'test.jsonl', 'dropped.jsonl', 'report.json', 'report.md'],
  config,

  async run({ config: cfg, out, input, log }) {
    const options: GateOptions = { minConfidence: cfg.min_confidence, minMargin: cfg.min_margin, sources: cfg.sources };
    const report = new GateReport();
    const dropped = new JsonlWriter(join(out, 'dropped.jsonl'));
    const counts: Record<string, number> = { train: 0, test: 0, dropped: 0 };
    for (const side of SPLITS) {
      const writer = new JsonlWriter(join(out, `${side}.jsonl`));
      const progress = log.progress(`gate ${side}`);
      for await (const p of readJsonl<JudgedPair>(join(input('judge'), `${side}.jsonl`))) {
        const reason = gateReason(p, options);
        report.add(p, reason === null);
        if (reason === null) {
          await writer.write(exported(p));
          counts[side]!++;
        } else {
          await dropped.write({ pair_id: p.pair_id, split: p.split, source: p.source, negative_type: p.negative_type, task_id: p.task_id, chosen_session_id: p.chosen_session_id, rejected_session_id: p.rejected_session_id, confidence: p.confidence, judge: p.judge, reason });
          counts.dropped!++;
        }
        progress.tick();
      }
      progress.done();
      await writer.close();
    }
    await dropped.close();
    const rows = report.rows();
    const judgeReport = await readJsonFile<{ endpoint: unknown; judges: string[] }>(join(input('judge'), 'report.json'));
    await writeFile(join(out, 'report.json'), JSON.stringify({ options, judges: judgeReport?.judges ?? [], endpoint: judgeReport?.endpoint ?? null, rows }, null, 2) + '\n');
    await writeFile(join(out, 'report.md'), reportMarkdown(rows, options, judgeReport?.endpoint ?? null));
    const total = rows.at(-1)!;
    for (const r of rows.slice(0, -1)) counts[`kept_${r.source}${r.negative_type ? `_${r.negative_type}` : ''}`] = r.kept;
    return {
      counts: { ...counts, flipped: Math.round(total.flip_rate * total.judged), abstained: Math.round(total.abstain_rate * total.judged), reversed: total.reversed },
      summary: `kept ${counts.train} train / ${counts.test} test of ${total.judged} judged (${(100 * total.coverage).toFixed(1)}%, confidence ≥ ${cfg.min_confidence}); ${counts.dropped} dropped with reasons in dropped.jsonl`,
    };
  },
});
