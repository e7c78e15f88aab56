// The CPU path's C kernels (runtime/cpu/) one by one against the reference model's own operations in tfjs on
// the WASM backend (model/llama.ts, model/ops.ts, model/parameters.ts): outputs, and tfjs's gradients through
// them, within 1e-5 relative; the GEMM against a plain loop in doubles, every transpose, added to or not. The
// whole model against tfjs is test/runtime/held-llama.test.ts; here, what its threads change.
import * as tf from '@tensorflow/tfjs-core';
import { availableParallelism } from 'node:os';
import { beforeEach, describe, expect, it } from 'vitest';
import { seeded } from '../../../core/random.ts';
import { openDevice } from '../../../runtime/device.ts';
import { initialWeights, rmsNorm, ropeTable, rotate, silu } from '../../../model/llama.ts';
import { ADAMW_DEFAULTS } from '../../../trainers/optimizer.ts';
import { CpuAdamW } from '../../../runtime/cpu/adamw.ts';
import { CpuLlama } from '../../../runtime/cpu/llama.ts';
import { loadCpuKernels, type CpuKernels } from '../../../runtime/cpu/kernels.ts';
import { targetLogprobs } from '../../../model/parameters.ts';
import { drawArray, sampleToken } from '../../../runtime/sampling.ts';
import { sftStep } from '../../../trainers/step.ts';
import { ATTENTION_CASES, attentionInputs, modelAttention } from '../../fixtures/attention.ts';
import { tinyLlama } from '../../fixtures/llama.ts';
import { relativeError } from '../../fixtures/webgpu.ts';
import type { LlamaConfig } from '../../../model/config.ts';

await openDevice({ backend: 'wasm' });
// The C kernels where npm ci built them (in CI they must be: each test fails without them).
const { kernels: loaded, why } = loadCpuKernels();
const absent = !loaded && !process.env.CI;
const random = seeded('cpu-kernels');
const values = (n: number, scale = 1) => Float32Array.from({ length: n }, () => (random() * 2 - 1) * scale);
const data = async (t: tf.Tensor) => (await t.data()) as Float32Array;

describe('the CPU path’s C kernels', () => {
  let k: CpuKernels;
  beforeEach(() => {
    if (!loaded) throw new Error(`the C kernels are not here: ${why}`);
    k = loaded;
  });
  it.skipIf(absent)(
    'multiplies as a plain loop does, every operand transposed or not, written or added to',
    async () => {
      for (const [m, n, kk] of [
        [5, 7, 3],
        [64, 33, 130],
      ] as const)
        for (const transposeA of [false, true])
          for (const transposeB of [false, true])
            for (const accumulate of [false, true]) {
              const [a, b, c] = [values(m * kk), values(kk * n), values(m * n)];
              const want = Float64Array.from({ length: m * n }, (_, i) => (accumulate ? c[i]! : 0));
              for (let i = 0; i < m; i++)
                for (let j = 0; j < n; j++)
                  for (let p = 0; p < kk; p++)
                    want[i * n + j]! +=
                      (transposeA ? a[p * m + i]! : a[i * kk + p]!) * (transposeB ? b[j * kk + p]! : b[p * n + j]!);
              const [tA, tB] = [transposeA ? 1 : 0, transposeB ? 1 : 0];
              k.sgemm(tA, tB, m, n, kk, 1, a, tA ? m : kk, b, tB ? kk : n, accumulate ? 1 : 0, c, n);
              expect(relativeError(c, want), `${m}×${n}×${kk} ${transposeA} ${transposeB} ${accumulate}`).toBeLessThan(
                1e-5,
              );
            }
    },
  );

  it.skipIf(absent)(
    'takes a step’s rows through a weight matrix in panels as a plain loop does, set or added, on one thread or shared',
    () => {
      // Weight rows not a multiple of 16 (a panel) and rows not of 6 (a block), one row to a prompt's 64, and a
      // matrix large enough to be shared between threads.
      for (const [m, n, kk] of [
        [1, 7, 3],
        [3, 33, 130],
        [8, 1030, 67],
        [2, 4099, 96],
        [13, 17, 16],
        [5, 40, 24],
        [11, 33, 9],
        [64, 300, 1100],
      ] as const) {
        const [x, w] = [values(m * kk), values(n * kk)];
        const before = values(m * n);
        const want = Float64Array.from({ length: m * n }, (_, at) => {
          const [i, j] = [Math.floor(at / n), at % n];
          let sum = 0;
          for (let p = 0; p < kk; p++) sum += x[i * kk + p]! * w[j * kk + p]!;
          return sum;
        });
        // One running f32 sum an output over kk products: 1,100 of them round to about 1e-5 of the sum.
        const bound = kk > 256 ? 1e-4 : 1e-5;
        const panels = new Float32Array(Math.ceil(n / 16) * 16 * kk).fill(Number.NaN);
        k.packPanels(w, n, kk, panels);
        const y = new Float32Array(m * n).fill(Number.NaN);
        k.panelTimes(x, m, panels, n, kk, y, false);
        expect(relativeError(y, want), `${m}×${n}×${kk}`).toBeLessThan(bound);
        const added = before.slice();
        k.panelTimes(x, m, panels, n, kk, added, true);
        const wantAdded = want.map((v, i) => v + before[i]!);
        expect(relativeError(added, wantAdded), `${m}×${n}×${kk}, added`).toBeLessThan(bound);
      }
    },
  );

  it.skipIf(absent)('gives SwiGLU of each row’s gate and up (R, 2F) as the plain definition does', () => {
    const [R, F] = [7, 13]; // F ending past a multiple of eight
    const gateUp = values(R * 2 * F, 6);
    const out = new Float32Array(R * F).fill(Number.NaN);
    k.swigluRows(gateUp, R, F, out);
    // An array of another type is refused, not read or written past its end as floats.
    expect(() => k.swigluRows(gateUp, R, F, new Uint8Array(R * F) as unknown as Float32Array)).toThrow(
      /expected a Float32Array/,
    );
    const want = Float64Array.from({ length: R * F }, (_, at) => {
      const [r, i] = [Math.floor(at / F), at % F];
      const [g, u] = [gateUp[r * 2 * F + i]!, gateUp[r * 2 * F + F + i]!];
      return (g / (1 + Math.exp(-g))) * u;
    });
    expect(relativeError(out, want)).toBeLessThan(1e-5);
  });

  it.skipIf(absent)(
    'draws each row’s token as sampleToken does, at every temperature and top-p, with ties and impossible tokens, on one thread or shared',
    () => {
      const gen = seeded('draw-rows');
      // [rows, vocabulary, spread]: few small rows (one thread), and a step's rows at a real vocabulary (shared).
      // Spread 0: one likely token, the rest e⁻¹² each, below the cutoff under which the nucleus is first looked
      // for and together most of the mass: top-p below 1 sorts the whole row.
      for (const [R, V, spread] of [
        [12, 200, 40], // a few tokens a value: ties among a bucket's last sixteen
        [12, 700, 8],
        [12, 3_000, 24],
        [6, 4_000, 2],
        [6, 50_000, 0],
        [32, 49_152, 6],
      ] as const) {
        const rounded = V < 4_000; // ties across and within the buckets
        const logits = Array.from({ length: R }, (_, r) =>
          Float32Array.from({ length: V }, (_, i) => {
            if (spread === 0) return i === r ? 0 : -12;
            if (r % 3 === 1 && i % 10 === 3) return -Infinity;
            const x = gen() * spread - spread / 2;
            return rounded ? Math.round(x) : x;
          }),
        );
        const settings = [
          [1, 1],
          [0.7, 1],
          [0, 1],
          [1, 0.95],
          [1.3, 0.8],
          [0.5, 0.5],
        ] as const;
        const draws = logits.map((_, r) => {
          const [temperature, topP] = settings[r % settings.length]!;
          // The ends of the range too, at top-p 1 and below: u 0 and u just under 1.
          const u = r === 0 || r === 3 ? 0 : r === 1 || r === 4 ? 1 - 2 ** -53 : gen();
          return { temperature, topP, u };
        });
        const tokens = new Int32Array(R).fill(-1);
        k.drawRows(logits, drawArray(draws), tokens);
        const want = logits.map((l, r) => sampleToken(l, draws[r]!.temperature, draws[r]!.topP, () => draws[r]!.u));
        expect([...tokens], `${R} rows of ${V}`).toEqual(want);
      }
      const bad = (logits: Float32Array[], why: RegExp) =>
        expect(() => k.drawRows(logits, new Float64Array(3 * logits.length), new Int32Array(logits.length))).toThrow(
          why,
        );
      bad([new Float32Array(4), new Float32Array(5)], /differ in length/);
      bad([new Float64Array(4) as unknown as Float32Array], /not a Float32Array/);
      // A row with no distribution (NaN, or every token impossible) throws, as sampleToken does; at temperature
      // 0 it is its argmax, as there.
      for (const l of [Float32Array.from([0, Number.NaN, 1]), new Float32Array(3).fill(-Infinity)]) {
        expect(() => k.drawRows([l], new Float64Array([1, 1, 0.5]), new Int32Array(1))).toThrow(/no distribution/);
        expect(() => sampleToken(l, 1, 1, () => 0.5)).toThrow(/no token/);
        const greedy = new Int32Array(1).fill(-1);
        k.drawRows([l], new Float64Array([0, 1, 0.5]), greedy);
        expect(greedy[0]).toBe(sampleToken(l, 0, 1, () => 0.5));
      }
      const row = [new Float32Array(4)];
      expect(() => k.drawRows(row, new Float64Array(2), new Int32Array(1))).toThrow(/3 numbers a row/);
      // The other typed arrays, which would be read or written past their end.
      expect(() => k.drawRows(row, new Float32Array(3) as unknown as Float64Array, new Int32Array(1))).toThrow(
        /expected a Float64Array/,
      );
      expect(() => k.drawRows(row, new Float64Array(3), new Uint8Array(1) as unknown as Int32Array)).toThrow(
        /expected an Int32Array/,
      );
      k.drawRows([], new Float64Array(0), new Int32Array(0)); // no rows: nothing to draw
    },
  );

  it.skipIf(absent)(
    'places each decoding row’s key and value in its cache (biases, RoPE) and attends as the plain definition does',
    () => {
      // Two caches, heads of 12 (eight lanes, then four), two query heads a key/value head; cache A reads two
      // rows in the pass (positions 4 and 5: the second sees the first), cache B one at position 10 (eight keys
      // at a time, then three).
      const [H, K, hd, cap] = [4, 2, 12, 16];
      const [hp, width, hs] = [hd, (H + 2 * K) * hd, cap * hd];
      const { cos, sin } = ropeTable(cap, hd, 10_000);
      const mems = [values(2 * K * hs), values(2 * K * hs)];
      const before = mems.map((m) => m.slice());
      const rows = [
        { cache: 0, at: 4 },
        { cache: 0, at: 5 },
        { cache: 1, at: 10 },
      ];
      const qkv = values(rows.length * width, 2);
      const bias = values(width, 0.5);
      const meta = Float64Array.from(rows.flatMap(({ at }) => [0, K * hs, at + 1, hs]));
      const out = new Float32Array(rows.length * H * hd).fill(Number.NaN);
      const projected = qkv.slice();
      k.decodeAttentionRows(
        rows.map(({ cache }) => mems[cache]!),
        qkv,
        meta,
        cos,
        sin,
        bias,
        H,
        K,
        hd,
        hp,
        out,
      );
      // The plain definition: the biases, RoPE at each row's position, the key and value into the cache, then
      // softmax(q·k / √hd) over the positions up to the row's, the values weighted by it.
      const caches = before.map((m) => Array.from(m));
      const queries = rows.map(({ cache, at }, r) => {
        const row = Array.from(projected.subarray(r * width, (r + 1) * width), (v, i) => v + bias[i]!);
        for (let h = 0; h < H + 2 * K; h++)
          if (h < H + K)
            for (let f = 0; f < hd / 2; f++) {
              const [a, b, c, s] = [row[h * hd + f]!, row[h * hd + hd / 2 + f]!, cos[at * hd + f]!, sin[at * hd + f]!];
              [row[h * hd + f], row[h * hd + hd / 2 + f]] = [a * c - b * s, b * c + a * s];
            }
        for (let j = 0; j < K; j++)
          for (let i = 0; i < hd; i++) {
            caches[cache]![j * hs + at * hp + i] = row[(H + j) * hd + i]!;
            caches[cache]![K * hs + j * hs + at * hp + i] = row[(H + K + j) * hd + i]!;
          }
        return row;
      });
      const want = rows.flatMap(({ cache, at }, r) =>
        Array.from({ length: H }, (_, h) => {
          const kv = Math.floor(h / (H / K));
          const scores = Array.from({ length: at + 1 }, (_, t) => {
            let dot = 0;
            for (let i = 0; i < hd; i++) dot += queries[r]![h * hd + i]! * caches[cache]![kv * hs + t * hp + i]!;
            return dot / Math.sqrt(hd);
          });
          const top = Math.max(...scores);
          const weights = scores.map((x) => Math.exp(x - top));
          const total = weights.reduce((a, b) => a + b, 0);
          return Array.from({ length: hd }, (_, i) =>
            weights.reduce((sum, p, t) => sum + (p / total) * caches[cache]![K * hs + kv * hs + t * hp + i]!, 0),
          );
        }).flat(),
      );
      expect(relativeError(out, want)).toBeLessThan(1e-5);
      mems.forEach((m, c) => expect(relativeError(m, caches[c]!), `cache ${c}`).toBeLessThan(1e-6));
    },
  );

  it.skipIf(absent)(
    'gives the model’s causal attention and its gradients, a key/value head a query head or shared',
    async () => {
      for (const shape of ATTENTION_CASES) {
        const { batch, length, heads, kvHeads, headDim } = shape;
        const { q, k, v, dout } = attentionInputs(shape, random);
        const want = await modelAttention(q, k, v, dout, shape);
        const [p, out] = [new Float32Array(batch * heads * length * length), new Float32Array(q.length)];
        const [dq, dk, dv] = [new Float32Array(q.length), new Float32Array(k.length), new Float32Array(v.length)];
        const dims = [batch, length, heads, kvHeads, headDim] as const;
        loaded!.attentionForward(q, k, v, p, out, ...dims);
        loaded!.attentionBackward(q, k, v, p, dout, dq, dk, dv, ...dims);
        const at = `B${batch} T${length} H${heads} K${kvHeads}`;
        expect(relativeError(out, want.out), at).toBeLessThan(1e-5);
        expect(relativeError(dq, want.dq), `dq ${at}`).toBeLessThan(1e-5);
        expect(relativeError(dk, want.dk), `dk ${at}`).toBeLessThan(1e-5);
        expect(relativeError(dv, want.dv), `dv ${at}`).toBeLessThan(1e-5);
      }
    },
  );

  it.skipIf(absent)(
    'normalises rows as RMSNorm does, after adding the residual, and takes its gradients back, added to the stream’s',
    async () => {
      // 13 rows on one thread; 1,500 (36,000 values) in shares of rows and, for dw, of columns.
      for (const rows of [13, 1500]) {
        const [dim, eps] = [24, 1e-5];
        const [x, r, w, dy, dxIn] = [
          values(rows * dim, 3),
          values(rows * dim),
          values(dim),
          values(rows * dim),
          values(rows * dim),
        ];
        const f = (a: tf.Tensor, b: tf.Tensor, g: tf.Tensor) => rmsNorm(tf.add(a, b) as tf.Tensor2D, g, eps);
        const [xt, rt, wt] = [tf.tensor2d(x, [rows, dim]), tf.tensor2d(r, [rows, dim]), tf.tensor1d(w)];
        const want = await data(f(xt, rt, wt));
        const [dxWant, , dwWant] = tf.grads((a: tf.Tensor, b: tf.Tensor, g: tf.Tensor) =>
          tf.sum(tf.mul(f(a, b, g), tf.tensor2d(dy, [rows, dim]))),
        )([xt, rt, wt]);
        const [s, y, rstd] = [new Float32Array(rows * dim), new Float32Array(rows * dim), new Float32Array(rows)];
        k.rmsnormForward(x, r, s, w, y, rstd, rows, dim, eps);
        expect(relativeError(y, want)).toBeLessThan(1e-5);
        expect(relativeError(s, await data(tf.add(xt, rt)))).toBeLessThan(1e-6);
        const [dx, dw] = [new Float32Array(rows * dim), new Float32Array(dim).fill(0.5)];
        k.rmsnormBackward(s, w, rstd, dy, dxIn, dx, dw, rows, dim);
        const dxWanted = (await data(dxWant!)).map((g, i) => g + dxIn[i]!);
        expect(relativeError(dx, dxWanted)).toBeLessThan(1e-5);
        expect(
          relativeError(
            dw,
            (await data(dwWant!)).map((g) => g + 0.5),
          ),
        ).toBeLessThan(1e-5);
      }
    },
  );

  it.skipIf(absent)('rotates each head by its position as the model does, and takes the rotation back', async () => {
    for (const [batch, length, heads, headDim, theta] of [
      [2, 5, 3, 8, 10_000],
      [1, 40, 2, 64, 500_000],
    ] as const) {
      const n = batch * length;
      const table = ropeTable(length + 3, headDim, theta); // longer than the pass: its first rows are read
      const [x, dy] = [values(n * heads * headDim), values(n * heads * headDim)];
      const rows = (t: Float32Array) =>
        tf.tensor3d(
          Float32Array.from(
            { length: n * headDim },
            (_, i) => t[(Math.floor(i / headDim) % length) * headDim + (i % headDim)]!,
          ),
          [n, 1, headDim],
        );
      const f = (a: tf.Tensor) => rotate(a as tf.Tensor3D, rows(table.cos), rows(table.sin));
      const xt = tf.tensor3d(x, [n, heads, headDim]);
      const [dxWant] = tf.grads((a: tf.Tensor) => tf.sum(tf.mul(f(a), tf.tensor3d(dy, [n, heads, headDim]))))([xt]);
      const [out, dx] = [new Float32Array(x.length), new Float32Array(x.length)];
      k.rope(x, table.cos, table.sin, out, n, length, heads, headDim, 1);
      k.rope(dy, table.cos, table.sin, dx, n, length, heads, headDim, -1);
      expect(relativeError(out, await data(f(xt)))).toBeLessThan(1e-5);
      expect(relativeError(dx, await data(dxWant!))).toBeLessThan(1e-5);
    }
  });

  it.skipIf(absent)('gives SwiGLU’s silu(g)·u and its gradients', async () => {
    // 1,000 values on one thread, 70,000 in shares.
    for (const n of [1000, 70_000]) {
      const [g, u, dm] = [values(n, 6), values(n), values(n)];
      const [gt, ut] = [tf.tensor2d(g, [n / 100, 100]), tf.tensor2d(u, [n / 100, 100])];
      const f = (a: tf.Tensor, b: tf.Tensor) => tf.mul(silu(a as tf.Tensor2D), b);
      const [dgWant, duWant] = tf.grads((a: tf.Tensor, b: tf.Tensor) =>
        tf.sum(tf.mul(f(a, b), tf.tensor2d(dm, [n / 100, 100]))),
      )([gt, ut]);
      const [m, dg, du] = [new Float32Array(n), new Float32Array(n), new Float32Array(n)];
      k.swigluForward(g, u, m, n);
      k.swigluBackward(g, u, dm, dg, du, n);
      expect(relativeError(m, await data(f(gt, ut)))).toBeLessThan(1e-5);
      expect(relativeError(dg, await data(dgWant!))).toBeLessThan(1e-5);
      expect(relativeError(du, await data(duWant!))).toBeLessThan(1e-5);
    }
  });

  it.skipIf(absent)(
    'gives every position’s log p(target) and entropy from the hidden state through the head, and its gradients',
    async () => {
      const [batch, length, dim, vocab] = [3, 5, 8, 37];
      const rows = batch * length;
      const [h, w, dlogp] = [values(rows * dim, 2), values(vocab * dim), values(rows)];
      const targets = Int32Array.from({ length: rows }, () => Math.floor(random() * vocab));
      const [ht, wt] = [tf.tensor2d(h, [rows, dim]), tf.tensor2d(w, [vocab, dim])];
      const f = (a: tf.Tensor, b: tf.Tensor) =>
        targetLogprobs(tf.matMul(a as tf.Tensor2D, b as tf.Tensor2D, false, true), targets, batch, length);
      const [dhWant, dwWant] = tf.grads((a: tf.Tensor, b: tf.Tensor) =>
        tf.sum(tf.mul(f(a, b), tf.tensor2d(dlogp, [batch, length]))),
      )([ht, wt]);
      const logSoftmax = tf.logSoftmax(tf.matMul(ht, wt, false, true));
      const entropyWant = await data(tf.neg(tf.sum(tf.mul(tf.exp(logSoftmax), logSoftmax), -1)));
      const [z, logp, lse, entropy] = [
        new Float32Array(rows * vocab),
        new Float32Array(rows),
        new Float32Array(rows),
        new Float32Array(rows),
      ];
      const [dh, dw] = [new Float32Array(rows * dim), new Float32Array(vocab * dim).fill(0.25)];
      k.sgemm(0, 1, rows, vocab, dim, 1, h, dim, w, dim, 0, z, vocab); // the logits
      k.logprobsForward(z, targets, logp, lse, entropy, rows, vocab);
      expect(relativeError(logp, await data(f(ht, wt)))).toBeLessThan(1e-5);
      expect(relativeError(entropy, entropyWant)).toBeLessThan(1e-5);
      // The logits' gradient in their place, then dh = dz·W and dW += dzᵀ·h.
      k.logprobsBackward(z, targets, lse, dlogp, rows, vocab);
      k.sgemm(0, 0, rows, dim, vocab, 1, z, vocab, w, dim, 0, dh, dim);
      k.sgemm(1, 0, vocab, dim, rows, 1, z, vocab, h, dim, 1, dw, dim);
      expect(relativeError(dh, await data(dhWant!))).toBeLessThan(1e-5);
      expect(
        relativeError(
          dw,
          (await data(dwWant!)).map((g) => g + 0.25),
        ),
      ).toBeLessThan(1e-5);
    },
  );

  it.skipIf(absent)(
    'takes the head a chunk of rows at a time to the log-probs and gradients of the whole head',
    async () => {
      const config = tinyLlama({ vocabSize: 37 });
      const weights = initialWeights(config, 'cpu-head-chunks');
      const [batch, length] = [3, 5];
      const ids = Int32Array.from({ length: batch * length }, () => Math.floor(random() * config.vocabSize));
      const block = { ids, targets: ids, batch, length };
      const dlogp = values(batch * length);
      // Whole, and in chunks of 4 rows (the last of 3).
      const [whole, chunked] = [
        new CpuLlama(config, weights, k),
        new CpuLlama(config, weights, k, { headChunk: 4 * 37 }),
      ];
      const [a, b] = [await whole.forward(block), await chunked.forward(block)];
      expect(relativeError(b, a)).toBeLessThan(1e-6);
      await whole.backward(0, dlogp);
      await chunked.backward(0, dlogp);
      for (const name of whole.grads.keys())
        expect(relativeError(await chunked.gradient(name), await whole.gradient(name)), name).toBeLessThan(1e-5);
    },
  );
});

describe('the CPU path’s threads', () => {
  const steps = async (k: CpuKernels, config: LlamaConfig, batch: number, length: number, n: number) => {
    const held = new CpuLlama(config, initialWeights(config, 'cpu-threads'), k);
    const adamw = new CpuAdamW(ADAMW_DEFAULTS, k);
    const draw = seeded('cpu-threads', 'tokens');
    const tokens = () => Int32Array.from({ length: batch * length }, () => Math.floor(draw() * config.vocabSize));
    const mask = new Float32Array(batch * length).fill(1);
    for (let step = 0; step < n; step++) {
      if (step > 0) adamw.apply(held.parameters(), 1e-3);
      held.zeroGradients();
      await sftStep(held, { ids: tokens(), targets: tokens(), mask, batch, length });
      held.clipGradients(1);
    }
    return held;
  };

  // OpenBLAS splits a large product between its threads in ways that sum some of its values in another order
  // (docs/trainer.md, "The CPU path"): the C kernels' gradients agree across thread counts to float rounding,
  // not to the bit. Their own loops (RMSNorm, attention, clipping's norm) sum in an order that does not depend
  // on the threads.
  it.skipIf(absent)(
    'give the C kernels’ gradients on one thread and on two to float rounding, at sizes OpenBLAS splits',
    async () => {
      if (!loaded) throw new Error(`the C kernels are not here: ${why}`);
      const config = tinyLlama({
        hiddenSize: 128,
        intermediateSize: 352,
        heads: 4,
        kvHeads: 2,
        headDim: 32,
        vocabSize: 300,
      });
      const grads = async (threads: number) => {
        loaded.setThreads(threads);
        return (await steps(loaded, config, 4, 300, 2)).grads;
      };
      const [one, two] = [await grads(1), await grads(2)];
      for (const [name, g] of one) expect(relativeError(two.get(name)!, g), name).toBeLessThan(1e-4);
      loaded.setThreads(availableParallelism()); // every core again for the tests after
    },
  );
});
