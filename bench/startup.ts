// How long a command takes before it does anything: `prefab status`, `stages` and `--help` on an empty
// workspace, against `node -e ''` measured in the same run (the baseline: Node's own start). Medians of
// --runs runs each, interleaved so that a busy machine slows all alike. Goal: status ≤ 0.3 s over Node.
// Usage: npm run bench:startup [-- --runs 15]
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';

const opts = new Command().option('--runs <n>', 'runs of each command', '15').parse().opts<{ runs: string }>();
const BIN = join(import.meta.dirname, '..', 'bin', 'prefab.js');
const dir = mkdtempSync(join(tmpdir(), 'prefab-bench-startup-'));
const workdir = join(dir, 'workspace');

// prefab as `npx prefab` runs it: bin/prefab.js as a program (sh starts node on it, its first line).
const commands: [string, string, string[]][] = [
  ["node -e ''", process.execPath, ['-e', '']],
  ['prefab status', BIN, ['--workdir', workdir, 'status']],
  ['prefab stages', BIN, ['--workdir', workdir, 'stages']],
  ['prefab --help', BIN, ['--help']],
];

/** GNU time gives each run's peak RSS; without it only the times are printed. */
const TIME = existsSync('/usr/bin/time') ? '/usr/bin/time' : null;
const times = new Map<string, number[]>(commands.map(([name]) => [name, []]));
const peaks = new Map<string, number>();
for (let run = 0; run < Number(opts.runs); run++) {
  for (const [name, program, args] of commands) {
    const t0 = performance.now();
    const r = TIME
      ? spawnSync(TIME, ['-f', '%M', program, ...args], { encoding: 'utf8' })
      : spawnSync(program, args, { encoding: 'utf8' });
    times.get(name)!.push(performance.now() - t0);
    if (r.status !== 0) throw new Error(`${name} exited ${r.status}: ${r.stderr}`);
    if (TIME) peaks.set(name, Math.max(peaks.get(name) ?? 0, Number(r.stderr.trim().split('\n').at(-1)) / 1024));
  }
}

rmSync(dir, { recursive: true, force: true });

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const base = median(times.get("node -e ''")!);
process.stdout.write(
  `${opts.runs} runs each, medians\n\n| command | seconds | over node -e '' | peak RSS |\n|---|---|---|---|\n`,
);
for (const [name] of commands) {
  const m = median(times.get(name)!);
  process.stdout.write(
    `| ${name} | ${(m / 1000).toFixed(3)} | ${((m - base) / 1000).toFixed(3)} | ${TIME ? `${peaks.get(name)!.toFixed(0)} MiB` : '—'} |\n`,
  );
}
const over = (median(times.get('prefab status')!) - base) / 1000;
process.stdout.write(
  `goal: prefab status ≤ 0.3 s over node -e '': ${over <= 0.3 ? 'met' : 'not met'} (${over.toFixed(3)} s)\n`,
);
