// The SwiGLU MLP's backward on the CPU in one ONNX graph, for a layer whose projections carry no adapter: from
// the gradient dy of its output down(silu(gate(h))·up(h)), the gradient of its input h and of its three
// weights, with the N×F gradients between them (dm, dg, du) kept inside the graph rather than made and
// copied out one product at a time (runtime/cpu/llama.ts takes a layer with adapters the long way).
//   dW_down = dyᵀ·m,   dm = dy·W_down,   dg = dm·u·σ(g)·(1 + g·(1 − σ(g))),   du = dm·g·σ(g),
//   dh = dg·W_gate + du·W_up,   dW_gate = dgᵀ·h,   dW_up = duᵀ·h.
// Shapes: h, dy, dh (N, D); g, u, m (N, F), kept by the forward; W_gate, W_up (F, D) and W_down (D, F).
// Where the runtime has the C kernels (runtime/cpu/kernels.ts), prefab_cpu.c's the same steps as OpenBLAS GEMMs around swigluBackward instead.
import { graph, type OrtRuntime } from './onnx.ts';

const backward = (trained: boolean) => () =>
  graph(
    { dy: 2, h: 2, g: 2, u: 2, m: 2, wg: 2, wu: 2, wd: 2 },
    trained ? { dh: 2, dwg: 2, dwu: 2, dwd: 2 } : { dh: 2 },
    (b) => {
      const dm = b.op('MatMul', ['dy', 'wd']);
      const s = b.op('Sigmoid', ['g']);
      const du = b.op('Mul', [dm, b.op('Mul', ['g', s])]);
      const slope = b.op('Mul', [s, b.op('Add', [b.float(1), b.op('Mul', ['g', b.op('Sub', [b.float(1), s])])])]);
      const dg = b.op('Mul', [b.op('Mul', [dm, 'u']), slope]);
      b.op('Add', [b.op('MatMul', [dg, 'wg']), b.op('MatMul', [du, 'wu'])], {}, 'dh');
      if (!trained) return;
      b.op('Gemm', ['dy', 'm'], { transA: 1 }, 'dwd');
      b.op('Gemm', [dg, 'h'], { transA: 1 }, 'dwg');
      b.op('Gemm', [du, 'h'], { transA: 1 }, 'dwu');
    },
  );

/** A weight and where its gradient is added (null: frozen). */
export interface Weight {
  value: Float32Array;
  grad: Float32Array | null;
}

export class MlpBackward {
  /** The weights' gradients of the last pass, added to theirs. */
  private readonly scratch = { dwg: new Float32Array(0), dwu: new Float32Array(0), dwd: new Float32Array(0) };
  /** With the C kernels: dm (then dg, in place) and du, N×F each. */
  private between = { dg: new Float32Array(0), du: new Float32Array(0) };

  constructor(private readonly ort: OrtRuntime) {}

  /** dh from dy over `rows` rows; each weight's gradient added to its `grad` (all three trained, or none). */
  async run(
    dy: Float32Array,
    h: Float32Array,
    g: Float32Array,
    u: Float32Array,
    m: Float32Array,
    w: { gate: Weight; up: Weight; down: Weight },
    dh: Float32Array,
    rows: number,
  ): Promise<void> {
    const D = h.length / rows;
    const F = w.gate.value.length / D;
    const k = this.ort.native;
    if (k) {
      // The C kernels: each weight's gradient added in its GEMM (β = 1), dg written over dm.
      const N = rows;
      if (this.between.dg.length < N * F) this.between = { dg: new Float32Array(N * F), du: new Float32Array(N * F) };
      const { dg, du } = this.between;
      k.sgemm(0, 0, N, F, D, 1, dy, D, w.down.value, F, 0, dg, F);
      k.swigluBackward(g, u, dg, dg, du, N * F);
      k.sgemm(0, 0, N, D, F, 1, dg, F, w.gate.value, D, 0, dh, D);
      k.sgemm(0, 0, N, D, F, 1, du, F, w.up.value, D, 1, dh, D);
      if (w.down.grad) k.sgemm(1, 0, D, F, N, 1, dy, D, m, F, 1, w.down.grad, F);
      if (w.gate.grad) k.sgemm(1, 0, F, D, N, 1, dg, F, h, D, 1, w.gate.grad, D);
      if (w.up.grad) k.sgemm(1, 0, F, D, N, 1, du, F, h, D, 1, w.up.grad, D);
      return;
    }
    const trained = w.gate.grad !== null;
    const sc = this.scratch;
    if (trained && sc.dwg.length !== F * D)
      for (const k of ['dwg', 'dwu', 'dwd'] as const) sc[k] = new Float32Array(F * D);
    const [nd, nf] = [
      [rows, D],
      [rows, F],
    ];
    await this.ort.run(
      `mlp.backward.${trained}`,
      backward(trained),
      {
        dy: { data: dy, dims: nd },
        h: { data: h, dims: nd },
        g: { data: g, dims: nf },
        u: { data: u, dims: nf },
        m: { data: m, dims: nf },
        wg: { data: w.gate.value, dims: [F, D] },
        wu: { data: w.up.value, dims: [F, D] },
        wd: { data: w.down.value, dims: [D, F] },
      },
      {
        dh: { data: dh, dims: nd },
        ...(trained
          ? {
              dwg: { data: sc.dwg, dims: [F, D] },
              dwu: { data: sc.dwu, dims: [F, D] },
              dwd: { data: sc.dwd, dims: [D, F] },
            }
          : {}),
      },
    );
    if (!trained) return;
    for (const [grad, add] of [
      [w.gate.grad!, sc.dwg],
      [w.up.grad!, sc.dwu],
      [w.down.grad!, sc.dwd],
    ] as const)
      for (let i = 0; i < grad.length; i++) grad[i]! += add[i]!;
  }
}
