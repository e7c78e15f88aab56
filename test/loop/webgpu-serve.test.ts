// `prefab --backend webgpu serve` against `prefab serve` on WASM, both real processes on 127.0.0.1 over the same
// registry: the same seeded requests, sent at once (decoded together, the later ones forking the shared
// system prompt's cache) and then a conversation's second turn (its idle cache reused), get the same replies
// token for token: the GPU's caches and steps (runtime/webgpu/decode.ts) give the CPU's logits to rounding, and
// seeded sampling draws the same tokens from them.
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Registry } from '../../loop/registry.ts';
import { TOOLS } from '../../env/env.ts';
import { prefabAsync } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { servedModelFolder } from '../fixtures/served-model.ts';
import { absent } from '../fixtures/webgpu.ts';

const children: ChildProcessWithoutNullStreams[] = [];

/** Starts `prefab serve` on `backend` and resolves with its URL once it listens. */
async function serve(workdir: string, backend: string): Promise<string> {
  const child = prefabAsync([
    '--workdir',
    workdir,
    '--backend',
    backend,
    'serve',
    '--port',
    '0',
    '--max-batch',
    '8',
    '--max-tokens',
    '32',
    '--follow-ms',
    '0',
  ]) as ChildProcessWithoutNullStreams;
  children.push(child);
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /at (http:\/\/\S+\/v1)/.exec(out);
      if (m) resolve(m[1]!);
    });
    child.on('exit', (code) => reject(new Error(`prefab serve (${backend}) exited ${code}: ${stderr}`)));
  });
}

const conversation = (who: string) => [
  {
    role: 'system',
    content:
      'You are a customer-service agent. Use the tools to help the user with their request, and ask before you share anything.',
  },
  { role: 'user', content: `Hi, I am ${who}. Please update my phone number with Acme Billing.` },
];

type Reply = {
  choices: { message: { role: string; content: string | null; tool_calls?: unknown[] } }[];
  usage: { completion_tokens: number };
};
const ask = async (url: string, messages: unknown[], seed: number): Promise<Reply> => {
  const r = await fetch(`${url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'production', messages, tools: TOOLS, max_tokens: 24, temperature: 1, seed }),
  });
  expect(r.status).toBe(200);
  return (await r.json()) as Reply;
};

afterAll(() => {
  for (const child of children) child.kill('SIGKILL');
});

describe('prefab serve on the GPU', () => {
  it.skipIf(absent)(
    'answers what the WASM server answers: requests decoded together, forked from a shared prompt, and a second turn',
    async () => {
      const workdir = join(tempDir(), 'workspace');
      new Registry(join(workdir, 'registry')).register(await servedModelFolder(tempDir(), 'gpu-serve', 1024), {
        source: { stage: 'dpo' },
        config: {},
        eval: null,
      });
      const [onCpu, onGpu] = await Promise.all([serve(workdir, 'wasm'), serve(workdir, 'webgpu')]);
      const people = ['Ana', 'Bo', 'Cy', 'Di', 'Ed'];
      const turn = (url: string) => Promise.all(people.map((who, i) => ask(url, conversation(who), i)));
      const [want, got] = [await turn(onCpu), await turn(onGpu)];
      expect(got.map((r) => r.choices[0]!.message)).toEqual(want.map((r) => r.choices[0]!.message));
      expect(want.reduce((n, r) => n + r.usage.completion_tokens, 0)).toBeGreaterThan(people.length * 4);
      const second = (url: string, first: Reply) =>
        ask(url, [...conversation('Ana'), first.choices[0]!.message, { role: 'user', content: 'Any news?' }], 9);
      expect((await second(onGpu, got[0]!)).choices[0]!.message).toEqual(
        (await second(onCpu, want[0]!)).choices[0]!.message,
      );
    },
  );
});
