// llama.cpp's llama-server, the serving peer of bench:serve and the check that it reads prefab's calls
// (test/model/gguf.test.ts): where bench/peers/llama-server.sh caches its build, and one started on a GGUF;
// and llama-batched-bench, built beside it, the decoding peer of bench:decode.
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { createServer } from 'node:net';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';

/** The binary llama-server.sh builds (PREFAB_LLAMA_SERVER names another). */
export const LLAMA_SERVER =
  process.env.PREFAB_LLAMA_SERVER ??
  join(homedir(), '.cache', 'prefab', 'llama-server', 'build', 'bin', 'llama-server');

/** llama-batched-bench, which llama-server.sh builds beside llama-server. */
export const LLAMA_BATCHED_BENCH = join(dirname(LLAMA_SERVER), 'llama-batched-bench');

/**
 * llama.cpp's generated tokens/s at each number of sequences decoded together (llama-batched-bench: each
 * sequence its own random prompt of `prompt` tokens read in one batch, then `generated` steps of one token a
 * sequence, logits computed, no sampling), counted as prefab's bench counts: generated tokens over the
 * prompt's reading and the steps. Flash attention off and an F32 KV cache, as prefab's.
 */
export function llamaBatchedDecode(o: {
  binary: string;
  gguf: string;
  threads: number;
  levels: number[];
  prompt: number;
  generated: number;
}): Map<number, number> {
  const args = ['-m', o.gguf, '-t', String(o.threads), '-tb', String(o.threads)];
  args.push('-c', String(Math.max(...o.levels) * (o.prompt + o.generated)), '-b', '2048', '-ub', '512');
  args.push('-npp', String(o.prompt), '-ntg', String(o.generated), '-npl', o.levels.join(','));
  args.push('-fa', 'off', '-ctk', 'f32', '-ctv', 'f32', '--output-format', 'jsonl');
  const r = spawnSync(o.binary, args, { encoding: 'utf8', maxBuffer: 1 << 26 });
  if (r.status !== 0)
    throw new Error(`${o.binary} exited ${r.status}: ${r.stderr.trim().split('\n').slice(-3).join(' ')}`);
  const rates = new Map<number, number>();
  for (const line of r.stdout.split('\n').filter((l) => l.startsWith('{'))) {
    const j = JSON.parse(line) as { pl: number; tg: number; t: number };
    rates.set(j.pl, (j.pl * j.tg) / j.t);
  }
  return rates;
}

export interface LlamaServerOptions {
  gguf: string;
  binary?: string;
  threads: number;
  /** Requests decoded together. */
  slots: number;
  /** Positions per slot. */
  context: number;
  /** Replies read by its Jinja chat template's parser (tool calls and all). */
  jinja?: boolean;
}

/**
 * llama-server on a free port of 127.0.0.1, once it answers /health; flash attention off and an F32 KV
 * cache, for figures comparable with prefab's. `close` stops it.
 */
export async function startLlamaServer(o: LlamaServerOptions): Promise<{ url: string; close(): Promise<void> }> {
  const port = await new Promise<number>((resolve) => {
    const probe = createServer().listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
  const args = ['-m', o.gguf, '--host', '127.0.0.1', '--port', String(port), '-t', String(o.threads)];
  args.push('-tb', String(o.threads), '-np', String(o.slots), '-c', String(o.slots * o.context));
  args.push('-fa', 'off', '-ctk', 'f32', '-ctv', 'f32', o.jinja ? '--jinja' : '--no-jinja');
  const server = spawn(o.binary ?? LLAMA_SERVER, args, { stdio: ['ignore', 'ignore', 'inherit'] });
  const close = async () => {
    server.kill('SIGTERM');
    if (server.exitCode === null) await once(server, 'exit');
  };
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    if (server.exitCode !== null) throw new Error(`llama-server exited ${server.exitCode}`);
    const up = await fetch(`${url}/health`).then(
      (r) => r.ok,
      () => false,
    );
    if (up) return { url, close };
    if (i > 600) {
      await close();
      throw new Error('llama-server did not come up in a minute');
    }
    await new Promise((done) => setTimeout(done, 100));
  }
}
