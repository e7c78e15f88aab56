// configs/recipe.yaml end to end at a tiny size: its own data command (the one in its header) makes the
// sessions, and the run goes through eval with the recipe's settings but a tiny model and few steps.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { DuckDBInstance } from '@duckdb/node-api';
import { parse, stringify } from 'yaml';
import { prefab, REPO } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';

const RECIPE = join(REPO, 'configs', 'recipe.yaml');

/** The `prefab simulate` line of the recipe's header, as its arguments. */
function dataCommand(): string[] {
  const line = readFileSync(RECIPE, 'utf8')
    .split('\n')
    .find((l) => /^#\s+npx prefab simulate /.test(l));
  if (!line) throw new Error('configs/recipe.yaml: no `npx prefab simulate` line in its header');
  return line.replace(/^#\s+npx prefab /, '').split(/\s+/);
}

/** `args` with the value of each option in `values` replaced. */
function withValues(args: string[], values: Record<string, string>): string[] {
  return args.map((a, i) => (i > 0 && args[i - 1]! in values ? values[args[i - 1]!]! : a));
}

/** One simulated day of the recipe's loop with `configFile`: the night's report (day `day`). */
function refreshDay(configFile: string, day: number, ...options: string[]) {
  const r = prefab([
    '--workdir',
    workdir,
    '--config',
    configFile,
    ...options,
    '--log-format',
    'json',
    'refresh',
    '--days',
    '1',
  ]);
  expect(r.code, r.stderr).toBe(0);
  const night = String(day).padStart(4, '0');
  return JSON.parse(readFileSync(join(workdir, 'refresh', 'nights', night, 'report.json'), 'utf8'));
}

/** The task of each session day `day` brought to the inbox. */
const dayTasks = (day: number): string[] =>
  readFileSync(join(dir, 'data', 'inbox', `day-${String(day).padStart(4, '0')}.jsonl`), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l).task_id as string);

let dir: string;
let workdir: string;
let simulated: string[];
let config: Record<string, any>;
beforeAll(() => {
  dir = tempDir();
  workdir = join(dir, 'workspace');
  simulated = dataCommand();
  const made = prefab(withValues(simulated, { '--tasks': '60', '--out': join(dir, 'data', 'sessions.jsonl.gz') }));
  expect(made.code, made.stderr).toBe(0);
  config = parse(readFileSync(RECIPE, 'utf8'));
  config.ingest.inputs = [join(dir, 'data')];
  config.tokenizer.vocab_size = 512;
  config.sft = { ...config.sft, model: { layers: 1, hidden_size: 32, heads: 2, context: 640 }, max_steps: 4 };
  config.dpo = { ...config.dpo, max_examples: 32, max_steps: 2 };
  config.eval = { max_pairs: 12, max_sessions: 6, simulator: { ...config.eval.simulator, tasks: 3, max_tokens: 16 } };
  // The loop's inbox inside the data folder, as the recipe has it (ingest reads the folder whole).
  config.refresh = {
    ...config.refresh,
    inbox: join(dir, 'data', 'inbox'),
    dpo: { ...config.refresh.dpo, max_steps: 2 },
    eval: { ...config.refresh.eval, tasks: 2, max_tokens: 16 },
    days: { ...config.refresh.days, tasks: 2, trials: 2 },
  };
  writeFileSync(join(dir, 'recipe.yaml'), stringify(config));
  const r = prefab(['--workdir', workdir, '--config', join(dir, 'recipe.yaml'), '--log-format', 'json', 'run']);
  expect(r.code, r.stderr).toBe(0);
}, 600_000);

describe('configs/recipe.yaml', () => {
  it('trains SFT on sessions in which a call fails, the representative names what is missing, and the next call has it', async () => {
    const db = await DuckDBInstance.create(':memory:');
    const c = await db.connect();
    // The reply that names a missing field, then a later call to the same department: the try SFT learns from.
    const [row] = (
      await c.runAndReadAll(
        `SELECT count(*)::INTEGER AS n FROM '${join(workdir, 'export', 'sft', 'train.parquet')}'
         WHERE regexp_matches(to_json(messages)::VARCHAR, 'can''t verify your identity yet: I need your [^"]*".*"name":"call"')`,
      )
    ).getRowObjects();
    c.closeSync();
    expect(row!.n).toBeGreaterThan(0);
  });

  it('evaluates SFT and the preference-trained model on validation tasks of at most two departments, two tries each, twin by twin', () => {
    const report = JSON.parse(readFileSync(join(workdir, 'eval', 'eval.json'), 'utf8'));
    expect(report.held_out).toMatchObject({ val_tasks: 3, k: 2 });
    // The preference stage's column is named by its loss (the recipe's: ORPO, on the retries alone).
    expect(report.preference_loss.loss).toBe('orpo');
    expect(Object.keys(report.models)).toEqual(['untrained', 'sft', 'orpo']);
    for (const model of ['sft', 'orpo'])
      expect(report.models[model]).toMatchObject({
        'success/mean@2': expect.any(Number),
        'success/pass@2': expect.any(Number),
      });
    expect(Object.keys(report.against_sft)).toEqual(['orpo']);
    const dpo = JSON.parse(readFileSync(join(workdir, 'dpo', 'manifest.json'), 'utf8')).counts;
    expect(dpo.examples).toBeGreaterThan(0);
  });

  it("runs days of the online loop from the recipe's model: production's sessions land in the inbox inside the data folder, the night decides on them, and a later run with fewer days.tasks brings new tasks", () => {
    const night = refreshDay(join(dir, 'recipe.yaml'), 1);
    expect(dayTasks(1)).toHaveLength(4);
    expect(night.data.new_sessions).toBe(4);
    // A night with new pairs trains a candidate and plays it against production; one without says so.
    if (night.data.new_pairs > 0)
      expect(night.comparison).toMatchObject({ episodes: 2 * 2, promote: expect.any(Boolean) });
    else expect(night.decision).toBe('nothing to train on');

    const fewer = join(dir, 'recipe-fewer.yaml');
    writeFileSync(
      fewer,
      stringify({ ...config, refresh: { ...config.refresh, days: { ...config.refresh.days, tasks: 1 } } }),
    );
    const second = refreshDay(fewer, 2, '--switch-config');
    const [tasks1, tasks2] = [new Set(dayTasks(1)), new Set(dayTasks(2))];
    expect(tasks1.size).toBe(2);
    expect(tasks2.size).toBe(1);
    // Day 1 played tasks first_task and first_task + 1; at one task a day, day 2 would be first_task + 1 again.
    expect([...tasks2].filter((t) => tasks1.has(t))).toEqual([]);
    expect(second.data.new_sessions).toBe(2);
  }, 600_000);
});
