// Decoding throughput: generated tokens/s with 1, 8, 32 and 128 sequences decoded together on the CPU
// (runtime/shared-decoder.ts, as DAPO's rollouts, eval's and a refresh night's episodes are) and, where a GPU
// is (or with --gpu), on it (runtime/webgpu/decode.ts: every live sequence's row in one step, as the server
// steps its requests), for the default run's model shape and, asked for, the SmolLM2-135M and Qwen2.5-0.5B
// shapes; random weights, a fixed prompt length, a fixed number of new tokens (no stop token), the prompt's
// reading counted in the time. The ratio is against one sequence in the same run: what decoding together is
// worth. Two peers in the same run on the same shapes and lengths: llama.cpp's llama-batched-bench (built
// beside llama-server by bench/peers/llama-server.sh; not in CI) on an F32 GGUF of the same weights, as many
// threads as prefab's kernels; and where python3 has torch and transformers, their batched `generate` (bf16 on
// a GPU, f32 on the CPU). The goal: prefab's C kernels at 32 sequences ≥ 1.0× llama.cpp's tokens/s.
// Usage: npm run bench:decode [-- --shapes default,smollm2-135m --levels 1,8,32 --prompt 256 --new 64 --gpu
//   --draw gpu --no-reference --llama-batched-bench BIN]
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command, Option } from 'commander';
import { seeded } from '../core/random.ts';
import { openDevice } from '../runtime/device.ts';
import { Llama } from '../model/llama.ts';
import { SharedDecoder } from '../runtime/shared-decoder.ts';
import { loadCpuKernels } from '../runtime/cpu/kernels.ts';
import { cpuCaches, type CachePool } from '../runtime/decode.ts';
import { openGpu, probeGpu } from '../runtime/webgpu/device.ts';
import { GpuDecoder } from '../runtime/webgpu/decode.ts';
import { GpuKernels } from '../runtime/webgpu/kernel.ts';
import { SHAPES } from './shapes.ts';
import { LLAMA_BATCHED_BENCH, llamaBatchedDecode } from './peers/llama-server.ts';
import { writeGguf } from '../model/gguf.ts';
import { trainTokenizer } from '../model/tokenizer.ts';

const opts = new Command()
  .option('--shapes <list>', 'default, smollm2-135m, qwen2.5-0.5b', 'default')
  .option('--levels <list>', 'sequences decoded together', '1,8,32,128')
  .option('--prompt <n>', 'prompt tokens', '256')
  .option('--new <n>', 'tokens generated per sequence', '64')
  .option('--gpu', 'decode on the GPU too, even on a CPU implementation of Vulkan (lavapipe)')
  .option('--no-cpu', 'the GPU only')
  .option('--no-reference', "leave out the reference's plain loops (slow at the larger shapes)")
  .option(
    '--llama-batched-bench <binary>',
    "the llama.cpp peer (default: bench/peers/llama-server.sh's cached build, when there is one)",
  )
  .option('--no-llama-batched-bench', 'no llama.cpp peer')
  .addOption(
    new Option('--draw <where>', "where the GPU's tokens are drawn: gpu, or cpu (its logits read back, as before)")
      .choices(['gpu', 'cpu'])
      .default('gpu'),
  )
  .parse()
  .opts<{
    shapes: string;
    levels: string;
    prompt: string;
    new: string;
    gpu?: boolean;
    cpu: boolean;
    reference: boolean;
    draw: string;
    llamaBatchedBench?: string | false;
  }>();

const levels = opts.levels.split(',').map(Number);
const [promptLength, newTokens] = [Number(opts.prompt), Number(opts.new)];
await openDevice({ backend: 'wasm' });

/**
 * Tokens/s of `n` sequences decoded together (SharedDecoder, as DAPO's episodes are), each a random prompt then
 * --new sampled tokens, over the caches `pool` makes: the CPU's (the reference's plain loops, or the C
 * kernels) or the GPU's. One sequence's prompt and 8 tokens first, untimed, as llama-batched-bench warms up
 * after loading: the decoder's copy of the weights made, the kernels' first calls, the JIT on both paths.
 */
async function ours(config: LlamaConfig, n: number, pool: (model: Llama) => CachePool): Promise<number> {
  const model = Llama.create(config, 'bench-decode');
  const shared = new SharedDecoder(model, pool(model));
  const warm = shared.cache();
  const prompt = Array.from({ length: promptLength }, (_, i) => i % config.vocabSize);
  await shared.generate(warm, prompt, { maxTokens: 8, temperature: 1, random: seeded('bench-decode') });
  shared.free(warm);
  const rand = seeded('bench-decode', n);
  const prompts = Array.from({ length: n }, () =>
    Array.from({ length: promptLength }, () => Math.floor(rand() * config.vocabSize)),
  );
  const started = performance.now();
  const outs = await Promise.all(
    prompts.map((p, i) =>
      shared.generate(shared.cache(), p, {
        maxTokens: newTokens,
        temperature: 1,
        random: seeded('bench-decode', n, i),
      }),
    ),
  );
  const seconds = (performance.now() - started) / 1000;
  shared.dispose();
  model.dispose();
  return outs.reduce((t, o) => t + o.length, 0) / seconds;
}

const PEER = `
import json, sys, time, torch
from transformers import LlamaConfig, Qwen2Config, AutoModelForCausalLM
c, levels, prompt, new = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cls = Qwen2Config if c["modelType"] == "qwen2" else LlamaConfig
config = cls(vocab_size=c["vocabSize"], hidden_size=c["hiddenSize"], intermediate_size=c["intermediateSize"],
  num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=c["kvHeads"], head_dim=c["headDim"],
  tie_word_embeddings=c["tiedEmbeddings"], max_position_embeddings=c["maxPositions"])
cuda = torch.cuda.is_available()
model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16 if cuda else torch.float32).to("cuda" if cuda else "cpu").eval()
out = {"device": torch.cuda.get_device_name() if cuda else "cpu"}
for n in levels:
  ids = torch.randint(0, c["vocabSize"], (n, prompt), device=model.device)
  with torch.no_grad():
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=True)
    if cuda: torch.cuda.synchronize()
    t = time.perf_counter()
    model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=True, top_k=0)
    if cuda: torch.cuda.synchronize()
  out[str(n)] = n * new / (time.perf_counter() - t)
print(json.dumps(out))
`;
import type { LlamaConfig } from '../model/config.ts';

/** transformers' tokens/s per level, or why there are none. */
function peer(config: LlamaConfig): Record<string, number | string> | string {
  const check = spawnSync('python3', ['-c', 'import torch, transformers'], { encoding: 'utf8' });
  if (check.status !== 0) return 'no python3 with torch and transformers here';
  const script = join(mkdtempSync(join(tmpdir(), 'prefab-bench-decode-')), 'peer.py');
  writeFileSync(script, PEER);
  const r = spawnSync(
    'python3',
    [script, JSON.stringify(config), JSON.stringify(levels), String(promptLength), String(newTokens)],
    { encoding: 'utf8' },
  );
  return r.status === 0 ? (JSON.parse(r.stdout.trim().split('\n').at(-1)!) as Record<string, number>) : r.stderr.trim();
}

const llamaBinary =
  opts.llamaBatchedBench === false
    ? null
    : (opts.llamaBatchedBench ?? (existsSync(LLAMA_BATCHED_BENCH) ? LLAMA_BATCHED_BENCH : null));

/**
 * llama.cpp's tokens/s per level on an F32 GGUF of `ours`' weights (the same seed), or why there are none.
 * The GGUF needs a tokenizer: one trained here, its ids past its own vocabulary padding.
 */
function llamaCpp(config: LlamaConfig): Map<number, number> | string {
  if (!llamaBinary) return 'no llama-batched-bench (bench/peers/llama-server.sh builds it)';
  const dir = mkdtempSync(join(tmpdir(), 'prefab-bench-decode-'));
  const model = Llama.create(config, 'bench-decode');
  try {
    const gguf = join(dir, 'model-f32.gguf');
    const tokenizer = { 'tokenizer.json': trainTokenizer(['a tokenizer for the GGUF: 0123456789'], 300) };
    const weights = new Map([...model.weights()].map(([name, w]) => [name, w.data]));
    writeGguf(gguf, { config, weights, tokenizer, name: 'bench-decode', source: 'bench/decode.ts' }, 'f32');
    const threads = availableParallelism();
    return llamaBatchedDecode({
      binary: llamaBinary,
      gguf,
      threads,
      levels,
      prompt: promptLength,
      generated: newTokens,
    });
  } catch (error) {
    return (error as Error).message;
  } finally {
    model.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The GPU's pool as --draw asks: drawing there, or (cpu) reading the logits back for the CPU to draw from. */
function onGpu(decoder: GpuDecoder): CachePool {
  if (opts.draw === 'gpu') return decoder;
  return {
    model: decoder.model,
    create: () => decoder.create(),
    fork: (source, n) => decoder.fork(source, n),
    readMany: (caches, reads) => decoder.readMany(caches, reads),
    free: (cache) => decoder.free(cache),
    dispose: () => decoder.dispose(),
  };
}

// The GPU where there is one of hardware, or asked for; its tables' columns are left out otherwise.
const gpuKernels = opts.gpu || (await probeGpu()).hardware ? new GpuKernels(await openGpu()) : null;

for (const name of opts.shapes.split(',')) {
  const config = SHAPES[name];
  if (!config) throw new Error(`unknown shape ${name}: one of ${Object.keys(SHAPES).join(', ')}`);
  const theirs = peer(config);
  const llama = llamaCpp(config);
  console.log(`\n${name}: prompt ${promptLength}, ${newTokens} new tokens a sequence`);
  console.log(`transformers: ${typeof theirs === 'string' ? theirs : theirs.device}`);
  console.log(
    `llama.cpp: ${typeof llama === 'string' ? llama : `${llamaBinary}, ${availableParallelism()} threads, F32 GGUF`}`,
  );
  if (gpuKernels) console.log(`the GPU: ${gpuKernels.gpu.adapter.description}`);
  const native = opts.cpu ? loadCpuKernels().kernels : null;
  if (opts.cpu && !native) console.log(`the C kernels: ${loadCpuKernels().why}`);
  console.log(
    '| sequences | prefab, reference, tokens/s | × one sequence | prefab, C kernels, tokens/s | × one sequence | prefab, webgpu, tokens/s | × one sequence | llama.cpp tokens/s | prefab C ÷ llama.cpp | transformers tokens/s | prefab (best) / transformers |',
  );
  console.log('|---|---|---|---|---|---|---|---|---|---|---|');
  const one = { wasm: 0, native: 0, gpu: 0 };
  const cell = (rate: number | null, base: number) =>
    rate ? `${rate.toFixed(0)} | ${(rate / base).toFixed(2)}` : '— | —';
  const versus = (rate: number | null, peerRate: number | undefined) =>
    peerRate ? `${peerRate.toFixed(0)} | ${rate ? (rate / peerRate).toFixed(2) : '—'}` : '— | —';
  for (const n of levels) {
    const wasm = opts.cpu && opts.reference ? await ours(config, n, (m) => cpuCaches(m, null)) : null;
    const c = native ? await ours(config, n, (m) => cpuCaches(m, native)) : null;
    const g = gpuKernels ? await ours(config, n, (m) => onGpu(new GpuDecoder(m, gpuKernels))) : null;
    if (n === levels[0]) Object.assign(one, { wasm: wasm ?? 0, native: c ?? 0, gpu: g ?? 0 });
    const peerRate = typeof theirs === 'string' ? undefined : (theirs[String(n)] as number | undefined);
    const llamaRate = typeof llama === 'string' ? undefined : llama.get(n);
    const best = Math.max(wasm ?? 0, c ?? 0, g ?? 0);
    console.log(
      `| ${n} | ${cell(wasm, one.wasm)} | ${cell(c, one.native)} | ${cell(g, one.gpu)} | ${versus(c, llamaRate)} | ${versus(best, peerRate)} |`,
    );
  }
}
process.exit(0);
