// The report page's script: draws the plots and starts the pair browser from the data the page carries
// (a JSON script element, #report-data). Bundled with uPlot into the page itself: it opens from disk, offline.
import type { PageData } from '../data.ts';
import { drawPlots } from './draw-plots.ts';
import { pairBrowser } from './pair-browser.ts';

const data = JSON.parse(document.getElementById('report-data')!.textContent!) as PageData;
drawPlots(data.plots);
const browser = document.getElementById('pair-browser');
if (browser && data.pairs) pairBrowser(browser, data.pairs);
document.body.dataset.ready = 'true';
