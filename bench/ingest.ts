// Throughput and memory of the whole pipeline (`prefab run`: ingest → split → pairs → export) on synthetic
// sessions, next to a baseline that only reads the same JSONL file line by line and JSON.parses each line.
// For each size N it prints wall time, sessions/s, the pipeline/baseline rate ratio and each child's peak RSS,
// then checks that the pipeline's peak RSS does not grow with N (largest N / smallest N within 1.5×).
//
//   npx tsx bench/ingest.ts                      # sizes 10000,100000
//   npx tsx bench/ingest.ts --sizes 2000,10000
//
// Both are measured as child processes. Peak RSS comes from GNU `/usr/bin/time -f %M` (max RSS of the child,
// in KiB), which is present on the machine this was written on; where it is missing, the script falls back
// to polling VmHWM (the kernel's high-water mark of RSS) in /proc/<pid>/status every 50 ms.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { parseDocument } from 'yaml';
import { writeSyntheticSessions } from './synthetic-sessions.ts';

const SEED = 1;
const GNU_TIME = '/usr/bin/time';
const MiB = 1024 * 1024;
const STAGE_ORDER = ['ingest', 'split', 'pairs', 'export'];

interface Measurement {
  seconds: number;
  peakRssBytes: number;
  stdout: string;
}

/** Reads VmHWM (peak RSS so far) of a live process, in bytes; 0 once it has exited. */
async function readVmHwm(pid: number): Promise<number> {
  try {
    const status = await readFile(`/proc/${pid}/status`, 'utf8');
    const kib = /^VmHWM:\s+(\d+)\s+kB/m.exec(status)?.[1];
    return kib ? Number(kib) * 1024 : 0;
  } catch {
    return 0;
  }
}

/** Runs `command args` to completion: wall time and peak RSS; throws with its stderr unless it exits 0. */
async function measure(command: string, args: string[], rssFile: string): Promise<Measurement> {
  const useTime = existsSync(GNU_TIME);
  const [cmd, argv] = useTime ? [GNU_TIME, ['-f', '%M', '-o', rssFile, command, ...args]] : [command, args];
  const started = performance.now();
  const child = spawn(cmd, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
  child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));

  let polledPeak = 0;
  const poll = useTime
    ? undefined
    : setInterval(() => void readVmHwm(child.pid!).then((b) => (polledPeak = Math.max(polledPeak, b))), 50);
  const code = await new Promise<number | null>((resolvePromise, reject) => {
    child.on('error', reject);
    child.on('close', (c) => resolvePromise(c));
  });
  const seconds = (performance.now() - started) / 1000;
  if (poll) clearInterval(poll);

  if (code !== 0) throw new Error(`${command} ${args.join(' ')} exited ${code}:\n${stderr}`);
  const peakRssBytes = useTime ? Number((await readFile(rssFile, 'utf8')).trim().split('\n').pop()) * 1024 : polledPeak;
  return { seconds, peakRssBytes, stdout };
}

/** The baseline: read the file with readline and JSON.parse every line, nothing else; prints the line count. */
const BASELINE = `
const { createReadStream } = require('node:fs');
const { createInterface } = require('node:readline');
(async () => {
  let n = 0;
  for await (const line of createInterface({ input: createReadStream(process.argv[1]), crlfDelay: Infinity })) {
    if (line) { JSON.parse(line); n++; }
  }
  process.stdout.write(String(n));
})();
`;

interface Row {
  n: number;
  pipeline: Measurement;
  baseline: Measurement;
  counts: Record<string, Record<string, unknown>>;
}

async function benchOne(n: number): Promise<Row> {
  const dir = await mkdtemp(join(tmpdir(), `prefab-bench-${n}-`));
  try {
    const input = join(dir, 'sessions.jsonl');
    await writeSyntheticSessions(input, n, SEED);

    // configs/default.yaml with ingest.inputs pointing at the generated file (relative to the config's folder).
    const config = parseDocument(await readFile('configs/default.yaml', 'utf8'));
    config.setIn(['ingest', 'inputs'], ['sessions.jsonl']);
    const configPath = join(dir, 'config.yaml');
    await writeFile(configPath, config.toString());

    const baseline = await measure(process.execPath, ['-e', BASELINE, input], join(dir, 'baseline.rss'));
    if (Number(baseline.stdout) !== n) throw new Error(`baseline read ${baseline.stdout} lines, expected ${n}`);

    const workspace = join(dir, 'workspace');
    const pipeline = await measure(
      process.execPath,
      ['bin/prefab.js', '--workdir', workspace, '--config', configPath, '--log-format', 'json', '-q', 'run'],
      join(dir, 'pipeline.rss'),
    );

    // Every stage's manifest counts, in run order (stages not in STAGE_ORDER go last).
    const counts: Row['counts'] = {};
    const stages = (await readdir(workspace, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name);
    const rank = (s: string) => (STAGE_ORDER.includes(s) ? STAGE_ORDER.indexOf(s) : STAGE_ORDER.length);
    for (const stage of stages.sort((a, b) => rank(a) - rank(b))) {
      const manifest = join(workspace, stage, 'manifest.json');
      if (existsSync(manifest)) counts[stage] = (JSON.parse(await readFile(manifest, 'utf8')) as { counts: Record<string, unknown> }).counts;
    }
    if (counts.ingest?.sessions !== n) throw new Error(`ingest counted ${String(counts.ingest?.sessions)} sessions, expected ${n}`);
    return { n, pipeline, baseline, counts };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const { values } = parseArgs({ options: { sizes: { type: 'string', default: '10000,100000' } } });
const sizes = values.sizes.split(',').map((s) => Number(s.trim()));
if (sizes.some((n) => !Number.isInteger(n) || n <= 0)) throw new Error(`--sizes wants positive integers, got ${values.sizes}`);
sizes.sort((a, b) => a - b);

const rows: Row[] = [];
for (const n of sizes) {
  process.stderr.write(`running N=${n}...\n`);
  rows.push(await benchOne(n));
}

const header = ['sessions', 'pipeline s', 'pipeline sess/s', 'baseline s', 'baseline sess/s', 'ratio', 'pipeline RSS MiB', 'baseline RSS MiB'];
const table = rows.map((r) => {
  const pRate = r.n / r.pipeline.seconds;
  const bRate = r.n / r.baseline.seconds;
  return [
    String(r.n),
    r.pipeline.seconds.toFixed(2),
    pRate.toFixed(0),
    r.baseline.seconds.toFixed(2),
    bRate.toFixed(0),
    (pRate / bRate).toFixed(3),
    (r.pipeline.peakRssBytes / MiB).toFixed(1),
    (r.baseline.peakRssBytes / MiB).toFixed(1),
  ];
});
const widths = header.map((h, i) => Math.max(h.length, ...table.map((row) => row[i]!.length)));
for (const row of [header, ...table]) console.log(row.map((cell, i) => cell.padStart(widths[i]!)).join('  '));

const smallest = rows[0]!;
const largest = rows[rows.length - 1]!;
const growth = largest.pipeline.peakRssBytes / smallest.pipeline.peakRssBytes;
console.log(
  `\npipeline peak RSS, N=${largest.n} / N=${smallest.n}: ${growth.toFixed(2)}× — ` +
    (growth <= 1.5 ? 'within 1.5× (memory does not grow with input size)' : 'NOT within 1.5× (memory grows with input size)'),
);
console.log(`peak RSS measured with ${existsSync(GNU_TIME) ? `${GNU_TIME} -f %M` : 'VmHWM polled from /proc/<pid>/status'}`);

console.log(`\nstage counts at N=${largest.n}:`);
for (const [stage, counts] of Object.entries(largest.counts)) console.log(`  ${stage}: ${JSON.stringify(counts)}`);
