// Iterative on-policy DPO (rl/iterative.ts), end to end at a tiny size: rounds of rollouts (here a scripted
// agent of middling skill plays them, so that they part), step pairs where they do, DPO with RPO's anchor on
// them, the policy on validation after each round; a rerun resumes from the rounds already made.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { NEVER } from '../../pipeline/interrupt.ts';
import { ScriptedAgent } from '../../env/agents.ts';
import { DEFAULT_WORLD, generateWorld } from '../../env/world.ts';
import { loadCheckpoint } from '../../model/checkpoint.ts';
import { deviceOn, openDevice } from '../../runtime/device.ts';
import { keptModel, runIterativeDpo, type IterativeRunOptions } from '../../rl/iterative.ts';
import { iterativeKnobs } from '../../rl/settings.ts';
import { preferenceKnobs, PAIRWISE_LOSSES } from '../../trainers/settings.ts';
import { z } from 'zod';
import { tempDir } from '../fixtures/pipeline.ts';
import { servedModelFolder } from '../fixtures/served-model.ts';
import { quietLogger } from '../fixtures/toy-stages.ts';

const world = generateWorld({ ...DEFAULT_WORLD });
const knobs = z.strictObject(iterativeKnobs).parse({
  rounds: 2,
  tasks_per_round: 3,
  rollouts_per_task: 6,
  max_calls: 1,
  task_pool: 20,
  simulator: { max_tokens: 8, max_turns: 10 },
  validation: { tasks: 2, tries: 1 },
  keep: 'last',
});
const preference = z
  .strictObject(preferenceKnobs({ lr: 1e-3, losses: PAIRWISE_LOSSES }))
  .parse({ rpo_alpha: 1, batch_size: 4, max_steps: 2, micro_batch_tokens: 4096 });

async function run(
  cache: string,
  out: string,
  reference: 'reset' | 'fixed' = 'reset',
  method: 'dpo' | 'rft' = 'dpo',
): Promise<IterativeRunOptions> {
  await openDevice({ backend: 'wasm' });
  return {
    from: await servedModelFolder(tempDir(), 'iterative'),
    out,
    cache,
    key: `test-${reference}-${method}`,
    knobs: { ...knobs, reference, method },
    preference,
    device: deviceOn({ kind: 'reference' }),
    signal: NEVER,
    log: quietLogger(),
    actor: (task, round, trial) => new ScriptedAgent('noisy', world, task, `iterative-${round}-${trial}`, 0.5),
  };
}

describe('iterative on-policy DPO', () => {
  it('plays rounds, trains on their step pairs, validates after each, and resumes from the rounds it made', async () => {
    const [cache, out] = [tempDir(), tempDir()];
    const o = await run(cache, out);
    const rows = (await runIterativeDpo(o)).figures;
    expect(rows.map((r) => [r.round, r.episodes])).toEqual([
      [0, 0],
      [1, 18],
      [2, 36],
    ]);
    for (const r of rows) expect(r['val/success_first']).toBeGreaterThanOrEqual(0);
    // The scripted rollouts part where the agent's noise makes it try another turn: step pairs, and a model trained on them.
    expect(rows[1]!['rollouts/step_pairs']).toBeGreaterThan(0);
    const [start, last] = [loadCheckpoint(o.from).model, loadCheckpoint(join(out, 'model')).model];
    const moved = [...start.params].some(([name, v]) => {
      const [a, b] = [v.dataSync(), last.params.get(name)!.dataSync()];
      return a.some((x, i) => x !== b[i]);
    });
    expect(moved).toBe(true);
    start.dispose();
    last.dispose();
    expect(readFileSync(join(out, 'metrics.jsonl'), 'utf8').trim().split('\n')).toHaveLength(3);
    // Run again on the same cache: every round is read back, nothing played or trained again.
    const again = (
      await runIterativeDpo({
        ...o,
        actor: () => {
          throw new Error('played again');
        },
      })
    ).figures;
    expect(again).toEqual(rows);
  });

  it('keeps the round with the best validation first-try success (the earlier of equals), or the last', () => {
    const rows = [0.1, 0.25, 0.3, 0.15, 0.3].map((v, round) => ({ round, 'val/success_first': v }));
    const folders = ['sft', 'r1', 'r2', 'r3', 'r4'];
    expect(keptModel('best', rows, folders)).toBe('r2');
    expect(keptModel('last', rows, folders)).toBe('r4');
    // No round better than where it started: the starting model.
    expect(
      keptModel(
        'best',
        [0.2, 0.2, 0.1].map((v) => ({ 'val/success_first': v })),
        ['sft', 'r1', 'r2'],
      ),
    ).toBe('sft');
  });

  it('as its control (rft), fine-tunes on the same rollouts’ successes instead', async () => {
    const [cache, out] = [tempDir(), tempDir()];
    const o = await run(cache, out, 'reset', 'rft');
    const rows = (await runIterativeDpo(o)).figures;
    expect(rows).toHaveLength(3);
    expect(rows[1]!['rollouts/success']).toBeGreaterThan(0);
    const trained = JSON.parse(readFileSync(join(out, 'model', 'trainer_state.json'), 'utf8')) as { info: object };
    expect(trained.info).toMatchObject({ method: 'rft', round: 2 });
  });

  it('runs with a fixed reference too: the starting model for every round', async () => {
    const [cache, out] = [tempDir(), tempDir()];
    const rows = (await runIterativeDpo(await run(cache, out, 'fixed'))).figures;
    expect(rows).toHaveLength(3);
    expect(existsSync(join(out, 'model', 'model.safetensors'))).toBe(true);
  });
});
