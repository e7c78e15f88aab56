// The head-to-head's driver (bench/iterative.ts) at a tiny size: every arm runs end to end from one model,
// writes a point at each checkpoint against the same SFT episodes, and the table lists them; a rerun of an
// arm writes nothing twice.
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { openDevice } from '../../runtime/device.ts';
import { REPO } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { servedModelFolder } from '../fixtures/served-model.ts';
import { ParquetTableWriter } from '../../pipeline/parquet.ts';
import { SFT_COLUMNS } from '../../stages/export/schema.ts';

const ARMS = [
  'offline',
  'iterative',
  'iterative-fixed',
  'offline-iterative',
  'rft',
  'rft-iterative',
  'dapo',
  'dapo-feedback',
];
let from: string;
let work: string;
let out: string;

function driver(...args: string[]) {
  const tiny = ['--episodes', '16', '--per-round', '8', '--k', '4', '--val-tasks', '2', '--tries', '1'];
  const small = ['--max-tokens', '8', '--max-calls', '1', '--backend', 'cpu', '--work', work, '--out', out];
  const r = spawnSync(
    process.execPath,
    ['--import', 'tsx', join(REPO, 'bench', 'iterative.ts'), '--from', from, ...tiny, ...small, ...args],
    { cwd: REPO, encoding: 'utf8' },
  );
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

const curves = () =>
  readFileSync(join(out, 'curves.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map(
      (l) =>
        JSON.parse(l) as {
          arm: string;
          seed: number;
          episodes: number;
          success_first: number;
          p: number;
          with_notes?: number;
          retry?: number;
        },
    );

describe('the head-to-head driver', () => {
  beforeAll(async () => {
    await openDevice({ backend: 'cpu' });
    from = await servedModelFolder(tempDir(), 'head-to-head');
    [work, out] = [tempDir(), tempDir()];
  });

  it('runs every arm end to end and tables their checkpoints against SFT', { timeout: 300_000 }, () => {
    const methods = new Map<string, string[]>();
    for (const arm of ARMS) {
      const r = driver('--arm', arm, '--seed', '1');
      expect(r.code, `${arm}: ${r.stderr.slice(-2000)}`).toBe(0);
      const rounds = r.stderr.split('\n').filter((l) => l.includes('"event":"rollouts"'));
      methods.set(
        arm,
        rounds.map((l) => (JSON.parse(l) as { round: number; method: string }).method),
      );
    }
    // Each round trains as its arm says: RFT then DPO, halves of the rounds, in rft-iterative.
    expect(methods.get('rft')).toEqual(['rft', 'rft']);
    expect(methods.get('iterative')).toEqual(['dpo', 'dpo']);
    expect(methods.get('rft-iterative')).toEqual(['rft', 'dpo']);
    const points = curves();
    expect(points.map((p) => `${p.arm} ${p.episodes}`)).toEqual(ARMS.flatMap((a) => [`${a} 8`, `${a} 16`]));
    for (const p of points) {
      expect(p.success_first).toBeGreaterThanOrEqual(0);
      expect(p.p).toBeGreaterThan(0);
      expect(p.p).toBeLessThanOrEqual(1);
    }
    // The offline rounds trained on the logs' step pairs: the mix of agents parts where one succeeds.
    const run = readdirSync(work).find((f) => f.startsWith('offline-1-'))!;
    const offline = readFileSync(join(work, run, 'model', 'model.safetensors'));
    expect(offline.equals(readFileSync(join(from, 'model.safetensors')))).toBe(false);
    const table = driver('--table');
    expect(table.code, table.stderr).toBe(0);
    expect(table.stdout).toMatch(
      /^\| SFT \| \| – \| 0 \| \d\.\d{3} \| \d\.\d{3} \/ \d\.\d{3} \| \| \| \| \d\.\d{3} \/ \d\.\d{3} \| \d\.\d{3} \| +\| \|$/m,
    );
    // The last checkpoint's with-feedback and retry success, each within the tries.
    for (const p of points.filter((p) => p.episodes === 16)) {
      expect(p.with_notes).toBeGreaterThanOrEqual(0);
      expect(p.retry).toBeGreaterThanOrEqual(0);
    }
    expect(points.filter((p) => p.episodes === 8).every((p) => p.with_notes === undefined)).toBe(true);
    for (const arm of ARMS)
      expect(table.stdout).toMatch(
        new RegExp(
          `^\\| ${arm} \\| k 4, per_round 8, lr [^|]+ \\| 1 \\| 16 \\| \\d\\.\\d{3} \\| \\d\\.\\d{3} \\/ \\d\\.\\d{3} \\|`,
          'm',
        ),
      );
    // Episodes to +0.10, a run a line: a checkpoint's episodes, or not within the run.
    for (const arm of ARMS)
      expect(table.stdout).toMatch(new RegExp(`^\\| ${arm} \\| k 4, [^|]+ \\| 1 \\| (8|16|not within 16) \\|$`, 'm'));
    // Again: every round is found made, and no point is written twice.
    const again = driver('--arm', 'offline', '--seed', '1');
    expect(again.code, again.stderr).toBe(0);
    expect(curves()).toHaveLength(points.length);
    // Another learning rate is another run, beside the first.
    const other = driver('--arm', 'offline', '--seed', '1', '--lr', '1e-4');
    expect(other.code, other.stderr).toBe(0);
    expect(curves()).toHaveLength(points.length + 2);
    expect(curves().at(-1)).toMatchObject({ arm: 'offline', knobs: { lr: 1e-4 } });
  });

  it('says whether a model reads notes: with-feedback against retry success on the same tasks', () => {
    const r = driver('--notes', '--notes-tries', '2');
    expect(r.code, r.stderr).toBe(0);
    const line = JSON.parse(r.stdout.trim().split('\n').at(-1)!);
    expect(line).toMatchObject({ from, tasks: 2, tries: 2, max_calls: 1 });
    expect(line.with_notes).toBeGreaterThanOrEqual(line.first);
    expect(line.retry).toBeGreaterThanOrEqual(line.first);
    expect(line.p).toBeGreaterThan(0);
    expect(readFileSync(join(out, 'notes.jsonl'), 'utf8')).toContain(JSON.stringify(line));
  });

  it('scores held-out NLL of SFT and of an arm’s checkpoints, once each, and tables it', async () => {
    const file = join(tempDir(), 'test.parquet');
    const w = await ParquetTableWriter.open(file, SFT_COLUMNS, { rowGroupSize: 100, compression: 'snappy' });
    for (let i = 0; i < 4; i++)
      await w.append({
        messages: [
          { role: 'user', content: `Please update my phone number, ticket ${i}.` },
          { role: 'assistant', content: `Done: ticket ${i} is updated.` },
        ],
        session_id: `s${i}`,
        task_id: null,
        reward: 1,
        tools: null,
      });
    await w.close();
    const r = driver('--nll', file, '--arm', 'offline', '--seed', '1');
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { arm: string; episodes: number; nll: number });
    expect(lines.map((l) => `${l.arm} ${l.episodes}`)).toEqual(['SFT 0', 'offline 8', 'offline 16']);
    for (const l of lines) expect(l.nll).toBeGreaterThan(0);
    // The offline rounds trained on the logs' step pairs: the NLL is another number than SFT's.
    expect(lines[2]!.nll).not.toBe(lines[0]!.nll);
    expect(driver('--nll', file, '--arm', 'offline', '--seed', '1').stdout).toBe('');
    expect(driver('--table').stdout).toMatch(/^\| SFT \|.*\| \d\.\d{3} \| \|$/m);
  });

  it('refuses an arm it does not know, naming the ones it does', () => {
    const r = driver('--arm', 'ppo');
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/--arm ppo: expected one of offline, iterative, .*dapo-feedback/);
  });
});
