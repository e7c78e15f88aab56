// A checkpoint is a Hugging Face model folder (model/hf.ts: config.json, generation_config.json,
// model.safetensors in transformers' names) with the tokenizer's files beside it, which is all a model needs
// to be loaded by transformers, vLLM or prefab and to continue training from; a training checkpoint adds
// optimizer.safetensors (AdamW's moments) and trainer_state.json (step, data-order seed, schedule), which is
// everything a killed run needs to resume where it stopped. Folders are written whole, then renamed.
// prefab's own keys in config.json (transformers keeps unknown keys as attributes and ignores them):
//   prefab_context       the sequence length the model was trained at (windows, pairs and prompts are cut to it)
//   prefab_placeholders  how the model reads the values it copies (model/placeholders.ts); absent: as they are
// A checkpoint of a LoRA run also has adapter/ (PEFT's layout) with the adapters it is training.
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs-core';
import { readHfModel, readTokenizerFiles, writeModelFiles, type TokenizerFiles } from './hf.ts';
import { loadAdapter, saveAdapter } from './lora.ts';
import { Llama } from './llama.ts';
import { parsePlaceholders, type Placeholders } from './placeholders.ts';
import { readSafetensors, writeSafetensors, type NamedTensor } from './safetensors.ts';
import type { LoraConfig } from './config.ts';

interface TrainerState {
  /** Optimiser steps taken. */
  step: number;
  /** Steps the run will take in all: the schedule's length. */
  totalSteps: number;
  /** The data order is a function of this seed and the step, so it needs no other state. */
  seed: string;
  /** Free-form: what the run was trained on, last metrics. */
  info?: Record<string, unknown>;
}

/** AdamW's state as a checkpoint keeps it (trainers/optimizer.ts AdamW): each weight's two moments, and the step. */
interface OptimizerMoments {
  readonly m: Map<string, tf.Variable>;
  readonly v: Map<string, tf.Variable>;
  step: number;
}

const read = (t: tf.Tensor): NamedTensor => ({ shape: t.shape, data: t.dataSync() as Float32Array });

export interface CheckpointParts {
  model: Llama;
  tokenizer: TokenizerFiles;
  /** The sequence length the model is trained at. */
  context: number;
  /** The masking the model was trained with; absent or null: none. */
  placeholders?: Placeholders;
  optimizer?: OptimizerMoments;
  state?: TrainerState;
  /** The model's adapters' settings, when it is training LoRA adapters: saved in adapter/. */
  lora?: LoraConfig;
}

export function saveCheckpoint(dir: string, parts: CheckpointParts): void {
  const tmp = `${dir}.tmp`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  writeModelFiles(tmp, parts.model, {
    prefab_context: parts.context,
    ...(parts.placeholders ? { prefab_placeholders: parts.placeholders } : {}),
  });
  for (const [name, content] of Object.entries(parts.tokenizer)) writeFileSync(join(tmp, name), content);
  if (parts.optimizer) {
    const o = parts.optimizer;
    const moments = new Map<string, NamedTensor>();
    for (const name of o.m.keys()) {
      moments.set(`${name}.exp_avg`, read(o.m.get(name)!));
      moments.set(`${name}.exp_avg_sq`, read(o.v.get(name)!));
    }
    writeSafetensors(join(tmp, 'optimizer.safetensors'), moments, { step: String(o.step) });
  }
  if (parts.state) writeFileSync(join(tmp, 'trainer_state.json'), `${JSON.stringify(parts.state, null, 2)}\n`);
  if (parts.lora) saveAdapter(join(tmp, 'adapter'), parts.model, parts.lora, '..');
  rmSync(dir, { recursive: true, force: true });
  renameSync(tmp, dir);
}

export interface LoadedCheckpoint {
  model: Llama;
  tokenizer: TokenizerFiles;
  /** The sequence length the model was trained at: prefab_context, else max_position_embeddings. */
  context: number;
  placeholders: Placeholders;
  state: TrainerState | null;
  /** Puts the saved AdamW moments and step into `optimizer` (made for this model); false when none were saved. */
  restoreOptimizer(optimizer: OptimizerMoments): boolean;
}

/**
 * A model folder prefab wrote (with its adapters, when it has adapter/, unless `adapter` is false: the base
 * they sit on), or any Hugging Face folder of the Llama family with a tokenizer.json.
 */
export function loadCheckpoint(dir: string, { adapter = true }: { adapter?: boolean } = {}): LoadedCheckpoint {
  const hf = readHfModel(dir);
  const model = new Llama(hf.config, hf.weights);
  if (adapter && existsSync(join(dir, 'adapter'))) loadAdapter(join(dir, 'adapter'), model);
  const statePath = join(dir, 'trainer_state.json');
  const optimizerPath = join(dir, 'optimizer.safetensors');
  const context = hf.json.prefab_context;
  return {
    model,
    tokenizer: readTokenizerFiles(dir),
    context:
      typeof context === 'number' && Number.isInteger(context) && context > 0
        ? Math.min(context, hf.config.maxPositions)
        : hf.config.maxPositions,
    placeholders: parsePlaceholders(hf.json.prefab_placeholders, join(dir, 'config.json')),
    state: existsSync(statePath) ? (JSON.parse(readFileSync(statePath, 'utf8')) as TrainerState) : null,
    restoreOptimizer(optimizer) {
      if (!existsSync(optimizerPath)) return false;
      const { tensors: saved, metadata } = readSafetensors(optimizerPath);
      for (const name of optimizer.m.keys()) {
        const m = saved.get(`${name}.exp_avg`);
        const v = saved.get(`${name}.exp_avg_sq`);
        if (!m || !v) throw new Error(`${optimizerPath}: no moments for ${name}`);
        optimizer.m.get(name)!.assign(tf.tensor(m.data, m.shape));
        optimizer.v.get(name)!.assign(tf.tensor(v.data, v.shape));
      }
      optimizer.step = Number(metadata.step ?? 0);
      return true;
    },
  };
}
