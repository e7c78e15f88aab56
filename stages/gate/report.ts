// The gate's decision for one judged pair, and its report per source and negative type: what came in, what
// was kept, how sure the judges were, how often they flipped with the order or abstained, and what it cost.
import type { JudgedPair, PairSource } from '../../core/records.ts';
import type { CalibrationRow } from './calibration.ts';

export interface GateOptions {
  minConfidence: number;
  /** Pairs whose margin is known and below this are dropped. */
  minMargin: number | null;
  sources: readonly PairSource[];
}

/** report.json: the gate's options, the judges, its rows per source and negative type, and the judges as measured. */
export interface GateReportFile {
  options: GateOptions;
  judges: string[];
  endpoint: unknown;
  rows: ReportRow[];
  calibration: CalibrationRow[] | null;
}

/** Why the pair is dropped, or null to keep it. */
export function gateReason(p: JudgedPair<unknown>, o: GateOptions): string | null {
  if (!o.sources.includes(p.source)) return `source ${p.source} is not in gate.sources`;
  if (p.verdict.winner === 'abstain')
    return `the judges abstained${p.verdict.rationale ? `: ${p.verdict.rationale}` : ''}`;
  if (p.verdict.winner === 'tie') return 'the judges call it a tie';
  if (p.verdict.winner === 'b') return 'the judges prefer the rejected side';
  if (p.confidence < o.minConfidence) return `confidence ${p.confidence.toFixed(3)} is below ${o.minConfidence}`;
  if (o.minMargin !== null && p.margin !== null && p.margin < o.minMargin)
    return `margin ${p.margin.toFixed(3)} is below ${o.minMargin}`;
  return null;
}

/** Per group, counted as they are: ties, reversed (the judges preferred the side built as rejected), and the cost. */
const COUNTED = ['ties', 'reversed', 'parse_failures', 'request_errors', 'requests', 'cached'] as const;
type Counted = Record<(typeof COUNTED)[number], number>;

export type ReportRow = {
  source: PairSource;
  negative_type: string | null;
  judged: number;
  kept: number;
  /** kept / judged */
  coverage: number;
  /** Over the kept pairs. */
  mean_confidence: number | null;
  mean_margin: number | null;
  /** Share of comparisons whose LLM orders disagreed. */
  flip_rate: number;
  abstain_rate: number;
} & Counted;

type Acc = {
  judged: number;
  kept: number;
  confidence: number;
  margin: number;
  margins: number;
  flipped: number;
  abstained: number;
} & Counted;

const empty = (): Acc => ({
  judged: 0,
  kept: 0,
  confidence: 0,
  margin: 0,
  margins: 0,
  flipped: 0,
  abstained: 0,
  ...(Object.fromEntries(COUNTED.map((k) => [k, 0])) as Counted),
});

/** Adds judged pairs one at a time; `rows()` gives the report so far, one row per (source, negative type) and a total. */
export class GateReport {
  private readonly groups = new Map<string, { source: PairSource; negative_type: string | null; acc: Acc }>();

  add(p: JudgedPair<unknown>, kept: boolean): void {
    const key = `${p.source}/${p.negative_type ?? ''}`;
    let g = this.groups.get(key);
    if (!g) this.groups.set(key, (g = { source: p.source, negative_type: p.negative_type, acc: empty() }));
    const a = g.acc;
    a.judged++;
    if (kept) {
      a.kept++;
      a.confidence += p.confidence;
      if (p.margin !== null) {
        a.margin += p.margin;
        a.margins++;
      }
    }
    if (p.judge_stats.flipped) a.flipped++;
    if (p.verdict.winner === 'abstain') a.abstained++;
    if (p.verdict.winner === 'tie') a.ties++;
    if (p.verdict.winner === 'b') a.reversed++;
    a.parse_failures += p.judge_stats.parse_failures;
    a.request_errors += p.judge_stats.errors;
    a.requests += p.judge_stats.requests;
    a.cached += p.judge_stats.cached;
  }

  rows(): ReportRow[] {
    const sorted = [...this.groups.values()].sort((x, y) =>
      `${x.source}/${x.negative_type ?? ''}`.localeCompare(`${y.source}/${y.negative_type ?? ''}`),
    );
    const total = empty();
    for (const { acc } of sorted) for (const k of Object.keys(total) as (keyof Acc)[]) total[k] += acc[k];
    return [...sorted.map((g) => row(g.source, g.negative_type, g.acc)), row('total' as PairSource, null, total)];
  }
}

function row(source: PairSource, negative_type: string | null, a: Acc): ReportRow {
  const rate = (n: number) => (a.judged ? n / a.judged : 0);
  return {
    source,
    negative_type,
    judged: a.judged,
    kept: a.kept,
    coverage: rate(a.kept),
    mean_confidence: a.kept ? a.confidence / a.kept : null,
    mean_margin: a.margins ? a.margin / a.margins : null,
    flip_rate: rate(a.flipped),
    abstain_rate: rate(a.abstained),
    ...(Object.fromEntries(COUNTED.map((k) => [k, a[k]])) as Counted),
  };
}

const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
const num = (x: number | null) => (x === null ? '–' : x.toFixed(3));

/** The report as a Markdown table, for people. */
export function reportMarkdown(
  rows: ReportRow[],
  options: GateOptions,
  endpoint: unknown,
  calibration: CalibrationRow[] | null,
): string {
  const lines = [
    '# Gate report',
    '',
    `Kept: pairs the judges confirm with confidence ≥ ${options.minConfidence}${options.minMargin === null ? '' : ` and, where known, margin ≥ ${options.minMargin}`}; sources ${options.sources.join(', ')}.`,
    '',
    '| source | negative type | judged | kept | coverage | mean confidence | mean margin | flip rate | abstain rate | ties | reversed | parse failures | request errors | requests | from cache |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
    ...rows.map(
      (r) =>
        `| ${r.source} | ${r.negative_type ?? ''} | ${r.judged} | ${r.kept} | ${pct(r.coverage)} | ${num(r.mean_confidence)} | ${num(r.mean_margin)} | ${pct(r.flip_rate)} | ${pct(r.abstain_rate)} | ${r.ties} | ${r.reversed} | ${r.parse_failures} | ${r.request_errors} | ${r.requests} | ${r.cached} |`,
    ),
    '',
    'flip rate: comparisons whose two orders disagreed (a judge preferring a position); they abstain. reversed: the judges preferred the side built as rejected.',
  ];
  if (calibration) {
    lines.push(
      '',
      '## Judges, measured',
      '',
      'Each judge other than the verifier on the pairs whose truth is known (the verifier decided them, their rewards differ, or they are hard negatives). A pair the verifier did not decide is decided by the judges trusted on its group (source and negative type, or the source), each weighing by its lower bound; the others decide nothing.',
      '',
      '| judge | group | votes | correct | accuracy | 95% interval | trusted |',
      '|---|---|---|---|---|---|---|',
      ...calibration.map(
        (c) =>
          `| ${c.judge} | ${c.group} | ${c.votes} | ${c.correct} | ${pct(c.accuracy)} | ${pct(c.low)}–${pct(c.high)} | ${c.trusted ? 'yes' : c.too_few ? 'no: too few votes' : 'no'} |`,
      ),
    );
    if (calibration.length === 0)
      lines.push('| (no judge other than the verifier voted on a pair of known truth) | | | | | | |');
  }
  if (endpoint) lines.push('', `Endpoint: \`${JSON.stringify(endpoint)}\``);
  return lines.join('\n') + '\n';
}
