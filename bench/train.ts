// Training throughput on the bench shape (4 layers, width 256, 4 heads, context 256, vocabulary 512, batch 8,
// AdamW): tokens/s and achieved GFLOP/s, beside a plain 2048×256·256×1024 matMul's GFLOP/s measured in the
// same run, which is the ceiling this backend can reach. `--model llama` measures the Llama-family model
// (train/llama.ts) of the same shape: tied embeddings, SwiGLU of width 688, `--kv-heads` key/value heads.
// Usage: npm run bench:train [-- --backend wasm --steps 6 --model gpt|llama]
import * as tf from '@tensorflow/tfjs-core';
import { Command } from 'commander';
import { BACKENDS, useBackend, type BackendChoice } from '../train/backend.ts';
import { causalMask } from '../train/kernels.ts';
import { GPT, gelu, layerNorm } from '../train/model.ts';
import { Llama } from '../train/llama.ts';
import { ADAMW_DEFAULTS, AdamW } from '../train/optimizer.ts';
import { optimizerStep } from '../train/step.ts';
import { seeded } from '../core/random.ts';

const opts = new Command()
  .option('--backend <name>', `one of ${BACKENDS.join(', ')}`, 'wasm')
  .option('--steps <n>', 'timed steps', '6')
  .option('--batch <n>', 'sequences per step', '8')
  .option('--positions <kind>', 'learned (GPT-2, the bench shape) or rope (what sft trains by default)', 'learned')
  .option('--no-naive', 'skip the naive baseline (tf.matMul gradients, batched attention): slow')
  .option('--model <kind>', 'gpt (what sft trains today) or llama', 'gpt')
  .option('--kv-heads <n>', 'llama: key/value heads (grouped-query attention below 4)', '4')
  .parse()
  .opts<{ backend: BackendChoice; steps: string; batch: string; positions: string; naive: boolean; model: string; kvHeads: string }>();

const backend = await useBackend(opts.backend);
if (opts.positions !== 'learned' && opts.positions !== 'rope') throw new Error(`--positions is learned or rope, not ${opts.positions}`);
const config = { vocabSize: 512, contextLength: 256, layers: 4, width: 256, heads: 4, positions: opts.positions as 'learned' | 'rope' };
const B = Number(opts.batch);
const T = config.contextLength;

function matmulPeak(): number {
  const a = tf.randomNormal([2048, 256]) as tf.Tensor2D;
  const b = tf.randomNormal([256, 1024]) as tf.Tensor2D;
  tf.matMul(a, b).dispose();
  const n = 10;
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    const c = tf.matMul(a, b);
    c.dataSync();
    c.dispose();
  }
  const seconds = (performance.now() - t0) / 1000 / n;
  a.dispose();
  b.dispose();
  return (2 * 2048 * 256 * 1024) / seconds / 1e9;
}

const gpt = GPT.create(config, 'bench');
const llama =
  opts.model === 'llama'
    ? Llama.create(
        { modelType: 'llama', vocabSize: config.vocabSize, hiddenSize: config.width, intermediateSize: 688, layers: config.layers, heads: config.heads, kvHeads: Number(opts.kvHeads), headDim: config.width / config.heads, ropeTheta: 10000, rmsNormEps: 1e-5, tiedEmbeddings: true, attentionBias: false, maxPositions: T, bosTokenId: null, eosTokenId: null },
        'bench',
      )
    : null;
if (opts.model !== 'gpt' && !llama) throw new Error(`--model is gpt or llama, not ${opts.model}`);
const model = gpt;
const trained = llama ?? gpt;
/** Training FLOPs per token, as nanoGPT's estimate_mfu counts them: 6 per parameter used in a matMul, and attention's. */
const flopsPerToken = llama ? 6 * llama.size() + 12 * config.layers * config.width * T : gpt.flopsPerToken();
const optimizer = new AdamW(trained.params, ADAMW_DEFAULTS);
const rand = seeded('bench', 'data');
const batch = () => {
  const ids = new Int32Array(B * T).map(() => Math.floor(rand() * config.vocabSize));
  const targets = new Int32Array(B * T).map(() => Math.floor(rand() * config.vocabSize));
  return { ids, targets };
};
const step = () => {
  const { ids, targets } = batch();
  return optimizerStep(trained, optimizer, [() => ({ loss: tf.neg(tf.mean(trained.tokenLogprobs(ids, targets, B, T))) as tf.Scalar })], 3e-4, 1);
};

/**
 * The same model written the obvious way: tf.matMul with its built-in gradient (transpose flags), attention as
 * a batched matMul, the embedding as a one-hot matMul (tf.gather's gradient does not run on WASM).
 */
function naiveLoss(ids: Int32Array, targets: Int32Array, b: number): tf.Scalar {
  const C = config.width;
  const H = config.heads;
  const hs = C / H;
  const w = (name: string) => model.p(name);
  const ln = (x: tf.Tensor, name: string) => layerNorm(x as tf.Tensor2D, w(`${name}.weight`), w(`${name}.bias`));
  const mask = causalMask(T);
  let x: tf.Tensor = tf.add(tf.reshape(tf.matMul(tf.cast(tf.oneHot(tf.tensor1d(ids, 'int32'), config.vocabSize), 'float32'), w('wte.weight')), [b, T, C]), tf.slice(w('wpe.weight'), [0, 0], [T, C]));
  x = tf.reshape(x, [b * T, C]);
  for (let i = 0; i < config.layers; i++) {
    const qkv = tf.matMul(ln(x, `h.${i}.ln_1`), w(`h.${i}.attn.c_attn.weight`));
    const heads = (k: number) => tf.transpose(tf.reshape(tf.slice(qkv, [0, k * C], [b * T, C]), [b, T, H, hs]), [0, 2, 1, 3]);
    const att = tf.softmax(tf.add(tf.mul(tf.matMul(heads(0), heads(1), false, true), 1 / Math.sqrt(hs)), mask));
    const y = tf.reshape(tf.transpose(tf.matMul(att, heads(2)), [0, 2, 1, 3]), [b * T, C]);
    x = tf.add(x, tf.matMul(y, w(`h.${i}.attn.c_proj.weight`)));
    const h = tf.matMul(ln(x, `h.${i}.ln_2`), w(`h.${i}.mlp.c_fc.weight`));
    x = tf.add(x, tf.matMul(gelu(h as tf.Tensor2D), w(`h.${i}.mlp.c_proj.weight`)));
  }
  const logits = tf.matMul(ln(x, 'ln_f'), w('wte.weight'), false, true);
  const picked = tf.sum(tf.mul(tf.logSoftmax(logits), tf.cast(tf.oneHot(tf.tensor1d(targets, 'int32'), config.vocabSize), 'float32')), -1);
  return tf.neg(tf.mean(picked));
}

function naiveTokensPerSecond(): number {
  const b = 1; // one sequence: the naive step is slow
  const ids = new Int32Array(b * T).map(() => Math.floor(rand() * config.vocabSize));
  const targets = new Int32Array(b * T).map(() => Math.floor(rand() * config.vocabSize));
  const t0 = performance.now();
  optimizerStep(model, optimizer, [() => ({ loss: naiveLoss(ids, targets, b) })], 3e-4, 1);
  return (b * T) / ((performance.now() - t0) / 1000);
}

const peakBefore = matmulPeak();
step(); // warm-up: kernels compiled, heap grown
const tensorsBefore = tf.memory().numTensors;
const steps = Number(opts.steps);
const t0 = performance.now();
let last = 0;
for (let i = 0; i < steps; i++) last = step().loss;
const seconds = (performance.now() - t0) / 1000;
const peakAfter = matmulPeak();
const peak = (peakBefore + peakAfter) / 2;
const tokensPerSecond = (steps * B * T) / seconds;
const gflops = (tokensPerSecond * flopsPerToken) / 1e9;
console.log(`backend          ${backend.description}`);
console.log(
  llama
    ? `model            Llama ${(llama.size() / 1e6).toFixed(2)}M parameters, ${config.layers} layers, width ${config.width}, ${config.heads} heads (${llama.config.kvHeads} key/value), SwiGLU ${llama.config.intermediateSize}, context ${T}, vocab ${config.vocabSize}, tied`
    : `model            GPT ${(model.size() / 1e6).toFixed(2)}M parameters, ${config.layers} layers, width ${config.width}, ${config.heads} heads, context ${T}, vocab ${config.vocabSize}, ${config.positions} positions`,
);
console.log(`batch            ${B} × ${T} tokens, AdamW, ${steps} timed steps (${(seconds / steps).toFixed(2)} s/step), last loss ${last.toFixed(3)}`);
console.log(`tokens/s         ${tokensPerSecond.toFixed(0)}`);
console.log(`achieved         ${gflops.toFixed(1)} GFLOP/s (${(flopsPerToken / 1e6).toFixed(1)} MFLOP per token, forward + backward)`);
console.log(`plain matMul     ${peak.toFixed(1)} GFLOP/s (2048×256 · 256×1024, mean of before and after)`);
console.log(`ratio            ${(gflops / peak).toFixed(2)} of the plain matMul`);
if (opts.naive && (config.positions === 'rope' || llama)) console.log('naive tfjs       (measured for the GPT with --positions learned only)');
else if (opts.naive) {
  const naive = naiveTokensPerSecond();
  console.log(`naive tfjs       ${naive.toFixed(0)} tokens/s (one sequence, one step): prefab's kernels are ${(tokensPerSecond / naive).toFixed(1)}× faster`);
}
console.log(`tensors leaked   ${tf.memory().numTensors - tensorsBefore} over ${steps} steps`);
