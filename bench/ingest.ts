// The data stages' throughput and memory on synthetic sessions (bench/synthetic-sessions.ts, shaped like the
// simulator's), each a whole process as a user runs it, beside two baselines measured in the same run on the
// same file: the parse floor (Node reading the JSONL line by line and JSON.parse-ing each line, nothing else)
// and DuckDB's round trip (read and type every session, write it back as JSONL; 2 threads). For each size N:
// `prefab run --until ingest` and `prefab run --until pairs` in fresh workspaces (no training: the data
// stages only). Goals (issue 21): ingest ≥ 0.5× the parse floor; ingest → pairs ≥ 1.0× DuckDB's round trip at
// no more than its peak RSS; the pairs run's peak RSS at 1M ≤ 1.2× that at 100k (stated when the smallest N is
// 100k or more).
//
//   npm run bench:ingest                         # sizes 10000,100000
//   npm run bench:ingest -- --sizes 100000,1000000
//   npm run bench:ingest -- --input sessions.jsonl   # your own sessions (e.g. `prefab simulate`'s), one size
//   npm run bench:ingest -- --rounds 5           # medians of 5 paired rounds (default 3)
//   npm run bench:ingest -- --files 50000        # N one-session files instead (issue 66: many files at once)
//
// With --files, each of N files holds one session, and `prefab run --until ingest` reads them under
// `ulimit -n 1024` (a common default) beside the parse floor over the same files (each read whole and
// JSON.parse-d, one after another): ingest's memory over many small files (issue 66; figures in
// docs/hostile.md).
//
// Each is measured as a child process, after a `sync` (what the one before wrote is on disk). Peak RSS comes from GNU `/usr/bin/time -f %M` (max RSS of the child,
// in KiB), which is present on the machine this was written on; where it is missing, the script falls back
// to polling VmHWM (the kernel's high-water mark of RSS) in /proc/<pid>/status every 50 ms.
import { spawn, spawnSync } from 'node:child_process';
import { createReadStream, existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';
import { parseDocument } from 'yaml';
import { writeSyntheticSessions } from './synthetic-sessions.ts';

const SEED = 1;
const GNU_TIME = '/usr/bin/time';
const MiB = 1024 * 1024;

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

/**
 * Runs `command args` to completion: wall time and peak RSS; throws with its stderr unless it exits 0. What
 * earlier contenders wrote is first put on disk (`sync`), so that the kernel's writing it back does not fall
 * on this one.
 */
async function measure(command: string, args: string[], rssFile: string): Promise<Measurement> {
  spawnSync('sync');
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

/** The parse floor: read the file with readline and JSON.parse every line, nothing else; prints the line count. */
const PARSE_FLOOR = `
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

/**
 * DuckDB's round trip: every session read and typed, then written back as JSONL; nothing else. Its rows are
 * counted afterwards, outside the timed process (sessionsIn): reading its output back inside it would time
 * work prefab's side does not do (docs/experiments.md, Benchmarks, has what that cost).
 */
const DUCKDB = `
import { DuckDBInstance } from '@duckdb/node-api';
const [input, output] = process.argv.slice(2);
const db = await DuckDBInstance.create(':memory:', { threads: '2' });
const c = await db.connect();
await c.run(\`COPY (SELECT * FROM read_json('\${input}', format = 'newline_delimited', maximum_object_size = 67108864)) TO '\${output}' (FORMAT json)\`);
`;

/** The sessions of a JSONL file: its lines that hold more than white space (the input's, and DuckDB's output's). */
async function sessionsIn(path: string): Promise<number> {
  let n = 0;
  for await (const line of createInterface({ input: createReadStream(path), crlfDelay: Infinity }))
    if (line.trim() !== '') n++;
  return n;
}

interface Row {
  n: number;
  /** Size of the input file. */
  bytes: number;
  floor: Measurement;
  duckdb: Measurement;
  ingest: Measurement;
  /** Ingest with --workers 1: what the threads gain. */
  ingestOneThread: Measurement;
  pairs: Measurement;
  counts: Record<string, unknown>;
  /** Seconds each data stage took in the ingest → pairs runs, as their manifests record them, and the rest of the run (`other`): medians. */
  stageSeconds: Record<string, number>;
  /** The seen-id set (ingest/ids.bin): the one thing that grows with the data, by design. */
  idSetBytes: number;
}

/** The middle of `values` by `key` (of an even count, the lower of the two middle ones). */
const middle = <T>(values: T[], key: (v: T) => number): T =>
  [...values].sort((a, b) => key(a) - key(b))[(values.length - 1) >> 1]!;

/** The median seconds and the median peak RSS of `runs` (each on its own: they may come from different runs). */
function median(runs: Measurement[]): Measurement {
  return {
    seconds: middle(runs, (m) => m.seconds).seconds,
    peakRssBytes: middle(runs, (m) => m.peakRssBytes).peakRssBytes,
    stdout: runs[0]!.stdout,
  };
}

/** Measures on `given` (a JSONL file of n sessions), or on n synthetic sessions written for the run, in `rounds` paired rounds. */
async function benchOne(n: number, rounds: number, given?: string): Promise<Row> {
  const dir = await mkdtemp(join(tmpdir(), `prefab-bench-${n}-`));
  try {
    const input = join(dir, 'sessions.jsonl');
    if (given) await symlink(resolve(given), input);
    else await writeSyntheticSessions(input, n, SEED);
    const bytes = (await stat(input)).size;
    // configs/default.yaml with ingest.inputs pointing at the generated file (relative to the config's folder).
    const config = parseDocument(await readFile('configs/default.yaml', 'utf8'));
    config.setIn(['ingest', 'inputs'], ['sessions.jsonl']);
    const configPath = join(dir, 'config.yaml');
    await writeFile(configPath, config.toString());

    const script = join(process.cwd(), 'node_modules', '.cache', 'prefab-bench-duckdb.mjs');
    await writeFile(script, DUCKDB);
    // bin/prefab.js run as a program, as `npx prefab` runs it: its first line starts node with malloc's threshold set.
    const run = (until: string, round: number, ...options: string[]) =>
      measure(
        resolve('bin', 'prefab.js'),
        [
          '--workdir',
          join(dir, `workspace-${until}${options.join('')}-${round}`),
          '--config',
          configPath,
          '--log-format',
          'json',
          '-q',
          ...options,
          'run',
          '--until',
          until,
        ],
        join(dir, `${until}.rss`),
      );
    // Paired rounds: each round measures every contender once, in turn, so that the machine's slow moments fall
    // on all of them alike; each figure is the median of its rounds.
    const taken: Record<'floor' | 'duckdb' | 'ingest' | 'ingestOneThread' | 'pairs', Measurement[]> = {
      floor: [],
      duckdb: [],
      ingest: [],
      ingestOneThread: [],
      pairs: [],
    };
    type StageManifest = { counts: Record<string, unknown>; seconds: number };
    const manifest = (workspace: string, stage: string) =>
      readFile(join(workspace, stage, 'manifest.json'), 'utf8').then((t) => JSON.parse(t) as StageManifest);
    let stages: Record<'ingest' | 'split' | 'pairs', StageManifest> | null = null;
    const stageRounds: Record<string, number[]> = {};
    for (let round = 0; round < rounds; round++) {
      const floor = await measure(process.execPath, ['-e', PARSE_FLOOR, input], join(dir, 'floor.rss'));
      if (Number(floor.stdout) !== n) throw new Error(`the parse floor read ${floor.stdout} lines, expected ${n}`);
      const duckdb = await measure(
        process.execPath,
        [script, input, join(dir, 'duckdb.jsonl')],
        join(dir, 'duckdb.rss'),
      );
      const written = await sessionsIn(join(dir, 'duckdb.jsonl'));
      if (written !== n) throw new Error(`DuckDB wrote ${written} rows, expected ${n}`);
      await rm(join(dir, 'duckdb.jsonl'), { force: true });
      taken.floor.push(floor);
      taken.duckdb.push(duckdb);
      // Each workspace goes once measured, as DuckDB's output does: the page cache it holds would otherwise be
      // reclaimed during the next contender (at the simulator's 100k, the ingest → pairs run's ingest stage
      // took 1.8 s with the ingest runs' 433 MB each still there, against 1.25 s without).
      taken.ingest.push(await run('ingest', round));
      await rm(join(dir, `workspace-ingest-${round}`), { recursive: true, force: true });
      taken.ingestOneThread.push(await run('ingest', round, '--workers', '1'));
      await rm(join(dir, `workspace-ingest--workers1-${round}`), { recursive: true, force: true });
      const pairsRun = await run('pairs', round);
      taken.pairs.push(pairsRun);
      // Each stage's seconds as the run's manifests record them, and what the run spent outside them.
      const workspace = join(dir, `workspace-pairs-${round}`);
      stages = {
        ingest: await manifest(workspace, 'ingest'),
        split: await manifest(workspace, 'split'),
        pairs: await manifest(workspace, 'pairs'),
      };
      const inStages = Object.values(stages).reduce((sum, m) => sum + m.seconds, 0);
      for (const [name, m] of Object.entries({ ...stages, other: { seconds: pairsRun.seconds - inStages } }))
        (stageRounds[name] ??= []).push(m.seconds);
      // The last round's seen-id set is measured below.
      if (round < rounds - 1) await rm(join(dir, `workspace-pairs-${round}`), { recursive: true, force: true });
    }
    const workspace = join(dir, `workspace-pairs-${rounds - 1}`);
    const counts = Object.fromEntries(Object.entries(stages!).map(([name, m]) => [name, m.counts]));
    const stageSeconds = Object.fromEntries(
      Object.entries(stageRounds).map(([name, seconds]) => [name, middle(seconds, (s) => s)]),
    );
    const idSetBytes = (await stat(join(workspace, 'ingest', 'ids.bin'))).size;
    const read = Number(counts.ingest.sessions) + Number(counts.ingest.quarantined) + Number(counts.ingest.duplicates);
    if (read !== n)
      throw new Error(`ingest read ${read} records (sessions, quarantined and duplicates), expected ${n}`);
    return {
      n,
      bytes,
      floor: median(taken.floor),
      duckdb: median(taken.duckdb),
      ingest: median(taken.ingest),
      ingestOneThread: median(taken.ingestOneThread),
      pairs: median(taken.pairs),
      counts,
      stageSeconds,
      idSetBytes,
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** The parse floor over many files: each read whole and JSON.parse-d line by line; prints the line count. */
const FILES_FLOOR = `
const { readdirSync, readFileSync } = require('node:fs');
const { join } = require('node:path');
let n = 0;
for (const name of readdirSync(process.argv[1])) {
  for (const line of readFileSync(join(process.argv[1], name), 'utf8').split('\\n')) if (line) { JSON.parse(line); n++; }
}
process.stdout.write(String(n));
`;

/** `prefab run --until ingest` over `n` files of one session each, under `ulimit -n 1024`, beside the parse floor over them; medians of `rounds`. */
async function benchFiles(n: number, rounds: number): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), `prefab-bench-files-${n}-`));
  try {
    const one = join(dir, 'one.jsonl');
    await writeSyntheticSessions(one, n, SEED);
    const lines = (await readFile(one, 'utf8')).split('\n').filter(Boolean);
    await rm(one);
    await mkdir(join(dir, 'in'));
    for (const [i, line] of lines.entries()) await writeFile(join(dir, 'in', `s${i}.jsonl`), line + '\n');
    await writeFile(join(dir, 'config.yaml'), 'ingest:\n  inputs: [in]\n');
    const prefab = resolve('bin', 'prefab.js');
    const floors: Measurement[] = [];
    const ingests: Measurement[] = [];
    for (let round = 0; round < rounds; round++) {
      const floor = await measure(process.execPath, ['-e', FILES_FLOOR, join(dir, 'in')], join(dir, 'floor.rss'));
      if (Number(floor.stdout) !== n) throw new Error(`the parse floor read ${floor.stdout} lines, expected ${n}`);
      floors.push(floor);
      const workspace = join(dir, `workspace-${round}`);
      const command = `ulimit -n 1024 && exec "$0" "$@"`;
      const args = ['--workdir', workspace, '--config', join(dir, 'config.yaml'), '-q', 'run', '--until', 'ingest'];
      ingests.push(await measure('sh', ['-c', command, prefab, ...args], join(dir, 'ingest.rss')));
      const counts = (
        JSON.parse(await readFile(join(workspace, 'ingest', 'manifest.json'), 'utf8')) as {
          counts: { sessions: number };
        }
      ).counts;
      if (counts.sessions !== n) throw new Error(`ingest made ${counts.sessions} sessions of ${n} files`);
      await rm(workspace, { recursive: true, force: true });
    }
    const [floor, ingest] = [median(floors), median(ingests)];
    console.log(`${n} files of one session each; medians of ${rounds} paired round(s)`);
    console.log('| what | seconds | files/s | peak RSS MiB |\n|---|---|---|---|');
    for (const [what, m] of [
      ['parse floor (read each file, JSON.parse)', floor],
      ['prefab ingest (ulimit -n 1024)', ingest],
    ] as const)
      console.log(
        `| ${what} | ${m.seconds.toFixed(2)} | ${(n / m.seconds).toFixed(0)} | ${(m.peakRssBytes / MiB).toFixed(0)} |`,
      );
    const rss = ingest.peakRssBytes / MiB;
    console.log(
      `ingest ${(floor.seconds / ingest.seconds).toFixed(3)}× the parse floor's rate; peak RSS ${rss.toFixed(0)} MiB (goal ≤ 300 at 50,000 files: ${n === 50_000 ? (rss <= 300 ? 'met' : 'not met') : 'run --files 50000'})`,
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const { values } = parseArgs({
  options: {
    sizes: { type: 'string', default: '10000,100000' },
    input: { type: 'string' },
    rounds: { type: 'string', default: '3' },
    files: { type: 'string' },
  },
});
const rounds = Number(values.rounds);
if (!Number.isInteger(rounds) || rounds < 1) throw new Error(`--rounds wants a positive integer, got ${values.rounds}`);
if (values.files !== undefined) {
  const n = Number(values.files);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`--files wants a positive integer, got ${values.files}`);
  await benchFiles(n, rounds);
  process.exit(0);
}
const rows: Row[] = [];
if (values.input) {
  const n = await sessionsIn(values.input);
  process.stderr.write(`running on ${values.input} (${n} sessions)...\n`);
  rows.push(await benchOne(n, rounds, values.input));
} else {
  const sizes = values.sizes.split(',').map((s) => Number(s.trim()));
  if (sizes.some((n) => !Number.isInteger(n) || n <= 0))
    throw new Error(`--sizes wants positive integers, got ${values.sizes}`);
  sizes.sort((a, b) => a - b);
  for (const n of sizes) {
    process.stderr.write(`running N=${n}...\n`);
    rows.push(await benchOne(n, rounds));
  }
}

const rate = (r: Row, m: Measurement) => r.n / m.seconds;
const mib = (m: Measurement) => (m.peakRssBytes / MiB).toFixed(0);
for (const r of rows)
  console.log(
    `N=${r.n}: ${(r.bytes / 1e6).toFixed(0)} MB of JSONL (${(r.bytes / r.n / 1024).toFixed(1)} KiB a session)`,
  );
console.log(`Each figure is the median of ${rounds} paired round(s) (every contender once a round, in turn).`);
console.log('| sessions | what | seconds | sessions/s | peak RSS MiB |\n|---|---|---|---|---|');
for (const r of rows) {
  for (const [what, m] of [
    ['parse floor (readline + JSON.parse)', r.floor],
    ['DuckDB round trip (2 threads)', r.duckdb],
    ['prefab ingest', r.ingest],
    ['prefab ingest, one thread (--workers 1)', r.ingestOneThread],
    ['prefab ingest → split → pairs', r.pairs],
  ] as const) {
    console.log(`| ${r.n} | ${what} | ${m.seconds.toFixed(2)} | ${rate(r, m).toFixed(0)} | ${mib(m)} |`);
  }
}
console.log('');
for (const r of rows) {
  const a = rate(r, r.ingest) / rate(r, r.floor);
  const b = rate(r, r.pairs) / rate(r, r.duckdb);
  console.log(
    `N=${r.n}: ingest ${a.toFixed(3)}× the parse floor (goal ≥ 0.5: ${a >= 0.5 ? 'met' : 'not met'}); ingest → pairs ${b.toFixed(3)}× DuckDB's round trip (goal ≥ 1.0: ${b >= 1 ? 'met' : 'not met'}), peak RSS ${mib(r.pairs)} against its ${mib(r.duckdb)} MiB (${r.pairs.peakRssBytes <= r.duckdb.peakRssBytes ? 'met' : 'not met'})`,
  );
}
for (const r of rows) {
  const { other, ...stages } = r.stageSeconds;
  console.log(
    `N=${r.n}, ingest → pairs by stage (medians): ${Object.entries(stages)
      .map(([name, s]) => `${name} ${s.toFixed(2)} s`)
      .join(', ')}; the other ${other!.toFixed(2)} s start the process, hash the input and go between stages`,
  );
}
const smallest = rows[0]!;
const largest = rows[rows.length - 1]!;
// The seen-id set aside (as the goal states it): while it doubles, the old table and the new one are both held.
const aside = (r: Row) => r.pairs.peakRssBytes - 1.5 * r.idSetBytes;
const growth = aside(largest) / aside(smallest);
// One size (--input): no growth to state.
if (rows.length > 1)
  console.log(
    `ingest → pairs peak RSS, N=${largest.n} / N=${smallest.n}: ${(largest.pairs.peakRssBytes / smallest.pairs.peakRssBytes).toFixed(2)}×; with the seen-id set aside (${(largest.idSetBytes / MiB).toFixed(0)} and ${(smallest.idSetBytes / MiB).toFixed(0)} MiB, 1.5× while it grows) ${growth.toFixed(2)}× (${smallest.n >= 100_000 ? `goal ≤ 1.2: ${growth <= 1.2 ? 'met' : 'not met'}` : 'the goal compares 1M sessions with 100k: --sizes 100000,1000000; below 100k the buffers have not reached their size'}); measured with ${existsSync(GNU_TIME) ? `${GNU_TIME} -f %M` : 'VmHWM polled from /proc/<pid>/status'}`,
  );
console.log(`\nstage counts at N=${largest.n}: ${JSON.stringify(largest.counts)}`);
