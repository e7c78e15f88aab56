// The dapo stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
// dapo: reinforcement learning of the preference-tuned model in the simulator, by DAPO (verl's recipe:
// rl/dapo.ts runs it, rl/trainer.ts and train/losses/policy-gradient.ts are its trainer and loss). Each
// step draws training tasks, plays group_size episodes of each with the current policy, keeps the groups whose
// rewards differ (dynamic sampling, drawing more tasks up to max_generation_batches), and updates on them.
// mode: feedback plays a group's episodes in order, each reading what the representatives said in the failed
// ones before it (seed 004). Every validation.every steps the policy is measured on validation tasks. Off, the
// stage passes the dpo model on unchanged.
import { cp, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { runDapo } from '../../rl/dapo.ts';
import { chosenBackend } from '../../train/backend.ts';

import type { StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config } from './index.ts';

export async function run({ config: cfg, out, input, cache, key, log, options, signal }: StageContext<Config>): Promise<StageReport> {
  const from = join(input('dpo'), 'model');
  if (!cfg.enabled) {
    await cp(from, join(out, 'model'), { recursive: true });
    await writeFile(join(out, 'metrics.jsonl'), ''); // no DAPO step was taken
    return { counts: { steps: 0, resumed_from: 0 }, summary: 'DAPO is off (dapo.enabled: false): the dpo model is passed on' };
  }
  const backend = await chosenBackend(options, log);
  const run = await runDapo(from, out, cache, key, cfg, {}, signal, log, backend.gpu);
  const last = run.last;
  const final = run.final;
  return {
    counts: { steps: cfg.steps, resumed_from: run.resumedFrom },
    summary:
      `${cfg.steps} ${cfg.mode === 'feedback' ? 'feedback-guided ' : ''}DAPO steps of ${cfg.tasks_per_step} tasks × ${cfg.group_size} episodes (${cfg.reward} reward); last steps: reward ${last.reward_mean?.toFixed(3)}, success ${last.success?.toFixed(3)}, kept groups ${last.kept_groups?.toFixed(1)}` +
      (final?.['val/success_first'] === undefined ? '' : `; validation: first try ${final['val/success_first']!.toFixed(3)}, with feedback ${final['val/success_feedback']!.toFixed(3)}`),
  };
}
