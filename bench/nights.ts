// A refresh loop's nights replayed on fresh validation draws (issue 63: a worse model is never promoted):
// every night's candidate against the production it was compared with, on the eligible validation tasks
// after those the night's paired evaluation played, with another sampler seed. A promotion the replay does
// not confirm was the gate's luck; a rejection it calls better was a gain the gate could not see.
//
//   npx tsx bench/nights.ts --config configs/recipe-notes.yaml --workdir workspace/recipe-notes
//
// Each version's episodes are kept (a version's weights never change), the table is printed and written to
// --out as nights.jsonl, whole, on every run.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Command } from 'commander';
import { parse } from 'yaml';
import { NEVER } from '../pipeline/interrupt.ts';
import { Logger } from '../pipeline/log.ts';
import { pairedSuccess } from '../core/paired-success.ts';
import type { EpisodeRecord } from '../env/evaluate.ts';
import { playEpisodes, type NightReport } from '../loop/refresh.ts';
import { Registry } from '../loop/registry.ts';
import { refreshConfig } from '../loop/settings.ts';
import { openDevice, type BackendChoice } from '../runtime/device.ts';

const o = new Command()
  .requiredOption('--config <file>', 'the loop’s config (its refresh.eval says how episodes are played)')
  .requiredOption('--workdir <dir>', 'the loop’s workspace')
  .option('--seed <s>', 'the replay’s sampler seed (the nights used refresh.seed)', 'replay')
  .option('--backend <name>', 'auto, cpu, webgpu or wasm', 'auto')
  .option('--out <dir>', 'nights.jsonl and each version’s episodes', 'bench/results/loop-steps')
  .parse()
  .opts<{ config: string; workdir: string; seed: string; backend: string; out: string }>();

const cfg = refreshConfig.parse((parse(readFileSync(o.config, 'utf8')) as { refresh?: unknown }).refresh ?? {});
const root = resolve(o.workdir);
const registry = new Registry(join(root, 'registry'));
const reports = readFileSync(join(root, 'refresh', 'nights.jsonl'), 'utf8')
  .split('\n')
  .filter(Boolean)
  .map((l) => JSON.parse(l) as NightReport)
  .filter((r) => r.candidate !== null && r.comparison !== null);
const log = new Logger('json', process.stderr);
const device = await openDevice({ backend: o.backend as BackendChoice });
mkdirSync(join(o.out, 'episodes'), { recursive: true });

/** A version on the fresh draws: its kept episodes, or played and kept. */
async function episodesOf(version: string): Promise<EpisodeRecord[]> {
  const path = join(o.out, 'episodes', `${version}-${o.seed}.json`);
  if (existsSync(path)) return JSON.parse(readFileSync(path, 'utf8')) as EpisodeRecord[];
  const folder = join(registry.folder(version), 'model');
  const play = { eval: cfg.eval, seed: o.seed, skip: cfg.eval.tasks, device, signal: NEVER, log };
  const records = await playEpisodes(version, folder, play);
  writeFileSync(path, JSON.stringify(records));
  return records;
}

const f = (x: number) => (x >= 0 ? '+' : '') + x.toFixed(3);
const lines: string[] = [];
console.log('| night | decision | production → candidate | gate: difference (p) | replay: difference [90%] (p) |');
console.log('|---|---|---|---|---|');
for (const r of reports) {
  const [production, candidate] = [await episodesOf(r.production), await episodesOf(r.candidate!)];
  const replay = pairedSuccess(production, candidate, { samples: 2000, alpha: 0.05, seed: `replay-${r.night}` });
  const gate = r.comparison!.success;
  lines.push(
    JSON.stringify({
      night: r.night,
      decision: r.decision,
      production: r.production,
      candidate: r.candidate,
      gate,
      replay,
    }),
  );
  console.log(
    `| ${r.night} | ${r.decision} | ${r.production} → ${r.candidate} | ${f(gate.difference)} (${gate.p.toPrecision(2)}) | ${f(replay.difference)} [${f(replay.interval[0])}, ${f(replay.interval[1])}] (${replay.p.toPrecision(2)}) |`,
  );
}
writeFileSync(join(o.out, 'nights.jsonl'), lines.map((l) => l + '\n').join(''));
