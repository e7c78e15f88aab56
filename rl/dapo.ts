// DAPO's run (verl's recipe: trainer.ts, trainers/losses/policy-gradient.ts) from a model folder: each step
// draws training tasks, plays group_size episodes of each with the current policy (rollouts.ts), keeps
// the groups whose rewards differ (dynamic sampling), and updates on them; every validation.every steps the
// policy is measured on validation tasks. The dapo stage runs it after DPO; a refresh night after the
// candidate's DPO, when refresh.dapo.enabled.
import type { Logger } from '../pipeline/log.ts';
import { TOOLS } from '../env/env.ts';
import { DEFAULT_WORLD, generateWorld, taskPool } from '../env/world.ts';
import { openChat } from '../model/chat.ts';
import { loadCheckpoint } from '../model/checkpoint.ts';
import type { Llama } from '../model/llama.ts';
import type { Device } from '../runtime/device.ts';
import { decodingEngine } from '../runtime/placement.ts';
import { finalMetrics, trainingRun, type Held } from '../trainers/run.ts';
import type { TrainingSettings } from '../trainers/settings.ts';
import { simulatorRollouts, validation } from './rollouts.ts';
import type { DapoSettings } from './settings.ts';
import { dapoTrainer } from './trainer.ts';

export interface DapoRun {
  steps: number;
  resumedFrom: number;
  /** Means of the last steps' metrics. */
  last: Record<string, number>;
  /** The last step's metrics (its validation figures when it validated). */
  final: Record<string, number> | undefined;
}

/** What a DAPO run is given: its model, its knobs, where it goes, and the device it runs on. */
export interface DapoRunOptions {
  /** The model to start from (a Hugging Face folder). */
  from: string;
  /** Where the trained model and its metrics go: `out/model`, `out/metrics.jsonl`. */
  out: string;
  /** The stage's cache: the run's checkpoints, in a folder named by `key` (a rerun after a kill resumes there). */
  cache: string;
  key: string;
  knobs: DapoSettings;
  /** Joins the model's trainer_state.json. */
  info: Record<string, unknown>;
  /** Where the updates, the rollouts and validation run (under auto, each phase where it is faster). */
  device: Device;
  signal: AbortSignal;
  log: Logger;
}

/**
 * Trains the model in `o.from` by DAPO into `o.out`, resuming from the run's checkpoints. The dapo stage runs
 * it after DPO; a refresh night after the candidate's DPO.
 */
export async function runDapo(o: DapoRunOptions): Promise<DapoRun> {
  const { from, out, cache, key, knobs: cfg, info, device, signal, log } = o;
  const start = loadCheckpoint(from);
  const chat = openChat(start.tokenizer, start.model.config.eosTokenId, from);
  const s = cfg.simulator;
  // A step's groups are decoded side by side: under auto on the GPU where it is faster at that many sequences.
  const engine = await decodingEngine(device, start.model, cfg.group_size * cfg.tasks_per_step, log);
  const world = generateWorld({ ...DEFAULT_WORLD, seed: s.world_seed, companies: s.companies });
  const sampling = {
    maxTokens: s.max_tokens,
    temperature: s.temperature,
    topP: s.top_p,
    tools: s.constrained ? TOOLS : undefined,
    signal,
    recordTurns: true,
    engine,
  };

  const rollouts = simulatorRollouts({
    world,
    chat,
    context: start.context,
    placeholders: start.placeholders,
    sampling,
    maxTurns: s.max_turns,
    seed: cfg.seed,
    groupSize: cfg.group_size,
    tasksPerStep: cfg.tasks_per_step,
    maxGenerationBatches: cfg.max_generation_batches,
    taskPool: cfg.task_pool,
    maxCalls: cfg.max_calls,
    mode: cfg.mode,
    reward: cfg.reward,
    overlongBuffer: cfg.overlong_buffer,
    log,
  });
  const v = cfg.validation;
  const validate = {
    world,
    chat,
    context: start.context,
    placeholders: start.placeholders,
    sampling: { ...sampling, temperature: v.temperature, topP: 1 },
    maxTurns: s.max_turns,
    seed: cfg.seed,
    tasks: taskPool(world, 'val', v.tasks, cfg.max_calls),
    tries: v.tries,
  };
  const after = async (step: number, model: Llama, held: Held) => {
    if (v.every === 0 || ((step + 1) % v.every !== 0 && step + 1 !== cfg.steps)) return {};
    const figures = await validation(validate, model, held.trained);
    log.info('validation', { step: step + 1, ...figures });
    return figures;
  };

  const trainer = dapoTrainer({
    steps: cfg.steps,
    start: () => loadCheckpoint(from).model,
    rollouts,
    pad: chat.pad,
    microBatchTokens: cfg.micro_batch_tokens,
    clip: { clipLow: cfg.clip_low, clipHigh: cfg.clip_high, dualClip: cfg.dual_clip, klCoef: cfg.kl_coef },
    reference: cfg.kl_coef > 0 ? start.model : undefined,
    feedbackTraining: cfg.feedback_training,
    after,
    decodesOnCpu: device.gpu !== null && engine.kind !== 'gpu',
    ppoEpochs: cfg.ppo_epochs,
    miniBatches: cfg.mini_batches,
    seed: cfg.seed,
    signal,
  });
  log.info('training', {
    steps: cfg.steps,
    tasks_per_step: cfg.tasks_per_step,
    group_size: cfg.group_size,
    reward: cfg.reward,
    mode: cfg.mode,
  });
  // The run's settings in trainingRun's terms: a constant learning rate after warmup, a step per batch of rollouts.
  const settings: TrainingSettings = {
    seed: cfg.seed,
    batch_size: cfg.tasks_per_step,
    epochs: 1,
    max_steps: cfg.steps,
    lr: cfg.lr,
    warmup: cfg.warmup,
    min_lr_ratio: 1,
    weight_decay: cfg.weight_decay,
    max_grad_norm: cfg.max_grad_norm,
    checkpoint_every: cfg.checkpoint_every,
    micro_batch_tokens: cfg.micro_batch_tokens,
  };
  const result = await trainingRun(
    {
      config: settings,
      cache,
      key,
      tokenizer: start.tokenizer,
      context: start.context,
      placeholders: start.placeholders,
      signal,
      log,
      device,
    },
    trainer,
  );
  start.model.dispose();
  const final = result.metrics.at(-1);
  const last = await result.save(out, {
    stage: 'dapo',
    steps: cfg.steps,
    reward: cfg.reward,
    ...info,
    ...(Object.keys(info).length ? { last: finalMetrics(result.metrics) } : {}),
  });
  return { steps: cfg.steps, resumedFrom: result.resumedFrom, last, final };
}
