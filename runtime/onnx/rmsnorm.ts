// RMSNorm on the CPU, forward and backward, as model/llama.ts defines it: y = x · rsqrt(mean(x²) + eps) · w
// over each row of x (rows × dim), one ONNX graph a pass. The forward may add a residual first (s = x + r,
// the transformer's stream, returned too) and keeps each row's rsqrt for the backward, which is written out:
//   dx = r · (dy·w − x̂ · mean(dy·w·x̂)),   dw = Σ_rows dy · x̂,   where x̂ = x · r.
// Where the runtime has the C kernels (runtime/cpu/kernels.ts), prefab_cpu.c's rmsnormForward and rmsnormBackward instead.
import { graph, type OrtRuntime } from './onnx.ts';

// ONNX Runtime's fused operators, one pass a row: SkipSimplifiedLayerNormalization adds the residual too.
const forward = (eps: number, residual: boolean) => () =>
  graph(
    residual ? { x: 3, r: 3, w: 1 } : { x: 3, w: 1 },
    residual ? { s: 3, y: 3, rstd: 3 } : { y: 3, rstd: 3 },
    (g) => {
      const attributes = { epsilon: { float: eps } };
      if (residual)
        g.nodes.push({
          op: 'SkipSimplifiedLayerNormalization',
          inputs: ['x', 'r', 'w'],
          outputs: ['y', '', 'rstd', 's'],
          attributes,
          domain: 'com.microsoft',
        });
      else
        g.nodes.push({
          op: 'SimplifiedLayerNormalization',
          inputs: ['x', 'w'],
          outputs: ['y', 'rstd'],
          attributes: { ...attributes, axis: -1 },
        });
    },
  );

const backward = (accumulate: boolean) => () =>
  graph({ x: 2, w: 1, rstd: 2, dy: 2, ...(accumulate ? { dxIn: 2 } : {}) }, { dx: 2, dw: 1 }, (g) => {
    const xh = g.op('Mul', ['x', 'rstd']);
    const dyw = g.op('Mul', ['dy', 'w']);
    const mean = g.op('ReduceMean', [g.op('Mul', [dyw, xh])], { axes: [-1], keepdims: 1 });
    const grad = g.op('Mul', ['rstd', g.op('Sub', [dyw, g.op('Mul', [xh, mean])])], {}, accumulate ? undefined : 'dx');
    if (accumulate) g.op('Add', ['dxIn', grad], {}, 'dx');
    g.op('ReduceSum', [g.op('Mul', ['dy', xh]), g.ints([0])], { keepdims: 0 }, 'dw');
  });

export class RmsNorm {
  /** dw of the last backward, added to the weight's gradient by the caller. */
  private dw = new Float32Array(0);

  constructor(private readonly ort: OrtRuntime) {}

  /** y (rows × dim) and rstd (rows) from x, or from x + r into s when `r` is given. */
  async forward(
    x: Float32Array,
    w: Float32Array,
    y: Float32Array,
    rstd: Float32Array,
    o: { rows: number; eps: number; r?: Float32Array; s?: Float32Array },
  ): Promise<void> {
    const D = w.length;
    if (this.ort.native)
      return this.ort.native.rmsnormForward(x, o.r ?? null, o.s ?? null, w, y, rstd, o.rows, D, o.eps);
    const rows = [1, o.rows, D];
    const residual = o.r !== undefined;
    await this.ort.run(
      `rmsnorm.forward.${o.eps}.${residual}`,
      forward(o.eps, residual),
      { x: { data: x, dims: rows }, w: { data: w, dims: [D] }, ...(residual ? { r: { data: o.r!, dims: rows } } : {}) },
      {
        y: { data: y, dims: rows },
        rstd: { data: rstd, dims: [1, o.rows, 1] },
        ...(residual ? { s: { data: o.s!, dims: rows } } : {}),
      },
    );
  }

  /**
   * dx from dy (plus `dxIn` when given: the residual stream's gradient so far), and dw added to `dw` where
   * the weight is trained (null: frozen).
   */
  async backward(
    x: Float32Array,
    w: Float32Array,
    rstd: Float32Array,
    dy: Float32Array,
    dx: Float32Array,
    dw: Float32Array | null,
    o: { rows: number; dxIn?: Float32Array },
  ): Promise<void> {
    const D = w.length;
    if (this.ort.native) return this.ort.native.rmsnormBackward(x, w, rstd, dy, o.dxIn ?? null, dx, dw, o.rows, D);
    const rows = [o.rows, D];
    if (this.dw.length !== D) this.dw = new Float32Array(D);
    const accumulate = o.dxIn !== undefined;
    await this.ort.run(
      `rmsnorm.backward.${accumulate}`,
      backward(accumulate),
      {
        x: { data: x, dims: rows },
        w: { data: w, dims: [D] },
        rstd: { data: rstd, dims: [o.rows, 1] },
        dy: { data: dy, dims: rows },
        ...(accumulate ? { dxIn: { data: o.dxIn!, dims: rows } } : {}),
      },
      { dx: { data: dx, dims: rows }, dw: { data: this.dw, dims: [D] } },
    );
    if (dw) for (let j = 0; j < D; j++) dw[j]! += this.dw[j]!;
  }
}
