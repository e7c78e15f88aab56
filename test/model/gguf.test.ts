// GGUF exports (model/gguf.ts, `prefab model export`) read by llama.cpp itself (test/fixtures/llama-cpp.ts):
// each transformers fixture's log-probs within 1e-4 of transformers' at F32 and its greedy continuation the
// same; a prefab model trained here to call a tool: log-probs within 1e-4 of prefab's, the GGUF's own chat
// template rendering the prompt llama.cpp tokenizes into prefab's ids, and its greedy reply, tool call and all
// (not stopped at the call's token), parsed as the call prefab writes; a LoRA adapter's GGUF, run over its
// base's GGUF, gives the adapted model's log-probs. The float16 and Q8_0 conversions are checked on hand-made
// numbers.
import { cpSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import * as tf from '@tensorflow/tfjs-core';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Message } from '../../core/records.ts';
import { prefabChat } from '../../model/chat.ts';
import { conversationTexts, renderText } from '../../model/chat-template.ts';
import { saveCheckpoint } from '../../model/checkpoint.ts';
import { exportModel } from '../../model/export.ts';
import { q8Bytes, servingTemplate, toHalf } from '../../model/gguf.ts';
import { PROJECTIONS } from '../../model/config.ts';
import { readHfModel } from '../../model/hf.ts';
import { Llama } from '../../model/llama.ts';
import { attachLora, mergeLora, saveAdapter } from '../../model/lora.ts';
import { Registry } from '../../loop/registry.ts';
import { TextTokenizer, trainTokenizer } from '../../model/tokenizer.ts';
import { deviceOn, openDevice } from '../../runtime/device.ts';
import type { PreferenceSettings } from '../../trainers/dpo.ts';
import { trainingRun } from '../../trainers/run.ts';
import { sftTrainer } from '../../trainers/sft.ts';
import { REPO, prefab } from '../fixtures/cli.ts';
import { runSettings } from '../fixtures/held.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { absent, llamaCppGreedy, llamaCppLogprobs, noLlamaServer, openGguf, serveGguf } from '../fixtures/llama-cpp.ts';
import { tempDir } from '../fixtures/pipeline.ts';

const FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'hf-tiny');

interface Reference {
  input_ids: number[][];
  token_logprobs: number[][];
  greedy_prompt: number[];
  greedy_continuation: number[];
}

/** `prefab model export` as a user runs it; its JSON line. */
function exported(...args: string[]): { path: string; bytes: number | null; format: string } {
  const r = prefab(['model', 'export', ...args]);
  expect(r.code, r.stderr).toBe(0);
  return JSON.parse(r.stdout) as { path: string; bytes: number | null; format: string };
}

const worst = (a: number[], b: number[]) => Math.max(...a.map((x, i) => Math.abs(x - b[i]!)));

beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
});

describe('float16 and Q8_0 as ggml writes them', () => {
  it('rounds float32 to half to nearest even, with subnormals, overflow and NaN', () => {
    const cases: [number, number][] = [
      [1, 0x3c00],
      [-2, 0xc000],
      [65504, 0x7bff],
      [65520, 0x7c00], // halfway to the next step rounds to even: infinity
      [2 ** -24, 0x0001],
      [2 ** -25, 0x0000], // a tie between 0 and the smallest subnormal: even
      [3 * 2 ** -25, 0x0002],
      [1 + 2 ** -11, 0x3c00], // a tie: the even mantissa
      [1 + 3 * 2 ** -11, 0x3c02],
      [Infinity, 0x7c00],
      [1e-10, 0x0000],
    ];
    for (const [x, h] of cases) expect(toHalf(x), String(x)).toBe(h);
    expect(toHalf(NaN) & 0x7c00).toBe(0x7c00);
    expect(toHalf(NaN) & 0x3ff).not.toBe(0);
  });

  it('quantizes each block of 32 to int8 with a half scale max|x| / 127, halves rounded away from zero', () => {
    const block = Float32Array.from({ length: 32 }, (_, j) => j - 16); // max |x| 16: d = 16/127
    block[31] = 127 / 8; // 15.875: q = 15.875 · 127/16 = 126.0…
    const zeros = new Float32Array(32);
    const halves = Float32Array.from({ length: 32 }, (_, j) => (j === 0 ? 127 : j === 1 ? 0.5 : j === 2 ? -0.5 : 0));
    const out = q8Bytes(Float32Array.from([...block, ...zeros, ...halves]));
    expect(out.length).toBe(3 * 34);
    expect(out.readUInt16LE(0)).toBe(toHalf(Math.fround(16 / 127)));
    expect(out.readInt8(2)).toBe(-127); // −16
    expect(out.readInt8(2 + 16)).toBe(0);
    expect(out.readInt8(2 + 31)).toBe(126);
    expect([out.readUInt16LE(34), ...out.subarray(36, 68)].every((v) => v === 0)).toBe(true);
    expect(out.readUInt16LE(68)).toBe(0x3c00); // d = 1
    expect([out.readInt8(70), out.readInt8(71), out.readInt8(72)]).toEqual([127, 1, -1]);
    expect(() => q8Bytes(new Float32Array(33))).toThrow(/multiple of 32/);
  });
});

/** A conversation whose reply calls a tool, for a model to learn by heart. */
const CALLING: Message[] = [
  { role: 'system', content: 'You call companies for the user.' },
  { role: 'user', content: 'Find the number of Acme Gym, please.' },
  {
    role: 'assistant',
    content: 'Looking it up.',
    tool_calls: [
      { id: 'call_1', type: 'function', function: { name: 'search_directory', arguments: '{"company":"Acme Gym"}' } },
    ],
  },
];

/** A tiny prefab model (its tokenizer trained on the conversation) trained until greedy decoding writes its reply. */
async function trainedToCall(conversation: Message[], steps = 150) {
  const json = trainTokenizer(conversationTexts(conversation), 300);
  const chat = prefabChat(json);
  const [encoded] = await chat.encode([conversation]);
  const cfg = {
    seed: 'gguf',
    batch_size: 1,
    epochs: 1000,
    max_steps: steps,
    lr: 0.01,
    warmup: 1,
    min_lr_ratio: 1,
    weight_decay: 0,
    max_grad_norm: 1,
    checkpoint_every: 1000,
    micro_batch_tokens: 1024,
    label_smoothing: 0,
  } as unknown as PreferenceSettings;
  const context = 1024;
  const config = tinyLlama({ vocabSize: new TextTokenizer(json).vocabSize, maxPositions: context, layers: 2 });
  const run = await trainingRun(
    runSettings(cfg, { device: deviceOn({ kind: 'reference' }), context }),
    sftTrainer([encoded!], () => Llama.create(config, 'gguf'), cfg, chat.pad),
  );
  const folder = join(tempDir(), 'model');
  saveCheckpoint(folder, { model: run.model, tokenizer: { 'tokenizer.json': json }, context });
  run.model.dispose();
  return { folder, chat, encoded: encoded! };
}

describe('GGUF in llama.cpp', () => {
  it.skipIf(absent)(
    'matches transformers on each fixture: log-probs within 1e-4 at F32, the same greedy continuation; F16 and Q8_0 near',
    async () => {
      for (const name of ['llama-tiny', 'llama-tiny-tied', 'qwen2-tiny']) {
        const ref = JSON.parse(readFileSync(join(FIXTURES, name, 'reference.json'), 'utf8')) as Reference;
        // The fixtures have no tokenizer, and GGUF carries one: prefab's, trained to the fixture's vocabulary.
        const dir = join(tempDir(), name);
        cpSync(join(FIXTURES, name), dir, { recursive: true });
        const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as { vocab_size: number };
        const json = trainTokenizer(['a small corpus, for a tokenizer of 320 tokens: 12345'], config.vocab_size);
        writeFileSync(join(dir, 'tokenizer.json'), json);
        const tolerance = { f32: 1e-4, f16: 3e-2, q8_0: 0.5 };
        for (const type of ['f32', 'f16', 'q8_0'] as const) {
          // The command line once a fixture; the same function in this process for the other types.
          const path = join(dir, `${type}.gguf`);
          const out =
            type === 'f32'
              ? exported(dir, '--out', path, '--type', type)
              : exportModel({ from: dir, out: path, format: 'gguf', type });
          expect(out).toMatchObject({ path, format: `gguf ${type}` });
          const gguf = await openGguf(out.path);
          for (const [s, ids] of ref.input_ids.entries())
            expect(worst(await llamaCppLogprobs(gguf, ids), ref.token_logprobs[s]!), `${name} ${type}`).toBeLessThan(
              tolerance[type],
            );
          if (type === 'f32')
            expect(await llamaCppGreedy(gguf, ref.greedy_prompt, ref.greedy_continuation.length)).toEqual(
              ref.greedy_continuation,
            );
          await gguf.close();
        }
      }
    },
    120_000,
  );

  it.skipIf(absent)(
    'runs a prefab model trained to call a tool: its log-probs, its chat template, and its call as prefab writes it',
    async () => {
      const conversation = CALLING;
      const { folder, chat, encoded } = await trainedToCall(conversation);
      const out = exported(folder, '--out', join(folder, '..', 'model.gguf'), '--type', 'f32');
      const gguf = await openGguf(out.path);
      // Log-probs of the whole conversation: llama.cpp's against prefab's own scorer.
      const score = prefab(['model', 'score', folder, '--ids', JSON.stringify([encoded.ids])]);
      expect(score.code).toBe(0);
      const ours = (JSON.parse(score.stdout) as { token_logprobs: number[][] }).token_logprobs[0]!;
      expect(worst(await llamaCppLogprobs(gguf, encoded.ids), ours)).toBeLessThan(1e-4);

      // The template the GGUF carries renders the prompt; llama.cpp's tokenizer makes prefab's ids of it.
      const template = gguf.model.fileInfo.metadata.tokenizer.chat_template!;
      expect(template).not.toMatch(/\{%-? *(end)?generation/);
      const prompt = conversation.slice(0, 2);
      const text = new Template(template).render({ messages: prompt, add_generation_prompt: true });
      const [open] = await chat.encode([prompt], true);
      expect(gguf.model.tokenize(text, true)).toEqual(open!.ids);

      // Greedy in llama.cpp: the whole reply, through the call's tokens, to <|end|>; read as prefab reads it.
      const reply = await llamaCppGreedy(gguf, open!.ids, 64);
      const spelt = gguf.model.detokenize(reply, true);
      expect(reply.at(-1)).toBe(chat.stop[0]);
      expect(reply.filter((id) => gguf.model.isEogToken(id))).toEqual(chat.stop); // only <|end|> ends it
      expect(spelt).toMatch(/^Looking it up\.<tool_call>\{.*\}<\/tool_call>/);
      const parsed = await chat.parseAssistant(reply, 1);
      expect(parsed).toEqual(conversation[2]);
      const generated = prefab([
        'model',
        'generate',
        folder,
        '--ids',
        JSON.stringify(open!.ids),
        '--max-new-tokens',
        '64',
        '--stop',
        JSON.stringify(chat.stop),
      ]);
      expect((JSON.parse(generated.stdout) as { continuation: number[] }).continuation).toEqual(reply);
      // A serving stack's Hermes parser reads the call from the text between the tags.
      const call = JSON.parse(/<tool_call>(.*)<\/tool_call>/s.exec(spelt)![1]!) as { name: string; arguments: unknown };
      expect(call).toEqual({ name: 'search_directory', arguments: { company: 'Acme Gym' } });
      await gguf.close();
    },
    180_000,
  );

  it.skipIf(absent || noLlamaServer)(
    'is served by llama-server --jinja, which returns the call as tool_calls (its Hermes parser)',
    async () => {
      const tools = [
        {
          type: 'function',
          function: {
            name: 'search_directory',
            description: "A company's phone number.",
            parameters: { type: 'object', properties: { company: { type: 'string' } }, required: ['company'] },
          },
        },
      ];
      // The prompt llama-server renders with the tools: prefab's models learn their tools from the
      // conversation, so this one is trained on the list as the template writes it, a system message first.
      const probe = await trainedToCall(CALLING, 1); // any model with the template will do
      const probeGguf = exported(probe.folder, '--out', join(probe.folder, '..', 'probe.gguf'), '--type', 'f32');
      let server = await serveGguf(probeGguf.path);
      const applied = (await (
        await fetch(`${server.url}/apply-template`, {
          method: 'POST',
          body: JSON.stringify({ messages: CALLING.slice(0, 2), tools }),
        })
      ).json()) as { prompt: string };
      await server.close();
      const plain = renderText(CALLING.slice(0, 2), true);
      expect(applied.prompt.endsWith(plain)).toBe(true);
      const listed = applied.prompt.slice(0, -plain.length);
      expect(listed).toMatch(/^<\|system\|>.*<tools>\n\{.*"search_directory".*\}\n<\/tools><\|end\|>$/s);
      const conversation: Message[] = [
        { role: 'system', content: listed.slice('<|system|>'.length, -'<|end|>'.length) },
        ...CALLING,
      ];
      const { folder } = await trainedToCall(conversation);
      const gguf = exported(folder, '--out', join(folder, '..', 'model.gguf'), '--type', 'f32');
      server = await serveGguf(gguf.path);
      const r = await fetch(`${server.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: CALLING.slice(0, 2), tools, temperature: 0, max_tokens: 64 }),
      });
      const body = (await r.json()) as {
        choices: {
          message: { content: string | null; tool_calls?: { function: { name: string; arguments: string } }[] };
          finish_reason: string;
        }[];
      };
      await server.close();
      const choice = body.choices[0]!;
      expect(choice.finish_reason).toBe('tool_calls');
      expect(choice.message.content).toBe('Looking it up.');
      expect(choice.message.tool_calls?.map((c) => [c.function.name, JSON.parse(c.function.arguments)])).toEqual([
        ['search_directory', { company: 'Acme Gym' }],
      ]);
    },
    240_000,
  );

  it.skipIf(absent)(
    "writes a LoRA adapter as llama.cpp's adapter GGUF: over the base's GGUF, log-probs within 1e-4 of prefab's",
    async () => {
      for (const name of ['llama-tiny', 'qwen2-tiny']) {
        const ref = JSON.parse(readFileSync(join(FIXTURES, name, 'reference.json'), 'utf8')) as Reference;
        // A prefab model folder with adapter/: the fixture's weights, a tokenizer, adapters on every projection
        // whose B is not zero (a fresh adapter changes nothing).
        const dir = join(tempDir(), name);
        cpSync(join(FIXTURES, name), dir, { recursive: true });
        const hf = readHfModel(dir);
        writeFileSync(join(dir, 'tokenizer.json'), trainTokenizer(['a corpus for the tokens'], hf.config.vocabSize));
        const model = new Llama(hf.config, hf.weights);
        const lora = { r: 4, alpha: 8, dropout: 0, targetModules: [...PROJECTIONS] };
        attachLora(model, lora, 'gguf-lora');
        for (const ad of model.adapters.values()) ad.b.assign(tf.randomNormal(ad.b.shape, 0, 0.3, 'float32', 3));
        saveAdapter(join(dir, 'adapter'), model, lora, '..');
        model.dispose();

        const base = exported(dir, '--no-adapter', '--out', join(dir, 'base.gguf'), '--type', 'f32');
        // The adapter/ folder as PEFT writes it: its base is the folder's own weights, not merged twice.
        const adapter = exported(join(dir, 'adapter'), '--format', 'gguf-lora', '--out', join(dir, 'lora.gguf'));
        expect(adapter).toMatchObject({ format: 'gguf-lora f16' });
        const f32 = exported(dir, '--format', 'gguf-lora', '--out', join(dir, 'lora-f32.gguf'), '--type', 'f32');
        const without = prefab(['model', 'export', join(dir, 'adapter'), '--no-adapter', '--out', join(dir, 'x.gguf')]);
        expect(without.stderr).toContain('is a LoRA adapter: --no-adapter');
        const both = prefab([
          'model',
          'export',
          dir,
          '--no-adapter',
          '--format',
          'gguf-lora',
          '--out',
          join(dir, 'x.gguf'),
        ]);
        expect(both.stderr).toContain('--no-adapter leaves the adapter out, and --format gguf-lora');
        const score = prefab(['model', 'score', dir, '--ids', JSON.stringify(ref.input_ids)]);
        expect(score.code, score.stderr).toBe(0);
        const ours = (JSON.parse(score.stdout) as { token_logprobs: number[][] }).token_logprobs;

        const plain = await openGguf(base.path);
        const adapted = await openGguf(base.path, { lora: f32.path });
        const half = await openGguf(base.path, { lora: adapter.path });
        for (const [s, ids] of ref.input_ids.entries()) {
          // The base's GGUF alone is the fixture (transformers' log-probs), which the adapters move.
          expect(worst(await llamaCppLogprobs(plain, ids), ref.token_logprobs[s]!), name).toBeLessThan(1e-4);
          expect(worst(ours[s]!, ref.token_logprobs[s]!), name).toBeGreaterThan(1e-2);
          expect(worst(await llamaCppLogprobs(adapted, ids), ours[s]!), name).toBeLessThan(1e-4);
          expect(worst(await llamaCppLogprobs(half, ids), ours[s]!), name).toBeLessThan(3e-2);
        }
        for (const g of [plain, adapted, half]) await g.close();
      }
    },
    120_000,
  );

  it('writes a registry version, and a LoRA adapter merged onto its base as one Hugging Face folder', async () => {
    // A base with a tokenizer, and an adapter on it whose B is not zero (a fresh adapter changes nothing).
    const base = join(tempDir(), 'base');
    cpSync(join(FIXTURES, 'llama-tiny'), base, { recursive: true });
    writeFileSync(join(base, 'tokenizer.json'), trainTokenizer(['a corpus for 320 tokens'], 320));
    const model = new Llama(readHfModel(base).config, readHfModel(base).weights);
    const lora = { r: 2, alpha: 4, dropout: 0, targetModules: ['q_proj', 'down_proj'] };
    attachLora(model, lora, 'export');
    for (const ad of model.adapters.values()) ad.b.assign(tf.randomNormal(ad.b.shape, 0, 0.5, 'float32', 7));
    const adapter = join(base, '..', 'adapter');
    saveAdapter(adapter, model, lora, '../base');
    mergeLora(model);
    const merged = join(base, '..', 'merged');
    expect(exported(adapter, '--format', 'hf', '--out', merged)).toEqual({ path: merged, bytes: null, format: 'hf' });
    const read = readHfModel(merged);
    for (const [name, w] of model.weights())
      expect(worst([...read.weights.get(name)!], [...w.data]), name).toBeLessThan(1e-6);
    expect(readFileSync(join(merged, 'tokenizer.json'), 'utf8')).toBe(
      readFileSync(join(base, 'tokenizer.json'), 'utf8'),
    );
    model.dispose();

    const workdir = join(tempDir(), 'workspace');
    const registry = new Registry(join(workdir, 'registry'));
    registry.register(merged, { source: { stage: 'sft' }, config: {}, eval: null });
    const r = prefab([
      '--workdir',
      workdir,
      'models',
      'export',
      'production',
      '--out',
      join(workdir, 'p.gguf'),
      '--type',
      'q8_0',
    ]);
    expect(r.code, r.stderr).toBe(0);
    const written = JSON.parse(r.stdout) as { version: string; path: string; bytes: number; format: string };
    expect(written).toMatchObject({ version: 'v0001', path: join(workdir, 'p.gguf'), format: 'gguf q8_0' });
    expect(statSync(written.path).size).toBe(written.bytes);
    expect(readFileSync(written.path).subarray(0, 4).toString()).toBe('GGUF');
    const unknown = prefab(['--workdir', workdir, 'models', 'export', 'v0042', '--out', join(workdir, 'x.gguf')]);
    expect(unknown.stderr).toMatch(/no version v0042/);
  });

  it('writes the chat template without the training-only generation markers', () => {
    expect(servingTemplate('{%- if a -%}{%- generation -%}{{- x -}}{%- endgeneration -%}{%- endif -%}')).toBe(
      '{%- if a -%}{{- x -}}{%- endif -%}',
    );
  });

  it('refuses what it cannot write, naming the folder and why', () => {
    const dir = join(tempDir(), 'no-tokenizer');
    cpSync(join(FIXTURES, 'llama-tiny'), dir, { recursive: true });
    const none = prefab(['model', 'export', dir, '--out', join(dir, 'x.gguf')]);
    expect(none.code).toBe(1);
    expect(none.stderr).toContain(`${dir} has no tokenizer.json`);
    const unigram = JSON.stringify({ model: { type: 'Unigram', vocab: [] }, added_tokens: [] });
    writeFileSync(join(dir, 'tokenizer.json'), unigram);
    const other = prefab(['model', 'export', dir, '--out', join(dir, 'x.gguf')]);
    expect(other.code).toBe(1);
    expect(other.stderr).toMatch(/tokenizer model \\?"Unigram\\?" is not supported/);
    const noAdapter = prefab(['model', 'export', dir, '--format', 'gguf-lora', '--out', join(dir, 'x.gguf')]);
    expect(noAdapter.code).toBe(1);
    expect(noAdapter.stderr).toContain(`${dir} has no LoRA adapter (adapter/ or adapter_config.json)`);
    const neither = prefab(['model', 'export', REPO, '--out', join(dir, 'x.gguf')]);
    expect(neither.stderr).toMatch(/neither a model folder \(config.json\) nor a LoRA adapter/);
  });
});
