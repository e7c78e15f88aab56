// A checkpoint is a folder in Hugging Face's layout: model.safetensors, config.json and tokenizer.json, which
// is all a model needs to be loaded and to continue training from; a training checkpoint adds
// optimizer.safetensors (AdamW's moments) and trainer_state.json (step, data-order seed, schedule), which is
// everything a killed run needs to resume where it stopped. Folders are written whole, then renamed.
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs-core';
import { GPT, ROPE_BASE, parameterShapes, type GPTConfig } from './model.ts';
import type { AdamW } from './optimizer.ts';
import { parsePlaceholders, type Placeholders } from './placeholders.ts';
import { readSafetensors, writeSafetensors, type NamedTensor } from './safetensors.ts';

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

function configJson(c: GPTConfig, placeholders: Placeholders): Record<string, unknown> {
  return {
    model_type: 'prefab-gpt',
    vocab_size: c.vocabSize,
    n_positions: c.contextLength,
    n_layer: c.layers,
    n_embd: c.width,
    n_head: c.heads,
    activation_function: 'gelu_sigmoid',
    layer_norm_epsilon: 1e-5,
    tie_word_embeddings: true,
    // Linear weights are stored (in, out), as GPT-2's Conv1D stores them.
    weight_layout: 'in_out',
    position_embedding_type: c.positions === 'rope' ? 'rope' : 'learned',
    ...(c.positions === 'rope' ? { rope_theta: ROPE_BASE } : {}),
    // How the model reads the values it copies (train/placeholders.ts); absent: as they are.
    ...(placeholders ? { prefab_placeholders: placeholders } : {}),
  };
}

/** A model folder's config.json as it is written; names the folder when there is none. */
function readConfigJson(dir: string): { path: string; json: Record<string, unknown> } {
  const path = join(dir, 'config.json');
  if (!existsSync(path)) throw new Error(`${dir} is not a model folder: it has no config.json`);
  return { path, json: JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown> };
}

function readModelConfig(dir: string): GPTConfig {
  const { path, json: j } = readConfigJson(dir);
  if (j.model_type !== 'prefab-gpt') throw new Error(`${path}: model_type is ${JSON.stringify(j.model_type)}, not "prefab-gpt"`);
  const positions = j.position_embedding_type ?? 'learned';
  if (positions !== 'learned' && positions !== 'rope') throw new Error(`${path}: position_embedding_type is ${JSON.stringify(positions)}: prefab knows "learned" and "rope"`);
  return { vocabSize: Number(j.vocab_size), contextLength: Number(j.n_positions), layers: Number(j.n_layer), width: Number(j.n_embd), heads: Number(j.n_head), positions };
}

/** The masking a model folder's config.json records (null: none). */
function readPlaceholders(dir: string): Placeholders {
  const { path, json } = readConfigJson(dir);
  return parsePlaceholders(json.prefab_placeholders, path);
}

const read = (t: tf.Tensor): NamedTensor => ({ shape: t.shape, data: t.dataSync() as Float32Array });

export interface CheckpointParts {
  model: GPT;
  tokenizerJson: string;
  /** The masking the model was trained with; absent or null: none. */
  placeholders?: Placeholders;
  optimizer?: AdamW;
  state?: TrainerState;
}

export function saveCheckpoint(dir: string, parts: CheckpointParts): void {
  const tmp = `${dir}.tmp`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  writeSafetensors(join(tmp, 'model.safetensors'), new Map([...parts.model.params].map(([k, v]) => [k, read(v)])), { format: 'pt' });
  writeFileSync(join(tmp, 'config.json'), `${JSON.stringify(configJson(parts.model.config, parts.placeholders ?? null), null, 2)}\n`);
  writeFileSync(join(tmp, 'tokenizer.json'), parts.tokenizerJson);
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
  rmSync(dir, { recursive: true, force: true });
  renameSync(tmp, dir);
}

export interface LoadedCheckpoint {
  model: GPT;
  tokenizerJson: string;
  placeholders: Placeholders;
  state: TrainerState | null;
  /** Puts the saved AdamW moments and step into `optimizer` (made for this model); false when none were saved. */
  restoreOptimizer(optimizer: AdamW): boolean;
}

export function loadCheckpoint(dir: string): LoadedCheckpoint {
  const config = readModelConfig(dir);
  const { tensors } = readSafetensors(join(dir, 'model.safetensors'));
  for (const [name, shape] of parameterShapes(config)) {
    const t = tensors.get(name);
    if (!t || t.shape.join() !== shape.join()) throw new Error(`${join(dir, 'model.safetensors')}: ${name} is ${t ? `[${t.shape}]` : 'missing'}, config.json says [${shape}]`);
  }
  const model = new GPT(config, new Map([...tensors].map(([k, v]) => [k, v.data])));
  const statePath = join(dir, 'trainer_state.json');
  const optimizerPath = join(dir, 'optimizer.safetensors');
  return {
    model,
    tokenizerJson: readFileSync(join(dir, 'tokenizer.json'), 'utf8'),
    placeholders: readPlaceholders(dir),
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
