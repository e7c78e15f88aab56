// `prefab refresh --days N`: N simulated days end to end. Each day production is served (loop/serve/), the
// simulator's users bring it the day's new tasks through the OpenAI-compatible API (`prefab simulate --agent`'s
// path), the sessions land in the inbox tagged with the version that acted, and the night refreshes
// (loop/refresh.ts). A row a day: production, its success on the day's traffic, the candidate's paired
// evaluation against it with the interval, and the decision.
import { createWriteStream, existsSync, mkdirSync, readFileSync, readdirSync, renameSync } from 'node:fs';
import { once } from 'node:events';
import { join } from 'node:path';
import type { Logger } from '../pipeline/log.ts';
import { simulate } from '../env/simulate.ts';
import { parseTaskId } from '../env/world.ts';
import { Registry } from './registry.ts';
import {
  inboxOf,
  liveFigures,
  refreshNight,
  unfinishedNight,
  type Live,
  type NightOptions,
  type NightReport,
} from './refresh.ts';
import { SERVE_DEFAULTS, type RefreshConfig } from './settings.ts';
import { loadCatalog } from './serve/batcher.ts';
import { startServer } from './serve/http.ts';
import type { Device } from '../runtime/device.ts';

export interface Day {
  day: number;
  date: string;
  production: string;
  traffic: Live;
  night: NightReport;
}

const DAY_FILE = /^day-(\d{4})\.jsonl$/;
const dayFile = (inbox: string, day: number) => join(inbox, `day-${String(day).padStart(4, '0')}.jsonl`);

/**
 * Day `day`'s first training task: `days.first_task` + the tasks of the days before, or past the last task the
 * inbox's days played in this world when that reached further. A run with fewer `days.tasks` than the last
 * one's would otherwise play earlier days' tasks again, whose sessions (the same ids while production is the
 * same) ingest drops as duplicates.
 */
function firstTaskOf(inbox: string, day: number, cfg: RefreshConfig): number {
  let last = -1;
  for (const name of readdirSync(inbox).filter((f) => DAY_FILE.test(f)))
    for (const [, id] of readFileSync(join(inbox, name), 'utf8').matchAll(/"task_id":"([^"]+)"/g)) {
      const task = parseTaskId(id!);
      if (task?.split === 'train' && task.seed === cfg.eval.world_seed) last = Math.max(last, task.index);
    }
  return Math.max(cfg.days.first_task + (day - 1) * cfg.days.tasks, last + 1);
}

/** The day `n` days after `start` (YYYY-MM-DD). */
const dateOf = (start: string, n: number) =>
  new Date(Date.parse(`${start}T00:00:00Z`) + n * 86_400_000).toISOString().slice(0, 10);

/** Serves production and writes the day's sessions into the inbox (aside, then renamed: a killed day leaves no file). */
async function collectDay(o: {
  registry: Registry;
  cfg: RefreshConfig;
  device: Device;
  inbox: string;
  day: number;
  log: Logger;
}): Promise<string> {
  const { registry, cfg, device, inbox, day, log } = o;
  const settings = {
    ...SERVE_DEFAULTS,
    port: 0,
    apiKey: null,
    split: null,
    maxQueue: 1024,
    device,
    log,
  };
  const catalog = loadCatalog(registry, ['production'], settings);
  const server = await startServer(catalog, settings, log);
  const file = dayFile(inbox, day);
  const tmp = `${file}.tmp`;
  try {
    const out = createWriteStream(tmp);
    const d = cfg.days;
    const progress = log.progress(`day ${day}: conversations with production`, d.tasks * d.trials);
    const sessions = simulate({
      tasks: d.tasks,
      trials: d.trials,
      agent: {
        url: server.url,
        model: 'production',
        apiKey: '',
        temperature: d.temperature,
        maxTokens: cfg.eval.max_tokens,
        maxTurns: cfg.eval.max_turns,
        concurrency: d.concurrency,
      },
      noise: 0,
      split: 'train',
      seed: cfg.eval.world_seed,
      companies: cfg.eval.companies,
      offset: firstTaskOf(inbox, day, cfg),
      date: dateOf(d.start, day - 1),
    });
    for await (const s of sessions) {
      if (!out.write(JSON.stringify(s) + '\n')) await once(out, 'drain');
      progress.tick();
    }
    progress.done();
    out.end();
    await once(out, 'finish');
    renameSync(tmp, file);
  } finally {
    await server.close();
    for (const m of new Set(catalog.values())) m.dispose();
  }
  return file;
}

/** Runs `o.days` days after those the inbox already holds; an unfinished night is finished first. */
export async function simulatedDays(
  o: NightOptions & { days: number; onDay: (d: Day) => Promise<void> | void },
): Promise<Day[]> {
  const { engine, cfg, device, days: n, log, onDay } = o;
  const registry = new Registry(join(engine.ws.root, 'registry'), (m) => log.warn(m));
  const inbox = inboxOf(engine, cfg);
  mkdirSync(inbox, { recursive: true });
  if (unfinishedNight(engine)) await refreshNight(o);
  const done = existsSync(inbox)
    ? Math.max(0, ...readdirSync(inbox).map((f) => Number(DAY_FILE.exec(f)?.[1] ?? 0)))
    : 0;
  const days: Day[] = [];
  for (let day = done + 1; day <= done + n; day++) {
    const production = registry.aliases().production;
    if (!production) throw new Error(`no production model in ${registry.dir}: run \`prefab run\` first`);
    const file = await collectDay({ registry, cfg, device, inbox, day, log });
    const traffic = (await liveFigures([file], cfg.rollback.success_reward)).get(production) ?? {
      version: production,
      sessions: 0,
      success: null,
    };
    const night = await refreshNight(o);
    const d = { day, date: dateOf(cfg.days.start, day - 1), production, traffic, night };
    await onDay(d);
    days.push(d);
  }
  return days;
}

/** The daily table, as the README shows it. */
export function formatDays(days: Day[]): string {
  const f = (x: number | null | undefined) => (x === null || x === undefined ? '—' : x.toFixed(3));
  const head = [
    'day',
    'date',
    'production',
    'live success',
    'candidate',
    'paired success (cand vs prod)',
    'difference [bounds]',
    'p',
    'decision',
    'production after',
  ];
  const rows = days.map((d) => {
    const c = d.night.comparison;
    return [
      String(d.day),
      d.date,
      d.production + (d.night.rollback.rolled_back ? ` → ${d.night.production} (rolled back)` : ''),
      `${f(d.traffic.success)} (${d.traffic.sessions})`,
      d.night.candidate ?? '—',
      c ? `${f(c.success.candidate)} vs ${f(c.success.production)} (${c.episodes})` : '—',
      c ? `${f(c.success.difference)} [${f(c.success.interval[0])}, ${f(c.success.interval[1])}]` : '—',
      c ? c.success.p.toPrecision(3) : '—',
      d.night.decision,
      d.night.production_after,
    ];
  });
  const line = (cells: string[]) => `| ${cells.join(' | ')} |`;
  return [line(head), line(head.map(() => '---')), ...rows.map(line)].join('\n');
}
