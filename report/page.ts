// `workspace/report/index.html`: one page that opens from disk without a network. Its tables are HTML, its
// plots and pair browser a script (client/, bundled here with uPlot by esbuild) over data the page carries.
import { readFileSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Engine } from '../pipeline/engine.ts';
import type { Logger } from '../pipeline/log.ts';
import { writeFileAtomic } from '../pipeline/workspace.ts';
import type { PageData, PairBrowser } from './data.ts';
import { gather } from './gather.ts';
import { browserPairs } from './pairs.ts';
import { plotsOf } from './plots.ts';
import { esc, sections } from './sections.ts';

const CLIENT = resolve(dirname(fileURLToPath(import.meta.url)), 'client');

export interface ReportOptions {
  /** The most pairs the browser carries (pairs.ts picks them). */
  maxPairs: number;
}

/** Writes the workspace's report and returns its path. */
export async function writeReport(engine: Engine, log: Logger, o: ReportOptions): Promise<string> {
  const g = await gather(engine);
  const plots = plotsOf(g);
  let pairs: PairBrowser | null = null;
  let pairsError: string | null = null;
  try {
    pairs = await browserPairs(engine, o.maxPairs);
  } catch (error) {
    // Pairs made from an earlier split cannot be read back; the rest of the report still can.
    pairsError = (error as Error).message;
    log.warn(`report: the pair browser is left out: ${pairsError}`);
  }
  const body = sections(g, plots, pairs !== null)
    .map((s) => `<section id="${s.id}"><h2>${esc(s.title)}</h2>\n${s.html}</section>`)
    .join('\n');
  const nav = sections(g, plots, pairs !== null)
    .map((s) => `<a href="#${s.id}">${esc(s.title)}</a>`)
    .join('');
  const data: PageData = { plots, pairs };
  const html = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>prefab report: ${esc(g.root)}</title>
<style>${await styles()}</style>
</head>
<body>
<header><h1>prefab report</h1><p>Workspace ${esc(g.root)} · written ${esc(new Date().toISOString().slice(0, 19).replace('T', ' '))} UTC by <code>prefab report</code>${pairsError ? ` · <span class="bad">pairs left out: ${esc(pairsError)}</span>` : ''}</p></header>
<nav>${nav}</nav>
<main>
${body || '<p class="note">Nothing in this workspace yet: run <code>prefab run</code>.</p>'}
</main>
<script type="application/json" id="report-data">${JSON.stringify(data).replace(/</g, '\\u003c')}</script>
<script>${(await script()).replaceAll('</script', '<\\/script')}</script>
</body>
</html>
`;
  const out = join(engine.ws.root, 'report', 'index.html');
  await mkdir(dirname(out), { recursive: true });
  await writeFileAtomic(out, html);
  return out;
}

/** The page's script: client/main.ts and uPlot, bundled and minified. */
async function script(): Promise<string> {
  const { build } = await import('esbuild');
  const result = await build({
    entryPoints: [join(CLIENT, 'main.ts')],
    bundle: true,
    format: 'iife',
    minify: true,
    target: 'es2020',
    write: false,
    logLevel: 'silent',
  });
  return result.outputFiles[0]!.text;
}

async function styles(): Promise<string> {
  const uplot = createRequire(import.meta.url).resolve('uplot/dist/uPlot.min.css');
  return readFileSync(uplot, 'utf8') + readFileSync(join(CLIENT, 'style.css'), 'utf8');
}
