// The gate stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { JsonlWriter, readJsonl } from '../../pipeline/jsonl.ts';
import { readJsonFile } from '../../pipeline/workspace.ts';
import { SPLITS, type JudgedPair, type Pair } from '../../core/records.ts';
import type { PairSide } from '../../store/messages.ts';
import { Calibration } from './calibration.ts';
import { GateReport, gateReason, reportMarkdown, type GateOptions, type GateReportFile } from './report.ts';

import type { StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

/** The exported pair: the judged record without the judging details (its sides as the judge stored them). */
function exported(p: JudgedPair<PairSide>): Pair<PairSide> {
  const { metadata: _m, verdict: _v, verdicts: _vs, judge_stats: _s, ...pair } = p;
  return pair;
}

export async function run({ config: cfg, out, input, log }: StageContext<Config>): Promise<StageReport> {
  const options: GateOptions = { minConfidence: cfg.min_confidence, minMargin: cfg.min_margin, sources: cfg.sources };
  // First every judge is measured where the truth is known, then every pair is gated.
  const c = cfg.calibration;
  const calibration = c.enabled
    ? new Calibration({ minVotes: c.min_votes, z: c.z, minRewardGap: c.min_reward_gap })
    : null;
  if (calibration)
    for (const side of SPLITS)
      for await (const p of readJsonl<JudgedPair<PairSide>>(join(input('judge'), `${side}.jsonl`))) calibration.add(p);
  const report = new GateReport();
  const dropped = new JsonlWriter(join(out, 'dropped.jsonl'));
  const counts: Record<string, number> = { train: 0, test: 0, dropped: 0 };
  for (const side of SPLITS) {
    const writer = new JsonlWriter(join(out, `${side}.jsonl`));
    const progress = log.progress(`gate ${side}`);
    for await (const judged of readJsonl<JudgedPair<PairSide>>(join(input('judge'), `${side}.jsonl`))) {
      const p = calibration ? calibration.decide(judged) : judged;
      const reason = gateReason(p, options);
      report.add(p, reason === null);
      if (reason === null) {
        await writer.write(exported(p));
        counts[side]!++;
      } else {
        await dropped.write({
          pair_id: p.pair_id,
          split: p.split,
          source: p.source,
          negative_type: p.negative_type,
          task_id: p.task_id,
          chosen_session_id: p.chosen_session_id,
          rejected_session_id: p.rejected_session_id,
          confidence: p.confidence,
          judge: p.judge,
          reason,
        });
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
  await writeFile(
    join(out, 'report.json'),
    JSON.stringify(
      {
        options,
        judges: judgeReport?.judges ?? [],
        endpoint: judgeReport?.endpoint ?? null,
        rows,
        calibration: measured,
      } satisfies GateReportFile,
      null,
      2,
    ) + '\n',
  );
  await writeFile(join(out, 'report.md'), reportMarkdown(rows, options, judgeReport?.endpoint ?? null, measured));
  const total = rows.at(-1)!;
  for (const r of rows.slice(0, -1)) counts[`kept_${r.source}${r.negative_type ? `_${r.negative_type}` : ''}`] = r.kept;
  return {
    counts: {
      ...counts,
      flipped: Math.round(total.flip_rate * total.judged),
      abstained: Math.round(total.abstain_rate * total.judged),
      reversed: total.reversed,
    },
    summary:
      `kept ${counts.train} train / ${counts.test} test of ${total.judged} judged (${(100 * total.coverage).toFixed(1)}%, confidence ≥ ${cfg.min_confidence}); ${counts.dropped} dropped with reasons in dropped.jsonl` +
      (measured
        ? `; judges measured: ${
            measured
              .filter((r) => r.group === 'all')
              .map(
                (r) => `${r.judge} ${(100 * r.accuracy).toFixed(0)}% of ${r.votes}${r.trusted ? '' : ' (untrusted)'}`,
              )
              .join(', ') || 'none voted on a pair of known truth'
          }`
        : ''),
  };
}
