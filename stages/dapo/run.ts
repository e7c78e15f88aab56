// The dapo stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { cp, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { runDapo } from '../../rl/dapo.ts';
import { deviceFor } from '../../runtime/device.ts';
import type { StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

export async function run({
  config: cfg,
  out,
  input,
  cache,
  key,
  log,
  options,
  signal,
}: StageContext<Config>): Promise<StageReport> {
  const from = join(input('dpo'), 'model');
  if (!cfg.enabled) {
    await cp(from, join(out, 'model'), { recursive: true });
    await writeFile(join(out, 'metrics.jsonl'), ''); // no DAPO step was taken
    return {
      counts: { steps: 0, resumed_from: 0 },
      summary: 'DAPO is off (dapo.enabled: false): the dpo model is passed on',
    };
  }
  const device = await deviceFor(options, log);
  const run = await runDapo({ from, out, cache, key, knobs: cfg, info: {}, device, signal, log });
  const last = run.last;
  const final = run.final;
  return {
    counts: { steps: cfg.steps, resumed_from: run.resumedFrom },
    summary:
      `${cfg.steps} ${cfg.mode === 'feedback' ? 'feedback-guided ' : ''}DAPO steps of ${cfg.tasks_per_step} tasks × ${cfg.group_size} episodes (${cfg.reward} reward); last steps: reward ${last.reward_mean?.toFixed(3)}, success ${last.success?.toFixed(3)}, kept groups ${last.kept_groups?.toFixed(1)}` +
      (final?.['val/success_first'] === undefined
        ? ''
        : `; validation: first try ${final['val/success_first']!.toFixed(3)}, with feedback ${final['val/success_feedback']!.toFixed(3)}`),
  };
}
