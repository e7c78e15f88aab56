// Serving throughput and latency of `prefab serve` at 1, 4 and 16 concurrent clients, measured as a client
// sees it: the server is a child process on 127.0.0.1, each client sends chat completions one after another
// (a simulator conversation up to the user's request, a seed per request, temperature 1), and the bench
// counts the completion tokens the server reports. Two workloads: `agent` sends the tools and lets the model
// end its reply (short tool calls: reading the prompt is most of the work), `decode` asks for 64 tokens with
// ignore_eos and no tools (vLLM's benchmark setting: generation is the work). The baseline is one client in
// the same run (requests in flight are decoded together). The peer is llama.cpp's llama-server
// (bench/peers/llama-server.sh builds it) on an F32 GGUF of the same weights (`prefab model export`), with as
// many threads as prefab's kernels and 16 slots, running the decode workload in the same run: the goal is
// prefab's 16 clients at ≥ 1.0× its tokens/s.
// The model: --model FOLDER (default: the default run's, workspace/dapo/model, when it is there), else a
// random model of the default run's shape (4 layers, width 128, vocabulary 1024) with a tokenizer trained here,
// or of --shape's (a larger model, whose weights rather than its caches are most of a step's reading).
// Usage: npm run bench:serve [-- --model workspace/dapo/model --requests 48 --shape smollm2-135m --llama-server BIN]
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import type { Message } from '../core/records.ts';
import { ScriptedAgent } from '../env/agents.ts';
import { SYSTEM_PROMPT, TOOLS } from '../env/env.ts';
import { runEpisode } from '../env/rollout.ts';
import { DEFAULT_WORLD, generateTask, generateWorld } from '../env/world.ts';
import { Registry } from '../loop/registry.ts';
import { openDevice } from '../runtime/device.ts';
import { renderText } from '../model/chat-template.ts';
import { saveCheckpoint } from '../model/checkpoint.ts';
import { Llama } from '../model/llama.ts';
import { TextTokenizer, trainTokenizer } from '../model/tokenizer.ts';
import { SHAPES } from './shapes.ts';
import { LLAMA_SERVER, startLlamaServer } from './peers/llama-server.ts';
import type { LlamaConfig } from '../model/config.ts';

const opts = new Command()
  .option(
    '--model <folder>',
    'a model folder to serve (default: workspace/dapo/model if present, else a random model of that shape)',
  )
  .option('--requests <n>', 'requests per concurrency level', '48')
  .option('--levels <list>', 'concurrent clients', '1,4,16')
  .option('--max-tokens <n>', 'tokens per reply', '64')
  .option(
    '--shape <name>',
    "the random model's shape: default (the default run's) or smollm2-135m, qwen2.5-0.5b (bench/shapes.ts, with the tokenizer's vocabulary)",
    'default',
  )
  .option(
    '--llama-server <binary>',
    "the peer (default: bench/peers/llama-server.sh's cached build, when there is one); --no-llama-server: none",
  )
  .option('--no-llama-server', 'no peer')
  .parse()
  .opts<{
    model?: string;
    requests: string;
    levels: string;
    maxTokens: string;
    shape: string;
    llamaServer?: string | false;
  }>();
const peerBinary =
  opts.llamaServer === false ? null : (opts.llamaServer ?? (existsSync(LLAMA_SERVER) ? LLAMA_SERVER : null));

const REPO = join(import.meta.dirname, '..');
const dir = mkdtempSync(join(tmpdir(), 'prefab-bench-serve-'));
const world = generateWorld({ ...DEFAULT_WORLD });

/** Conversations up to the user's request, of training tasks (what a client sends first). */
const prompts: Message[][] = [];
for (let i = 0; i < 64; i++) {
  const task = generateTask(world, 'train', 30_000 + i);
  prompts.push([
    { role: 'system', content: SYSTEM_PROMPT },
    { role: 'user', content: task.request },
  ]);
}

/**
 * The serve bench's model since it was written (the default run's layers, width and vocabulary; an MLP of 344
 * and eps 1e-5 where the default run has 352 and 1e-6), kept so that its figures compare across sessions.
 */
const DEFAULT_RUN: LlamaConfig = {
  modelType: 'llama',
  vocabSize: 1024,
  hiddenSize: 128,
  intermediateSize: 344,
  layers: 4,
  heads: 4,
  kvHeads: 4,
  headDim: 32,
  ropeTheta: 10000,
  rmsNormEps: 1e-5,
  tiedEmbeddings: true,
  attentionBias: false,
  maxPositions: 1024,
  bosTokenId: null,
  eosTokenId: null,
};

async function randomModel(): Promise<string> {
  await openDevice({ backend: 'wasm' });
  const texts: string[] = [];
  for (let i = 0; i < 40; i++) {
    const task = generateTask(world, 'train', i);
    texts.push(
      renderText((await runEpisode(world, task, new ScriptedAgent('oracle', world, task, 'bench', 0))).messages),
    );
  }
  const json = trainTokenizer(texts, 1024);
  const vocab = new TextTokenizer(json).vocabSize;
  const shape = opts.shape === 'default' ? DEFAULT_RUN : SHAPES[opts.shape];
  if (!shape) throw new Error(`--shape ${opts.shape}: one of ${Object.keys(SHAPES).join(', ')}`);
  const model = Llama.create({ ...shape, vocabSize: vocab, maxPositions: 1024 }, 'bench');
  const folder = join(dir, 'random-model');
  saveCheckpoint(folder, { model, tokenizer: { 'tokenizer.json': json }, context: 1024 });
  return folder;
}

const folder =
  opts.model ??
  (opts.shape === 'default' && existsSync(join(REPO, 'workspace', 'dapo', 'model', 'config.json'))
    ? join(REPO, 'workspace', 'dapo', 'model')
    : await randomModel());
const workdir = join(dir, 'workspace');
new Registry(join(workdir, 'registry')).register(folder, { source: { bench: true }, config: {}, eval: null });

const server = spawn(
  process.execPath,
  [
    join(REPO, 'bin', 'prefab.js'),
    '--workdir',
    workdir,
    '--quiet',
    'serve',
    '--port',
    '0',
    '--max-batch',
    '16',
    '--max-queue',
    '256',
    '--max-tokens',
    opts.maxTokens,
  ],
  { stdio: ['ignore', 'pipe', 'inherit'] },
);
const url = await new Promise<string>((resolve, reject) => {
  let out = '';
  server.stdout.on('data', (d: Buffer) => {
    out += d.toString();
    const m = /at (http:\/\/\S+\/v1)/.exec(out);
    if (m) resolve(m[1]!);
  });
  server.on('exit', (code) => reject(new Error(`prefab serve exited ${code}`)));
});

type Workload = 'agent' | 'decode';

interface Level {
  workload: Workload;
  clients: number;
  requests: number;
  tokens: number;
  seconds: number;
  latencies: number[];
}

/** One request of prefab's server: the i-th prompt; the completion tokens it reports. */
async function prefabRequest(workload: Workload, i: number): Promise<number> {
  const r = await fetch(`${url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'production',
      messages: prompts[i % prompts.length],
      max_tokens: Number(opts.maxTokens),
      temperature: 1,
      seed: i,
      ...(workload === 'agent' ? { tools: TOOLS } : { ignore_eos: true }),
    }),
  });
  const body = (await r.json()) as { usage?: { completion_tokens: number }; error?: { message: string } };
  if (!r.ok) throw new Error(`request ${i}: ${r.status} ${body.error?.message}`);
  return body.usage!.completion_tokens;
}

async function level(
  workload: Workload,
  clients: number,
  requests: number,
  send: (i: number) => Promise<number> = (i) => prefabRequest(workload, i),
): Promise<Level> {
  let next = 0;
  let tokens = 0;
  const latencies: number[] = [];
  const started = performance.now();
  const client = async () => {
    for (let i = next++; i < requests; i = next++) {
      const t0 = performance.now();
      const n = await send(i); // not `tokens += await …`, which would add to the total read before the wait
      tokens += n;
      latencies.push(performance.now() - t0);
    }
  };
  await Promise.all(Array.from({ length: clients }, client));
  return {
    workload,
    clients,
    requests,
    tokens,
    seconds: (performance.now() - started) / 1000,
    latencies: latencies.sort((a, b) => a - b),
  };
}

const q = (xs: number[], p: number) => xs[Math.min(xs.length - 1, Math.floor(p * xs.length))]!;
await level('agent', 2, 4); // warm-up: weights, the tool constraint, the first caches
const results: Level[] = [];
for (const workload of ['agent', 'decode'] as const)
  for (const clients of opts.levels.split(',').map(Number))
    results.push(await level(workload, clients, Number(opts.requests)));
server.kill('SIGTERM');
await new Promise((done) => server.once('close', done));
const peer = peerBinary ? await peerLevels(peerBinary) : [];
rmSync(dir, { recursive: true, force: true });

/** The decode workload at each level against llama-server on an F32 GGUF of the same weights. */
async function peerLevels(binary: string): Promise<Level[]> {
  await openDevice({ backend: 'wasm' });
  const { exportModel } = await import('../model/export.ts');
  const gguf = join(dir, 'model-f32.gguf');
  exportModel({ from: folder, out: gguf, format: 'gguf', type: 'f32' });
  // The same prompts as token ids, as prefab's server encodes them, to llama-server's raw /completion.
  const { openChat } = await import('../model/chat.ts');
  const { readTokenizerFiles } = await import('../model/hf.ts');
  const files = readTokenizerFiles(folder);
  const ids = (await openChat(files, null, folder).encode(prompts, true)).map((e) => e.ids);
  // A random model writes bytes that are not UTF-8, on which llama-server's reply parser fails (a 500): its
  // tokens are never drawn there (logit_bias), so the text is ASCII; the lengths are fixed either way.
  const { Tokenizer } = await import('tokenizers');
  const tokenizer = Tokenizer.fromString(files['tokenizer.json']!);
  const texts = await Promise.all(
    Array.from({ length: tokenizer.getVocabSize(true) }, (_, id) => tokenizer.decode([id], false)),
  );
  const banned = texts.flatMap((t, id) => (/[^\x00-\x7f]/.test(t) ? [[id, false]] : []));
  const levels = opts.levels.split(',').map(Number);
  const threads = availableParallelism();
  const llama = await startLlamaServer({ gguf, binary, threads, slots: Math.max(...levels), context: 1024 });
  const send = async (i: number) => {
    const r = await fetch(`${llama.url}/completion`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        prompt: ids[i % ids.length],
        n_predict: Number(opts.maxTokens),
        ignore_eos: true,
        temperature: 1,
        seed: i,
        logit_bias: banned,
      }),
    });
    const body = (await r.json()) as { tokens_predicted?: number; error?: { message: string } };
    if (!r.ok) throw new Error(`llama-server request ${i}: ${r.status} ${body.error?.message}`);
    return body.tokens_predicted!;
  };
  try {
    await level('decode', 2, 4, send);
    const out: Level[] = [];
    for (const clients of levels) out.push(await level('decode', clients, Number(opts.requests), send));
    return out;
  } finally {
    await llama.close();
  }
}

process.stdout.write(
  `model: ${folder.startsWith(dir) ? `a random model of the ${opts.shape} shape (removed)` : folder}\n${Number(opts.requests)} requests a level; prompts of the system prompt and a user request; replies of at most ${opts.maxTokens} tokens\n\n`,
);
process.stdout.write(
  '| workload | clients | tokens/s | × 1 client | tokens a reply | requests/s | p50 latency | p95 latency |\n|---|---|---|---|---|---|---|---|\n',
);
const rate = (r: Level) => r.tokens / r.seconds;
for (const r of results) {
  const base = rate(results.find((x) => x.workload === r.workload)!);
  process.stdout.write(
    `| ${r.workload} | ${r.clients} | ${rate(r).toFixed(0)} | ${(rate(r) / base).toFixed(2)} | ${(r.tokens / r.requests).toFixed(1)} | ${(r.requests / r.seconds).toFixed(2)} | ${q(r.latencies, 0.5).toFixed(0)} ms | ${q(r.latencies, 0.95).toFixed(0)} ms |\n`,
  );
}
for (const workload of ['agent', 'decode'] as const) {
  const mine = results.filter((r) => r.workload === workload);
  const ratio = rate(mine.at(-1)!) / rate(mine[0]!);
  process.stdout.write(`${workload}: ${mine.at(-1)!.clients} clients at ${ratio.toFixed(2)}× one client's tokens/s\n`);
}
if (peer.length === 0)
  process.stdout.write('\nno peer: bench/peers/llama-server.sh builds llama-server (or pass --llama-server BIN)\n');
else {
  process.stdout.write(
    `\nthe peer: llama-server (${peerBinary}) on an F32 GGUF of the same weights, ${availableParallelism()} threads, the decode workload\n\n| clients | prefab tokens/s | llama.cpp tokens/s | prefab ÷ llama.cpp | llama.cpp p50 latency |\n|---|---|---|---|---|\n`,
  );
  for (const p of peer) {
    const mine = results.find((r) => r.workload === 'decode' && r.clients === p.clients)!;
    process.stdout.write(
      `| ${p.clients} | ${rate(mine).toFixed(0)} | ${rate(p).toFixed(0)} | ${(rate(mine) / rate(p)).toFixed(2)} | ${q(p.latencies, 0.5).toFixed(0)} ms |\n`,
    );
  }
  const last = peer.at(-1)!;
  const ratio = rate(results.find((r) => r.workload === 'decode' && r.clients === last.clients)!) / rate(last);
  process.stdout.write(
    `goal: prefab at ${last.clients} clients ≥ 1.0× llama.cpp's tokens/s: ${ratio >= 1 ? 'met' : 'not met'} (${ratio.toFixed(2)}×)\n`,
  );
}
