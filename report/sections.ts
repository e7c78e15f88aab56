// The report's sections as HTML: the tables are written here, the plots and the pair browser are places the
// page's script fills (client/). A section whose files are not in the workspace is left out.
import { pairedLine } from '../core/paired-success.ts';
import type { Plot } from './data.ts';
import type { Gathered } from './gather.ts';

export interface Section {
  id: string;
  title: string;
  html: string;
}

export function sections(g: Gathered, plots: Plot[], withPairs: boolean): Section[] {
  const out: (Section | null)[] = [
    funnel(g),
    judges(g),
    training(g, plots),
    evaluation(g),
    loop(g, plots),
    withPairs ? { id: 'pairs', title: 'Pairs', html: '<div id="pair-browser"></div>' } : null,
  ];
  return out.filter((s): s is Section => s !== null);
}

export const esc = (s: string) =>
  s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);

/** A count as a table shows it (thousands separated); '—' for none. */
const count = (v: number | null | undefined) =>
  v === null || v === undefined || !Number.isFinite(v) ? '—' : v.toLocaleString('en-US');

/** A figure as a table shows it: to `places` places, so a column lines up; '—' for none. */
const fig = (v: number | null | undefined, places = 3) =>
  v === null || v === undefined || !Number.isFinite(v) ? '—' : v.toFixed(places);

/** A time of a record (ISO 8601) to the second, on one line. */
const when = (iso: string) => `<span class="nowrap">${esc(iso.slice(0, 19).replace('T', ' '))}</span>`;

const pct = (v: number | null | undefined) => (v === null || v === undefined ? '—' : `${(100 * v).toFixed(1)}%`);

/** A table: `head` escaped, each cell already HTML; `numeric` columns right-aligned. */
function table(head: string[], rows: string[][], numeric: number[] = []): string {
  const align = (i: number) => (numeric.includes(i) ? ' class="n"' : '');
  return `<table><thead><tr>${head.map((h, i) => `<th${align(i)}>${esc(h)}</th>`).join('')}</tr></thead><tbody>${rows
    .map((r) => `<tr>${r.map((c, i) => `<td${align(i)}>${c}</td>`).join('')}</tr>`)
    .join('')}</tbody></table>`;
}

const note = (text: string) => `<p class="note">${text}</p>`;
const source = (text: string) => `<p class="source">From ${esc(text)}.</p>`;

function funnel(g: Gathered): Section | null {
  if (g.stages.length === 0) return null;
  const counts = (stage: string) => g.stages.find((s) => s.stage === stage)?.manifest?.counts ?? null;
  const parts: string[] = [];
  const stageRows = g.stages.map((a) => {
    const state = a.lastFailure
      ? `<span class="bad">${esc(a.lastFailure.status)}</span>`
      : a.state === 'fresh'
        ? 'fresh'
        : `<span class="warn" title="${esc(a.reasons.join('; '))}">stale</span>`;
    return [
      esc(a.stage),
      state,
      a.manifest ? when(a.manifest.finished_at) : '—',
      a.manifest ? fig(a.manifest.seconds, 1) : '—',
      // A summary's first line: the eval stage's goes on with its table, shown in full below.
      esc(a.lastFailure?.error ?? a.manifest?.summary.split('\n')[0] ?? ''),
    ];
  });
  parts.push(table(['stage', 'state', 'finished (UTC)', 'seconds', 'what it did'], stageRows, [3]));
  parts.push(source('each stage’s manifest.json (its counts and summary) and .runs/'));

  const ingest = counts('ingest');
  const split = counts('split');
  const pairs = counts('pairs');
  const judge = counts('judge');
  const gate = counts('gate');
  const imported = counts('import');
  const bars: [string, number][] = [];
  if (ingest) bars.push(['sessions ingested', ingest.sessions ?? 0]);
  if (ingest) bars.push(['quarantined', ingest.quarantined ?? 0], ['duplicates dropped', ingest.duplicates ?? 0]);
  if (split) bars.push(['train sessions', split.train_sessions ?? 0], ['test sessions', split.test_sessions ?? 0]);
  if (pairs) bars.push(['pairs made', (pairs.train ?? 0) + (pairs.test ?? 0)]);
  if (imported && (imported.train ?? 0) + (imported.test ?? 0) > 0)
    bars.push(['pairs imported', (imported.train ?? 0) + (imported.test ?? 0)]);
  if (judge) bars.push(['comparisons judged', (judge.judged_train ?? 0) + (judge.judged_test ?? 0)]);
  if (gate) bars.push(['pairs kept', (gate.train ?? 0) + (gate.test ?? 0)], ['pairs dropped', gate.dropped ?? 0]);
  if (bars.length) {
    const top = Math.max(1, ...bars.map((b) => b[1]));
    parts.push(
      `<h3>The funnel</h3><div class="funnel">${bars
        .map(
          ([label, n]) =>
            `<div class="bar-row"><span class="bar-label">${esc(label)}</span><span class="bar" style="width:${((100 * n) / top).toFixed(1)}%"></span><span class="bar-n">${count(n)}</span></div>`,
        )
        .join('')}</div>`,
      source('the counts in ingest/, split/, pairs/, import/, judge/ and gate/manifest.json'),
    );
  }

  for (const q of g.quarantine) {
    if (q.records === 0) continue;
    parts.push(
      `<h3>Quarantined records (${count(q.records)})</h3>`,
      table(
        ['reason (numbers and quoted values blanked)', 'records', 'first of them'],
        q.kinds.map((k) => [
          esc(k.reason),
          count(k.count),
          k.examples.map((e) => `${esc(e.file)} ${esc(e.where)}`).join('<br>'),
        ]),
        [1],
      ),
      source(q.file),
    );
  }

  if (g.gate) {
    const made = (source: string, type: string | null) =>
      source === 'outcome'
        ? pairs?.outcome
        : type && source === 'hard_negative'
          ? pairs?.[`hard_negative_${type}`]
          : undefined;
    parts.push(
      '<h3>Pairs by source and negative type</h3>',
      table(
        [
          'source',
          'negative type',
          'made',
          'judged',
          'kept',
          'kept share',
          'mean confidence',
          'abstained',
          'reversed',
          'order flips',
        ],
        g.gate.rows.map((r) => [
          esc(r.source),
          esc(r.negative_type ?? '—'),
          count(made(r.source, r.negative_type)),
          count(r.judged),
          count(r.kept),
          pct(r.coverage),
          fig(r.mean_confidence),
          pct(r.abstain_rate),
          count(r.reversed),
          pct(r.flip_rate),
        ]),
        [2, 3, 4, 5, 6, 7, 8, 9],
      ),
      source(
        `gate/report.json (the gate keeps a pair whose confidence is at least ${g.gate.options.minConfidence}${g.gate.options.minMargin === null ? '' : ` and margin at least ${g.gate.options.minMargin}`}) and pairs/manifest.json (made)`,
      ),
    );
  }
  if (g.dropped.length)
    parts.push(
      '<h3>Why the gate dropped pairs</h3>',
      table(
        ['reason', 'pairs'],
        g.dropped.map((d) => [esc(d.reason), count(d.count)]),
        [1],
      ),
      source('gate/dropped.jsonl'),
    );
  return { id: 'funnel', title: 'Data', html: parts.join('\n') };
}

function judges(g: Gathered): Section | null {
  const rows = g.gate?.calibration ?? [];
  if (rows.length === 0) return null;
  const interval = (low: number, acc: number, high: number) =>
    `<span class="interval" title="${fig(low)} to ${fig(high)}"><span class="span" style="left:${(100 * low).toFixed(1)}%;width:${(100 * (high - low)).toFixed(1)}%"></span><span class="dot" style="left:${(100 * acc).toFixed(1)}%"></span></span>`;
  return {
    id: 'judges',
    title: 'Judges',
    html: [
      note(
        'Each judge’s accuracy on the pairs whose answer is known (outcome pairs and hard negatives), per group, with its 95% interval; a judge is trusted in a group when it has the gate’s least number of votes there (min_votes) and its interval’s lower end clears the gate’s bar. A group “type@c” holds the votes the judge gave with confidence c.',
      ),
      table(
        ['judge', 'group', 'votes', 'correct', 'accuracy', '95% interval', '0 — 1', 'trusted'],
        rows.map((r) => [
          esc(r.judge),
          esc(r.group),
          count(r.votes),
          count(r.correct),
          fig(r.accuracy),
          `${fig(r.low)} – ${fig(r.high)}`,
          interval(r.low, r.accuracy, r.high),
          r.trusted ? 'yes' : r.too_few ? 'no: too few votes' : '<span class="bad">no</span>',
        ]),
        [2, 3, 4, 5],
      ),
      source('gate/report.json (calibration)'),
    ].join('\n'),
  };
}

/** Places for the plots whose ids start with `prefix`: the script draws each into its own. */
const figures = (plots: Plot[], prefix: string) =>
  plots
    .filter((p) => p.id.startsWith(prefix))
    .map(
      (p) =>
        `<figure class="plot" id="plot-${esc(p.id)}"><figcaption><b>${esc(p.title)}</b> ${esc(p.what)} <span class="source">From ${esc(p.source)}.</span></figcaption><div class="canvas"></div></figure>`,
    )
    .join('\n');

function training(g: Gathered, plots: Plot[]): Section | null {
  const parts: string[] = [];
  for (const [stage, name] of [
    ['sft', 'SFT'],
    ['dpo', 'Preference training'],
    ['dapo', 'DAPO'],
  ] as const) {
    if (!g.metrics[stage]?.length) continue;
    const summary = g.stages.find((s) => s.stage === stage)?.manifest?.summary;
    parts.push(
      `<h3>${name}</h3>`,
      summary ? note(esc(summary)) : '',
      `<div class="plots">${figures(plots, `${stage}-`)}</div>`,
    );
  }
  return parts.length ? { id: 'training', title: 'Training', html: parts.join('\n') } : null;
}

function evaluation(g: Gathered): Section | null {
  const e = g.eval;
  if (!e) return null;
  const models = Object.keys(e.models);
  const metrics = [...new Set(models.flatMap((m) => Object.keys(e.models[m]!)))];
  const parts = [
    table(
      ['', ...models],
      metrics.map((k) => [esc(k), ...models.map((m) => fig(e.models[m]![k]))]),
      models.map((_, i) => i + 1),
    ),
    source('eval/eval.json: each model on the same held-out pairs, SFT windows and validation episodes'),
    // eval.json files written before the paired comparison have none.
    ...Object.entries(e.against_sft ?? {}).map(([name, p]) => note(esc(pairedLine(name, 'sft', p)))),
  ];
  if (e.pairs_by_type) {
    const types = Object.entries(e.pairs_by_type);
    parts.push(
      '<h3>Pair accuracy by type, beside the shorter side</h3>',
      note(
        '“shorter” is the accuracy of always preferring the shorter side: a model that beats it by little may have learnt length, not the difference the type is about.',
      ),
      table(
        ['type', 'pairs', 'shorter', ...models],
        types.map(([type, t]) => [
          esc(type),
          count(t.pairs),
          fig(t.shorter_chosen),
          ...models.map((m) => {
            const a = t.accuracy[m];
            const beats = a !== null && a !== undefined && t.shorter_chosen !== null && a > t.shorter_chosen;
            return beats ? `<b>${fig(a)}</b>` : fig(a);
          }),
        ]),
        [1, 2, ...models.map((_, i) => i + 3)],
      ),
      source('eval/eval.json (pairs_by_type); bold: above the shorter side'),
    );
  }
  return { id: 'eval', title: 'Evaluation', html: parts.join('\n') };
}

function loop(g: Gathered, plots: Plot[]): Section | null {
  const parts: string[] = [];
  if (g.history?.length) {
    parts.push(
      '<h3>Registry history</h3>',
      table(
        ['when (UTC)', 'event', 'version', 'from', 'why', 'by'],
        g.history.map((e) => [
          when(e.at),
          esc(e.event),
          esc(e.version),
          esc('from' in e ? (e.from ?? '—') : 'parent' in e ? (e.parent ?? '—') : '—'),
          esc('reason' in e ? e.reason : ''),
          esc('by' in e ? (e.by ?? '') : ''),
        ]),
      ),
      source('registry/history.jsonl'),
    );
  }
  if (g.nights?.length) {
    parts.push(
      '<h3>Refresh nights</h3>',
      `<div class="plots">${figures(plots, 'nights-')}</div>`,
      table(
        [
          'night',
          'production',
          'candidate',
          'new pairs',
          'production success',
          'candidate success',
          'difference',
          'interval',
          'p',
          'decision',
          'why',
          'rollback check',
        ],
        g.nights.map((n) => {
          const s = n.comparison?.success;
          return [
            count(n.night),
            esc(n.production_before + (n.rollback.rolled_back ? ` → ${n.production}` : '')),
            esc(n.candidate ?? '—'),
            `${count(n.data.new_pairs)} of ${count(n.data.pairs)}`,
            fig(s?.production),
            fig(s?.candidate),
            fig(s?.difference),
            s ? `${fig(s.interval[0])} – ${fig(s.interval[1])}` : '—',
            s ? s.p.toPrecision(3) : '—',
            n.decision === 'promoted' ? '<b>promoted</b>' : esc(n.decision),
            esc(n.reason),
            esc(n.rollback.reason),
          ];
        }),
        [0, 3, 4, 5, 6, 8],
      ),
      source('refresh/nights.jsonl (each night’s refresh/nights/NNNN/report.json)'),
    );
  }
  return parts.length ? { id: 'loop', title: 'Registry and refresh', html: parts.join('\n') } : null;
}
