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
import { Calibration } from './calibration.ts';
import { GateReport, gateReason, reportMarkdown, type GateOptions } from './report.ts';

const config = z.strictObject({
  min_confidence: z.number().min(0).max(1).default(0.5).describe('The least confidence a kept pair has.'),
  min_margin: z.number().min(0).nullable().default(null).describe('Drop pairs whose margin is known and below this; null: no margin filter.'),
  sources: z.array(z.enum(PAIR_SOURCES as [PairSource, ...PairSource[]])).default([...PAIR_SOURCES]).describe('Sources whose pairs may be kept.'),
  calibration: z
    .strictObject({
      enabled: z.boolean().default(true).describe("Decide the pairs the verifier did not by each judge's measured accuracy (a Wilson lower bound above chance earns a vote) instead of the confidence the judges report; false: as the judges said."),
      min_votes: z.number().int().min(1).default(20).describe("Votes of known truth a group (source and negative type) needs before its own accuracy is used; below it the source's, and with fewer there too the judge decides nothing there."),
      z: z.number().positive().default(1.96).describe("The Wilson interval's z: 1.96 is 95%."),
      min_reward_gap: z.number().min(0).max(1).default(0.1).describe('A reward gap at least this wide says which side is truly better.'),
    })
    .prefault({}).describe('How judges earn their weight: measured on the pairs whose truth is known (the verifier decided them, their rewards differ, or they are hard negatives), per source and negative type.'),
});

/** The exported pair: the judged record without the judging details. */
function exported(p: JudgedPair): Pair {
  const { metadata: _m, verdict: _v, verdicts: _vs, judge_stats: _s, ...pair } = p;
  return pair;
}

export const gate = defineStage({
  name: 'gate',
  description: 'keep pairs the judges confirm with enough confidence; report per source and negative type',
  version: 2,
  inputs: ['judge'],
  outputs: ['train.jsonl', 'test.jsonl', 'dropped.jsonl', 'report.json', 'report.md'],
  config,

  async run({ config: cfg, out, input, log }) {
    const options: GateOptions = { minConfidence: cfg.min_confidence, minMargin: cfg.min_margin, sources: cfg.sources };
    // First every judge is measured where the truth is known, then every pair is gated.
    const c = cfg.calibration;
    const calibration = c.enabled ? new Calibration({ minVotes: c.min_votes, z: c.z, minRewardGap: c.min_reward_gap }) : null;
    if (calibration) for (const side of SPLITS) for await (const p of readJsonl<JudgedPair>(join(input('judge'), `${side}.jsonl`))) calibration.add(p);
    const report = new GateReport();
    const dropped = new JsonlWriter(join(out, 'dropped.jsonl'));
    const counts: Record<string, number> = { train: 0, test: 0, dropped: 0 };
    for (const side of SPLITS) {
      const writer = new JsonlWriter(join(out, `${side}.jsonl`));
      const progress = log.progress(`gate ${side}`);
      for await (const judged of readJsonl<JudgedPair>(join(input('judge'), `${side}.jsonl`))) {
        const p = calibration ? calibration.decide(judged) : judged;
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
    const measured = calibration?.rows() ?? null;
    await writeFile(join(out, 'report.json'), JSON.stringify({ options, judges: judgeReport?.judges ?? [], endpoint: judgeReport?.endpoint ?? null, rows, calibration: measured }, null, 2) + '\n');
    await writeFile(join(out, 'report.md'), reportMarkdown(rows, options, judgeReport?.endpoint ?? null, measured));
    const total = rows.at(-1)!;
    for (const r of rows.slice(0, -1)) counts[`kept_${r.source}${r.negative_type ? `_${r.negative_type}` : ''}`] = r.kept;
    return {
      counts: { ...counts, flipped: Math.round(total.flip_rate * total.judged), abstained: Math.round(total.abstain_rate * total.judged), reversed: total.reversed },
      summary:
        `kept ${counts.train} train / ${counts.test} test of ${total.judged} judged (${(100 * total.coverage).toFixed(1)}%, confidence ≥ ${cfg.min_confidence}); ${counts.dropped} dropped with reasons in dropped.jsonl` +
        (measured ? `; judges measured: ${measured.filter((r) => r.group === 'all').map((r) => `${r.judge} ${(100 * r.accuracy).toFixed(0)}% of ${r.votes}${r.trusted ? '' : ' (untrusted)'}`).join(', ') || 'none voted on a pair of known truth'}` : ''),
    };
  },
});
