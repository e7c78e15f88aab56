// The trainer's GEMM on the GPU: C (M×N) = op(A) (M×K) · op(B) (K×N), f32, row-major, optionally batched
// (a batch of independent products, as attention's per-head matmuls are) and optionally added to C. The
// transposes the backward pass needs (dW = Xᵀ·dY, dX = dY·Wᵀ) are read in place, never copied.
//
// Each workgroup makes a 64×64 block of C with 16×16 threads, each thread a 4×4 patch, walking K 16 at a time
// through workgroup memory. A tile is loaded so that neighbouring threads read neighbouring addresses in
// whichever orientation the operand is stored.
/// <reference types="@webgpu/types" />
import { Kernels, fields, type Binding } from './kernel.ts';

const SHADER = /* wgsl */ `
override TRANS_A: bool = false;
override TRANS_B: bool = false;
override ACCUMULATE: bool = false;

struct Dims { m: u32, n: u32, k: u32, stride_a: u32, stride_b: u32, stride_c: u32 }

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

const TILE: u32 = 64u;
const TK: u32 = 16u;
var<workgroup> tile_a: array<f32, 1024>; // [k][m] of op(A)'s 64×16 block
var<workgroup> tile_b: array<f32, 1024>; // [k][n] of op(B)'s 16×64 block

fn load_a(base: u32, row: u32, kk: u32) -> f32 {
  if (row >= dims.m || kk >= dims.k) { return 0.0; }
  if (TRANS_A) { return a[base + kk * dims.m + row]; }
  return a[base + row * dims.k + kk];
}

fn load_b(base: u32, kk: u32, col: u32) -> f32 {
  if (kk >= dims.k || col >= dims.n) { return 0.0; }
  if (TRANS_B) { return b[base + col * dims.k + kk]; }
  return b[base + kk * dims.n + col];
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u) {
  let row0 = wg.y * TILE;
  let col0 = wg.x * TILE;
  let base_a = wg.z * dims.stride_a;
  let base_b = wg.z * dims.stride_b;
  let t = lid.y * 16u + lid.x;
  var acc: array<f32, 16>;
  for (var k0 = 0u; k0 < dims.k; k0 += TK) {
    for (var i = 0u; i < 4u; i++) {
      let e = t + i * 256u;
      // A stored M×K: neighbouring threads take neighbouring k; stored K×M (transposed): neighbouring m.
      var am = e % 64u;
      var ak = e / 64u;
      if (!TRANS_A) { am = e / 16u; ak = e % 16u; }
      tile_a[ak * 64u + am] = load_a(base_a, row0 + am, k0 + ak);
      var bn = e % 64u;
      var bk = e / 64u;
      if (TRANS_B) { bn = e / 16u; bk = e % 16u; }
      tile_b[bk * 64u + bn] = load_b(base_b, k0 + bk, col0 + bn);
    }
    workgroupBarrier();
    for (var kk = 0u; kk < TK; kk++) {
      var av: array<f32, 4>;
      var bv: array<f32, 4>;
      for (var i = 0u; i < 4u; i++) {
        av[i] = tile_a[kk * 64u + lid.y * 4u + i];
        bv[i] = tile_b[kk * 64u + lid.x * 4u + i];
      }
      for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) { acc[i * 4u + j] += av[i] * bv[j]; }
      }
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < 4u; i++) {
    let r = row0 + lid.y * 4u + i;
    for (var j = 0u; j < 4u; j++) {
      let col = col0 + lid.x * 4u + j;
      if (r < dims.m && col < dims.n) {
        let at = wg.z * dims.stride_c + r * dims.n + col;
        if (ACCUMULATE) { c[at] += acc[i * 4u + j]; } else { c[at] = acc[i * 4u + j]; }
      }
    }
  }
}
`;

export interface MatmulShape {
  m: number;
  n: number;
  k: number;
  /** Independent products, each operand's matrices one after another (default 1). */
  batch?: number;
  /** A is stored K×M (its transpose is used). */
  transposeA?: boolean;
  /** B is stored N×K. */
  transposeB?: boolean;
  /** C += op(A)·op(B) instead of C = (gradient accumulation). */
  accumulate?: boolean;
}

export class Matmul {
  constructor(private readonly k: Kernels) {}

  /** Records C = op(A)·op(B) (or C +=) into `pass`; the buffers hold f32s, C batch × M × N of them. */
  encode(pass: GPUComputePassEncoder, a: Binding, b: Binding, c: Binding, s: MatmulShape): void {
    const constants = {
      TRANS_A: s.transposeA ? 1 : 0,
      TRANS_B: s.transposeB ? 1 : 0,
      ACCUMULATE: s.accumulate ? 1 : 0,
    };
    const dims = this.k.uniform(fields(...[s.m, s.n, s.k, s.m * s.k, s.k * s.n, s.m * s.n].map((u32) => ({ u32 }))));
    this.k.dispatch(
      pass,
      this.k.pipeline(SHADER, constants),
      [a, b, c, dims],
      Math.ceil(s.n / 64),
      Math.ceil(s.m / 64),
      s.batch ?? 1,
    );
  }
}
