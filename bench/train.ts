// Training throughput on the bench shape (4 layers, width 256, 4 heads, context 256, vocabulary 512, batch 8,
// AdamW): tokens/s and achieved GFLOP/s, beside a plain 2048×256·256×1024 matMul's GFLOP/s measured in the
// same run, which is the ceiling this backend can reach. Usage: npm run bench:train [-- --backend wasm --steps 6]
import * as tf from '@tensorflow/tfjs-core';
import { Command } from 'commander';
import { BACKENDS, useBackend, type BackendChoice } from '../stages/train/backend.ts';
import { GPT } from '../stages/train/model.ts';
import { ADAMW_DEFAULTS, AdamW } from '../stages/train/optimizer.ts';
import { optimizerStep } from '../stages/train/step.ts';
import { seeded } from '../stages/environment/random.ts';

const opts = new Command()
  .option('--backend <name>', `one of ${BACKENDS.join(', ')}`, 'wasm')
  .option('--steps <n>', 'timed steps', '6')
  .option('--batch <n>', 'sequences per step', '8')
  .parse()
  .opts<{ backend: BackendChoice; steps: string; batch: string }>();

const backend = await useBackend(opts.backend);
const config = { vocabSize: 512, contextLength: 256, layers: 4, width: 256, heads: 4 };
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

const model = GPT.create(config, 'bench');
const optimizer = new AdamW(model.params, ADAMW_DEFAULTS);
const rand = seeded('bench', 'data');
const batch = () => {
  const ids = new Int32Array(B * T).map(() => Math.floor(rand() * config.vocabSize));
  const targets = new Int32Array(B * T).map(() => Math.floor(rand() * config.vocabSize));
  return { ids, targets };
};
const step = () => {
  const { ids, targets } = batch();
  return optimizerStep(model, optimizer, () => ({ loss: tf.neg(tf.mean(model.tokenLogprobs(ids, targets, B, T))) as tf.Scalar }), 3e-4, 1);
};

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
const gflops = (tokensPerSecond * model.flopsPerToken()) / 1e9;
console.log(`backend          ${backend.description}`);
console.log(`model            ${(model.size() / 1e6).toFixed(2)}M parameters, ${config.layers} layers, width ${config.width}, ${config.heads} heads, context ${T}, vocab ${config.vocabSize}`);
console.log(`batch            ${B} × ${T} tokens, AdamW, ${steps} timed steps (${(seconds / steps).toFixed(2)} s/step), last loss ${last.toFixed(3)}`);
console.log(`tokens/s         ${tokensPerSecond.toFixed(0)}`);
console.log(`achieved         ${gflops.toFixed(1)} GFLOP/s (${(model.flopsPerToken() / 1e6).toFixed(1)} MFLOP per token, forward + backward)`);
console.log(`plain matMul     ${peak.toFixed(1)} GFLOP/s (2048×256 · 256×1024, mean of before and after)`);
console.log(`ratio            ${(gflops / peak).toFixed(2)} of the plain matMul`);
console.log(`tensors leaked   ${tf.memory().numTensors - tensorsBefore} over ${steps} steps`);
