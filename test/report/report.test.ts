// The workspace report: written at the end of a run and of a refresh night, read back in headless Chromium
// from disk with the network cut: no console errors, every plot drawn with its series, a screenshot that is
// not blank, and a pair browser that filters and shows what the judges said. Sections of stages that never
// ran are left out.
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, Page } from 'puppeteer-core';
import type { Session } from '../../core/records.ts';
import { simulate } from '../../env/simulate.ts';
import { DEFAULT_WORLD } from '../../env/world.ts';
import type { PageData } from '../../report/data.ts';
import { metricsOf } from '../../report/gather.ts';
import { pick } from '../../report/pairs.ts';
import { trainerPlots } from '../../report/plots.ts';
import { REPO, prefab } from '../fixtures/cli.ts';
import { launch, noBrowser } from '../fixtures/chromium.ts';
import { tempDir } from '../fixtures/pipeline.ts';

let dir: string;
let workdir: string;
let config: string;
let runLog: string;
let nightLog: string;
const reportPath = () => join(workdir, 'report', 'index.html');
/** The data the page carries for its script. */
const pageData = (html: string) =>
  JSON.parse(/<script type="application\/json" id="report-data">(.*?)<\/script>/s.exec(html)![1]!) as PageData;
const sectionIds = (html: string) => [...html.matchAll(/<section id="([^"]+)"/g)].map((m) => m[1]);

beforeAll(async () => {
  dir = tempDir();
  workdir = join(dir, 'workspace');
  const inbox = join(dir, 'inbox');
  mkdirSync(inbox);
  // Two records that cannot be read, so the report has a quarantine to show.
  writeFileSync(join(dir, 'damaged.jsonl'), '{"session_id": "a", "messages": 3}\nnot json at all\n');
  config = join(dir, 'report.yaml');
  writeFileSync(
    config,
    `ingest:
  inputs: [${join(REPO, 'data', 'sample')}, ${join(dir, 'damaged.jsonl')}, ${inbox}]
tokenizer: { vocab_size: 512 }
sft:
  model: { layers: 1, hidden_size: 32, heads: 2, context: 640 }
  max_sessions: 80
  max_steps: 6
  warmup: 1
dpo: { max_steps: 4, max_examples: 48, batch_size: 4 }
dapo:
  enabled: true
  steps: 2
  tasks_per_step: 1
  group_size: 2
  reward: partial
  mode: feedback
  max_calls: 1
  simulator: { max_tokens: 40, max_turns: 2 }
  validation: { every: 1, tasks: 1, tries: 2 }
eval:
  max_pairs: 12
  max_sessions: 6
  simulator: { tasks: 2, k: 1, max_tokens: 16 }
refresh:
  inbox: ${inbox}
  buffer: { size: 24 }
  dpo: { max_steps: 2 }
  eval: { tasks: 4, k: 1, max_tokens: 16, max_turns: 3 }
`,
  );
  const run = prefab(['--workdir', workdir, '--config', config, '--log-format', 'json', 'run']);
  expect(run.code, run.stderr).toBe(0);
  runLog = run.stderr;
  const sessions: Session[] = [];
  for await (const s of simulate({
    tasks: 4,
    trials: 4,
    agent: 'mix',
    noise: 0.3,
    split: 'train',
    seed: DEFAULT_WORLD.seed,
    companies: DEFAULT_WORLD.companies,
    offset: 30_000,
  }))
    sessions.push(s);
  writeFileSync(join(inbox, 'night-1.jsonl'), sessions.map((s) => JSON.stringify(s)).join('\n') + '\n');
  const night = prefab(['--workdir', workdir, '--config', config, '--log-format', 'json', 'refresh']);
  expect(night.code, night.stderr).toBe(0);
  nightLog = night.stderr;
});

describe('prefab report', () => {
  it('is written at the end of a run and of a refresh night, with every section of a workspace that has them', () => {
    const written = (log: string) =>
      log
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as { event: string; path?: string })
        .filter((e) => e.event === 'report written');
    expect(written(runLog)).toHaveLength(1);
    expect(written(nightLog)).toEqual([expect.objectContaining({ path: reportPath() })]);
    const html = readFileSync(reportPath(), 'utf8');
    expect(sectionIds(html)).toEqual(['funnel', 'judges', 'training', 'eval', 'loop', 'pairs']);
    // The night is in it, a row with its decision, and the plots of the paired comparison.
    const nights = readFileSync(join(workdir, 'refresh', 'nights.jsonl'), 'utf8')
      .trim()
      .split('\n');
    expect(nights).toHaveLength(1);
    const loop = /<section id="loop">(.*?)<\/section>/s.exec(html)![1]!;
    const rows = /<h3>Refresh nights<\/h3>.*?<tbody>(.*?)<\/tbody>/s.exec(loop)![1]!.split('<tr>').slice(1);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toContain(`>${(JSON.parse(nights[0]!) as { decision: string }).decision}<`);
    const data = pageData(html);
    const ids = data.plots.map((p) => p.id);
    expect(ids).toEqual(
      expect.arrayContaining([
        'sft-loss',
        'dpo-loss',
        'dpo-rewards-accuracy',
        'dpo-log-probabilities',
        'dapo-success',
        'dapo-validation',
        'dapo-clipping',
        'nights-success',
        'nights-difference',
      ]),
    );
    // The quarantine of the damaged file, by reason, with where each record was.
    expect(html).toMatch(/Quarantined records \(2\)/);
    expect(html).toContain('damaged.jsonl line 2');
    // Each plot says where its numbers come from.
    for (const p of data.plots) expect(p.source).toMatch(/^(sft|dpo|dapo)\/metrics\.jsonl|^refresh\/nights\.jsonl/);
  });

  it('leaves out the sections of stages that have not run', () => {
    const early = join(dir, 'early');
    const r = prefab(['--workdir', early, '--config', config, 'run', '--until', 'gate']);
    expect(r.code, r.stderr).toBe(0);
    const html = readFileSync(join(early, 'report', 'index.html'), 'utf8');
    expect(sectionIds(html)).toEqual(['funnel', 'judges', 'pairs']);
    expect(pageData(html).plots).toEqual([]);
    expect(html).not.toContain('href="#training"');
    // `prefab report` writes it again, carrying at most --max-pairs pairs.
    const again = prefab(['--workdir', early, 'report', '--max-pairs', '20']);
    expect(again.code, again.stderr).toBe(0);
    expect(again.stdout.trim()).toBe(join(early, 'report', 'index.html'));
    const pairs = pageData(readFileSync(join(early, 'report', 'index.html'), 'utf8')).pairs!;
    expect(pairs.pairs).toHaveLength(20);
    expect(pairs.total).toBeGreaterThan(20);
  });
});

describe.skipIf(noBrowser)('the report in headless Chromium', () => {
  let browser: Browser;
  let page: Page;
  const errors: string[] = [];
  const requests: string[] = [];
  let data: PageData;

  beforeAll(async () => {
    data = pageData(readFileSync(reportPath(), 'utf8'));
    browser = await launch();
    page = await browser.newPage();
    await page.setViewport({ width: 1400, height: 1000 });
    page.on('console', (m) => {
      if (m.type() === 'error' || m.type() === 'warn') errors.push(`${m.type()}: ${m.text()}`);
    });
    page.on('pageerror', (e) => errors.push(`page error: ${String(e)}`));
    // The network is cut: the page must need nothing but itself.
    await page.setRequestInterception(true);
    page.on('request', (r) => {
      if (r.url().startsWith('file:')) return void r.continue();
      requests.push(r.url());
      void r.abort();
    });
    await page.goto(`file://${reportPath()}`);
    await page.waitForSelector('body[data-ready="true"]', { timeout: 20_000 });
  }, 60_000);
  afterAll(async () => browser?.close());

  it('opens from disk with no request beyond the file and no console error', () => {
    expect(requests).toEqual([]);
    expect(errors).toEqual([]);
  });

  it('draws every plot: a canvas with its series in their colours and a legend entry each', async () => {
    expect(data.plots.length).toBeGreaterThan(16);
    for (const p of data.plots) {
      const drawn = await page.$eval(`#plot-${p.id}`, (figure) => {
        const canvas = figure.querySelector('canvas')!;
        const markers = [...figure.querySelectorAll('.u-legend .u-series:not(:first-child) .u-marker')];
        const colours = markers.map((m) => getComputedStyle(m).borderColor.match(/\d+/g)!.slice(0, 3).map(Number));
        const { data: px } = canvas.getContext('2d')!.getImageData(0, 0, canvas.width, canvas.height);
        // Pixels of each series' colour (lines are anti-aliased: a pixel is the colour where it is close to it).
        const near = colours.map((c) => {
          let n = 0;
          for (let i = 0; i < px.length; i += 4)
            if (
              px[i + 3]! > 200 &&
              Math.abs(px[i]! - c[0]!) + Math.abs(px[i + 1]! - c[1]!) + Math.abs(px[i + 2]! - c[2]!) < 30
            )
              n++;
          return n;
        });
        return {
          series: Number((figure as HTMLElement).dataset.series),
          legend: markers.length,
          near,
          width: canvas.width,
        };
      });
      expect(drawn.series, p.id).toBe(p.series.length);
      expect(drawn.legend, p.id).toBe(p.series.length);
      expect(drawn.width, p.id).toBeGreaterThan(200);
      // A series may lie under a later one where their values agree; all of them never do.
      expect(Math.max(...drawn.near), `${p.id}: ${drawn.near}`).toBeGreaterThan(16);
    }
  });

  it('makes a screenshot that is not blank', async () => {
    const png = await page.screenshot({ encoding: 'base64' });
    const inked = await page.evaluate(async (src) => {
      const img = new Image();
      img.src = `data:image/png;base64,${src}`;
      await img.decode();
      const c = document.createElement('canvas');
      [c.width, c.height] = [img.width, img.height];
      const ctx = c.getContext('2d')!;
      ctx.drawImage(img, 0, 0);
      const { data: px } = ctx.getImageData(0, 0, c.width, c.height);
      const colours = new Set<number>();
      let notWhite = 0;
      for (let i = 0; i < px.length; i += 4) {
        if (px[i]! < 240 || px[i + 1]! < 240 || px[i + 2]! < 240) notWhite++;
        colours.add((px[i]! << 16) | (px[i + 1]! << 8) | px[i + 2]!);
      }
      return { share: notWhite / (px.length / 4), colours: colours.size };
    }, png);
    expect(inked.share).toBeGreaterThan(0.02);
    expect(inked.colours).toBeGreaterThan(50);
  });

  it('browses the pairs: filters by source and type, and shows a pair’s prompt, sides, tool calls and verdicts', async () => {
    const pairs = data.pairs!;
    const count = () => page.$eval('#pair-browser .count', (e) => e.textContent);
    expect(await count()).toBe(`${pairs.pairs.length} of ${pairs.pairs.length} pairs match.`);
    await page.select('#pair-browser select[name="source"]', 'hard_negative');
    await page.select('#pair-browser select[name="type"]', 'refusal');
    const refusals = pairs.pairs.filter((p) => p.source === 'hard_negative' && p.type === 'refusal');
    expect(refusals.length).toBeGreaterThan(0);
    expect(await count()).toBe(`${refusals.length} of ${pairs.pairs.length} pairs match.`);
    const listed = await page.$$eval('#pair-browser .pair-list tbody tr', (rows) =>
      rows.map((r) => [...r.querySelectorAll('td')].map((td) => td.textContent)),
    );
    expect(listed.length).toBe(Math.min(50, refusals.length));
    for (const row of listed) expect(row.slice(1, 3)).toEqual(['hard_negative', 'refusal']);

    // A pair whose chosen side calls a tool: its call shown, and what each judge said.
    const message = (i: number) => pairs.messages[i]!;
    const withCall = refusals.find((p) => p.chosen.some((i) => message(i).calls?.length))!;
    expect(withCall).toBeDefined();
    await page.click(`#pair-browser .pair-list tr[data-pair="${withCall.id}"]`);
    const shown = await page.$eval('#pair-browser .pair', (e) => ({
      id: (e as HTMLElement).dataset.pair,
      chosen: e.querySelector('.side.chosen')!.textContent,
      rejected: e.querySelector('.side.rejected')!.textContent,
      prompt: e.querySelector('.prompt')!.textContent,
      verdicts: [...e.querySelectorAll('.verdicts tbody tr')].map((r) => r.querySelector('td')!.textContent),
    }));
    expect(shown.id).toBe(withCall.id);
    const call = withCall.chosen.flatMap((i) => message(i).calls ?? [])[0]!;
    expect(shown.chosen).toContain(`→ ${call.name}(${call.arguments})`);
    expect(shown.rejected).toContain(pairs.texts[message(withCall.rejected[0]!).text!]!);
    expect(shown.prompt).toContain(pairs.texts[message(withCall.prompt.at(-1)!).text!]!);
    expect(shown.verdicts).toEqual(Object.keys(withCall.verdicts));

    // Confidence above every pair's: nothing matches, and the page says so.
    await page.select('#pair-browser select[name="type"]', '');
    await page.select('#pair-browser select[name="source"]', '');
    await page.$eval('#pair-browser input[name="min"]', (e) => {
      (e as HTMLInputElement).value = '1.01';
      e.dispatchEvent(new Event('input'));
    });
    expect(await count()).toBe(`0 of ${pairs.pairs.length} pairs match.`);
    expect(await page.$eval('#pair-browser .pair-detail', (e) => e.textContent)).toBe('No pair matches.');
    expect(errors).toEqual([]);
  });
});

describe('what the report is made of', () => {
  it('picks an equal share of each kind of pair, the rest going to the kinds with more, by hash', () => {
    const seen = [
      ...Array.from({ length: 3 }, (_, i) => ({ file: 0, line: i + 1, hash: 100 - i, kind: 'rare' })),
      ...Array.from({ length: 50 }, (_, i) => ({ file: 0, line: 10 + i, hash: i, kind: 'common' })),
      ...Array.from({ length: 50 }, (_, i) => ({ file: 1, line: 1 + i, hash: 1000 - i, kind: 'other' })),
    ];
    const picked = pick(seen, 21);
    const lines = (f: number) => [...(picked.get(f) ?? [])].sort((a, b) => a - b);
    // The rare kind all 3; the 18 left split 9 and 9, each kind's lowest hashes.
    expect(lines(0)).toEqual([1, 2, 3, ...Array.from({ length: 9 }, (_, i) => 10 + i)]);
    expect(lines(1)).toEqual(Array.from({ length: 9 }, (_, i) => 42 + i));
  });

  it('plots every figure a trainer logs: grouped where a plot names it, on a plot of its own otherwise', () => {
    const rows = [
      { step: 1, loss: 1, 'rewards/chosen': 0.1, 'rewards/rejected': -0.1, 'new/figure': 3, episodes: 8 },
      { step: 2, loss: 0.5, 'rewards/chosen': 0.2, 'rewards/rejected': -0.2, 'new/figure': 4, episodes: 8 },
    ];
    const plots = trainerPlots('dpo', 'DPO', rows);
    expect(plots.map((p) => [p.id, p.series.map((s) => s.label)])).toEqual([
      ['dpo-loss', ['loss']],
      ['dpo-rewards-chosen-rejected-and-margin', ['chosen', 'rejected']],
      ['dpo-new-figure', ['new/figure']],
    ]);
    expect(plots[1]!.series[1]!.values).toEqual([-0.1, -0.2]);
  });

  it('reads a metrics file whose run resumed (a step twice: the last kept) and whose last line a kill cut short', () => {
    const file = join(tempDir(), 'metrics.jsonl');
    writeFileSync(
      file,
      '{"step":1,"loss":3}\n{"step":2,"loss":2}\n{"step":2,"loss":1.5}\n{"step":3,"loss":1}\n{"step":4,"lo',
    );
    expect(metricsOf(file)).toEqual([
      { step: 1, loss: 3 },
      { step: 2, loss: 1.5 },
      { step: 3, loss: 1 },
    ]);
  });
});
