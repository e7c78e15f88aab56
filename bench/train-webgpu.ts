// Training throughput and memory on the GPU (runtime/webgpu/): SFT steps with AdamW of the Llama on the bench
// shape, a GPT-2-small shape, the SmolLM2-135M and Qwen2.5-0.5B shapes at context 1024, and Qwen2.5-1.5B's
// with LoRA (r 16 on q, k, v, o), random weights, in f32 and in mixed precision (f16 products, on the tensor
// cores where their GEMM passes its check). Prints tokens/s, achieved TFLOP/s (nanoGPT's 6·N + attention per
// token) and the GPU memory prefab held at most, beside, where python3 has torch with CUDA and transformers,
// their LlamaForCausalLM / Qwen2ForCausalLM built from the same config (sdpa attention, fused AdamW, labels =
// input_ids) in the same run with torch.cuda.max_memory_allocated(): f32 against fp32 with TF32 off, mixed
// precision against bf16 autocast (LoRA rows have no peer: whether they fit is their goal).
// Also the GEMM alone at 4096³ and 4096×2304×768 (f32 in either block size, and f16). `--largest` finds the
// largest batch (doubling from the last one timed) that trains, each try in a process of its own. On a CPU
// driver (lavapipe) `--quick` takes one small step in each precision, with and without LoRA, to show that the
// paths run.
//   npm run bench:train:webgpu [-- --shape bench,gpt2,smollm2,qwen05,qwen15lora --batch 8 --steps 3 --precision f32,f16 --largest --quick]
import { spawnSync } from 'node:child_process';
import { Command } from 'commander';
import { initialWeights } from '../model/llama.ts';
import { ADAMW_DEFAULTS } from '../trainers/optimizer.ts';
import { GpuAdamW } from '../runtime/webgpu/adamw.ts';
import { allocate, submit, upload } from '../runtime/webgpu/buffers.ts';
import { useTensorCores } from '../runtime/webgpu/precision.ts';
import { openGpu } from '../runtime/webgpu/device.ts';
import { GpuKernels } from '../runtime/webgpu/kernel.ts';
import { GpuLlama } from '../runtime/webgpu/llama.ts';
import { sftStep } from '../trainers/step.ts';
import { Matmul } from '../runtime/webgpu/matmul.ts';
import { seeded } from '../core/random.ts';
import { flopsPerToken, type LlamaConfig } from '../model/config.ts';
import type { LoraWeights } from '../runtime/held.ts';

const opts = new Command()
  .option(
    '--shape <list>',
    'shapes, comma-separated: bench, gpt2, smollm2, qwen05, qwen15lora',
    'bench,gpt2,smollm2,qwen05,qwen15lora',
  )
  .option('--batch <list>', "sequences a step, comma-separated (default: each shape's own)")
  .option('--steps <n>', 'timed steps (after one untimed)', '3')
  .option('--largest', 'also find the largest batch that trains, doubling from the last one given')
  .option('--no-peers', 'prefab only (no PyTorch)')
  .option('--no-gemm', 'do not time the GEMM alone')
  .option('--precision <list>', 'f32, f16 (mixed precision, where the adapter has shader-f16) or both', 'f32,f16')
  .option('--quick', 'one step of a small shape: a check that the path runs (a CPU driver)')
  .parse()
  .opts<{
    shape: string;
    batch?: string;
    steps: string;
    largest?: boolean;
    peers: boolean;
    gemm: boolean;
    precision: string;
    quick?: boolean;
  }>();

interface Shape {
  config: LlamaConfig;
  /** Batches timed when --batch is not given. */
  batches: number[];
  /** LoRA of this rank on q, k, v and o (the base frozen) instead of full fine-tuning; no PyTorch peer then. */
  lora?: number;
}

const shape = (o: {
  layers: number;
  hidden: number;
  heads: number;
  kvHeads?: number;
  mlp: number;
  vocab: number;
  context: number;
  qwen2?: boolean;
  batches: number[];
  lora?: number;
}): Shape => ({
  batches: o.batches,
  lora: o.lora,
  config: {
    modelType: o.qwen2 ? 'qwen2' : 'llama',
    vocabSize: o.vocab,
    hiddenSize: o.hidden,
    intermediateSize: o.mlp,
    layers: o.layers,
    heads: o.heads,
    kvHeads: o.kvHeads ?? o.heads,
    headDim: o.hidden / o.heads,
    ropeTheta: 10000,
    rmsNormEps: 1e-5,
    tiedEmbeddings: true,
    attentionBias: o.qwen2 ?? false,
    maxPositions: o.context,
    bosTokenId: null,
    eosTokenId: null,
  },
});
const SHAPES: Record<string, Shape> = {
  bench: shape({ layers: 4, hidden: 256, heads: 4, mlp: 688, vocab: 512, context: 256, batches: [8, 32] }),
  gpt2: shape({ layers: 12, hidden: 768, heads: 12, mlp: 2048, vocab: 8192, context: 512, batches: [8, 32] }),
  smollm2: shape({
    layers: 30,
    hidden: 576,
    heads: 9,
    kvHeads: 3,
    mlp: 1536,
    vocab: 49152,
    context: 1024,
    batches: [8],
  }),
  qwen05: shape({
    layers: 24,
    hidden: 896,
    heads: 14,
    kvHeads: 2,
    mlp: 4864,
    vocab: 151936,
    context: 1024,
    qwen2: true,
    batches: [8],
  }),
  qwen15lora: shape({
    layers: 28,
    hidden: 1536,
    heads: 12,
    kvHeads: 2,
    mlp: 8960,
    vocab: 151936,
    context: 1024,
    qwen2: true,
    batches: [8],
    lora: 16,
  }),
  quick: shape({ layers: 2, hidden: 64, heads: 2, mlp: 128, vocab: 128, context: 32, batches: [2] }),
  quicklora: shape({ layers: 2, hidden: 64, heads: 2, mlp: 128, vocab: 128, context: 32, batches: [2], lora: 4 }),
};

const gpu = await openGpu();
const kernels = new GpuKernels(gpu);
/** Mixed precision's kernels, on the tensor cores where they pass their check; null without shader-f16. */
const half = gpu.f16 ? new GpuKernels(gpu, { precision: 'f16' }) : null;
const halfOn = half ? await useTensorCores(half) : 'no shader-f16 here';

/**
 * The GEMM alone, C = A·Bᵀ as a projection reads its weight, best of a few runs, TFLOP/s: f32 in blocks of
 * `tile`, or with `tile` 'f16' mixed precision's (its operands f16; the tensor cores where they passed).
 */
async function gemm(m: number, n: number, k: number, tile: 64 | 128 | 'f16'): Promise<number> {
  const mm = tile === 'f16' ? new Matmul(half!) : new Matmul(kernels, { tile });
  const operand = (n: number, x: number) =>
    tile === 'f16' ? allocate(gpu, n * 2) : upload(gpu, new Float32Array(n).fill(x));
  const [a, b, c] = [operand(m * k, 0.5), operand(n * k, 0.25), upload(gpu, new Float32Array(m * n))];
  const run = async (times: number) => {
    const t0 = performance.now();
    submit(gpu, (pass) => {
      for (let i = 0; i < times; i++) mm.encode(pass, a, b, c, { m, n, k, transposeB: true, half: tile === 'f16' });
    });
    await gpu.device.queue.onSubmittedWorkDone();
    return (performance.now() - t0) / 1000 / times;
  };
  await run(1);
  const seconds = Math.min(await run(10), await run(10));
  for (const buffer of [a, b, c]) buffer.destroy();
  return (2 * m * n * k) / seconds / 1e12;
}

/** prefab's SFT steps on `name` at `batch`: tokens/s and the most GPU memory held (weights, gradients, moments, activations). */
async function prefab(
  name: string,
  batch: number,
  steps: number,
  kernels: GpuKernels,
): Promise<{ tokens: number; bytes: number }> {
  const { config, lora } = SHAPES[name]!;
  const length = config.maxPositions;
  gpu.memory.peak = gpu.memory.now;
  const start = gpu.memory.now;
  const model = new GpuLlama(config, initialWeights(config, 'bench'), kernels, {
    adapters: lora ? adapters(config, lora) : undefined,
  });
  const adamw = new GpuAdamW(kernels, ADAMW_DEFAULTS);
  const random = seeded('bench', name, batch);
  const draw = () => Int32Array.from({ length: batch * length }, () => Math.floor(random() * config.vocabSize));
  const mask = new Float32Array(batch * length).fill(1);
  const step = async () => {
    await sftStep(model, { ids: draw(), targets: draw(), mask, batch, length });
    await model.clipGradients(1); // as a run's step does (mixed precision: the loss scale taken out here)
    if (!model.skipped) submit(gpu, (pass) => adamw.encode(pass, model.parameters(), 3e-4));
    await gpu.device.queue.onSubmittedWorkDone();
    if (gpu.failure) throw new Error(gpu.failure);
  };
  try {
    await step();
    const t0 = performance.now();
    for (let s = 0; s < steps; s++) await step();
    return { tokens: (batch * length * steps) / ((performance.now() - t0) / 1000), bytes: gpu.memory.peak - start };
  } finally {
    model.dispose();
  }
}

/** LoRA adapters of rank r on every layer's q, k, v and o projections (PEFT's start: A small, B zero), α = 2r. */
function adapters(c: LlamaConfig, r: number): Map<string, LoraWeights> {
  const random = seeded('bench-lora');
  const out = new Map<string, LoraWeights>();
  const sizes = { q_proj: c.heads * c.headDim, k_proj: c.kvHeads * c.headDim, v_proj: c.kvHeads * c.headDim };
  for (let l = 0; l < c.layers; l++)
    for (const [module, rows, inner] of [
      ...Object.entries(sizes).map(([m, rows]) => [m, rows, c.hiddenSize] as const),
      ['o_proj', c.hiddenSize, c.heads * c.headDim] as const,
    ]) {
      const a = Float32Array.from({ length: r * inner }, () => (random() - 0.5) / 50);
      out.set(`model.layers.${l}.self_attn.${module}`, {
        a,
        b: new Float32Array(rows * r),
        r,
        scale: 2,
        dropout: 0,
        index: out.size,
      });
    }
  return out;
}

/** transformers' model of the same config, fp32 (TF32 off) or bf16 autocast, where python3 has torch with CUDA; null otherwise. */
function pytorch(
  c: LlamaConfig,
  batch: number,
  steps: number,
  precision: 'fp32' | 'bf16',
): { tokens: number; bytes: number } | string | null {
  const script = String.raw`
import sys, json, time, torch
if not torch.cuda.is_available(): print("null"); sys.exit(0)
import transformers
a = json.loads(sys.argv[1]); c = a["config"]
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
kw = dict(vocab_size=c["vocabSize"], hidden_size=c["hiddenSize"], intermediate_size=c["intermediateSize"],
          num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=c["kvHeads"],
          max_position_embeddings=c["maxPositions"], rms_norm_eps=c["rmsNormEps"], rope_theta=c["ropeTheta"],
          tie_word_embeddings=c["tiedEmbeddings"])
if c["modelType"] == "qwen2": model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw))
else: model = transformers.LlamaForCausalLM(transformers.LlamaConfig(head_dim=c["headDim"], attention_bias=False, **kw))
model.config._attn_implementation = "sdpa"
model = model.cuda().train()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
B, T, S = a["batch"], c["maxPositions"], a["steps"]
ids = torch.randint(0, c["vocabSize"], (B, T), device="cuda")
def step():
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a["precision"] == "bf16"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
step(); torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(S): step()
torch.cuda.synchronize()
print(json.dumps({"tokens": B * T * S / (time.perf_counter() - t0), "bytes": torch.cuda.max_memory_allocated()}))
`;
  const args = JSON.stringify({ config: c, batch, steps, precision });
  const r = spawnSync('python3', ['-c', script, args], { encoding: 'utf8', timeout: 600_000 });
  if (r.error || (r.status !== 0 && !/out of memory/i.test(r.stderr))) return null;
  if (r.status !== 0) return 'out of memory';
  return JSON.parse(r.stdout.trim()) as { tokens: number; bytes: number } | null;
}

/** The largest batch, doubling from `from`, whose steps train in `precision`: each try a process of its own (a failed device stays failed). */
function largest(name: string, from: number, precision: string): number | null {
  let fits: number | null = null;
  for (let batch = from; batch <= 1024; batch *= 2) {
    const r = spawnSync(
      process.execPath,
      [
        ...process.execArgv,
        process.argv[1]!,
        '--shape',
        name,
        '--batch',
        String(batch),
        '--steps',
        '1',
        '--no-peers',
        '--no-gemm',
        '--precision',
        precision,
      ],
      { encoding: 'utf8', timeout: 600_000 },
    );
    if (r.status !== 0 || / fails: /.test(r.stdout)) break;
    fits = batch;
  }
  return fits;
}

const gib = (bytes: number) =>
  bytes >= 2 ** 30 ? `${(bytes / 2 ** 30).toFixed(1)} GiB` : `${(bytes / 2 ** 20).toFixed(1)} MiB`;
const names = opts.quick ? ['quick', 'quicklora'] : opts.shape.split(',');
const steps = opts.quick ? 1 : Number(opts.steps);
console.log(`adapter: ${gpu.adapter.description} (${gpu.software ? 'software: expect CPU speed' : 'hardware'})`);
console.log(`mixed precision multiplies on: ${halfOn}`);
if (gpu.software) console.log('GEMM: not timed on a software adapter (minutes at 4096³)');
else if (!opts.quick && opts.gemm)
  for (const [m, n, k] of [
    [4096, 4096, 4096],
    [4096, 2304, 768],
  ] as const)
    console.log(
      `GEMM ${m}×${n}×${k}: f32 ${(await gemm(m, n, k, 64)).toFixed(1)} TFLOP/s in 64×64 blocks, ${(await gemm(m, n, k, 128)).toFixed(1)} in 128×128; f16 ${half ? (await gemm(m, n, k, 'f16')).toFixed(1) : '—'}`,
    );
const precisions = opts.precision.split(',').filter((p) => p === 'f32' || (p === 'f16' && half));
console.log(
  '| shape | batch | precision | tokens/s | TFLOP/s | memory | PyTorch tokens/s (memory) | ratio |\n|---|---|---|---|---|---|---|---|',
);
for (const name of names) {
  const known = SHAPES[name];
  if (!known) throw new Error(`--shape ${name}: not one of ${Object.keys(SHAPES).join(', ')}`);
  const batches = opts.batch ? opts.batch.split(',').map(Number) : known.batches;
  for (const batch of batches)
    for (const precision of precisions) {
      // f32 against PyTorch's fp32 (TF32 off), f16 against its bf16 autocast: each side's fast path.
      const cells = [name, String(batch), precision];
      try {
        const { tokens, bytes } = await prefab(name, batch, steps, precision === 'f16' ? half! : kernels);
        const tflops = (tokens * flopsPerToken(known.config, known.config.maxPositions)) / 1e12;
        // With LoRA the frozen base has no weight gradients: 6·N a token would overstate it.
        cells.push(tokens.toFixed(0), known.lora ? '—' : tflops.toFixed(2), gib(bytes));
        const peer =
          opts.quick || !opts.peers || known.lora
            ? null
            : pytorch(known.config, batch, steps, precision === 'f16' ? 'bf16' : 'fp32');
        if (known.lora) cells.push(`LoRA r${known.lora}: memory is the goal, no peer`, '—');
        else if (peer === null) cells.push('no torch with CUDA here', '—');
        else if (typeof peer === 'string') cells.push(peer, '—');
        else
          cells.push(
            `${precision === 'f16' ? 'bf16' : 'fp32'} ${peer.tokens.toFixed(0)} (${gib(peer.bytes)})`,
            (tokens / peer.tokens).toFixed(2),
          );
      } catch (error) {
        cells.push(`fails: ${(error as Error).message.split('\n')[0]}`);
      }
      console.log(`| ${cells.join(' | ')} |`);
    }
  if (opts.largest)
    for (const precision of precisions) {
      const from = batches.at(-1)!;
      const most = largest(name, from, precision) ?? 'none';
      console.log(`${name} in ${precision}: the largest batch that trains, doubling from ${from}: ${most}`);
    }
}
process.exit(0);
