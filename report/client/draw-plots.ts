// Draws the report's plots with uPlot, each into the place the page has for it, and redraws them to the
// page's width. Each plot's figure says how many series it drew (data-series), for the browser tests.
import uPlot from 'uplot';
import type { Plot } from '../data.ts';

const PALETTE = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#17becf', '#8c564b', '#e377c2'];
const HEIGHT = 220;

export function drawPlots(plots: Plot[]): void {
  const drawn: { u: uPlot; el: HTMLElement }[] = [];
  for (const p of plots) {
    const figure = document.getElementById(`plot-${p.id}`);
    const el = figure?.querySelector<HTMLElement>('.canvas');
    if (!figure || !el) throw new Error(`the page has no place for plot ${p.id}`);
    const u = new uPlot(options(p, width(el)), [p.x, ...p.series.map((s) => s.values)], el);
    figure.dataset.series = String(u.series.length - 1);
    drawn.push({ u, el });
  }
  let pending = 0;
  window.addEventListener('resize', () => {
    cancelAnimationFrame(pending);
    pending = requestAnimationFrame(() => {
      for (const { u, el } of drawn) u.setSize({ width: width(el), height: HEIGHT });
    });
  });
}

const width = (el: HTMLElement) => Math.max(240, el.clientWidth || 480);

const WHOLE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000];

/** A y tick: learning rates (1e-5) and token rates (1e5) both readable, without uPlot's rounding to 0. */
function tick(v: number): string {
  const a = Math.abs(v);
  if (a === 0) return '0';
  if (a < 1e-3 || a >= 1e6) return v.toExponential(1);
  return String(Number(v.toPrecision(4)));
}

function options(p: Plot, w: number): uPlot.Options {
  // With few steps each point is marked: a line of two points hides how few there are.
  const points = p.x.length <= 60;
  return {
    width: w,
    height: HEIGHT,
    // Half a step either side, so the first and last points are whole.
    scales: { x: { time: false, range: (_, min, max) => (points ? [min - 0.5, max + 0.5] : [min, max]) } },
    // Steps and nights are whole numbers: no tick between them.
    axes: [
      { label: p.xLabel, labelSize: 20, incrs: WHOLE },
      { size: 60, values: (_, ticks) => ticks.map(tick) },
    ],
    legend: { live: true },
    cursor: { drag: { x: true, y: false } },
    series: [
      { label: p.xLabel },
      ...p.series.map((s, i) => ({
        label: s.label,
        stroke: PALETTE[i % PALETTE.length],
        width: 1.5,
        spanGaps: true,
        points: { show: points, size: 6, fill: PALETTE[i % PALETTE.length] },
      })),
    ],
  };
}
