// Causal self-attention on the CPU, forward and backward, as model/ops.ts causalAttention computes it for
// the model (grouped-query: key/value head h·K/H serves query head h, transformers' repeat_kv), each pass one
// ONNX graph of batched products. q, dq: (B, T, K, G, hd) with G = H/K query heads a key/value head, which is
// (B·T, H·hd) as the projections lay it out; k, v, dk, dv: (B, T, K, hd). The G query heads of a key/value
// head are stacked into one product, (G·T, hd)·(hd, T), so keys and values are never repeated. P is kept,
// (B, K, G·T, T): this is not FlashAttention, and costs T² memory a head.
//   forward:  P = softmax(q·kᵀ·scale + causal mask),  out = P·v
//   backward: dS = P ⊙ (dout·vᵀ − rowsum(dout·vᵀ ⊙ P)) · scale,  dq = dS·k,  dk = dSᵀ·q,  dv = Pᵀ·dout
// Where the runtime has the C kernels (runtime/cpu/kernels.ts), prefab_cpu.c's attentionForward and attentionBackward (a head at a time, in causal blocks of 64 query rows) instead.
import type { AttentionShape } from '../webgpu/attention.ts';
import { graph, type GraphBuilder, type OrtRuntime } from './onnx.ts';

/** (B, T, K, G, hd) → (B, K, G·T, hd): a key/value head's query rows stacked, head after head. */
const stack = (g: GraphBuilder, x: string, s: AttentionShape) =>
  g.op('Reshape', [g.op('Transpose', [x], { perm: [0, 2, 3, 1, 4] }), g.ints([0, 0, -1, s.headDim])]);
/** (B, K, G·T, hd) → (B, T, K, G, hd), stack's inverse, into `out`. */
const unstack = (g: GraphBuilder, x: string, s: AttentionShape, out: string) =>
  g.op(
    'Transpose',
    [g.op('Reshape', [x, g.ints([0, 0, s.heads / s.kvHeads, -1, s.headDim])])],
    { perm: [0, 3, 1, 2, 4] },
    out,
  );

const forward = (s: AttentionShape) => () =>
  graph({ q: 5, k: 4, v: 4, mask: 2 }, { p: 4, out: 5 }, (g) => {
    const kt = g.op('Transpose', ['k'], { perm: [0, 2, 3, 1] }); // (B, K, hd, T)
    const vs = g.op('Transpose', ['v'], { perm: [0, 2, 1, 3] }); // (B, K, T, hd)
    const scores = g.op('MatMul', [stack(g, 'q', s), kt]); // (B, K, G·T, T)
    const scaled = g.op('Mul', [scores, g.float(1 / Math.sqrt(s.headDim))]);
    g.op('Softmax', [g.op('Add', [scaled, 'mask'])], { axis: -1 }, 'p');
    unstack(g, g.op('MatMul', ['p', vs]), s, 'out'); // (B, K, G·T, hd) → (B, T, K, G, hd)
  });

const backward = (s: AttentionShape) => () =>
  graph({ q: 5, k: 4, v: 4, p: 4, dout: 5 }, { dq: 5, dk: 4, dv: 4 }, (g) => {
    const [qs, douts] = [stack(g, 'q', s), stack(g, 'dout', s)];
    const ks = g.op('Transpose', ['k'], { perm: [0, 2, 1, 3] }); // (B, K, T, hd)
    const vt = g.op('Transpose', ['v'], { perm: [0, 2, 3, 1] }); // (B, K, hd, T)
    const pt = g.op('Transpose', ['p'], { perm: [0, 1, 3, 2] }); // (B, K, T, G·T)
    const dvs = g.op('MatMul', [pt, douts]); // (B, K, T, hd): summed over the G heads
    g.op('Transpose', [dvs], { perm: [0, 2, 1, 3] }, 'dv');
    const dp = g.op('MatMul', [douts, vt]); // (B, K, G·T, T)
    const rowsum = g.op('ReduceSum', [g.op('Mul', [dp, 'p']), g.ints([-1])], { keepdims: 1 });
    const ds = g.op('Mul', [g.op('Mul', [g.op('Sub', [dp, rowsum]), 'p']), g.float(1 / Math.sqrt(s.headDim))]);
    unstack(g, g.op('MatMul', [ds, ks]), s, 'dq'); // (B, K, G·T, hd)
    const dks = g.op('MatMul', [g.op('Transpose', [ds], { perm: [0, 1, 3, 2] }), qs]); // (B, K, T, hd)
    g.op('Transpose', [dks], { perm: [0, 2, 1, 3] }, 'dk');
  });

export class Attention {
  /** The causal mask for the stacked rows, (G·T, T): 0 where a query may see a key, −1e9 above the diagonal. */
  private readonly masks = new Map<string, Float32Array>();

  constructor(private readonly ort: OrtRuntime) {}

  private mask(groups: number, length: number): Float32Array {
    const key = `${groups}x${length}`;
    let mask = this.masks.get(key);
    if (!mask) {
      mask = new Float32Array(groups * length * length);
      for (let g = 0; g < groups; g++)
        for (let t = 0; t < length; t++)
          mask.fill(-1e9, (g * length + t) * length + t + 1, (g * length + t + 1) * length);
      this.masks.set(key, mask);
    }
    return mask;
  }

  private dims(s: AttentionShape) {
    const { batch: B, length: T, kvHeads: K, headDim: hd } = s;
    const G = s.heads / K;
    return { q: [B, T, K, G, hd], kv: [B, T, K, hd], p: [B, K, G * T, T], G, T };
  }

  /** Fills p (B·H·T·T) and out (B·T·H·hd) from q, k, v. */
  async forward(
    q: Float32Array,
    k: Float32Array,
    v: Float32Array,
    p: Float32Array,
    out: Float32Array,
    s: AttentionShape,
  ): Promise<void> {
    const native = this.ort.native;
    if (native) return native.attentionForward(q, k, v, p, out, s.batch, s.length, s.heads, s.kvHeads, s.headDim);
    const d = this.dims(s);
    await this.ort.run(
      `attention.forward.${s.heads}.${s.kvHeads}.${s.headDim}`,
      forward(s),
      {
        q: { data: q, dims: d.q },
        k: { data: k, dims: d.kv },
        v: { data: v, dims: d.kv },
        mask: { data: this.mask(d.G, d.T), dims: [d.G * d.T, d.T] },
      },
      { p: { data: p, dims: d.p }, out: { data: out, dims: d.q } },
    );
  }

  /** Fills dq, dk and dv from the forward's q, k, v and p and the output's gradient dout. */
  async backward(
    q: Float32Array,
    k: Float32Array,
    v: Float32Array,
    p: Float32Array,
    dout: Float32Array,
    dq: Float32Array,
    dk: Float32Array,
    dv: Float32Array,
    s: AttentionShape,
  ): Promise<void> {
    const native = this.ort.native;
    if (native)
      return native.attentionBackward(q, k, v, p, dout, dq, dk, dv, s.batch, s.length, s.heads, s.kvHeads, s.headDim);
    const d = this.dims(s);
    await this.ort.run(
      `attention.backward.${s.heads}.${s.kvHeads}.${s.headDim}`,
      backward(s),
      {
        q: { data: q, dims: d.q },
        k: { data: k, dims: d.kv },
        v: { data: v, dims: d.kv },
        p: { data: p, dims: d.p },
        dout: { data: dout, dims: d.q },
      },
      { dq: { data: dq, dims: d.q }, dk: { data: dk, dims: d.kv }, dv: { data: dv, dims: d.kv } },
    );
  }
}
