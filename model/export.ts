// `prefab model export`: a model folder (or a LoRA adapter on its base) written where other tools run models:
// a GGUF file for llama.cpp, Ollama and LM Studio (gguf.ts), or one plain Hugging Face folder with the
// adapters merged into the weights (what vLLM and transformers load without PEFT); or the adapters alone as
// llama.cpp's adapter GGUF, to run over the base's GGUF (`--lora`).
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, isAbsolute, join, resolve } from 'node:path';
import { prefabTokenizerConfig } from './chat-template.ts';
import { loadCheckpoint } from './checkpoint.ts';
import { readHfConfig, writeHfModel, type TokenizerFiles } from './hf.ts';
import { readChatTemplate } from './hf-chat.ts';
import { writeGguf, writeGgufAdapter, type GgufType } from './gguf.ts';
import { loadAdapter, mergeLora } from './lora.ts';
import type { Llama } from './llama.ts';
import { TextTokenizer } from './tokenizer.ts';

export interface ExportOptions {
  /** A model folder (config.json, weights, tokenizer.json; adapter/ is merged), or a PEFT adapter folder. */
  from: string;
  /** The GGUF file, or the folder, to write. */
  out: string;
  /** gguf-lora: the adapters alone, as llama.cpp's adapter GGUF. */
  format: 'gguf' | 'hf' | 'gguf-lora';
  /** GGUF's weight type. */
  type: GgufType;
  /** false: a model folder's own weights, its adapter/ left out (the base its adapter GGUF runs on). */
  adapter?: boolean;
  /** An adapter's base model folder, where adapter_config.json's base_model_name_or_path is not one. */
  base?: string;
  /** GGUF's general.name (default: the folder's name). */
  name?: string;
}

type Loaded = { model: Llama; tokenizer: TokenizerFiles; json: Record<string, unknown> };

/** The model folder `dir` holds, with its adapter/ attached unless `adapter` is false. */
function held(dir: string, adapter: boolean): Loaded {
  const { model, tokenizer } = loadCheckpoint(dir, { adapter });
  return { model, tokenizer, json: readHfConfig(dir).json };
}

/**
 * The model `from` holds with its adapters attached, not merged: a model folder (with adapter/ unless
 * `adapter` is false), or a PEFT adapter folder on its base. A base whose adapter/ is this adapter (the
 * adapter/ of a prefab model folder) is that folder's own weights; another base is the model it holds.
 */
function loadModel(o: ExportOptions): Loaded {
  const adapterConfig = join(o.from, 'adapter_config.json');
  if (existsSync(join(o.from, 'config.json'))) return held(o.from, o.adapter !== false);
  if (!existsSync(adapterConfig))
    throw new Error(`${o.from} is neither a model folder (config.json) nor a LoRA adapter (adapter_config.json)`);
  if (o.adapter === false)
    throw new Error(
      `${o.from} is a LoRA adapter: --no-adapter leaves a model folder's adapter/ out; export its base instead`,
    );
  const named = (JSON.parse(readFileSync(adapterConfig, 'utf8')) as { base_model_name_or_path?: unknown })
    .base_model_name_or_path;
  const base =
    o.base ?? (typeof named === 'string' && named ? (isAbsolute(named) ? named : resolve(o.from, named)) : undefined);
  if (!base || !existsSync(join(base, 'config.json')))
    throw new Error(
      `${adapterConfig}: its base model ${JSON.stringify(named)} is not a model folder here; name one with --base`,
    );
  const ownBase = resolve(base, 'adapter') === resolve(o.from);
  const loaded = held(base, !ownBase);
  mergeLora(loaded.model);
  try {
    loadAdapter(o.from, loaded.model);
  } catch (error) {
    loaded.model.dispose();
    throw error;
  }
  return loaded;
}

/**
 * The tokenizer files with a chat template: a folder of prefab's tokenizer that carries none (prefab's
 * checkpoints do not) gets prefab's template for its call format, which GGUF and serving stacks need.
 */
function withTemplate(files: TokenizerFiles, context: number, source: string): TokenizerFiles {
  if (readChatTemplate(files, source)) return files;
  let tokenizer: TextTokenizer;
  try {
    tokenizer = new TextTokenizer(files['tokenizer.json']!);
  } catch {
    return files; // not prefab's: exported without a template, as it came
  }
  return { ...files, 'tokenizer_config.json': prefabTokenizerConfig(tokenizer, context) };
}

/** Writes the export; returns what was written. */
export function exportModel(o: ExportOptions): { path: string; bytes: number | null; format: string } {
  if (o.format === 'gguf-lora' && o.adapter === false)
    throw new Error(
      '--no-adapter leaves the adapter out, and --format gguf-lora writes the adapter alone: use one of them',
    );
  const { model, tokenizer, json } = loadModel(o);
  try {
    const name = o.name ?? basename(resolve(o.from));
    if (o.format === 'gguf-lora') {
      if (!model.adapters.size)
        throw new Error(
          `${o.from} has no LoRA adapter (adapter/ or adapter_config.json) to write as an adapter GGUF; --format gguf writes the whole model`,
        );
      const adapters = new Map(
        [...model.adapters].map(([module, ad]) => [
          module,
          { a: ad.a.dataSync() as Float32Array, b: ad.b.dataSync() as Float32Array, r: ad.a.shape[0] },
        ]),
      );
      // PEFT's one α for every module: α/r is each adapter's scale.
      const first = [...model.adapters.values()][0]!;
      const alpha = first.scale * first.a.shape[0];
      const adapter = { config: model.config, adapters, alpha, name, source: o.from };
      return { path: o.out, bytes: writeGgufAdapter(o.out, adapter, o.type), format: `gguf-lora ${o.type}` };
    }
    mergeLora(model);
    const files = withTemplate(tokenizer, model.config.maxPositions, o.from);
    if (o.format === 'gguf') {
      const weights = new Map([...model.weights()].map(([weight, w]) => [weight, w.data]));
      const bytes = writeGguf(o.out, { config: model.config, weights, tokenizer: files, name, source: o.from }, o.type);
      return { path: o.out, bytes, format: `gguf ${o.type}` };
    }
    // config.json's keys beyond the architecture's (prefab_context, prefab_placeholders) travel along.
    const extra = Object.fromEntries(Object.entries(json).filter(([key]) => key.startsWith('prefab_')));
    writeHfModel(o.out, model, extra);
    for (const [file, content] of Object.entries(files)) writeFileSync(join(o.out, file), content);
    return { path: o.out, bytes: null, format: 'hf' };
  } finally {
    model.dispose();
  }
}
