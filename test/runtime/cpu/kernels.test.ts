// The CPU path's kernels (runtime/cpu/) one by one against the model's own operations in tfjs on the WASM
// backend (model/llama.ts, model/ops.ts, model/parameters.ts): outputs, and tfjs's gradients through them,
// within 1e-5 relative; the GEMM against a plain loop in doubles, every transpose, added to or not. The
// whole model against tfjs is test/runtime/held-llama.test.ts; here, that its threads change none of its bits.
import * as tf from '@tensorflow/tfjs-core';
import { beforeEach, describe, expect, it } from 'vitest';
import { seeded } from '../../../core/random.ts';
import { useBackend } from '../../../runtime/device.ts';
import { initialWeights, rmsNorm, ropeTable, rotate, silu } from '../../../model/llama.ts';
import { ADAMW_DEFAULTS } from '../../../trainers/optimizer.ts';
import { CpuAdamW } from '../../../runtime/cpu/adamw.ts';
import { Attention } from '../../../runtime/onnx/attention.ts';
import { Rope, SwiGlu } from '../../../runtime/onnx/elementwise.ts';
import { HeadLogprobs } from '../../../runtime/onnx/logprobs.ts';
import { OrtLlama } from '../../../runtime/cpu/llama.ts';
import { Matmul } from '../../../runtime/onnx/matmul.ts';
import { nativeKernels, nativeStatus } from '../../../runtime/cpu/kernels.ts';
import { OrtRuntime } from '../../../runtime/onnx/onnx.ts';
import { RmsNorm } from '../../../runtime/onnx/rmsnorm.ts';
import { targetLogprobs } from '../../../model/parameters.ts';
import { sftStep } from '../../../trainers/step.ts';
import { ATTENTION_CASES, attentionInputs, modelAttention } from '../../fixtures/attention.ts';
import { tinyLlama } from '../../fixtures/llama.ts';
import { relativeError } from '../../fixtures/webgpu.ts';
import type { LlamaConfig } from '../../../model/config.ts';

await useBackend('wasm');
// Every kernel twice: as ONNX Runtime graphs, and by the C kernels where they are built (in CI they must be).
const missing = !nativeKernels() && !process.env.CI;
const RUNTIMES = [
  { name: 'ONNX Runtime', native: false, absent: false, ort: await OrtRuntime.open(undefined, { native: false }) },
  { name: 'the C kernels', native: true, absent: missing, ort: await OrtRuntime.open() },
];
const random = seeded('ort-kernels');
const values = (n: number, scale = 1) => Float32Array.from({ length: n }, () => (random() * 2 - 1) * scale);
const data = async (t: tf.Tensor) => (await t.data()) as Float32Array;

describe.each(RUNTIMES)('the CPU path’s kernels in $name', ({ ort, native, absent }) => {
  // In CI a runtime without its C kernels would run ONNX Runtime's graphs under their name: each test fails.
  beforeEach(() => {
    if (native && !ort.native) throw new Error(`the C kernels are not here: ${nativeStatus().why}`);
  });
  it.skipIf(absent)(
    'multiplies as a plain loop does, every operand transposed or not, written or added to',
    async () => {
      const mm = new Matmul(ort);
      for (const [m, n, k] of [
        [5, 7, 3],
        [64, 33, 130],
      ] as const)
        for (const transposeA of [false, true])
          for (const transposeB of [false, true])
            for (const accumulate of [false, true]) {
              const [a, b, c] = [values(m * k), values(k * n), values(m * n)];
              const want = Float64Array.from({ length: m * n }, (_, i) => (accumulate ? c[i]! : 0));
              for (let i = 0; i < m; i++)
                for (let j = 0; j < n; j++)
                  for (let p = 0; p < k; p++)
                    want[i * n + j]! +=
                      (transposeA ? a[p * m + i]! : a[i * k + p]!) * (transposeB ? b[j * k + p]! : b[p * n + j]!);
              await mm.run(a, b, c, { m, n, k, transposeA, transposeB, accumulate });
              expect(relativeError(c, want), `${m}×${n}×${k} ${transposeA} ${transposeB} ${accumulate}`).toBeLessThan(
                1e-5,
              );
            }
    },
  );

  it.skipIf(absent)(
    'gives the model’s causal attention and its gradients, a key/value head a query head or shared',
    async () => {
      const attention = new Attention(ort);
      for (const shape of ATTENTION_CASES) {
        const { batch, length, heads, kvHeads } = shape;
        const { q, k, v, dout } = attentionInputs(shape, random);
        const want = await modelAttention(q, k, v, dout, shape);
        const [p, out] = [new Float32Array(batch * heads * length * length), new Float32Array(q.length)];
        const [dq, dk, dv] = [new Float32Array(q.length), new Float32Array(k.length), new Float32Array(v.length)];
        await attention.forward(q, k, v, p, out, shape);
        await attention.backward(q, k, v, p, dout, dq, dk, dv, shape);
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
      const norm = new RmsNorm(ort);
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
        await norm.forward(x, w, y, rstd, { rows, eps, r, s });
        expect(relativeError(y, want)).toBeLessThan(1e-5);
        expect(relativeError(s, await data(tf.add(xt, rt)))).toBeLessThan(1e-6);
        const [dx, dw] = [new Float32Array(rows * dim), new Float32Array(dim).fill(0.5)];
        await norm.backward(s, w, rstd, dy, dx, dw, { rows, dxIn });
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
    const rope = new Rope(ort);
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
      const shape = { batch, length, heads, headDim };
      const [out, dx] = [new Float32Array(x.length), new Float32Array(x.length)];
      await rope.forward(x, table.cos, table.sin, out, shape);
      await rope.backward(dy, table.cos, table.sin, dx, shape);
      expect(relativeError(out, await data(f(xt)))).toBeLessThan(1e-5);
      expect(relativeError(dx, await data(dxWant!))).toBeLessThan(1e-5);
    }
  });

  it.skipIf(absent)('gives SwiGLU’s silu(g)·u and its gradients', async () => {
    const swiglu = new SwiGlu(ort);
    // 1,000 values on one thread, 70,000 in shares.
    for (const n of [1000, 70_000]) {
      const [g, u, dm] = [values(n, 6), values(n), values(n)];
      const [gt, ut] = [tf.tensor2d(g, [n / 100, 100]), tf.tensor2d(u, [n / 100, 100])];
      const f = (a: tf.Tensor, b: tf.Tensor) => tf.mul(silu(a as tf.Tensor2D), b);
      const [dgWant, duWant] = tf.grads((a: tf.Tensor, b: tf.Tensor) =>
        tf.sum(tf.mul(f(a, b), tf.tensor2d(dm, [n / 100, 100]))),
      )([gt, ut]);
      const [m, dg, du] = [new Float32Array(n), new Float32Array(n), new Float32Array(n)];
      await swiglu.forward(g, u, m, n);
      await swiglu.backward(g, u, dm, dg, du, n);
      expect(relativeError(m, await data(f(gt, ut)))).toBeLessThan(1e-5);
      expect(relativeError(dg, await data(dgWant!))).toBeLessThan(1e-5);
      expect(relativeError(du, await data(duWant!))).toBeLessThan(1e-5);
    }
  });

  it.skipIf(absent)(
    'gives every position’s log p(target) and entropy from the hidden state through the head, and its gradients, a chunk of rows at a time',
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
      // Whole, and in chunks of 4 rows (the last of 3).
      for (const head of [new HeadLogprobs(ort), new HeadLogprobs(ort, 4 * vocab)]) {
        const [logp, lse, entropy, dh, dw] = [
          new Float32Array(rows),
          new Float32Array(rows),
          new Float32Array(rows),
          new Float32Array(rows * dim),
          new Float32Array(vocab * dim).fill(0.25),
        ];
        await head.forward(h, w, targets, logp, lse, entropy);
        expect(relativeError(entropy, entropyWant)).toBeLessThan(1e-5);
        await head.backward(h, w, targets, lse, dlogp, dh, dw);
        expect(relativeError(logp, await data(f(ht, wt)))).toBeLessThan(1e-5);
        expect(relativeError(dh, await data(dhWant!))).toBeLessThan(1e-5);
        expect(
          relativeError(
            dw,
            (await data(dwWant!)).map((g) => g + 0.25),
          ),
        ).toBeLessThan(1e-5);
      }
    },
  );
});

describe('the CPU path’s threads', () => {
  const steps = async (ort: OrtRuntime, config: LlamaConfig, batch: number, length: number, n: number) => {
    const held = new OrtLlama(config, initialWeights(config, 'ort-threads'), ort);
    const adamw = new CpuAdamW(ADAMW_DEFAULTS, ort.native);
    const draw = seeded('ort-threads', 'tokens');
    const tokens = () => Int32Array.from({ length: batch * length }, () => Math.floor(draw() * config.vocabSize));
    const mask = new Float32Array(batch * length).fill(1);
    for (let step = 0; step < n; step++) {
      if (step > 0) adamw.apply(held.parameters(), 1e-3);
      held.zeroGradients();
      await sftStep(held, { ids: tokens(), targets: tokens(), mask, batch, length });
      held.clipGradients(1);
    }
    await ort.dispose();
    return held;
  };

  it('make a model that does not depend on how many there are in ONNX Runtime: SFT steps on one thread and on two end alike', async () => {
    const config = tinyLlama({
      hiddenSize: 64,
      intermediateSize: 160,
      heads: 4,
      kvHeads: 2,
      headDim: 16,
      vocabSize: 300,
    });
    const end = async (threads: number) =>
      (await steps(await OrtRuntime.open(threads, { native: false }), config, 4, 48, 3)).weights;
    const [one, two] = [await end(1), await end(2)];
    for (const [name, w] of one) expect(two.get(name), name).toEqual(w);
  });

  // OpenBLAS splits a large product between its threads in ways that sum some of its values in another order
  // (docs/trainer.md, "The C kernels"): the C kernels' gradients agree across thread counts to float rounding, not to the bit. Their own loops (RMSNorm,
  // attention, clipping's norm) sum in an order that does not depend on the threads.
  it.skipIf(missing)(
    'give the C kernels’ gradients on one thread and on two to float rounding, at sizes OpenBLAS splits',
    async () => {
      const config = tinyLlama({
        hiddenSize: 128,
        intermediateSize: 352,
        heads: 4,
        kvHeads: 2,
        headDim: 32,
        vocabSize: 300,
      });
      const grads = async (threads: number) => {
        const ort = await OrtRuntime.open(threads);
        if (!ort.native) throw new Error(`the C kernels are not here: ${nativeStatus().why}`);
        return (await steps(ort, config, 4, 300, 2)).grads;
      };
      const [one, two] = [await grads(1), await grads(2)];
      for (const [name, g] of one) expect(relativeError(two.get(name)!, g), name).toBeLessThan(1e-4);
      await OrtRuntime.open(); // every core again for the tests after
    },
  );
});
