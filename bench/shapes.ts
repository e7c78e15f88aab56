import type { LlamaConfig } from '../model/config.ts';
// The model shapes the decoding benches (decode.ts, serve.ts) run at, with random weights: the default run's
// and two small open models', as their config.json give them.

const base = { ropeTheta: 10_000, rmsNormEps: 1e-6, maxPositions: 2048, bosTokenId: null, eosTokenId: null };
export const SHAPES: Record<string, LlamaConfig> = {
  default: {
    ...base,
    modelType: 'llama',
    vocabSize: 1024,
    hiddenSize: 128,
    intermediateSize: 352,
    layers: 4,
    heads: 4,
    kvHeads: 4,
    headDim: 32,
    tiedEmbeddings: true,
    attentionBias: false,
  },
  'smollm2-135m': {
    ...base,
    modelType: 'llama',
    vocabSize: 49_152,
    hiddenSize: 576,
    intermediateSize: 1536,
    layers: 30,
    heads: 9,
    kvHeads: 3,
    headDim: 64,
    tiedEmbeddings: true,
    attentionBias: false,
  },
  'qwen2.5-0.5b': {
    ...base,
    modelType: 'qwen2',
    vocabSize: 151_936,
    hiddenSize: 896,
    intermediateSize: 4864,
    layers: 24,
    heads: 14,
    kvHeads: 2,
    headDim: 64,
    tiedEmbeddings: true,
    attentionBias: true,
  },
};
