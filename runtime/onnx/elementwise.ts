// The Llama's element-wise steps on the CPU, forward and backward: RoPE and SwiGLU as ONNX graphs (ONNX
// Runtime's vectorised loops on every core; SwiGLU's exponentials in a JavaScript loop took several times as
// long), and the embedding and Qwen2's biases, which only copy and add, as loops here. The same arithmetic as
// model/llama.ts's tfjs ops and runtime/webgpu/elementwise.ts's kernels of the same names.
// Where the runtime has the C kernels (runtime/cpu/kernels.ts), prefab_cpu.c's rope, swigluForward and swigluBackward instead.
import { graph, type OrtRuntime } from './onnx.ts';

export interface RopeShape {
  /** Sequences and their length: row r of a pass is position r mod length. */
  batch: number;
  length: number;
  heads: number;
  headDim: number;
}

// ONNX Runtime's fused RotaryEmbedding (rotate-half), positions from 0: its tables are cos and sin of the
// angles, (T, hd/2). The backward is the rotation by the opposite angles: the same operator with −sin.
const rotary = (heads: number) => () =>
  graph({ x: 3, cos: 2, sin: 2 }, { y: 3 }, (g) => {
    const start = g.ints([0]);
    g.nodes.push({
      op: 'RotaryEmbedding',
      inputs: ['x', start, 'cos', 'sin'],
      outputs: ['y'],
      attributes: { interleaved: 0, num_heads: heads },
      domain: 'com.microsoft',
    });
  });

export class Rope {
  /** The model's table (positions, hd) as RotaryEmbedding reads it: the first half of each row, and −sin. */
  private halves: { from: Float32Array; cos: Float32Array; sin: Float32Array; minusSin: Float32Array } | null = null;

  constructor(private readonly ort: OrtRuntime) {}

  private tables(cos: Float32Array, sin: Float32Array, hd: number) {
    if (this.halves?.from !== cos) {
      const positions = cos.length / hd;
      const half = (t: Float32Array, sign: number) =>
        Float32Array.from(
          { length: (positions * hd) / 2 },
          (_, i) => sign * t[Math.floor(i / (hd / 2)) * hd + (i % (hd / 2))]!,
        );
      this.halves = { from: cos, cos: half(cos, 1), sin: half(sin, 1), minusSin: half(sin, -1) };
    }
    return this.halves;
  }

  private async turn(x: Float32Array, cos: Float32Array, sin: Float32Array, out: Float32Array, s: RopeShape) {
    const dims = [s.batch, s.length, s.heads * s.headDim];
    const table = [s.length, s.headDim / 2];
    await this.ort.run(
      `rope.${s.heads}`,
      rotary(s.heads),
      { x: { data: x, dims }, cos: { data: cos, dims: table }, sin: { data: sin, dims: table } },
      { y: { data: out, dims } },
    );
  }

  /** out = RoPE(x) for x (B·T, heads, hd); cos and sin: the model's table, (positions ≥ T, hd). */
  async forward(x: Float32Array, cos: Float32Array, sin: Float32Array, out: Float32Array, s: RopeShape) {
    const native = this.ort.native;
    if (native) return native.rope(x, cos, sin, out, s.batch * s.length, s.length, s.heads, s.headDim, 1);
    const t = this.tables(cos, sin, s.headDim);
    await this.turn(x, t.cos, t.sin, out, s);
  }

  /** dx from dy: the rotation's transpose, dx₁ = dy₁·cos + dy₂·sin, dx₂ = dy₂·cos − dy₁·sin. */
  async backward(dy: Float32Array, cos: Float32Array, sin: Float32Array, dx: Float32Array, s: RopeShape) {
    const native = this.ort.native;
    if (native) return native.rope(dy, cos, sin, dx, s.batch * s.length, s.length, s.heads, s.headDim, -1);
    const t = this.tables(cos, sin, s.headDim);
    await this.turn(dy, t.cos, t.minusSin, dx, s);
  }
}

// m = silu(g)·u = g·σ(g)·u;  dg = dm·u·σ(g)·(1 + g·(1 − σ(g))),  du = dm·g·σ(g).
const swigluForward = () =>
  graph({ g: 1, u: 1 }, { m: 1 }, (b) => {
    b.op('Mul', [b.op('Mul', ['g', b.op('Sigmoid', ['g'])]), 'u'], {}, 'm');
  });

const swigluBackward = () =>
  graph({ g: 1, u: 1, dm: 1 }, { dg: 1, du: 1 }, (b) => {
    const s = b.op('Sigmoid', ['g']);
    b.op('Mul', ['dm', b.op('Mul', ['g', s])], {}, 'du');
    const slope = b.op('Mul', [s, b.op('Add', [b.float(1), b.op('Mul', ['g', b.op('Sub', [b.float(1), s])])])]);
    b.op('Mul', [b.op('Mul', ['dm', 'u']), slope], {}, 'dg');
  });

export class SwiGlu {
  constructor(private readonly ort: OrtRuntime) {}

  /** m = silu(g)·u over n elements. */
  async forward(g: Float32Array, u: Float32Array, m: Float32Array, n: number) {
    if (this.ort.native) return this.ort.native.swigluForward(g, u, m, n);
    const dims = [n];
    await this.ort.run(
      'swiglu.forward',
      swigluForward,
      { g: { data: g, dims }, u: { data: u, dims } },
      { m: { data: m, dims } },
    );
  }

  async backward(g: Float32Array, u: Float32Array, dm: Float32Array, dg: Float32Array, du: Float32Array, n: number) {
    if (this.ort.native) return this.ort.native.swigluBackward(g, u, dm, dg, du, n);
    const dims = [n];
    await this.ort.run(
      'swiglu.backward',
      swigluBackward,
      { g: { data: g, dims }, u: { data: u, dims }, dm: { data: dm, dims } },
      { dg: { data: dg, dims }, du: { data: du, dims } },
    );
  }
}

/** y[row] += bias, for rows of bias.length. */
export function biasForward(bias: Float32Array, y: Float32Array, rows: number) {
  const n = bias.length;
  for (let row = 0; row < rows; row++) for (let j = 0; j < n; j++) y[row * n + j]! += bias[j]!;
}

/** dbias += Σ_rows dy. */
export function biasBackward(dy: Float32Array, dbias: Float32Array, rows: number) {
  const n = dbias.length;
  for (let row = 0; row < rows; row++) for (let j = 0; j < n; j++) dbias[j]! += dy[row * n + j]!;
}

/** x[row] = table[ids[row]], rows of D. */
export function embeddingForward(table: Float32Array, ids: Int32Array, x: Float32Array, D: number) {
  for (let row = 0; row < ids.length; row++) x.set(table.subarray(ids[row]! * D, (ids[row]! + 1) * D), row * D);
}

/** dtable[ids[row]] += dx[row]. */
export function embeddingBackward(dx: Float32Array, ids: Int32Array, dtable: Float32Array, D: number) {
  for (let row = 0; row < ids.length; row++) {
    const [from, to] = [row * D, ids[row]! * D];
    for (let j = 0; j < D; j++) dtable[to + j]! += dx[from + j]!;
  }
}
