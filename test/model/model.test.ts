import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';
import { seeded } from '../../core/random.ts';
import { openDevice } from '../../runtime/device.ts';
import { loadCheckpoint, saveCheckpoint } from '../../model/checkpoint.ts';
import { sftLoss } from '../../trainers/losses/index.ts';
import { Decoding, DecodeWeights, KVCache } from '../../runtime/decode.ts';
import { Llama } from '../../model/llama.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { sampleToken } from '../../runtime/sampling.ts';
import { ADAMW_DEFAULTS, AdamW, learningRate } from '../../trainers/optimizer.ts';
import { optimizerStep } from '../../trainers/step.ts';
import type { LlamaConfig } from '../../model/config.ts';

const baseConfig = tinyLlama();
const config = baseConfig;
const B = 4;
const T = 16;
let ones: tf.Tensor2D;

/** Sequences that count up from a random start, mod 24: learnable, and different every batch. */
function batch(step: number): { ids: Int32Array; targets: Int32Array } {
  const rand = seeded('model test', step);
  const ids = new Int32Array(B * T);
  const targets = new Int32Array(B * T);
  for (let b = 0; b < B; b++) {
    const start = Math.floor(rand() * 24);
    for (let t = 0; t < T; t++) {
      ids[b * T + t] = (start + t) % 24;
      targets[b * T + t] = (start + t + 1) % 24;
    }
  }
  return { ids, targets };
}

function train(model: Llama, optimizer: AdamW, from: number, to: number): number[] {
  const losses: number[] = [];
  for (let s = from; s < to; s++) {
    const { ids, targets } = batch(s);
    const lr = learningRate(s, { peak: 1e-2, warmup: 5, total: 100, minRatio: 0.1 });
    losses.push(
      optimizerStep(model, optimizer, [() => ({ loss: sftLoss(model.tokenLogprobs(ids, targets, B, T), ones) })], lr, 1)
        .loss,
    );
  }
  return losses;
}

const weightsOf = (m: Llama) => [...m.params.values()].map((v) => Array.from(v.dataSync()));

beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
  ones = tf.ones([B, T]);
});

describe.each([
  ['tied embeddings', baseConfig],
  [
    'an output head of its own and biases on q, k, v (Qwen2)',
    { ...baseConfig, modelType: 'qwen2', tiedEmbeddings: false, attentionBias: true },
  ],
  // The decoder's attention kernels take four floats at a time: a head of 6 is padded to 8 in the KV cache.
  ['four query heads on two key/value heads of size 6', { ...baseConfig, heads: 4, kvHeads: 2, headDim: 6 }],
] as [string, LlamaConfig][])('a tiny Llama with %s, on the WASM backend', (_, config) => {
  it('learns a counting pattern: the loss falls from ln(24) to a small fraction of it', () => {
    const model = Llama.create(config, 'learn');
    const losses = train(model, new AdamW(model.params, { ...ADAMW_DEFAULTS, weightDecay: 0 }), 0, 100);
    expect(losses[0]).toBeGreaterThan(Math.log(24) - 0.3);
    expect(losses.at(-1)).toBeLessThan(0.3);
  });

  it('generates with a KV cache exactly what recomputing the whole sequence each step would pick', () => {
    const model = Llama.create(config, 'generate');
    const prompt = [3, 9, 1, 4];
    const cached = new KVCache(model).generate(prompt, { maxTokens: 8, temperature: 0 });
    const recomputed: number[] = [];
    const seq = [...prompt];
    for (let i = 0; i < 8; i++) {
      const logits = model.forward(Int32Array.from(seq), 1, seq.length).arraySync().at(-1)!;
      const next = logits.indexOf(Math.max(...logits));
      recomputed.push(next);
      seq.push(next);
    }
    expect(cached).toEqual(recomputed);
  });

  it('decodes token by token, on the CPU, the logits the training forward pass gives at every position; a long read goes through one batched pass to the same logits', () => {
    const model = Llama.create(config, 'decode');
    train(model, new AdamW(model.params, ADAMW_DEFAULTS), 0, 30); // weights far from their initial values
    const ids = [5, 6, 7, 8, 9, 10, 3, 3, 20, 21, 22, 23, 0, 1];
    const forward = model.forward(Int32Array.from(ids), 1, ids.length).arraySync();
    const cache = new KVCache(model);
    let spread = 0;
    for (const [t, id] of ids.entries()) {
      const got = cache.read([id]);
      forward[t]!.forEach((v, i) => expect(got[i]).toBeCloseTo(v, 3));
      spread = Math.max(spread, Math.max(...forward[t]!) - Math.min(...forward[t]!));
    }
    expect(spread).toBeGreaterThan(3); // logits that say something, not a flat start
    // Past the model's positions: an error, not a silent wrap.
    expect(() => cache.read([1, 2, 3])).toThrow(/17 tokens do not fit in the model's 16 positions/);
    // Eight tokens or more are read in one pass; then token by token again, from the keys and values it cached.
    const batched = new KVCache(model);
    const first = batched.read(ids.slice(0, 10));
    forward[9]!.forEach((v, i) => expect(first[i]).toBeCloseTo(v, 3));
    const next = batched.read([ids[10]!]);
    forward[10]!.forEach((v, i) => expect(next[i]).toBeCloseTo(v, 3));
    model.dispose();
  });

  it('keeps its KV cache across turns: extending a prompt reads only the new tokens and gives the logits a fresh cache gives', () => {
    const model = Llama.create(config, 'turns');
    const cache = new KVCache(model);
    const first = cache.generate([3, 9, 1, 4], { maxTokens: 3, temperature: 0 });
    expect(cache.tokens).toEqual([3, 9, 1, 4, ...first.slice(0, -1)]);
    // The next turn's prompt shares a prefix, then differs: the cache is cut back to the shared part.
    const next = [3, 9, 1, 4, 7, 7, 2];
    const reused = cache.generate(next, { maxTokens: 4, temperature: 0 });
    const fresh = new KVCache(model).generate(next, { maxTokens: 4, temperature: 0 });
    expect(reused).toEqual(fresh);
    const logits = (c: KVCache, ids: number[]) => Array.from(c.read(ids));
    const a = new KVCache(model);
    const whole = logits(a, [5, 6, 7, 8, 9]);
    const b = new KVCache(model);
    logits(b, [5, 6]);
    const pieces = logits(b, [7, 8, 9]);
    pieces.forEach((v, i) => expect(v).toBeCloseTo(whole[i]!, 4));
  });

  it('steps many caches of different lengths together (one matMul per projection) to the logits each gives alone, and decodes them together to what each generates alone', () => {
    const model = Llama.create(config, 'together');
    train(model, new AdamW(model.params, ADAMW_DEFAULTS), 0, 20);
    const weights = new DecodeWeights(model, null);
    const prompts = [[3, 9, 1], [5, 6, 7, 8, 9, 10, 11, 12, 2], [4]];
    const together = prompts.map(() => new KVCache(model, weights));
    const alone = prompts.map(() => new KVCache(model));
    together.forEach((c, i) => c.read(prompts[i]!));
    alone.forEach((c, i) => c.read(prompts[i]!));
    const next = [7, 1, 20];
    const stepped = KVCache.readEach(together, next);
    stepped.forEach((logits, i) => {
      const own = alone[i]!.read([next[i]!]);
      own.forEach((v, j) => expect(logits[j]).toBeCloseTo(v, 3));
    });
    expect(together.map((c) => c.tokens.length)).toEqual([4, 10, 2]);
    // Greedy decodings stepped together, the finished ones leaving the batch, end where each alone ends.
    const decodings = prompts.map(
      (p, i) => new Decoding(new KVCache(model, weights), p, { maxTokens: 2 + i * 2, temperature: 0 }),
    );
    for (;;) {
      const live = decodings.flatMap((d) => {
        const token = d.next();
        return token === null || d.finished ? [] : [{ d, token }];
      });
      if (live.length === 0) break;
      KVCache.readEach(
        live.map((l) => l.d.cache),
        live.map((l) => l.token),
      ).forEach((logits, i) => (live[i]!.d.logits = logits));
    }
    decodings.forEach((d, i) =>
      expect(d.out).toEqual(new KVCache(model).generate(prompts[i]!, { maxTokens: 2 + i * 2, temperature: 0 })),
    );
    expect(() => KVCache.readEach([new KVCache(model), new KVCache(model)], [1, 2])).toThrow(
      /do not share their weights/,
    );
    // A fork holds the first tokens of another cache: reading on from it gives what reading the whole gives.
    const fork = KVCache.forkOf(together[1]!, 6);
    expect(fork.tokens).toEqual(prompts[1]!.slice(0, 6));
    const onward = fork.read([9, 9]);
    const whole = new KVCache(model).read([...prompts[1]!.slice(0, 6), 9, 9]);
    whole.forEach((v, j) => expect(onward[j]).toBeCloseTo(v, 3));
    weights.dispose();
    model.dispose();
  });

  it('sums the gradients of micro-batches into the step the whole batch would take', () => {
    const whole = Llama.create(config, 'micro');
    const split = Llama.create(config, 'micro');
    const { ids, targets } = batch(0);
    const half = (B / 2) * T;
    const mask = (rows: number) => tf.ones([rows, T]) as tf.Tensor2D;
    const step = (m: Llama, parts: (() => { loss: tf.Scalar })[]) =>
      optimizerStep(m, new AdamW(m.params, ADAMW_DEFAULTS), parts, 1e-2, 1);
    const a = step(whole, [() => ({ loss: sftLoss(whole.tokenLogprobs(ids, targets, B, T), mask(B)) })]);
    const b = step(
      split,
      [0, 1].map((k) => () => ({
        loss: tf.mul(
          sftLoss(
            split.tokenLogprobs(ids.slice(k * half, (k + 1) * half), targets.slice(k * half, (k + 1) * half), B / 2, T),
            mask(B / 2),
          ),
          0.5,
        ) as tf.Scalar,
      })),
    );
    expect(b.loss).toBeCloseTo(a.loss, 5);
    expect(b.gradNorm).toBeCloseTo(a.gradNorm, 4);
    const w = (m: Llama) => Array.from(m.p('model.layers.0.mlp.gate_proj.weight').dataSync());
    w(split).forEach((v, i) => expect(v).toBeCloseTo(w(whole)[i]!, 5));
  });

  it('stops at a stop token and at the end of its context', () => {
    const model = Llama.create(config, 'stop');
    const free = new KVCache(model).generate([1, 2], { maxTokens: 100, temperature: 0 });
    expect(free.length).toBe(config.maxPositions - 2);
    const stopAt = free[3]!;
    const stopped = new KVCache(model).generate([1, 2], { maxTokens: 100, temperature: 0, stop: [stopAt] });
    expect(stopped.at(-1)).toBe(stopAt);
    expect(stopped.length).toBe(free.indexOf(stopAt) + 1);
  });
});

describe('sampling', () => {
  const logits = Float32Array.from([1, 3, 2, 0]);
  it('takes the argmax at temperature 0', () => {
    expect(sampleToken(logits, 0, 1, Math.random)).toBe(1);
  });
  it('draws only from the top-p nucleus', () => {
    const rand = seeded('nucleus');
    // softmax(1,3,2,0) ≈ (0.087, 0.644, 0.237, 0.032): top-p 0.8 keeps tokens 1 and 2 only.
    const seen = new Set(Array.from({ length: 400 }, () => sampleToken(logits, 1, 0.8, rand)));
    expect([...seen].sort()).toEqual([1, 2]);
  });
  it('draws what the plain definition draws (sorted objects, stable ties), token for token, so seeded runs keep their results', () => {
    // The definition the typed-array version replaced: every draw must be the same.
    const plain = (l: Float32Array, temperature: number, topP: number, rand: () => number) => {
      let best = 0;
      for (let i = 1; i < l.length; i++) if (l[i]! > l[best]!) best = i;
      const probs = Array.from(l, (v, i) => ({ i, p: Math.exp((v - l[best]!) / temperature) }));
      const total = probs.reduce((s, x) => s + x.p, 0);
      probs.sort((a, b) => b.p - a.p);
      const nucleus: typeof probs = [];
      let mass = 0;
      for (const x of probs) {
        nucleus.push(x);
        mass += x.p / total;
        if (mass >= topP) break;
      }
      let r = rand() * nucleus.reduce((s, x) => s + x.p, 0);
      for (const x of nucleus) if ((r -= x.p) <= 0) return x.i;
      return nucleus.at(-1)!.i;
    };
    const gen = seeded('logits');
    for (let trial = 0; trial < 300; trial++) {
      // Rounded logits: ties are common, and must break the same way. Spread over 24 every other trial: most
      // tokens fall below the cutoff under which the nucleus is first looked for, and the nucleus is found there.
      const spread = trial % 2 ? 24 : 8;
      // A tenth of them as long as a real vocabulary's tail, where top-p 1 draws without sorting.
      const length = trial % 10 ? 50 + (trial % 7) * 100 : 4_000;
      const l = Float32Array.from({ length }, () => Math.round(gen() * spread - spread / 2));
      const [t, p] = [
        [1, 1],
        [0.5, 0.95],
        [1.3, 0.8],
      ][trial % 3]!;
      expect(sampleToken(l, t!, p!, seeded('draw', trial))).toBe(plain(l, t!, p!, seeded('draw', trial)));
    }
  });
  it('at top-p 1 draws what the plain definition draws over unrounded logits, the mass found bucket by bucket', () => {
    // The plain definition at top-p 1: the probabilities walked from the largest (ties by id).
    const walk = (l: Float32Array, temperature: number, u: number) => {
      let best = 0;
      for (let i = 1; i < l.length; i++) if (l[i]! > l[best]!) best = i;
      const probs = Array.from(l, (v, i) => ({ i, p: Math.exp((v - l[best]!) / temperature) }));
      let r = u * probs.reduce((s, x) => s + x.p, 0);
      probs.sort((a, b) => b.p - a.p || a.i - b.i);
      for (const x of probs) if ((r -= x.p) <= 0) return x.i;
      return probs.at(-1)!.i;
    };
    const gen = seeded('unrounded');
    for (let trial = 0; trial < 200; trial++) {
      // Flat (a random model's) to steep (a trained one's): a few buckets of thousands, or many of a few.
      const spread = [2, 8, 40][trial % 3]!;
      const l = Float32Array.from({ length: 3_000 }, () => gen() * spread - spread / 2);
      const temperature = trial % 2 ? 1 : 0.7;
      const u = seeded('u', trial)();
      expect(sampleToken(l, temperature, 1, seeded('u', trial))).toBe(walk(l, temperature, u));
    }
  });
  it('at top-p 1 draws as the walk does with ties and impossible tokens, and never an impossible one at the top of the range', () => {
    const gen = seeded('ties');
    // Rounded logits (ties across and within the buckets) and a tenth of the tokens impossible (−∞).
    const l = Float32Array.from({ length: 2_000 }, (_, i) => (i % 10 === 3 ? -Infinity : Math.round(gen() * 12 - 6)));
    const top = Math.max(...l);
    const probs = Array.from(l, (v, i) => ({ i, p: Math.exp(v - top) })).sort((a, b) => b.p - a.p || a.i - b.i);
    const total = probs.reduce((s, x) => s + x.p, 0);
    for (const u of [0, 0.1, 0.37, 0.5, 0.81, 0.999]) {
      let r = u * total;
      const want = u === 0 ? probs[0]!.i : probs.find((x) => (r -= x.p) <= 0)!.i;
      expect(
        sampleToken(l, 1, 1, () => u),
        `u ${u}`,
      ).toBe(want);
    }
    // u just under 1: a token of the smallest possible probability, never one of probability 0.
    const drawn = sampleToken(l, 1, 1, () => 1 - 2 ** -53);
    const smallest = Math.min(...probs.filter((x) => x.p > 0).map((x) => x.p));
    expect(Math.exp(l[drawn]! - top)).toBe(smallest);
  });
  it('draws every token at top-p 1, more often the likelier ones', () => {
    const rand = seeded('full');
    const counts = [0, 0, 0, 0];
    for (let i = 0; i < 4000; i++) counts[sampleToken(logits, 1, 1, rand)]!++;
    expect(counts.every((c) => c > 0)).toBe(true);
    expect(counts[1]! / 4000).toBeCloseTo(0.644, 1);
  });
});

describe('checkpoints', () => {
  it('writes safetensors as the format specifies: u64 header length, JSON header with F32 offsets, aligned data', () => {
    const dir = join(mkdtempSync(join(tmpdir(), 'prefab-ckpt-')), 'model');
    const model = Llama.create(config, 'format');
    saveCheckpoint(dir, { model, tokenizer: { 'tokenizer.json': '{}' }, context: 16 });
    const buf = readFileSync(join(dir, 'model.safetensors'));
    const n = Number(buf.readBigUInt64LE(0));
    expect((8 + n) % 8).toBe(0);
    const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
    const wte = header['model.embed_tokens.weight'];
    expect(wte.dtype).toBe('F32');
    expect(wte.shape).toEqual([24, 16]);
    const [begin] = wte.data_offsets as number[];
    const first = buf.readFloatLE(8 + n + begin!);
    expect(first).toBe(model.p('model.embed_tokens.weight').dataSync()[0]);
    expect(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'))).toMatchObject({
      architectures: ['LlamaForCausalLM'],
      model_type: 'llama',
      vocab_size: 24,
      num_hidden_layers: 2,
      hidden_size: 16,
      num_attention_heads: 2,
      num_key_value_heads: 1,
      max_position_embeddings: 16,
      prefab_context: 16,
    });
    expect(readFileSync(join(dir, 'tokenizer.json'), 'utf8')).toBe('{}');
  });

  it('resumes from a checkpoint (weights, AdamW moments, step) to exactly the weights of an uninterrupted run', () => {
    const straight = Llama.create(config, 'resume');
    const straightOpt = new AdamW(straight.params, ADAMW_DEFAULTS);
    train(straight, straightOpt, 0, 12);

    const first = Llama.create(config, 'resume');
    const firstOpt = new AdamW(first.params, ADAMW_DEFAULTS);
    train(first, firstOpt, 0, 5);
    const dir = join(mkdtempSync(join(tmpdir(), 'prefab-ckpt-')), 'step-5');
    saveCheckpoint(dir, {
      model: first,
      tokenizer: { 'tokenizer.json': '{"t":1}' },
      context: 12,
      optimizer: firstOpt,
      state: { step: 5, totalSteps: 12, seed: 'resume' },
    });

    const loaded = loadCheckpoint(dir);
    const resumedOpt = new AdamW(loaded.model.params, ADAMW_DEFAULTS);
    expect(loaded.restoreOptimizer(resumedOpt)).toBe(true);
    expect(resumedOpt.step).toBe(5);
    expect(loaded.state).toEqual({ step: 5, totalSteps: 12, seed: 'resume' });
    expect(loaded.tokenizer).toEqual({ 'tokenizer.json': '{"t":1}' });
    expect(loaded.context).toBe(12);
    train(loaded.model, resumedOpt, 5, 12);
    expect(weightsOf(loaded.model)).toEqual(weightsOf(straight));
  });

  it('says what is wrong with a folder that is not a model', () => {
    expect(() => loadCheckpoint(mkdtempSync(join(tmpdir(), 'prefab-empty-')))).toThrow(/no config.json/);
  });
});
