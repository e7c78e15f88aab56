// Training throughput on the GPU (train/webgpu/): SFT steps with AdamW of the Llama on the bench shape (4
// layers, hidden 256, 4 heads of 64, SwiGLU 688, context 256, vocabulary 512) and on a GPT-2-small shape (12
// layers, hidden 768, 12 heads of 64, SwiGLU 2048, context 512, vocabulary 8192), at batch 8 and 32. Prints
// tokens/s and achieved TFLOP/s (nanoGPT's 6·N + attention per token), the GEMM's TFLOP/s at 4096³ and at
// 4096×2304×768, and, where python3 has torch with CUDA, PyTorch fp32 (TF32 off) on the same shape in the same
// run with the ratio. On a CPU driver (lavapipe) it runs, slowly: `--quick` takes one small step to show it works.
//   npm run bench:train:webgpu [-- --shape bench|gpt2|both --batch 8,32 --steps 5 --quick]
import { spawnSync } from 'node:child_process';
import { Command } from 'commander';
import { flopsPerToken, initialWeights, type LlamaConfig } from '../train/model.ts';
import { ADAMW_DEFAULTS } from '../train/optimizer.ts';
import { GpuAdamW } from '../train/webgpu/adamw.ts';
import { submit, upload } from '../train/webgpu/buffers.ts';
import { openGpu } from '../train/webgpu/device.ts';
import { Kernels } from '../train/webgpu/kernel.ts';
import { GpuLlama } from '../train/webgpu/llama.ts';
import { sftStep } from '../train/step.ts';
import { Matmul } from '../train/webgpu/matmul.ts';
import { seeded } from '../core/random.ts';

const opts = new Command()
  .option('--shape <name>', 'bench, gpt2 or both', 'both')
  .option('--batch <list>', 'sequences a step, comma-separated', '8,32')
  .option('--steps <n>', 'timed steps (after one untimed)', '5')
  .option('--quick', 'one step of a small shape: a check that the path runs (a CPU driver)')
  .parse()
  .opts<{ shape: string; batch: string; steps: string; quick?: boolean }>();

const llama = (
  layers: number,
  hidden: number,
  heads: number,
  mlp: number,
  vocab: number,
  context: number,
): LlamaConfig => ({
  modelType: 'llama',
  vocabSize: vocab,
  hiddenSize: hidden,
  intermediateSize: mlp,
  layers,
  heads,
  kvHeads: heads,
  headDim: hidden / heads,
  ropeTheta: 10000,
  rmsNormEps: 1e-5,
  tiedEmbeddings: true,
  attentionBias: false,
  maxPositions: context,
  bosTokenId: null,
  eosTokenId: null,
});
const SHAPES: Record<string, LlamaConfig> = {
  bench: llama(4, 256, 4, 688, 512, 256),
  gpt2: llama(12, 768, 12, 2048, 8192, 512),
  quick: llama(2, 64, 2, 128, 128, 32),
};

const gpu = await openGpu();
const kernels = new Kernels(gpu);
console.log(`adapter: ${gpu.adapter.description} (${gpu.software ? 'software: expect CPU speed' : 'hardware'})`);

/** The GEMM alone: C = A·Bᵀ as a projection reads its weight, best of a few runs, TFLOP/s. */
async function gemm(m: number, n: number, k: number): Promise<number> {
  const mm = new Matmul(kernels);
  const [a, b, c] = [
    upload(gpu, new Float32Array(m * k).fill(0.5)),
    upload(gpu, new Float32Array(n * k).fill(0.25)),
    upload(gpu, new Float32Array(m * n)),
  ];
  const run = async (times: number) => {
    const t0 = performance.now();
    submit(gpu, (pass) => {
      for (let i = 0; i < times; i++) mm.encode(pass, a, b, c, { m, n, k, transposeB: true });
    });
    await gpu.device.queue.onSubmittedWorkDone();
    return (performance.now() - t0) / 1000 / times;
  };
  await run(1);
  const seconds = Math.min(await run(10), await run(10));
  for (const buffer of [a, b, c]) buffer.destroy();
  return (2 * m * n * k) / seconds / 1e12;
}

/** PyTorch on the same shape and batch, fp32 with TF32 off, where python3 has torch with CUDA; null otherwise. */
function pytorch(c: LlamaConfig, batch: number, length: number, steps: number): number | null {
  const script = String.raw`
import sys, time, torch, torch.nn as nn, torch.nn.functional as F
if not torch.cuda.is_available(): print("none"); sys.exit(0)
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
L, D, H, FF, V, T, B, S = ${[c.layers, c.hiddenSize, c.heads, c.intermediateSize, c.vocabSize, length, batch, steps].join(', ')}
hd = D // H
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.n1 = nn.RMSNorm(D, eps=1e-5); s.n2 = nn.RMSNorm(D, eps=1e-5)
        s.qkv = nn.Linear(D, 3 * D, bias=False); s.o = nn.Linear(D, D, bias=False)
        s.gate = nn.Linear(D, FF, bias=False); s.up = nn.Linear(D, FF, bias=False); s.down = nn.Linear(FF, D, bias=False)
    def forward(s, x, cos, sin):
        q, k, v = s.qkv(s.n1(x)).view(B, T, 3, H, hd).unbind(2)
        rot = lambda t: t * cos + torch.cat([-t[..., hd // 2:], t[..., :hd // 2]], -1) * sin
        q, k, v = rot(q).transpose(1, 2), rot(k).transpose(1, 2), v.transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + s.o(a)
        h = s.n2(x)
        return x + s.down(F.silu(s.gate(h)) * s.up(h))
class Model(nn.Module):
    def __init__(s):
        super().__init__(); s.emb = nn.Embedding(V, D); s.blocks = nn.ModuleList(Block() for _ in range(L)); s.norm = nn.RMSNorm(D, eps=1e-5)
    def forward(s, ids, cos, sin):
        x = s.emb(ids)
        for b in s.blocks: x = b(x, cos, sin)
        return s.norm(x) @ s.emb.weight.T
dev = "cuda"; m = Model().to(dev); opt = torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=dev).float() / hd)); ang = torch.outer(torch.arange(T, device=dev).float(), inv)
ang = torch.cat([ang, ang], -1)[None, :, None, :]; cos, sin = ang.cos(), ang.sin()
ids = torch.randint(0, V, (B, T), device=dev); tg = torch.randint(0, V, (B, T), device=dev)
def step():
    loss = F.cross_entropy(m(ids, cos, sin).view(-1, V), tg.view(-1)); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
step(); torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(S): step()
torch.cuda.synchronize(); print(B * T * S / (time.perf_counter() - t0))
`;
  const r = spawnSync('python3', ['-c', script], { encoding: 'utf8', timeout: 600_000 });
  const out = r.status === 0 ? r.stdout.trim() : '';
  return out && out !== 'none' ? Number(out) : null;
}

const shapes = opts.quick ? ['quick'] : opts.shape === 'both' ? ['bench', 'gpt2'] : [opts.shape];
const batches = opts.quick ? [2] : opts.batch.split(',').map(Number);
const steps = opts.quick ? 1 : Number(opts.steps);
if (gpu.software) console.log('GEMM: not timed on a software adapter (minutes at 4096³)');
else if (!opts.quick)
  console.log(
    `GEMM: ${(await gemm(4096, 4096, 4096)).toFixed(1)} TFLOP/s at 4096³, ${(await gemm(4096, 2304, 768)).toFixed(1)} at 4096×2304×768`,
  );
console.log('| shape | batch | tokens/s | TFLOP/s | PyTorch fp32 tokens/s | ratio |\n|---|---|---|---|---|---|');
for (const name of shapes) {
  const config = SHAPES[name]!;
  const length = config.maxPositions;
  for (const batch of batches) {
    const model = new GpuLlama(config, initialWeights(config, 'bench'), kernels);
    const adamw = new GpuAdamW(kernels, ADAMW_DEFAULTS);
    const random = seeded('bench', name, batch);
    const draw = () => Int32Array.from({ length: batch * length }, () => Math.floor(random() * config.vocabSize));
    const mask = new Float32Array(batch * length).fill(1);
    const step = async () => {
      await sftStep(model, { ids: draw(), targets: draw(), mask, batch, length });
      submit(gpu, (pass) => adamw.encode(pass, model.parameters(), 3e-4));
      await gpu.device.queue.onSubmittedWorkDone();
    };
    await step();
    const t0 = performance.now();
    for (let s = 0; s < steps; s++) await step();
    const tokens = (batch * length * steps) / ((performance.now() - t0) / 1000);
    const torch = opts.quick ? null : pytorch(config, batch, length, steps);
    const tflops = (tokens * flopsPerToken(config, length)) / 1e12;
    console.log(
      `| ${name} | ${batch} | ${tokens.toFixed(0)} | ${tflops.toFixed(2)} | ${torch === null ? 'no torch with CUDA here' : torch.toFixed(0)} | ${torch === null ? '—' : (tokens / torch).toFixed(2)} |`,
    );
  }
}
process.exit(0);
