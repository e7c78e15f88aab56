// LoRA (Hu et al. 2021) on the Llama-family model, in PEFT's format: a chosen projection W (out, in) gets
// y = x·Wᵀ + (α/r)·(x·Aᵀ)·Bᵀ with A (r, in) and B (out, r); only A and B are trained. B starts at zero, so a
// fresh adapter changes nothing. Saved as PEFT saves it (adapter_config.json, adapter_model.safetensors with
// `base_model.model.<module>.lora_A.weight`), so PEFT and vLLM load it; merged into W for a plain checkpoint.
// With the adapters off, the model is its base: the DPO reference without a second copy of the weights.
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs-core';
import { seeded } from '../core/random.ts';
import type { Llama } from './llama.ts';
import { readSafetensors, writeSafetensors } from './safetensors.ts';
import { PROJECTIONS, type LoraConfig } from './config.ts';

/** The modules of `model` that `targets` names, e.g. model.layers.0.self_attn.q_proj. */
function targetModules(model: Llama, targets: string[]): string[] {
  const unknown = targets.filter((t) => !(PROJECTIONS as readonly string[]).includes(t));
  if (unknown.length)
    throw new Error(
      `lora target_modules: ${unknown.join(', ')} is not a projection of the Llama family (${PROJECTIONS.join(', ')})`,
    );
  return [...model.params.keys()]
    .filter((name) => name.endsWith('.weight') && targets.some((t) => name.endsWith(`.${t}.weight`)))
    .map((name) => name.slice(0, -'.weight'.length));
}

/**
 * Attaches fresh adapters: A drawn uniformly in ±1/√in (PEFT's Kaiming-uniform with a = √5), B zero. The
 * base weights stop being trained: `trainableParameters` gives the adapters alone.
 */
export function attachLora(model: Llama, cfg: LoraConfig, seed: string): void {
  if (model.adapters.size) throw new Error('the model already has adapters');
  for (const module of targetModules(model, cfg.targetModules)) {
    const [out, inner] = model.params.get(`${module}.weight`)!.shape as [number, number];
    const rand = seeded(seed, 'lora', module);
    const bound = 1 / Math.sqrt(inner);
    const a = Float32Array.from({ length: cfg.r * inner }, () => (2 * rand() - 1) * bound);
    model.adapters.set(module, {
      a: tf.variable(tf.tensor2d(a, [cfg.r, inner]), true),
      b: tf.variable(tf.zeros([out, cfg.r]), true),
      scale: cfg.alpha / cfg.r,
      dropout: cfg.dropout,
      index: model.adapters.size,
    });
  }
  if (!model.adapters.size)
    throw new Error(`lora target_modules ${cfg.targetModules.join(', ')} matched no projection`);
}

/** What an optimiser trains: the adapters when there are any, else every weight. Named as PEFT names them. */
export function trainableParameters(model: Llama): Map<string, tf.Variable> {
  if (!model.adapters.size) return model.params;
  return new Map(
    [...model.adapters].flatMap(
      ([module, ad]) =>
        [
          [`base_model.model.${module}.lora_A.weight`, ad.a],
          [`base_model.model.${module}.lora_B.weight`, ad.b],
        ] as [string, tf.Variable][],
    ),
  );
}

/** Writes the adapters in PEFT's layout: adapter_config.json and adapter_model.safetensors, aside and then renamed. */
export function saveAdapter(dir: string, model: Llama, cfg: LoraConfig, baseModel: string): void {
  const tmp = `${dir}.tmp`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  const config = {
    peft_type: 'LORA',
    task_type: 'CAUSAL_LM',
    base_model_name_or_path: baseModel,
    r: cfg.r,
    lora_alpha: cfg.alpha,
    lora_dropout: cfg.dropout,
    target_modules: cfg.targetModules,
    bias: 'none',
    fan_in_fan_out: false,
    use_rslora: false,
    modules_to_save: null,
    inference_mode: true,
  };
  writeFileSync(join(tmp, 'adapter_config.json'), JSON.stringify(config, null, 2) + '\n');
  const tensors = new Map(
    [...trainableParameters(model)].map(([name, v]) => [name, { shape: v.shape, data: v.dataSync() as Float32Array }]),
  );
  writeSafetensors(join(tmp, 'adapter_model.safetensors'), tensors, { format: 'pt' });
  rmSync(dir, { recursive: true, force: true });
  renameSync(tmp, dir);
}

/** Attaches the adapters a PEFT folder holds to `model` (its base); returns their config. */
export function loadAdapter(dir: string, model: Llama): LoraConfig {
  const configPath = join(dir, 'adapter_config.json');
  if (!existsSync(configPath)) throw new Error(`${dir} is not a LoRA adapter folder: it has no adapter_config.json`);
  const j = JSON.parse(readFileSync(configPath, 'utf8')) as Record<string, unknown>;
  if (j.peft_type !== 'LORA')
    throw new Error(`${configPath}: peft_type ${JSON.stringify(j.peft_type)}; prefab reads LORA adapters`);
  if (j.use_rslora === true || j.use_dora === true)
    throw new Error(`${configPath}: rsLoRA and DoRA adapters are not supported`);
  // Per-module ranks and alphas, or adapters on some layers only, would change the scale or the modules.
  for (const key of ['rank_pattern', 'alpha_pattern', 'layers_to_transform']) {
    const v = j[key];
    if (v !== undefined && v !== null && !(typeof v === 'object' && Object.keys(v).length === 0))
      throw new Error(`${configPath}: ${key} is not supported`);
  }
  if (!Array.isArray(j.target_modules))
    throw new Error(
      `${configPath}: target_modules ${JSON.stringify(j.target_modules)}: prefab reads a list of projection names (q_proj, v_proj, ...)`,
    );
  const targets = j.target_modules as string[];
  const cfg: LoraConfig = {
    r: Number(j.r),
    alpha: Number(j.lora_alpha),
    dropout: Number(j.lora_dropout ?? 0),
    targetModules: targets,
  };
  const { tensors } = readSafetensors(join(dir, 'adapter_model.safetensors'));
  for (const module of targetModules(model, targets)) {
    const a = tensors.get(`base_model.model.${module}.lora_A.weight`);
    const b = tensors.get(`base_model.model.${module}.lora_B.weight`);
    if (!a || !b) throw new Error(`${dir}: no lora_A/lora_B weights for ${module}`);
    const [out, inner] = model.params.get(`${module}.weight`)!.shape as [number, number];
    if (a.shape.join() !== [cfg.r, inner].join() || b.shape.join() !== [out, cfg.r].join())
      throw new Error(
        `${dir}: ${module}'s lora_A is [${a.shape}] and lora_B [${b.shape}]; expected [${cfg.r},${inner}] and [${out},${cfg.r}]`,
      );
    model.adapters.set(module, {
      a: tf.variable(tf.tensor2d(a.data, a.shape as [number, number]), true),
      b: tf.variable(tf.tensor2d(b.data, b.shape as [number, number]), true),
      scale: cfg.alpha / cfg.r,
      dropout: cfg.dropout,
      index: model.adapters.size,
    });
  }
  return cfg;
}

/**
 * The factor by which adapters' dropout multiplies an input of (rows, cols) at `seed`: 0, or 1/(1 − rate) for
 * what is kept. TensorFlow.js's dropout draws it from the shape and the seed alone, so it is the mask the
 * model's own forward applies at that seed (model/llama.ts linear); the GPU's forward uploads it.
 */
export function dropoutMask(rows: number, cols: number, rate: number, seed: number): Float32Array {
  return tf.tidy(() => tf.dropout(tf.ones([rows, cols]), rate, undefined, seed).dataSync() as Float32Array);
}

/** Folds every adapter into its weight, W + (α/r)·B·A, and removes the adapters: a plain checkpoint again. */
export function mergeLora(model: Llama): void {
  for (const [module, ad] of model.adapters) {
    const w = model.params.get(`${module}.weight`)!;
    const merged = tf.tidy(() => model.adaptedWeight(module));
    w.assign(merged);
    tf.dispose([merged, ad.a, ad.b]);
  }
  model.adapters.clear();
}
