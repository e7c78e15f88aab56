// The trainer's GEMM on the CPU: C (M×N) = op(A) (M×K) · op(B) (K×N), f32, row-major, optionally added to C,
// by OpenBLAS where the C kernels are here (runtime/cpu/kernels.ts), else ONNX Runtime's Gemm (its transposes read
// in place). The same contract as runtime/webgpu/matmul.ts.
import type { OnnxGraph, OrtRuntime } from './onnx.ts';

export interface MatmulShape {
  m: number;
  n: number;
  k: number;
  /** A is stored K×M. */
  transposeA?: boolean;
  /** B is stored N×K. */
  transposeB?: boolean;
  /** C += op(A)·op(B) instead of C = op(A)·op(B). */
  accumulate?: boolean;
}

const gemm = (transA: number, transB: number) => (): OnnxGraph => ({
  inputs: { a: 2, b: 2 },
  outputs: { c: 2 },
  nodes: [{ op: 'Gemm', inputs: ['a', 'b'], outputs: ['c'], attributes: { transA, transB } }],
});

export class Matmul {
  /** Where an accumulated product is made before it is added. */
  private scratch = new Float32Array(0);

  constructor(private readonly ort: OrtRuntime) {}

  async run(a: Float32Array, b: Float32Array, c: Float32Array, s: MatmulShape): Promise<void> {
    const [tA, tB] = [s.transposeA ? 1 : 0, s.transposeB ? 1 : 0];
    const native = this.ort.native;
    if (native) {
      native.sgemm(tA, tB, s.m, s.n, s.k, 1, a, tA ? s.m : s.k, b, tB ? s.k : s.n, s.accumulate ? 1 : 0, c, s.n);
      return;
    }
    const size = s.m * s.n;
    if (s.accumulate && this.scratch.length < size) this.scratch = new Float32Array(size);
    const out = s.accumulate ? this.scratch.subarray(0, size) : c.subarray(0, size);
    await this.ort.run(
      `gemm${tA}${tB}`,
      gemm(tA, tB),
      {
        a: { data: a.subarray(0, s.m * s.k), dims: tA ? [s.k, s.m] : [s.m, s.k] },
        b: { data: b.subarray(0, s.k * s.n), dims: tB ? [s.n, s.k] : [s.k, s.n] },
      },
      { c: { data: out, dims: [s.m, s.n] } },
    );
    if (s.accumulate) for (let i = 0; i < size; i++) c[i]! += out[i]!;
  }
}
