// log p(target) at every position from the last hidden state, the LM head fused in, and its backward, on the
// CPU: the logits z = h·Wᵀ are made a chunk of rows at a time inside one ONNX graph and never leave it (a
// vocabulary of 49,152 at 8 × 1,024 positions would be 1.6 GB of them), as Liger's fused linear
// cross-entropy does; the backward makes a chunk's logits again rather than keeping them. Every loss of the
// trainer starts from these token log-probs, so its gradient arrives here as d/d logp per position:
//   logp_t = z_t[y_t] − logsumexp(z_t),   dz_t = dlogp_t · (onehot(y_t) − softmax(z_t)),
//   dh = dz·W,   dW = dzᵀ·h.
// Where the runtime has the C kernels (runtime/cpu/kernels.ts), prefab_cpu.c's logprobsForward and logprobsBackward, the logits by OpenBLAS instead.
import { graph, type GraphBuilder, type OrtRuntime } from './onnx.ts';

const logits = (g: GraphBuilder) => g.op('Gemm', ['h', 'w'], { transB: 1 });

// With `entropy`, each row's too: H = lse − Σ softmax(z)·z (DAPO logs it of the rollouts it scores).
const forward = (entropy: boolean) => () =>
  graph(
    { h: 2, w: 2, targets: 2 },
    entropy ? { logp: 2, lse: 2, entropy: 2 } : { logp: 2, lse: 2 },
    (g) => {
      const z = logits(g);
      g.op('ReduceLogSumExp', [z], { axes: [-1], keepdims: 1 }, 'lse');
      g.op('Sub', [g.op('GatherElements', [z, 'targets'], { axis: 1 }), 'lse'], {}, 'logp');
      if (!entropy) return;
      const softmax = g.op('Exp', [g.op('Sub', [z, 'lse'])]);
      const expected = g.op('ReduceSum', [g.op('Mul', [softmax, z]), g.ints([-1])], { keepdims: 1 });
      g.op('Sub', ['lse', expected], {}, 'entropy');
    },
    ['targets'],
  );

const backward = (trained: boolean) => () =>
  graph(
    { h: 2, w: 2, targets: 2, lse: 2, dlogp: 2 },
    trained ? { dh: 2, dw: 2 } : { dh: 2 },
    (g) => {
      const softmax = g.op('Exp', [g.op('Sub', [logits(g), 'lse'])]);
      const spread = g.op('Mul', [g.op('Neg', ['dlogp']), softmax]);
      const dz = g.op('ScatterElements', [spread, 'targets', 'dlogp'], { axis: 1, reduction: 'add' });
      g.op('MatMul', [dz, 'w'], {}, 'dh');
      if (trained) g.op('Gemm', [dz, 'h'], { transA: 1 }, 'dw');
    },
    ['targets'],
  );

export class HeadLogprobs {
  /** A chunk's dW, added to the head's gradient. */
  private dw = new Float32Array(0);
  /** With the C kernels: a chunk's logits, then their gradient. */
  private z = new Float32Array(0);

  /** `chunk`: the logits a chunk of rows may hold (default 16M f32s, 64 MiB). */
  constructor(
    private readonly ort: OrtRuntime,
    private readonly chunk = 1 << 24,
  ) {}

  private logits(length: number): Float32Array {
    if (this.z.length < length) this.z = new Float32Array(length);
    return this.z;
  }

  /** Row ranges of at most `chunk` logits. */
  private chunks(rows: number, V: number): [number, number][] {
    const size = Math.max(1, Math.floor(this.chunk / V));
    const out: [number, number][] = [];
    for (let r = 0; r < rows; r += size) out.push([r, Math.min(rows, r + size)]);
    return out;
  }

  /** logp and lse (rows) from h (rows × D), the head W (V × D) and each row's target; each row's entropy if asked. */
  async forward(
    h: Float32Array,
    w: Float32Array,
    targets: Int32Array,
    logp: Float32Array,
    lse: Float32Array,
    entropy?: Float32Array,
  ) {
    const [rows, D] = [targets.length, h.length / targets.length];
    const V = w.length / D;
    const native = this.ort.native;
    for (const [r0, r1] of this.chunks(rows, V)) {
      const n = r1 - r0;
      if (native) {
        const z = this.logits(n * V);
        native.sgemm(0, 1, n, V, D, 1, h.subarray(r0 * D), D, w, D, 0, z, V);
        const e = entropy?.subarray(r0, r1) ?? null;
        native.logprobsForward(z, targets.subarray(r0, r1), logp.subarray(r0, r1), lse.subarray(r0, r1), e, n, V);
        continue;
      }
      await this.ort.run(
        `head.forward.${entropy !== undefined}`,
        forward(entropy !== undefined),
        {
          h: { data: h.subarray(r0 * D, r1 * D), dims: [n, D] },
          w: { data: w, dims: [V, D] },
          targets: { data: targets.subarray(r0, r1), dims: [n, 1] },
        },
        {
          logp: { data: logp.subarray(r0, r1), dims: [n, 1] },
          lse: { data: lse.subarray(r0, r1), dims: [n, 1] },
          ...(entropy ? { entropy: { data: entropy.subarray(r0, r1), dims: [n, 1] } } : {}),
        },
      );
    }
  }

  /** dh (rows × D) from d loss / d logp, and dW added to `dw` where the head is trained (null: frozen). */
  async backward(
    h: Float32Array,
    w: Float32Array,
    targets: Int32Array,
    lse: Float32Array,
    dlogp: Float32Array,
    dh: Float32Array,
    dw: Float32Array | null,
  ) {
    const [rows, D] = [targets.length, h.length / targets.length];
    const V = w.length / D;
    const native = this.ort.native;
    if (dw && !native && this.dw.length !== w.length) this.dw = new Float32Array(w.length);
    for (const [r0, r1] of this.chunks(rows, V)) {
      const n = r1 - r0;
      if (native) {
        // dz replaces the chunk's logits; dh = dz·W, dW += dzᵀ·h.
        const [z, hc] = [this.logits(n * V), h.subarray(r0 * D)];
        native.sgemm(0, 1, n, V, D, 1, hc, D, w, D, 0, z, V);
        native.logprobsBackward(z, targets.subarray(r0, r1), lse.subarray(r0, r1), dlogp.subarray(r0, r1), n, V);
        native.sgemm(0, 0, n, D, V, 1, z, V, w, D, 0, dh.subarray(r0 * D), D);
        if (dw) native.sgemm(1, 0, V, D, n, 1, z, V, hc, D, 1, dw, D);
        continue;
      }
      await this.ort.run(
        `head.backward.${dw !== null}`,
        backward(dw !== null),
        {
          h: { data: h.subarray(r0 * D, r1 * D), dims: [n, D] },
          w: { data: w, dims: [V, D] },
          targets: { data: targets.subarray(r0, r1), dims: [n, 1] },
          lse: { data: lse.subarray(r0, r1), dims: [n, 1] },
          dlogp: { data: dlogp.subarray(r0, r1), dims: [n, 1] },
        },
        {
          dh: { data: dh.subarray(r0 * D, r1 * D), dims: [n, D] },
          ...(dw ? { dw: { data: this.dw, dims: [V, D] } } : {}),
        },
      );
      if (dw) for (let i = 0; i < dw.length; i++) dw[i]! += this.dw[i]!;
    }
  }
}
