// Training throughput on the CPU of the trainer's model (model/llama.ts, a Llama) on the bench shape: 4 layers,
// hidden size 256, 4 heads (`--kv-heads` key/value heads), SwiGLU of width 688, context 256, vocabulary 512,
// tied embeddings, batch 8, AdamW. Three contenders in one run, each on the same shape and batch:
//   - the reference model on TensorFlow.js's WebAssembly backend (`--backend wasm`), with its plain
//     2048×256·256×1024 matMul's GFLOP/s (the ceiling that backend can reach) and, unless --no-naive, the same
//     model written the obvious way in tfjs;
//   - the CPU path (runtime/cpu/: the model held as arrays, its C kernels with OpenBLAS) on every core;
//   - PyTorch on the CPU (bench/peers/llama_cpu.py, the same model and optimizer in plain PyTorch) at 1 thread
//     and at every core's, each with OpenBLAS's threads spinning between calls (its default) and sleeping soon
//     (as the C kernels set it), where a python3 with torch is found (--python, else python3, else
//     /usr/bin/python3): the peer is the fastest of the four.
// Usage: npm run bench:train [-- --steps 6 --kv-heads 2 --no-naive --python /usr/bin/python3]
import { spawnSync } from 'node:child_process';
import { availableParallelism } from 'node:os';
import * as tf from '@tensorflow/tfjs-core';
import { Command } from 'commander';
import { openDevice } from '../runtime/device.ts';
import { causalMask } from '../model/ops.ts';
import { Llama, initialWeights } from '../model/llama.ts';
import { ADAMW_DEFAULTS, AdamW } from '../trainers/optimizer.ts';
import { CpuAdamW } from '../runtime/cpu/adamw.ts';
import { CpuLlama } from '../runtime/cpu/llama.ts';
import { loadCpuKernels } from '../runtime/cpu/kernels.ts';
import { optimizerStep, sftStep } from '../trainers/step.ts';
import { seeded } from '../core/random.ts';

const opts = new Command()
  .option('--steps <n>', 'timed steps', '6')
  .option('--batch <n>', 'sequences per step', '8')
  .option('--no-naive', 'skip the naive baseline (tf.matMul gradients, batched attention): slow')
  .option('--kv-heads <n>', 'key/value heads (grouped-query attention below 4)', '4')
  .option('--python <path>', 'a python3 with torch for the peer')
  .parse()
  .opts<{ steps: string; batch: string; naive: boolean; kvHeads: string; python?: string }>();

const device = await openDevice({ backend: 'wasm' });
const T = 256;
const B = Number(opts.batch);
const model = Llama.create(
  {
    modelType: 'llama',
    vocabSize: 512,
    hiddenSize: 256,
    intermediateSize: 688,
    layers: 4,
    heads: 4,
    kvHeads: Number(opts.kvHeads),
    headDim: 64,
    ropeTheta: 10000,
    rmsNormEps: 1e-5,
    tiedEmbeddings: true,
    attentionBias: false,
    maxPositions: T,
    bosTokenId: null,
    eosTokenId: null,
  },
  'bench',
);
const config = model.config;

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

const flopsPerToken = model.flopsPerToken(T);
const optimizer = new AdamW(model.params, ADAMW_DEFAULTS);
const rand = seeded('bench', 'data');
const batch = () => {
  const ids = new Int32Array(B * T).map(() => Math.floor(rand() * config.vocabSize));
  const targets = new Int32Array(B * T).map(() => Math.floor(rand() * config.vocabSize));
  return { ids, targets };
};
const step = () => {
  const { ids, targets } = batch();
  return optimizerStep(
    model,
    optimizer,
    [() => ({ loss: tf.neg(tf.mean(model.tokenLogprobs(ids, targets, B, T))) as tf.Scalar })],
    3e-4,
    1,
  );
};

/**
 * The same model written the obvious way: tf.matMul with its built-in gradient (transpose flags), attention as
 * a batched matMul, the embedding as a one-hot matMul (tf.gather's gradient does not run on WASM).
 */
function naiveLoss(ids: Int32Array, targets: Int32Array, b: number): tf.Scalar {
  const { heads: H, kvHeads: K, headDim: hd, vocabSize: V, rmsNormEps: eps } = config;
  const w = (name: string) => model.p(name);
  const norm = (x: tf.Tensor, name: string) =>
    tf.mul(tf.mul(x, tf.rsqrt(tf.add(tf.mean(tf.square(x), -1, true), eps))), w(name));
  const proj = (x: tf.Tensor, name: string) => tf.matMul(x as tf.Tensor2D, w(`${name}.weight`), false, true);
  const half = hd / 2;
  const inv = Array.from({ length: half }, (_, f) => 1 / Math.pow(config.ropeTheta, (2 * f) / hd));
  const angles = tf.tensor2d(
    Array.from({ length: T }, (_, p) => [...inv, ...inv].map((v) => p * v)),
    [T, hd],
  );
  const [cos, sin] = [tf.cos(angles), tf.sin(angles)];
  const turn = (x: tf.Tensor, n: number) => {
    const r = tf.reshape(x, [b, T, n, hd]);
    const [x1, x2] = tf.split(r, 2, 3);
    const c = tf.reshape(cos, [1, T, 1, hd]);
    const s = tf.reshape(sin, [1, T, 1, hd]);
    return tf.transpose(tf.add(tf.mul(r, c), tf.mul(tf.concat([tf.neg(x2), x1], 3), s)), [0, 2, 1, 3]); // (b, n, T, hd)
  };
  const mask = causalMask(T);
  let x: tf.Tensor = tf.matMul(
    tf.cast(tf.oneHot(tf.tensor1d(ids, 'int32'), V), 'float32'),
    w('model.embed_tokens.weight'),
  );
  for (let i = 0; i < config.layers; i++) {
    const l = `model.layers.${i}.`;
    const h = norm(x, `${l}input_layernorm.weight`);
    const q = turn(proj(h, `${l}self_attn.q_proj`), H);
    const repeat = (t: tf.Tensor) =>
      K === H ? t : tf.reshape(tf.tile(tf.reshape(t, [b, K, 1, T, hd]), [1, 1, H / K, 1, 1]), [b, H, T, hd]);
    const k = repeat(turn(proj(h, `${l}self_attn.k_proj`), K));
    const v = repeat(tf.transpose(tf.reshape(proj(h, `${l}self_attn.v_proj`), [b, T, K, hd]), [0, 2, 1, 3]));
    const att = tf.softmax(tf.add(tf.mul(tf.matMul(q, k, false, true), 1 / Math.sqrt(hd)), mask));
    const y = tf.reshape(tf.transpose(tf.matMul(att, v), [0, 2, 1, 3]), [b * T, H * hd]);
    x = tf.add(x, proj(y, `${l}self_attn.o_proj`));
    const m = norm(x, `${l}post_attention_layernorm.weight`);
    const gate = proj(m, `${l}mlp.gate_proj`);
    x = tf.add(x, proj(tf.mul(tf.mul(gate, tf.sigmoid(gate)), proj(m, `${l}mlp.up_proj`)), `${l}mlp.down_proj`));
  }
  const logits = tf.matMul(norm(x, 'model.norm.weight') as tf.Tensor2D, w('model.embed_tokens.weight'), false, true);
  const picked = tf.sum(
    tf.mul(tf.logSoftmax(logits), tf.cast(tf.oneHot(tf.tensor1d(targets, 'int32'), V), 'float32')),
    -1,
  );
  return tf.neg(tf.mean(picked)) as tf.Scalar;
}

function naiveTokensPerSecond(): number {
  const b = 1; // one sequence: the naive step is slow
  const ids = new Int32Array(b * T).map(() => Math.floor(rand() * config.vocabSize));
  const targets = new Int32Array(b * T).map(() => Math.floor(rand() * config.vocabSize));
  const t0 = performance.now();
  optimizerStep(model, optimizer, [() => ({ loss: naiveLoss(ids, targets, b) })], 3e-4, 1);
  return (b * T) / ((performance.now() - t0) / 1000);
}

/** The CPU path's tokens/s on the same shape: SFT steps of the held model with AdamW, after one untimed. */
async function cpuTokensPerSecond(): Promise<{ tokens: number; threads: number } | string> {
  const { kernels, why } = loadCpuKernels();
  if (!kernels) return `no C kernels: ${why}`;
  const threads = availableParallelism();
  kernels.setThreads(threads);
  const held = new CpuLlama(config, initialWeights(config, 'bench'), kernels);
  const adamw = new CpuAdamW(ADAMW_DEFAULTS, kernels);
  const mask = new Float32Array(B * T).fill(1);
  const heldStep = async () => {
    const { ids, targets } = batch();
    await sftStep(held, { ids, targets, mask, batch: B, length: T });
    held.clipGradients(1);
    adamw.apply(held.parameters(), 3e-4);
  };
  await heldStep();
  const started = performance.now();
  for (let i = 0; i < Number(opts.steps); i++) await heldStep();
  const tokens = (Number(opts.steps) * B * T) / ((performance.now() - started) / 1000);
  return { tokens, threads };
}

/**
 * PyTorch's tokens/s at `threads` threads on the same shape, or why there is none; `quiet`: OpenBLAS's threads
 * sleep soon after each call (OPENBLAS_THREAD_TIMEOUT=4, as the C kernels set it) instead of spinning.
 */
function pytorch(threads: number, quiet: boolean): { tokens: number; version: string } | string {
  const candidates = opts.python ? [opts.python] : ['python3', '/usr/bin/python3'];
  const python = candidates.find((p) => spawnSync(p, ['-c', 'import torch']).status === 0);
  if (!python) return `no python3 with torch (tried ${candidates.join(', ')})`;
  const shape = JSON.stringify({ ...config, length: T });
  const script = new URL('./peers/llama_cpu.py', import.meta.url).pathname;
  const env = { ...process.env, ...(quiet ? { OPENBLAS_THREAD_TIMEOUT: '4' } : {}) };
  const r = spawnSync(python, [script, shape, String(B), opts.steps, String(threads)], { encoding: 'utf8', env });
  if (r.status !== 0) return r.stderr.trim().split('\n').at(-1) ?? `exit ${r.status}`;
  const out = JSON.parse(r.stdout.trim().split('\n').at(-1)!) as { tokens_per_s: number; version: string };
  return { tokens: out.tokens_per_s, version: out.version };
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
console.log(`backend          ${device.description}`);
console.log(
  `model            Llama ${(model.size() / 1e6).toFixed(2)}M parameters, ${config.layers} layers, hidden ${config.hiddenSize}, ${config.heads} heads (${config.kvHeads} key/value), SwiGLU ${config.intermediateSize}, context ${T}, vocab ${config.vocabSize}, tied`,
);
console.log(
  `batch            ${B} × ${T} tokens, AdamW, ${steps} timed steps (${(seconds / steps).toFixed(2)} s/step), last loss ${last.toFixed(3)}`,
);
console.log(`tokens/s         ${tokensPerSecond.toFixed(0)}`);
console.log(
  `achieved         ${gflops.toFixed(1)} GFLOP/s (${(flopsPerToken / 1e6).toFixed(1)} MFLOP per token, forward + backward)`,
);
console.log(`plain matMul     ${peak.toFixed(1)} GFLOP/s (2048×256 · 256×1024, mean of before and after)`);
console.log(`ratio            ${(gflops / peak).toFixed(2)} of the plain matMul`);
if (opts.naive) {
  const naive = naiveTokensPerSecond();
  console.log(
    `naive tfjs       ${naive.toFixed(0)} tokens/s (one sequence, one step): prefab's kernels are ${(tokensPerSecond / naive).toFixed(1)}× faster`,
  );
}
console.log(`tensors leaked   ${tf.memory().numTensors - tensorsBefore} over ${steps} steps`);

const held = await cpuTokensPerSecond();
const cores = availableParallelism();
const torch = [...new Set([1, cores])].flatMap((threads) =>
  [false, true].map((quiet) => ({ threads, quiet, result: pytorch(threads, quiet) })),
);
const measured = torch.flatMap((t) => (typeof t.result === 'string' ? [] : [{ ...t.result, ...t }]));
const peer = measured.length ? measured.reduce((a, b) => (b.tokens > a.tokens ? b : a)) : null;
const ratio = (tokens: number) => (peer ? `${(tokens / peer.tokens).toFixed(2)}×` : '—');
const gf = (tokens: number) => ((tokens * flopsPerToken) / 1e9).toFixed(1);
console.log('\n| on the CPU | tokens/s | GFLOP/s | against PyTorch |\n|---|---|---|---|');
console.log(
  `| prefab, the reference on TensorFlow.js's WASM | ${tokensPerSecond.toFixed(0)} | ${gf(tokensPerSecond)} | ${ratio(tokensPerSecond)} |`,
);
console.log(
  typeof held === 'string'
    ? `| prefab, the CPU path (C kernels with OpenBLAS) | ${held} | | |`
    : `| prefab, the CPU path (C kernels with OpenBLAS, ${held.threads} threads) | ${held.tokens.toFixed(0)} | ${gf(held.tokens)} | ${ratio(held.tokens)} |`,
);
for (const t of torch) {
  const label = `${t.threads} thread${t.threads > 1 ? 's' : ''}${t.quiet ? ', OPENBLAS_THREAD_TIMEOUT=4' : ''}`;
  console.log(
    typeof t.result === 'string'
      ? `| PyTorch, ${label} | ${t.result} | | |`
      : `| PyTorch ${t.result.version}, ${label}${peer?.threads === t.threads && peer.quiet === t.quiet ? ' (the peer)' : ''} | ${t.result.tokens.toFixed(0)} | ${gf(t.result.tokens)} | ${ratio(t.result.tokens)} |`,
  );
}
