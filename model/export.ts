// `prefab model export`: a model folder (or a LoRA adapter on its base) written where other tools run models:
// a GGUF file for llama.cpp, Ollama and LM Studio (gguf.ts), or one plain Hugging Face folder with the
// adapters merged into the weights (what vLLM and transformers load without PEFT).
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, isAbsolute, join, resolve } from 'node:path';
import { prefabTokenizerConfig } from './chat-template.ts';
import { loadCheckpoint } from './checkpoint.ts';
import { readHfConfig, writeHfModel, type TokenizerFiles } from './hf.ts';
import { readChatTemplate } from './hf-chat.ts';
import { writeGguf, type GgufType } from './gguf.ts';
import { loadAdapter, mergeLora } from './lora.ts';
import type { Llama } from './llama.ts';
import { TextTokenizer } from './tokenizer.ts';

export interface ExportOptions {
  /** A model folder (config.json, weights, tokenizer.json; adapter/ is merged), or a PEFT adapter folder. */
  from: string;
  /** The GGUF file, or the folder, to write. */
  out: string;
  format: 'gguf' | 'hf';
  /** GGUF's weight type. */
  type: GgufType;
  /** An adapter's base model folder, where adapter_config.json's base_model_name_or_path is not one. */
  base?: string;
  /** GGUF's general.name (default: the folder's name). */
  name?: string;
}

/** The model `from` holds, its adapters merged, with its tokenizer files and config.json's own keys. */
function mergedModel(o: ExportOptions): { model: Llama; tokenizer: TokenizerFiles; json: Record<string, unknown> } {
  const adapterConfig = join(o.from, 'adapter_config.json');
  if (existsSync(join(o.from, 'config.json'))) {
    const checkpoint = loadCheckpoint(o.from);
    mergeLora(checkpoint.model);
    return { model: checkpoint.model, tokenizer: checkpoint.tokenizer, json: readHfConfig(o.from).json };
  }
  if (!existsSync(adapterConfig))
    throw new Error(`${o.from} is neither a model folder (config.json) nor a LoRA adapter (adapter_config.json)`);
  const named = (JSON.parse(readFileSync(adapterConfig, 'utf8')) as { base_model_name_or_path?: unknown })
    .base_model_name_or_path;
  const base =
    o.base ?? (typeof named === 'string' && named ? (isAbsolute(named) ? named : resolve(o.from, named)) : undefined);
  if (!base || !existsSync(join(base, 'config.json')))
    throw new Error(
      `${adapterConfig}: its base model ${JSON.stringify(named)} is not a model folder here; name one with --base`,
    );
  const checkpoint = loadCheckpoint(base);
  mergeLora(checkpoint.model);
  loadAdapter(o.from, checkpoint.model);
  mergeLora(checkpoint.model);
  return { model: checkpoint.model, tokenizer: checkpoint.tokenizer, json: readHfConfig(base).json };
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
  const { model, tokenizer, json } = mergedModel(o);
  try {
    const files = withTemplate(tokenizer, model.config.maxPositions, o.from);
    if (o.format === 'gguf') {
      const weights = new Map([...model.weights()].map(([name, w]) => [name, w.data]));
      const name = o.name ?? basename(resolve(o.from));
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
