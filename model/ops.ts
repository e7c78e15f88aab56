// The three operations a transformer spends its time in, written so that the WASM backend runs them fast.
//
// On the WASM backend a plain 2-D matMul takes the fast path, but with transposeA or transposeB, or with a
// batch dimension, the slow generic path, an order of magnitude slower (bench/train.ts prints both).
// tf.matMul's built-in gradient uses the transpose flags, and attention is a batched matMul.
// So: every matMul here is 2-D and plain, transposes are explicit, and attention loops over (batch, head)
// with a hand-written backward pass. The gradient of tf.gather needs UnsortedSegmentSum, which WASM lacks:
// the embedding's gradient is a one-hot matMul instead.
import * as tf from '@tensorflow/tfjs-core';

type T2 = tf.Tensor2D;
type Forward = Parameters<typeof tf.customGrad>[0];

/** x · w with a backward pass of plain matMuls on explicitly transposed operands. x: (N, in), w: (in, out). */
export const linear = tf.customGrad(((x: T2, w: T2, save: tf.GradSaveFunc) => {
  save([x, w]);
  return {
    value: tf.matMul(x, w),
    gradFunc: (dy: tf.Tensor, [xs, ws]: tf.Tensor[]) => [
      tf.matMul(dy as T2, tf.transpose(ws as T2)),
      tf.matMul(tf.transpose(xs as T2), dy as T2),
    ],
  };
}) as Forward) as (x: T2, w: T2) => T2;

/** Rows of `table` for each id, with the gradient scattered back by a one-hot matMul. ids: (N,) int32. */
export function embed(table: T2, ids: tf.Tensor1D): T2 {
  const vocab = table.shape[0];
  const f = tf.customGrad(((t: T2, save: tf.GradSaveFunc) => {
    save([ids]);
    return {
      value: tf.gather(t, ids),
      gradFunc: (dy: tf.Tensor, [i]: tf.Tensor[]) => tf.matMul(tf.transpose(oneHot(i as tf.Tensor1D, vocab)), dy as T2),
    };
  }) as Forward);
  return f(table) as T2;
}

/** (N, V) float one-hot rows. WASM's OneHot writes int32 bits into a float32 output, so it is cast instead. */
export function oneHot(ids: tf.Tensor1D, depth: number): T2 {
  return tf.cast(tf.oneHot(ids, depth), 'float32') as T2;
}

/** A (T, T) additive mask: 0 on and below the diagonal, -1e9 above it. */
export function causalMask(length: number): T2 {
  return tf.tidy(() => tf.mul(tf.sub(1, tf.linalg.bandPart(tf.ones([length, length]), -1, 0)), -1e9) as T2);
}

export interface AttentionShape {
  batch: number;
  length: number;
  heads: number;
}

/**
 * Causal multi-head self-attention on packed projections. qkv: (B·T, 3C) laid out [q | k | v], each split
 * into heads of C/H columns. Returns (B·T, C), heads concatenated. The backward pass is written out:
 *   dV = Pᵀ·dY,  dP = dY·Vᵀ,  dS = P ⊙ (dP − rowsum(dP ⊙ P)) · scale,  dQ = dS·K,  dK = dSᵀ·Q
 * computed in their transposed forms so that every product is a plain 2-D matMul.
 */
export function causalAttention(qkv: T2, shape: AttentionShape, mask: T2): T2 {
  const { batch: B, length: T, heads: H } = shape;
  const C = qkv.shape[1] / 3;
  const hs = C / H;
  const scale = 1 / Math.sqrt(hs);
  const rows = (m: T2, i: number, n: number) => tf.slice(m, [i * n, 0], [n, m.shape[1]]);
  const f = tf.customGrad(((x: T2, save: tf.GradSaveFunc) => {
    const packed: T2[] = []; // per batch row: (3C, T), the transposed q, k, v of every head
    const probs: T2[] = []; // per (batch, head): (T, T)
    const out: T2[] = [];
    for (let b = 0; b < B; b++) {
      const t = tf.transpose(rows(x, b, T)); // (3C, T)
      packed.push(t);
      const heads: T2[] = [];
      for (let h = 0; h < H; h++) {
        const qT = rows(t, h, hs); // (hs, T)
        const kT = rows(t, H + h, hs);
        const vT = rows(t, 2 * H + h, hs);
        const p = tf.softmax(tf.add(tf.mul(tf.matMul(tf.transpose(qT), kT), scale), mask)) as T2; // (T, T)
        probs.push(p);
        heads.push(tf.matMul(p, tf.transpose(vT))); // (T, hs)
      }
      out.push(tf.concat(heads, 1) as T2); // (T, C)
    }
    save([...packed, ...probs]);
    return {
      value: tf.concat(out, 0),
      gradFunc: (dy: tf.Tensor, saved: tf.Tensor[]) => {
        const grads: T2[] = [];
        for (let b = 0; b < B; b++) {
          const t = saved[b] as T2;
          const dyT = tf.transpose(rows(dy as T2, b, T)); // (C, T)
          const dq: T2[] = [];
          const dk: T2[] = [];
          const dv: T2[] = [];
          for (let h = 0; h < H; h++) {
            const p = saved[B + b * H + h] as T2;
            const qT = rows(t, h, hs);
            const kT = rows(t, H + h, hs);
            const vT = rows(t, 2 * H + h, hs);
            const dyhT = rows(dyT, h, hs); // (hs, T)
            dv.push(tf.matMul(dyhT, p)); // dVᵀ = dYᵀ·P
            const dp = tf.matMul(tf.transpose(dyhT), vT); // dY·Vᵀ: (T, T)
            const ds = tf.mul(tf.mul(p, tf.sub(dp, tf.sum(tf.mul(dp, p), 1, true))), scale) as T2;
            dq.push(tf.matMul(kT, tf.transpose(ds))); // dQᵀ = Kᵀ·dSᵀ
            dk.push(tf.matMul(qT, ds)); // dKᵀ = Qᵀ·dS
          }
          grads.push(tf.transpose(tf.concat([...dq, ...dk, ...dv], 0))); // (T, 3C)
        }
        return tf.concat(grads, 0);
      },
    };
  }) as Forward);
  return f(qkv) as T2;
}

let patched = false;

/**
 * tfjs-backend-wasm's Slice reads its whole input out of the WASM heap (a copy) before taking the slice, so
 * cutting a tensor into n pieces copies it n times. A contiguous slice is a view of the heap: copy only it.
 */
export function patchWasmSlice(): void {
  if (patched) return;
  const original = tf.getKernel('Slice', 'wasm');
  if (!original) return;
  patched = true;
  tf.unregisterKernel('Slice', 'wasm');
  tf.registerKernel({
    kernelName: 'Slice',
    backendName: 'wasm',
    setupFunc: original.setupFunc,
    kernelFunc: (args) => {
      const { inputs, attrs, backend } = args as unknown as {
        inputs: { x: tf.TensorInfo };
        attrs: { begin: number[]; size: number[] };
        backend: {
          makeOutput(shape: number[], dtype: tf.DataType): tf.TensorInfo;
          typedArrayFromHeap(t: tf.TensorInfo): Float32Array | Int32Array;
        };
      };
      const x = inputs.x;
      const [begin, size] = tf.slice_util.parseSliceParams(x as tf.TensorInfo as tf.Tensor, attrs.begin, attrs.size);
      if (x.dtype === 'string' || !tf.slice_util.isSliceContinous(x.shape, begin, size))
        return original.kernelFunc(args);
      const out = backend.makeOutput(size, x.dtype); // may grow the heap: take views after it
      const offset = tf.slice_util.computeFlatOffset(begin, tf.util.computeStrides(x.shape));
      const n = tf.util.sizeFromShape(size);
      backend.typedArrayFromHeap(out).set(backend.typedArrayFromHeap(x).subarray(offset, offset + n));
      return out;
    },
  });
}
