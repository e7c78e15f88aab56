// The Llama-family model against transformers: three tiny random checkpoints saved by transformers 5.17
// (Llama with GQA, tied Llama, Qwen2 with q/k/v biases), each with transformers' logits, per-token log-probs,
// per-sequence sums and a greedy continuation (test/fixtures/hf-tiny/*/reference.json), alone and decoded
// together with other sequences.
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';
import { openDevice } from '../../runtime/device.ts';
import { llamaConfigFromJson, readHfModel, writeHfModel } from '../../model/hf.ts';
import { seeded } from '../../core/random.ts';
import { DecodeWeights, KVCache, cpuCaches, type GenerateOptions } from '../../runtime/decode.ts';
import { loadCpuKernels } from '../../runtime/cpu/kernels.ts';
import { SharedDecoder } from '../../runtime/shared-decoder.ts';
import { Llama } from '../../model/llama.ts';
import { sampleToken } from '../../runtime/sampling.ts';
import { prefab } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { llamaParameterShapes } from '../../model/config.ts';

const FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'hf-tiny');
const CHECKPOINTS = ['llama-tiny', 'llama-tiny-tied', 'qwen2-tiny'];

interface Reference {
  input_ids: number[][];
  logits: number[][][];
  token_logprobs: number[][];
  sequence_logprob_sums: number[];
  greedy_prompt: number[];
  greedy_continuation: number[];
}

const reference = (name: string) =>
  JSON.parse(readFileSync(join(FIXTURES, name, 'reference.json'), 'utf8')) as Reference;
const load = (dir: string) => {
  const hf = readHfModel(dir);
  return new Llama(hf.config, hf.weights);
};

/** Logits (B, T, V) and per-token log-probs of every next token (B, T−1), as transformers computes them. */
function score(model: Llama, ids: number[][]): { logits: number[][][]; logprobs: number[][] } {
  const B = ids.length;
  const T = ids[0]!.length;
  const flat = Int32Array.from(ids.flat());
  const logits = model.forward(flat, B, T).arraySync() as number[][];
  const targets = Int32Array.from(ids.flatMap((row) => [...row.slice(1), 0]));
  const lp = model.tokenLogprobs(flat, targets, B, T).arraySync() as number[][];
  return {
    logits: ids.map((_, b) => logits.slice(b * T, (b + 1) * T)),
    logprobs: lp.map((row) => row.slice(0, T - 1)),
  };
}

/** Greedy continuation by recomputing the whole sequence for every new token (no cache). */
function greedyWithoutCache(model: Llama, prompt: number[], n: number): number[] {
  const ids = [...prompt];
  for (let i = 0; i < n; i++) {
    const logits = tf.tidy(
      () =>
        tf
          .slice(model.forward(Int32Array.from(ids), 1, ids.length), [ids.length - 1, 0], [1, -1])
          .dataSync() as Float32Array,
    );
    ids.push(sampleToken(logits, 0, 1, Math.random));
  }
  return ids.slice(prompt.length);
}

const maxAbsDiff = (a: number[][][], b: number[][][]) =>
  Math.max(...a.flatMap((x, i) => x.flatMap((y, j) => y.map((v, k) => Math.abs(v - b[i]![j]![k]!)))));

beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
});

describe.each(CHECKPOINTS)('%s against transformers', (name) => {
  const dir = join(FIXTURES, name);
  const ref = reference(name);

  it('gives transformers’ logits (max abs error ≤ 1e-4), per-token log-probs and sequence sums', () => {
    const model = load(dir);
    const { logits, logprobs } = score(model, ref.input_ids);
    expect(maxAbsDiff(logits, ref.logits)).toBeLessThanOrEqual(1e-4);
    logprobs.forEach((row, b) => row.forEach((v, t) => expect(v).toBeCloseTo(ref.token_logprobs[b]![t]!, 4)));
    logprobs.forEach((row, b) => expect(row.reduce((s, v) => s + v, 0)).toBeCloseTo(ref.sequence_logprob_sums[b]!, 3));
    model.dispose();
  });

  it('continues the prompt greedily as transformers does, with and without the KV cache', () => {
    const model = load(dir);
    const n = ref.greedy_continuation.length;
    expect(greedyWithoutCache(model, ref.greedy_prompt, n)).toEqual(ref.greedy_continuation);
    const cache = new KVCache(model);
    expect(cache.generate(ref.greedy_prompt, { maxTokens: n, temperature: 0, topP: 1, random: Math.random })).toEqual(
      ref.greedy_continuation,
    );
    // The cache read in pieces gives the logits of one read.
    const whole = new KVCache(model).read(ref.greedy_prompt);
    const pieces = new KVCache(model);
    pieces.read(ref.greedy_prompt.slice(0, 3));
    const last = pieces.read(ref.greedy_prompt.slice(3));
    last.forEach((v, i) => expect(v).toBeCloseTo(whole[i]!, 4));
    model.dispose();
  });

  it('decodes together with other sequences (SharedDecoder) what each decodes alone, greedy and sampled, turn after turn', async () => {
    const model = load(dir);
    const n = ref.greedy_continuation.length;
    const shared = new SharedDecoder(model, cpuCaches(model, null));
    const prompts = [
      ref.greedy_prompt,
      ref.input_ids[0]!.slice(0, 5),
      ref.input_ids[1]!,
      ref.greedy_prompt.slice(0, 2),
      ref.input_ids[0]!.slice(0, 12), // eight or more new tokens: read through the batched pass
    ];
    const options = (i: number, temperature = 0): GenerateOptions => ({
      maxTokens: [n, 3, n + 4, 1, 6][i]!,
      temperature,
      topP: 0.9,
      random: seeded('together', i),
    });
    const caches = prompts.map(() => shared.cache());
    const together = await Promise.all(prompts.map((p, i) => shared.generate(caches[i]!, p, options(i))));
    expect(together[0]).toEqual(ref.greedy_continuation);
    together.forEach((ids, i) => expect(ids).toEqual(new KVCache(model).generate(prompts[i]!, options(i))));
    // The next turn on the same caches: each prompt extends what its cache read; sampled this time.
    const next = prompts.map((p, i) => [...p, ...together[i]!, 7, 8]);
    const sampled = await Promise.all(next.map((p, i) => shared.generate(caches[i]!, p, options(i, 1))));
    sampled.forEach((ids, i) => expect(ids).toEqual(new KVCache(model).generate(next[i]!, options(i, 1))));
    shared.dispose();
    model.dispose();
  });

  it('writes a folder that reads back to the same numbers', () => {
    const model = load(dir);
    const out = join(tempDir(), 'saved');
    writeHfModel(out, model);
    const again = load(out);
    const a = score(model, ref.input_ids);
    const b = score(again, ref.input_ids);
    expect(maxAbsDiff(a.logits, b.logits)).toBe(0);
    const config = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'));
    expect(config).toMatchObject({
      model_type: name.startsWith('qwen2') ? 'qwen2' : 'llama',
      rope_theta: model.config.ropeTheta,
      rope_parameters: { rope_theta: model.config.ropeTheta },
    });
    model.dispose();
    again.dispose();
  });
});

// Where the CPU path's C kernels are here, the decoder runs on them (the products on panels or by OpenBLAS, the
// attention over the cache in C): the same continuations, and logits within float rounding of the reference's
// plain loops.
const { kernels: native, why } = loadCpuKernels();
describe.each(CHECKPOINTS)('%s decoded by the C kernels', (name) => {
  it.skipIf(!native && !process.env.CI)(
    'continues greedily as transformers does, its logits those of the reference decoder, and decodes together (a step’s tokens drawn in C) what it decodes alone',
    async () => {
      if (!native) throw new Error(`the C kernels are not here: ${why}`);
      const model = load(join(FIXTURES, name));
      const ref = reference(name);
      const n = ref.greedy_continuation.length;
      const cache = () => new KVCache(model, new DecodeWeights(model, native));
      const greedy = { maxTokens: n, temperature: 0, topP: 1, random: Math.random };
      expect(cache().generate(ref.greedy_prompt, greedy)).toEqual(ref.greedy_continuation);
      // A short prompt (five rows; the reference reads it token by token) and a long one, against the reference's.
      for (const prompt of [ref.greedy_prompt.slice(0, 5), ref.input_ids[0]!]) {
        const [got, want] = [cache().read(prompt), new KVCache(model, new DecodeWeights(model, null)).read(prompt)];
        expect(Math.max(...got.map((v, i) => Math.abs(v - want[i]!)))).toBeLessThan(1e-4);
      }
      const shared = new SharedDecoder(model, cpuCaches(model, native));
      const prompts = [ref.greedy_prompt, ref.input_ids[0]!.slice(0, 5), ref.input_ids[1]!];
      const sampled = (i: number): GenerateOptions => ({
        maxTokens: n + i,
        temperature: 1,
        topP: i % 2 ? 1 : 0.9,
        random: seeded('native', i),
      });
      const together = await Promise.all(prompts.map((p, i) => shared.generate(shared.cache(), p, sampled(i))));
      together.forEach((ids, i) => expect(ids).toEqual(cache().generate(prompts[i]!, sampled(i))));
      shared.dispose();
      // Under a constraint that refuses about half the tokens the C kernels draw: those are drawn again from the
      // row's logits, from the same random stream, as a sequence decoding alone draws them.
      const pool = cpuCaches(model, native);
      let refused = 0;
      const draw = pool.readAndDraw!.bind(pool);
      pool.readAndDraw = async (caches, reads, draws) => {
        const drawn = await draw(caches, reads, draws);
        return { ...drawn, logits: (b) => (refused++, drawn.logits(b)) };
      };
      const constrained = new SharedDecoder(model, pool);
      const constraint = { allows: (out: readonly number[], id: number) => out.length < 2 || id % 2 === 1 };
      const odd = (i: number): GenerateOptions => ({ ...sampled(i), maxTokens: 12, constraint });
      const oddTogether = await Promise.all(
        prompts.map((p, i) => constrained.generate(constrained.cache(), p, odd(i))),
      );
      oddTogether.forEach((ids, i) => {
        expect(ids).toEqual(cache().generate(prompts[i]!, odd(i)));
        expect(ids.slice(2).every((id) => id % 2 === 1)).toBe(true);
      });
      expect(refused).toBeGreaterThan(3);
      constrained.dispose();
      model.dispose();
    },
  );
});

describe('shapes the fixtures do not have', () => {
  it('one key/value head and a head_dim unlike hidden / heads: the cache agrees with the whole pass, and a saved folder reads back', () => {
    const config = {
      ...llamaConfigFromJson(
        JSON.parse(readFileSync(join(FIXTURES, 'llama-tiny', 'config.json'), 'utf8')),
        'config.json',
      ),
      hiddenSize: 48,
      heads: 4,
      kvHeads: 1,
      headDim: 20,
      intermediateSize: 96,
    };
    const model = Llama.create(config, 'shapes');
    const prompt = [5, 17, 200, 3, 99, 41];
    expect(new KVCache(model).generate(prompt, { maxTokens: 8, temperature: 0, topP: 1, random: Math.random })).toEqual(
      greedyWithoutCache(model, prompt, 8),
    );
    const dir = join(tempDir(), 'shapes');
    writeHfModel(dir, model);
    const saved = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
    expect(saved).toMatchObject({ num_key_value_heads: 1, head_dim: 20, hidden_size: 48 });
    const again = load(dir);
    const ids = [prompt, prompt.map((t) => (t * 7) % 320)];
    expect(maxAbsDiff(score(again, ids).logits, score(model, ids).logits)).toBe(0);
    model.dispose();
    again.dispose();
  });
});

// The C kernels' decoding attention takes a head 32 dimensions at a time, then 8, then one, and the positions
// eight at a time, then one: head sizes that end in each, prompts that do, two query heads a key/value head, and
// a feed-forward width (SwiGLU's, eight at a time) that ends in four, against the reference's loops.
describe.each([20, 40, 72])('the C kernels decoding heads of %i', (headDim) => {
  it.skipIf(!native && !process.env.CI)(
    'give the reference’s logits, one row and many, one sequence and several',
    () => {
      if (!native) throw new Error(`the C kernels are not here: ${why}`);
      const base = llamaConfigFromJson(
        JSON.parse(readFileSync(join(FIXTURES, 'llama-tiny', 'config.json'), 'utf8')),
        'config.json',
      );
      const model = Llama.create(
        { ...base, hiddenSize: 48, heads: 4, kvHeads: 2, headDim, intermediateSize: 100 },
        'heads',
      );
      const random = seeded('heads', headDim);
      const ids = (n: number) => Array.from({ length: n }, () => Math.floor(random() * base.vocabSize));
      const [c, reference] = [new DecodeWeights(model, native), new DecodeWeights(model, null)];
      const prompts = [ids(40), ids(90), ids(7)];
      const [ours, theirs] = [
        prompts.map(() => new KVCache(model, c)),
        prompts.map(() => new KVCache(model, reference)),
      ];
      const near = (got: Float32Array[], want: Float32Array[]) =>
        got.forEach((g, b) => expect(Math.max(...g.map((v, i) => Math.abs(v - want[b]![i]!)))).toBeLessThan(1e-4));
      near(KVCache.readMany(ours, prompts), KVCache.readMany(theirs, prompts));
      for (let step = 0; step < 3; step++) {
        const next = ids(3);
        near(KVCache.readEach(ours, next), KVCache.readEach(theirs, next));
        near([ours[0]!.read([next[0]!])], [theirs[0]!.read([next[0]!])]);
      }
      reference.dispose();
      model.dispose();
    },
  );
});

// On the reference's loops, and on the C kernels where they are here (their attention reads the same layout).
describe.each([
  { on: 'the reference', c: false, native: null, absent: false },
  { on: 'the C kernels', c: true, native, absent: !native && !process.env.CI },
])('a cache that grows, on $on', ({ c, native, absent }) => {
  it.skipIf(absent)(
    'keeps every layer’s keys and values where it reads them as its room doubles, read in pieces or forked',
    () => {
      if (c && !native) throw new Error(`the C kernels are not here: ${why}`);
      const config = llamaConfigFromJson(
        JSON.parse(readFileSync(join(FIXTURES, 'llama-tiny', 'config.json'), 'utf8')),
        'config.json',
      );
      const model = Llama.create({ ...config, maxPositions: 300 }, 'growing');
      const weights = new DecodeWeights(model, native);
      const random = seeded('growing');
      const ids = Array.from({ length: 260 }, () => Math.floor(random() * config.vocabSize));
      // Room for 64 positions, then 128, then 256, then 260: a token at a time, a few, and a batched read.
      const pieces = new KVCache(model, weights);
      for (const [from, to] of [
        [0, 60],
        [60, 70],
        [70, 200],
        [200, 259],
      ] as const)
        if (to - from < 8) for (let t = from; t < to; t++) pieces.read([ids[t]!]);
        else pieces.read(ids.slice(from, to));
      const fork = KVCache.forkOf(pieces, 230);
      const last = pieces.read([ids[259]!]);
      const whole = new KVCache(model, weights).read(ids);
      const forked = fork.read(ids.slice(230));
      for (const got of [last, forked])
        expect(Math.max(...got.map((v, i) => Math.abs(v - whole[i]!)))).toBeLessThan(1e-4);
      model.dispose();
    },
  );
});

describe('Hugging Face folders', () => {
  it('reads rope_theta at the top level (most published checkpoints) as well as rope_parameters (transformers 5)', () => {
    const base = JSON.parse(readFileSync(join(FIXTURES, 'qwen2-tiny', 'config.json'), 'utf8'));
    const { rope_parameters: _r, ...old } = base;
    expect(llamaConfigFromJson({ ...old, rope_theta: 500000 }, 'config.json').ropeTheta).toBe(500000);
    expect(llamaConfigFromJson(base, 'config.json').ropeTheta).toBe(1000000);
    expect(() => llamaConfigFromJson({ ...base, model_type: 'gpt2' }, 'x/config.json')).toThrow(
      /x\/config.json: model_type "gpt2" is not one prefab runs/,
    );
  });

  it('reads bfloat16, float16 and sharded weights as float32', () => {
    const src = join(FIXTURES, 'llama-tiny');
    const ref = reference('llama-tiny');
    const f32 = readHfModel(src);
    for (const dtype of ['BF16', 'F16'] as const) {
      const dir = join(tempDir(), dtype);
      mkdirSync(dir);
      copyFileSync(join(src, 'config.json'), join(dir, 'config.json'));
      writeHalf(join(dir, 'model.safetensors'), f32.weights, dtype);
      const hf = readHfModel(dir);
      expect(hf.dtype).toBe(dtype);
      // Every weight is the stored value exactly: bfloat16 is the top half of a float32's bits.
      for (const [name, w] of f32.weights) {
        const expected =
          dtype === 'BF16'
            ? new Float32Array(new Uint32Array(Float32Array.from(w).buffer).map((b) => b & 0xffff0000).buffer)
            : w.map((x) => halfToFloat(floatToHalf(x)));
        expect(hf.weights.get(name), name).toEqual(expected);
      }
      const model = new Llama(hf.config, hf.weights);
      const { logits } = score(model, ref.input_ids);
      // Rounding every weight to 8 (bf16) or 11 (f16) significant bits moves the logits a little, not much.
      expect(maxAbsDiff(logits, ref.logits)).toBeLessThan(dtype === 'BF16' ? 0.5 : 0.05);
      model.dispose();
    }
    // Two shards and an index, as save_pretrained writes them for large models.
    const sharded = join(tempDir(), 'sharded');
    mkdirSync(sharded);
    copyFileSync(join(src, 'config.json'), join(sharded, 'config.json'));
    const names = [...f32.weights.keys()];
    const halves = [names.slice(0, 7), names.slice(7)];
    const weightMap: Record<string, string> = {};
    halves.forEach((part, i) => {
      const file = `model-0000${i + 1}-of-00002.safetensors`;
      writeHalf(join(sharded, file), new Map(part.map((n) => [n, f32.weights.get(n)!])), 'F32');
      for (const n of part) weightMap[n] = file;
    });
    writeFileSync(
      join(sharded, 'model.safetensors.index.json'),
      JSON.stringify({ metadata: {}, weight_map: weightMap }),
    );
    const model = load(sharded);
    expect(maxAbsDiff(score(model, ref.input_ids).logits, ref.logits)).toBeLessThanOrEqual(1e-4);
    model.dispose();
  });
});

describe('prefab model', () => {
  const dir = join(FIXTURES, 'llama-tiny');
  const ref = reference('llama-tiny');

  it('score prints each token’s log-prob given the tokens before it, and the sums', () => {
    const ids = ref.input_ids.map((row, i) => row.slice(0, 10 + i * 5));
    const r = prefab(['model', 'score', dir, '--ids', JSON.stringify(ids)]);
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as { token_logprobs: number[][]; sums: number[] };
    expect(out.token_logprobs.map((row) => row.length)).toEqual([9, 14]);
    out.token_logprobs.forEach((row, b) => row.forEach((v, t) => expect(v).toBeCloseTo(ref.token_logprobs[b]![t]!, 4)));
    out.sums.forEach((s, b) =>
      expect(s).toBeCloseTo(
        out.token_logprobs[b]!.reduce((a, v) => a + v, 0),
        6,
      ),
    );
  });

  it('generate continues greedily unless given a temperature; inspect prints the architecture', () => {
    const r = prefab([
      'model',
      'generate',
      dir,
      '--ids',
      JSON.stringify(ref.greedy_prompt),
      '--max-new-tokens',
      String(ref.greedy_continuation.length),
    ]);
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({ continuation: ref.greedy_continuation });
    const sampled = (seed: string) =>
      JSON.parse(
        prefab([
          'model',
          'generate',
          dir,
          '--ids',
          '[1,5,9]',
          '--max-new-tokens',
          '8',
          '--temperature',
          '1',
          '--seed',
          seed,
        ]).stdout,
      ).continuation;
    expect(sampled('a')).toEqual(sampled('a'));
    expect(sampled('a')).toHaveLength(8);
    const inspect = prefab(['model', 'inspect', join(FIXTURES, 'qwen2-tiny')]);
    expect(inspect.code, inspect.stderr).toBe(0);
    expect(JSON.parse(inspect.stdout)).toMatchObject({
      architecture: 'Qwen2ForCausalLM',
      parameters: expect.any(Number),
      dtype: 'F32',
      layers: 2,
      heads: 4,
      kv_heads: 2,
      tied_embeddings: true,
      attention_bias: true,
    });
    const bad = prefab(['model', 'score', join(FIXTURES, 'nothing-here'), '--ids', '[[1,2]]']);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/nothing-here is not a model folder: it has no config\.json/);
  });
});

/** A safetensors file of `weights` stored as `dtype` (BF16 by truncation, F16 by rounding), for the readers' tests. */
function writeHalf(path: string, weights: Map<string, Float32Array>, dtype: 'BF16' | 'F16' | 'F32'): void {
  const width = dtype === 'F32' ? 4 : 2;
  const header: Record<string, unknown> = { __metadata__: { format: 'pt' } };
  const parts: Buffer[] = [];
  let offset = 0;
  const shapes = new Map(readHfModelShapes());
  for (const [name, data] of weights) {
    const bytes = Buffer.alloc(data.length * width);
    if (dtype === 'F32') Buffer.from(data.buffer, data.byteOffset, data.byteLength).copy(bytes);
    else {
      const bits = new Uint32Array(Float32Array.from(data).buffer);
      for (let i = 0; i < data.length; i++)
        bytes.writeUInt16LE(dtype === 'BF16' ? bits[i]! >>> 16 : floatToHalf(data[i]!), 2 * i);
    }
    header[name] = { dtype, shape: shapes.get(name), data_offsets: [offset, offset + bytes.length] };
    offset += bytes.length;
    parts.push(bytes);
  }
  const json = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  writeFileSync(path, Buffer.concat([len, json, ...parts]));
}

/** The shapes of the llama-tiny fixture's weights, by name. */
function readHfModelShapes(): [string, number[]][] {
  return llamaParameterShapes(
    llamaConfigFromJson(JSON.parse(readFileSync(join(FIXTURES, 'llama-tiny', 'config.json'), 'utf8')), 'config.json'),
  );
}

/** float32 → IEEE half, rounded to nearest (normal range; the fixtures' weights are small). */
function floatToHalf(x: number): number {
  const f = new Float32Array([x]);
  const bits = new Uint32Array(f.buffer)[0]!;
  const sign = (bits >>> 16) & 0x8000;
  const exponent = ((bits >>> 23) & 0xff) - 127 + 15;
  const mantissa = bits & 0x7fffff;
  if (exponent <= 0) return sign; // too small: zero
  if (exponent >= 0x1f) return sign | 0x7c00;
  const rounded = (exponent << 10) + (mantissa >>> 13) + ((mantissa >>> 12) & 1);
  return sign | rounded;
}

/** IEEE half → float32 (normal and subnormal values). */
function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  return exponent === 0 ? sign * fraction * 2 ** -24 : sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
}
