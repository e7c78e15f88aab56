// Causal self-attention on the CPU, forward and backward, as train/kernels.ts causalAttention computes it for
// the model (grouped-query: key/value head h·K/H serves query head h, transformers' repeat_kv), each pass one
// ONNX graph of batched products. q, dq: (B, T, K, G, hd) with G = H/K query heads a key/value head, which is
// (B·T, H·hd) as the projections lay it out; k, v, dk, dv: (B, T, K, hd). The G query heads of a key/value
// head are stacked into one product, (G·T, hd)·(hd, T), so keys and values are never repeated. P is kept,
// (B, K, G·T, T): this is not FlashAttention, and costs T² memory a head.
//   forward:  P = softmax(q·kᵀ·scale + causal mask),  out = P·v
//   backward: dS = P ⊙ (dout·vᵀ − rowsum(dout·vᵀ ⊙ P)) · scale,  dq = dS·k,  dk = dSᵀ·q,  dv = Pᵀ·dout
import type { AttentionShape } from '../webgpu/attention.ts';
import type { OnnxGraph, OnnxNode, OrtRuntime } from './onnx.ts';

const node = (op: string, inputs: string[], output: string, attributes?: OnnxNode['attributes']): OnnxNode => ({
  op,
  inputs,
  outputs: [output],
  attributes,
});
const constant = (name: string, ints: number[]) => node('Constant', [], name, { value_ints: ints });

/** (B, T, K, G, hd) → (B, K, G·T, hd): a key/value head's query rows stacked, head after head. */
const stack = (x: string, out: string): OnnxNode[] => [
  node('Transpose', [x], `${out}.t`, { perm: [0, 2, 3, 1, 4] }),
  node('Reshape', [`${out}.t`, 'stacked'], out),
];
/** (B, K, G·T, hd) → (B, T, K, G, hd), stack's inverse. */
const unstack = (x: string, out: string): OnnxNode[] => [
  node('Reshape', [x, 'split'], `${out}.s`),
  node('Transpose', [`${out}.s`], out, { perm: [0, 3, 1, 2, 4] }),
];
const shapes = (s: AttentionShape) => [
  constant('stacked', [0, 0, -1, s.headDim]),
  constant('split', [0, 0, s.heads / s.kvHeads, -1, s.headDim]),
];

const forward = (s: AttentionShape) => (): OnnxGraph => ({
  inputs: { q: 5, k: 4, v: 4, mask: 2 },
  outputs: { p: 4, out: 5 },
  nodes: [
    ...shapes(s),
    ...stack('q', 'qs'),
    node('Transpose', ['k'], 'kt', { perm: [0, 2, 3, 1] }), // (B, K, hd, T)
    node('Transpose', ['v'], 'vs', { perm: [0, 2, 1, 3] }), // (B, K, T, hd)
    node('MatMul', ['qs', 'kt'], 'scores'), // (B, K, G·T, T)
    node('Constant', [], 'scale', { value_float: { float: 1 / Math.sqrt(s.headDim) } }),
    node('Mul', ['scores', 'scale'], 'scaled'),
    node('Add', ['scaled', 'mask'], 'masked'),
    node('Softmax', ['masked'], 'p', { axis: -1 }),
    node('MatMul', ['p', 'vs'], 'os'), // (B, K, G·T, hd)
    ...unstack('os', 'out'),
  ],
});

const backward = (s: AttentionShape) => (): OnnxGraph => ({
  inputs: { q: 5, k: 4, v: 4, p: 4, dout: 5 },
  outputs: { dq: 5, dk: 4, dv: 4 },
  nodes: [
    ...shapes(s),
    ...stack('q', 'qs'),
    ...stack('dout', 'douts'),
    node('Transpose', ['k'], 'ks', { perm: [0, 2, 1, 3] }), // (B, K, T, hd)
    node('Transpose', ['v'], 'vt', { perm: [0, 2, 3, 1] }), // (B, K, hd, T)
    node('Transpose', ['p'], 'pt', { perm: [0, 1, 3, 2] }), // (B, K, T, G·T)
    node('MatMul', ['pt', 'douts'], 'dvs'), // (B, K, T, hd): summed over the G heads
    node('Transpose', ['dvs'], 'dv', { perm: [0, 2, 1, 3] }),
    node('MatMul', ['douts', 'vt'], 'dp'), // (B, K, G·T, T)
    node('Mul', ['dp', 'p'], 'dpp'),
    constant('last', [-1]),
    node('ReduceSum', ['dpp', 'last'], 'rowsum', { keepdims: 1 }),
    node('Sub', ['dp', 'rowsum'], 'centred'),
    node('Mul', ['centred', 'p'], 'dsu'),
    node('Constant', [], 'scale', { value_float: { float: 1 / Math.sqrt(s.headDim) } }),
    node('Mul', ['dsu', 'scale'], 'ds'),
    node('MatMul', ['ds', 'ks'], 'dqs'), // (B, K, G·T, hd)
    ...unstack('dqs', 'dq'),
    node('Transpose', ['ds'], 'dst', { perm: [0, 1, 3, 2] }), // (B, K, T, G·T)
    node('MatMul', ['dst', 'qs'], 'dks'), // (B, K, T, hd)
    node('Transpose', ['dks'], 'dk', { perm: [0, 2, 1, 3] }),
  ],
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
