// The report's plots: which figures of a trainer's metrics.jsonl go together on one plot, and the refresh
// nights. A plot keeps the series its file has; a figure no plot names gets one of its own, so nothing a
// trainer logs goes unseen.
import type { Plot } from './data.ts';
import type { Gathered, Metrics } from './gather.ts';

interface Group {
  title: string;
  what: string;
  /** metrics.jsonl key → the series' label. */
  keys: Record<string, string>;
}

const TRAINING: Group[] = [
  { title: 'Loss', what: 'The training loss of each step (mean over its micro-batches).', keys: { loss: 'loss' } },
  {
    title: 'Rewards: accuracy',
    what: 'The share of pairs whose implicit reward (β × log-ratio to the reference) is higher for the chosen side.',
    keys: { 'rewards/accuracies': 'accuracy' },
  },
  {
    title: 'Rewards: chosen, rejected and margin',
    what: 'The implicit rewards of the chosen and rejected sides, and their difference.',
    keys: { 'rewards/chosen': 'chosen', 'rewards/rejected': 'rejected', 'rewards/margins': 'margin' },
  },
  {
    title: 'Log-probabilities',
    what: 'The policy’s summed log-probability of each side’s completion tokens.',
    keys: { 'logps/chosen': 'chosen', 'logps/rejected': 'rejected' },
  },
  {
    title: 'Reward',
    what: 'The mean episode reward of the step’s rollouts, and its spread.',
    keys: { reward_mean: 'mean', reward_std: 'standard deviation' },
  },
  {
    title: 'Success',
    what: 'The share of the step’s episodes that succeeded: all, without feedback notes in context, and with them.',
    keys: { success: 'all', success_plain: 'without feedback', success_guided: 'with feedback' },
  },
  {
    title: 'Validation',
    what: 'Success on the validation tasks (companies never trained on), on the steps that validated.',
    keys: {},
  },
  {
    title: 'Clipping',
    what: 'The share of tokens whose ratio was clipped below, above, and by the dual clip.',
    keys: { clip_low: 'low', clip_high: 'high', dual_clip: 'dual' },
  },
  {
    title: 'Entropy and KL',
    what: 'The policy’s mean token entropy, and its KL to the reference.',
    keys: { entropy: 'entropy', kl: 'KL' },
  },
  {
    title: 'Groups kept',
    what: 'Groups of episodes whose rewards differed (the ones DAPO learns from), of those sampled.',
    keys: { kept_groups: 'kept', groups: 'sampled' },
  },
  {
    title: 'Response length',
    what: 'The mean length of a reply in tokens, and the share cut off at the limit.',
    keys: { response_length: 'tokens', overlong: 'overlong share' },
  },
  { title: 'Gradient norm', what: 'The gradient’s global norm before clipping.', keys: { grad_norm: 'norm' } },
  {
    title: 'Learning rate',
    what: 'The learning rate of the step (warm-up, then the schedule).',
    keys: { learning_rate: 'rate' },
  },
  { title: 'Throughput', what: 'Tokens trained on per second of the step.', keys: { 'tokens/s': 'tokens/s' } },
];

/** Logged for bookkeeping, not for a plot. */
const NOT_PLOTTED = new Set(['step', 'episodes', 'guided']);

const TRAINERS = [
  ['sft', 'SFT'],
  ['dpo', 'Preference training'],
  ['dapo', 'DAPO'],
] as const;

/** Every plot of the report, in page order: each trainer's, then the refresh nights'. */
export function plotsOf(g: Gathered): Plot[] {
  const plots: Plot[] = [];
  for (const [stage, name] of TRAINERS) {
    const rows = g.metrics[stage];
    if (rows?.length) plots.push(...trainerPlots(stage, name, rows));
  }
  if (g.nights?.length) plots.push(...nightPlots(g.nights));
  // A series without a single number (a figure every step left out, nights with nothing to compare) draws nothing.
  return plots
    .map((p) => ({ ...p, series: p.series.filter((s) => s.values.some((v) => v !== null)) }))
    .filter((p) => p.series.length > 0);
}

/** A trainer's plots: each group with the series its rows have, then one plot per figure no group names. */
export function trainerPlots(stage: string, name: string, rows: Metrics[]): Plot[] {
  const present = new Set<string>();
  for (const r of rows)
    for (const [k, v] of Object.entries(r)) if (typeof v === 'number' && Number.isFinite(v)) present.add(k);
  const x = rows.map((r) => r.step!);
  const series = (keys: Record<string, string>) =>
    Object.entries(keys)
      .filter(([k]) => present.has(k))
      .map(([k, label]) => ({ label, values: rows.map((r) => finite(r[k])) }));
  const plot = (title: string, what: string, keys: Record<string, string>): Plot => ({
    id: `${stage}-${slug(title)}`,
    title: `${name}: ${title.charAt(0).toLowerCase()}${title.slice(1)}`,
    what,
    source: `${stage}/metrics.jsonl, a point a step`,
    xLabel: 'step',
    x,
    series: series(keys),
  });
  const named = new Set<string>(NOT_PLOTTED);
  const plots: Plot[] = [];
  for (const group of TRAINING) {
    const keys =
      group.title === 'Validation'
        ? Object.fromEntries([...present].filter((k) => k.startsWith('val/')).map((k) => [k, k.slice(4)]))
        : group.keys;
    for (const k of Object.keys(keys)) named.add(k);
    const p = plot(group.title, group.what, keys);
    if (p.series.length) plots.push(p);
  }
  for (const k of [...present].filter((k) => !named.has(k)).sort())
    plots.push(plot(k, `The figure ${k} as the trainer logs it.`, { [k]: k }));
  return plots;
}

function nightPlots(nights: NonNullable<Gathered['nights']>): Plot[] {
  const x = nights.map((n) => n.night);
  const source = 'refresh/nights.jsonl, a point a night';
  const c = (f: (s: NonNullable<(typeof nights)[number]['comparison']>['success']) => number) =>
    nights.map((n) => (n.comparison ? finite(f(n.comparison.success)) : null));
  return [
    {
      id: 'nights-success',
      title: 'Refresh nights: success of production and candidate',
      what: 'Success on the same validation tasks and seeds (paired episodes) of the production model and the night’s candidate.',
      source,
      xLabel: 'night',
      x,
      series: [
        { label: 'production', values: c((s) => s.production) },
        { label: 'candidate', values: c((s) => s.candidate) },
      ],
    },
    {
      id: 'nights-difference',
      title: 'Refresh nights: paired difference and its bounds',
      what: 'Candidate minus production success on the paired episodes, with the interval the promotion gate reads.',
      source,
      xLabel: 'night',
      x,
      series: [
        { label: 'difference', values: c((s) => s.difference) },
        { label: 'lower bound', values: c((s) => s.interval[0]) },
        { label: 'upper bound', values: c((s) => s.interval[1]) },
      ],
    },
  ];
}

const finite = (v: number | undefined | null): number | null =>
  typeof v === 'number' && Number.isFinite(v) ? v : null;
const slug = (s: string) =>
  s
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-|-$/g, '');
