// The sft stage's work, loaded only when the stage runs (index.ts declares it: config, inputs, outputs).
import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { Message } from '../../core/records.ts';
import { deviceFor } from '../../runtime/device.ts';
import { resampledSessions } from '../../trainers/augment.ts';
import { readParquet, sftSequences, subset } from '../../trainers/data.ts';
import { trainingRun } from '../../trainers/run.ts';
import { openChat } from '../../model/chat.ts';
import { prefabTokenizerConfig } from '../../model/chat-template.ts';
import { readHfConfig, readHfModel, readTokenizerFiles } from '../../model/hf.ts';
import { attachLora } from '../../model/lora.ts';
import { loraOf } from '../../trainers/settings.ts';
import { Llama } from '../../model/llama.ts';
import { TextTokenizer } from '../../model/tokenizer.ts';
import { sftTrainer } from '../../trainers/sft.ts';
import { readPlaceholdersFile } from '../../model/placeholders.ts';

/** A from-scratch Llama of the configured shape for a tokenizer of `vocabSize` whose end of message is `eos`. */
function newModel(m: ModelSettings, vocabSize: number, eos: number, seed: string): Llama {
  const config: LlamaConfig = {
    modelType: 'llama',
    vocabSize,
    hiddenSize: m.hidden_size,
    intermediateSize: m.intermediate_size ?? Math.ceil(((8 / 3) * m.hidden_size) / 32) * 32,
    layers: m.layers,
    heads: m.heads,
    kvHeads: m.kv_heads ?? m.heads,
    headDim: m.hidden_size / m.heads,
    ropeTheta: m.rope_theta,
    rmsNormEps: 1e-6,
    tiedEmbeddings: m.tie_word_embeddings,
    attentionBias: false,
    maxPositions: m.context,
    bosTokenId: null,
    eosTokenId: eos,
  };
  return Llama.create(config, seed);
}

import type { StageContext, StageReport } from '../../pipeline/stage.ts';
import type { Config, ModelSettings } from './index.ts';
import type { LlamaConfig } from '../../model/config.ts';

export async function run({
  config: cfg,
  configDir,
  out,
  input,
  cache,
  key,
  log,
  options,
  signal,
}: StageContext<Config>): Promise<StageReport> {
  const device = await deviceFor(options, log);
  const placeholders = await readPlaceholdersFile(input('tokenizer'));
  const from = cfg.model.from ? resolve(configDir, cfg.model.from) : null;
  // The pretrained weights are read when the run starts from them, not when it resumes from a checkpoint.
  const pretrained = from ? readHfConfig(from) : null;
  const context = Math.min(cfg.model.context, pretrained?.config.maxPositions ?? Infinity);
  // A pretrained model brings its tokenizer and template; a new one reads the tokenizer stage's, and its
  // folder carries prefab's template in Jinja, so that transformers, TRL and vLLM read it as prefab does.
  const json = from ? '' : await readFile(join(input('tokenizer'), 'tokenizer.json'), 'utf8');
  const tokenizer = from
    ? readTokenizerFiles(from)
    : { 'tokenizer.json': json, 'tokenizer_config.json': prefabTokenizerConfig(new TextTokenizer(json), context) };
  const chat = openChat(tokenizer, pretrained?.config.eosTokenId ?? null, from ?? input('tokenizer'));
  const path = join(input('export'), 'sft', 'train.parquet');
  const sessions = subset(await readParquet<{ messages: Message[] }>(path), cfg.max_sessions, cfg.seed);
  if (sessions.length === 0)
    throw new Error(`${path} has no sessions: nothing to fine-tune on (export.sft_min_reward may be too high)`);
  const { conversations, resampled } = resampledSessions(
    sessions.map((s) => s.messages),
    cfg.resample_copies,
    cfg.seed,
  );
  const sequences = await sftSequences(chat, conversations, context + 1, path, placeholders);
  const lora = cfg.lora ? loraOf(cfg.lora) : undefined;
  const start = () => {
    const weights = from ? readHfModel(from) : null;
    const model = weights
      ? new Llama(weights.config, weights.weights)
      : newModel(cfg.model, chat.vocabSize, chat.stop[0]!, cfg.seed);
    if (lora) attachLora(model, lora, cfg.seed);
    return model;
  };
  const trainer = sftTrainer(sequences, start, cfg, chat.pad);
  log.info('training', {
    from,
    chat: chat.name,
    sessions: sessions.length,
    resampled,
    windows: sequences.length,
    tokens: sequences.reduce((n, s) => n + s.ids.length, 0),
    steps: trainer.steps,
    lora: lora ? `r ${lora.r} on ${lora.targetModules.join(', ')}` : null,
    backend: device.description,
  });

  const result = await trainingRun(
    {
      config: cfg,
      cache,
      key,
      tokenizer,
      context,
      placeholders,
      lora,
      base: from ?? undefined,
      signal,
      log,
      device,
    },
    trainer,
  );
  const parameters = result.model.size();
  const last = await result.save(out, { stage: 'sft', from, sessions: sessions.length, windows: sequences.length });
  return {
    counts: {
      sessions: sessions.length,
      resampled,
      windows: sequences.length,
      steps: trainer.steps,
      resumed_from: result.resumedFrom,
      parameters,
    },
    summary: `${trainer.steps} steps on ${sessions.length} sessions (${sequences.length} windows)${from ? ` from ${from}` : ''}${lora ? ` (LoRA r ${lora.r})` : ''}; loss ${last.loss?.toFixed(3)}, ${Math.round(last['tokens/s'] ?? 0)} tokens/s on ${result.device}`,
  };
}
