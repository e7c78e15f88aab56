// The trainer's GEMM on the GPU: C (M×N) = op(A) (M×K) · op(B) (K×N), row-major, C in f32 and A, B in f32 or
// (mixed precision) f16, optionally batched (a batch of independent products) and optionally added to C. The
// transposes the backward pass needs (dW = Xᵀ·dY, dX = dY·Wᵀ) are read in place, never copied.
//
// A product whose operands do not fit one binding (the device's maxStorageBufferBindingSize: 2 GiB on most
// GPUs, 128 MiB on lavapipe) is made of smaller products over blocks of M, N and K, each operand a span of
// its buffer: the same matrices read with their own row lengths (lda, ldb, ldc) from an offset.
//
// Each workgroup makes a block of C with 16×16 threads, walking K 16 at a time through workgroup memory: a
// 64×64 block (a 4×4 patch a thread) where M or N is under 128, a 128×128 block (8×8 a thread) otherwise.
// A tile is loaded so that neighbouring threads read neighbouring addresses in whichever orientation the
// operand is stored.
/// <reference types="@webgpu/types" />
import { GpuKernels, fields, lengthOf, span, type Binding } from './kernel.ts';

// What every GEMM kernel declares: the transposes, the sizes and the operands' bindings. `half`: A and B are
// f16 (mixed precision: products of f16 values summed in f32). After any `enable` directives.
const declarations = (half: boolean) => /* wgsl */ `override TRANS_A: bool = false;
override TRANS_B: bool = false;
override ACCUMULATE: bool = false;

struct Dims {
  m: u32, n: u32, k: u32, stride_a: u32, stride_b: u32, stride_c: u32,
  lda: u32, ldb: u32, ldc: u32, off_a: u32, off_b: u32, off_c: u32,
}

@group(0) @binding(0) var<storage, read> a: array<${half ? 'f16' : 'f32'}>;
@group(0) @binding(1) var<storage, read> b: array<${half ? 'f16' : 'f32'}>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;
`;

// What both tile sizes share: the declarations, and reading an element of op(A) or op(B) (0 outside).
const operands = (half: boolean) => /* wgsl */ `${half ? 'enable f16;' : ''}
${declarations(half)}
fn load_a(base: u32, row: u32, kk: u32) -> f32 {
  if (row >= dims.m || kk >= dims.k) { return 0.0; }
  if (TRANS_A) { return f32(a[base + kk * dims.lda + row]); }
  return f32(a[base + row * dims.lda + kk]);
}

fn load_b(base: u32, kk: u32, col: u32) -> f32 {
  if (kk >= dims.k || col >= dims.n) { return 0.0; }
  if (TRANS_B) { return f32(b[base + col * dims.ldb + kk]); }
  return f32(b[base + kk * dims.ldb + col]);
}

// Where a tile load's element e goes: op(A)'s (m, k) in its TILE×TK block and op(B)'s (k, n) in its TK×TILE
// block, so that neighbouring threads read neighbouring addresses in whichever orientation it is stored.
fn a_slot(e: u32) -> vec2u {
  if (TRANS_A) { return vec2u(e % TILE, e / TILE); }
  return vec2u(e / TK, e % TK);
}

fn b_slot(e: u32) -> vec2u {
  if (TRANS_B) { return vec2u(e % TK, e / TK); }
  return vec2u(e / TILE, e % TILE);
}

/** C's element (r, col) of product z written, or added to; outside C, nothing. */
fn store_c(z: u32, r: u32, col: u32, v: f32) {
  if (r >= dims.m || col >= dims.n) { return; }
  let at = dims.off_c + z * dims.stride_c + r * dims.ldc + col;
  if (ACCUMULATE) { c[at] += v; } else { c[at] = v; }
}
`;

// A workgroup's block of C: its first row and column, its operands' bases, and the thread's index.
const BLOCK = /* wgsl */ `
  let row0 = wg.y * TILE;
  let col0 = wg.x * TILE;
  let base_a = dims.off_a + wg.z * dims.stride_a;
  let base_b = dims.off_b + wg.z * dims.stride_b;
  let t = lid.y * 16u + lid.x;`;

const small = (half: boolean) => /* wgsl */ `${operands(half)}
const TILE: u32 = 64u;
const TK: u32 = 16u;
var<workgroup> tile_a: array<f32, 1024>; // [k][m] of op(A)'s 64×16 block
var<workgroup> tile_b: array<f32, 1024>; // [k][n] of op(B)'s 16×64 block

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u) {${BLOCK}
  var acc: array<f32, 16>;
  for (var k0 = 0u; k0 < dims.k; k0 += TK) {
    for (var i = 0u; i < 4u; i++) {
      let e = t + i * 256u;
      let am = a_slot(e);
      tile_a[am.y * 64u + am.x] = load_a(base_a, row0 + am.x, k0 + am.y);
      let bn = b_slot(e);
      tile_b[bn.x * 64u + bn.y] = load_b(base_b, k0 + bn.x, col0 + bn.y);
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
    for (var j = 0u; j < 4u; j++) { store_c(wg.z, row0 + lid.y * 4u + i, col0 + lid.x * 4u + j, acc[i * 4u + j]); }
  }
}
`;

// 128×128 blocks of C, each of 16×16 threads making an 8×8 patch: rows lid.y·4… and 64 + lid.y·4…, columns
// lid.x·4… and 64 + lid.x·4…, so that the threads of a row read neighbouring vec4s of workgroup memory.
// Twice the work a thread per value loaded from workgroup memory that the 64×64 kernel has.
const large = (half: boolean) => /* wgsl */ `${operands(half)}
const TILE: u32 = 128u;
const TK: u32 = 16u;
var<workgroup> tile_a: array<vec4f, 512>; // [k][m / 4] of op(A)'s 128×16 block
var<workgroup> tile_b: array<vec4f, 512>; // [k][n / 4] of op(B)'s 16×128 block

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u) {${BLOCK}
  var acc: array<vec4f, 16>; // [row i of 8][column half h]: acc[i * 2 + h]
  for (var k0 = 0u; k0 < dims.k; k0 += TK) {
    for (var i = 0u; i < 8u; i++) {
      let e = t + i * 256u;
      let am = a_slot(e);
      tile_a[am.y * 32u + am.x / 4u][am.x % 4u] = load_a(base_a, row0 + am.x, k0 + am.y);
      let bn = b_slot(e);
      tile_b[bn.x * 32u + bn.y / 4u][bn.y % 4u] = load_b(base_b, k0 + bn.x, col0 + bn.y);
    }
    workgroupBarrier();
    for (var kk = 0u; kk < TK; kk++) {
      var a_rows = array<vec4f, 2>(tile_a[kk * 32u + lid.y], tile_a[kk * 32u + 16u + lid.y]);
      let b0 = tile_b[kk * 32u + lid.x];
      let b1 = tile_b[kk * 32u + 16u + lid.x];
      for (var i = 0u; i < 8u; i++) {
        let x = a_rows[i / 4u][i % 4u];
        acc[i * 2u] += x * b0;
        acc[i * 2u + 1u] += x * b1;
      }
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < 8u; i++) {
    let r = row0 + (i / 4u) * 64u + lid.y * 4u + i % 4u;
    for (var j = 0u; j < 8u; j++) {
      store_c(wg.z, r, col0 + (j / 4u) * 64u + lid.x * 4u + j % 4u, acc[i * 2u + j / 4u][j % 4u]);
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
  /** A and B hold f16s (C f32): mixed precision's products. */
  half?: boolean;
}

/** Tiles of C a subgroup makes in the tensor-core kernel: TM down, TN across. */
const [TM, TN] = [4, 2];

// Mixed precision on the tensor cores: WebGPU's subgroup matrices (f16 × f16 → f32 tiles of m×n×k, the
// adapter's). A workgroup is one subgroup (device.ts offers the tiles only where every subgroup has the one
// size) and makes TM×TN tiles of C, reading its operands' tiles straight from the buffers (a
// transposed operand as a column-major one) and adding to C's where accumulating. Only for products whose
// M, N and K are whole blocks: the loads and stores have no edges.
const tensor = (t: { m: number; n: number; k: number; subgroup: number }) => {
  const [left, right, result] = [
    `subgroup_matrix_left<f16, ${t.k}, ${t.m}>`,
    `subgroup_matrix_right<f16, ${t.n}, ${t.k}>`,
    `subgroup_matrix_result<f32, ${t.n}, ${t.m}>`,
  ];
  return /* wgsl */ `enable f16;
enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium.subgroup_matrix_uniformity);
${declarations(true)}
@compute @workgroup_size(${t.subgroup})
fn main(@builtin(workgroup_id) wg: vec3u) {
  let row0 = wg.y * ${TM * t.m}u;
  let col0 = wg.x * ${TN * t.n}u;
  let base_a = dims.off_a + wg.z * dims.stride_a;
  let base_b = dims.off_b + wg.z * dims.stride_b;
  let base_c = dims.off_c + wg.z * dims.stride_c;
  var acc: array<${result}, ${TM * TN}>;
  for (var i = 0u; i < ${TM}u; i++) {
    for (var j = 0u; j < ${TN}u; j++) {
      let at = base_c + (row0 + i * ${t.m}u) * dims.ldc + col0 + j * ${t.n}u;
      if (ACCUMULATE) { acc[i * ${TN}u + j] = subgroupMatrixLoad<${result}>(&c, at, false, dims.ldc); }
      else { acc[i * ${TN}u + j] = ${result}(); }
    }
  }
  for (var k0 = 0u; k0 < dims.k; k0 += ${t.k}u) {
    var l: array<${left}, ${TM}>;
    var r: array<${right}, ${TN}>;
    for (var i = 0u; i < ${TM}u; i++) {
      let m0 = row0 + i * ${t.m}u;
      if (TRANS_A) { l[i] = subgroupMatrixLoad<${left}>(&a, base_a + k0 * dims.lda + m0, true, dims.lda); }
      else { l[i] = subgroupMatrixLoad<${left}>(&a, base_a + m0 * dims.lda + k0, false, dims.lda); }
    }
    for (var j = 0u; j < ${TN}u; j++) {
      let n0 = col0 + j * ${t.n}u;
      if (TRANS_B) { r[j] = subgroupMatrixLoad<${right}>(&b, base_b + n0 * dims.ldb + k0, true, dims.ldb); }
      else { r[j] = subgroupMatrixLoad<${right}>(&b, base_b + k0 * dims.ldb + n0, false, dims.ldb); }
    }
    for (var i = 0u; i < ${TM}u; i++) {
      for (var j = 0u; j < ${TN}u; j++) {
        acc[i * ${TN}u + j] = subgroupMatrixMultiplyAccumulate(l[i], r[j], acc[i * ${TN}u + j]);
      }
    }
  }
  for (var i = 0u; i < ${TM}u; i++) {
    for (var j = 0u; j < ${TN}u; j++) {
      let at = base_c + (row0 + i * ${t.m}u) * dims.ldc + col0 + j * ${t.n}u;
      subgroupMatrixStore(&c, at, acc[i * ${TN}u + j], false, dims.ldc);
    }
  }
}
`;
};

const SHADERS = new Map<string, string>();
/** The tensor-core shader for the adapter's tiles, written once. */
function tensorShader(t: { m: number; n: number; k: number; subgroup: number }): string {
  const key = `tensor${JSON.stringify(t)}`;
  let code = SHADERS.get(key);
  if (!code) SHADERS.set(key, (code = tensor(t)));
  return code;
}

/** The shader of a block size and operand type, written once. */
function shader(tile: 64 | 128, half: boolean): string {
  const key = `${tile}${half}`;
  let code = SHADERS.get(key);
  if (!code) SHADERS.set(key, (code = (tile === 128 ? large : small)(half)));
  return code;
}

export class Matmul {
  /** `tile`: one block size for every product (the benches and tests compare them); by default by the product's size. */
  constructor(
    private readonly k: GpuKernels,
    private readonly o: { tile?: 64 | 128 } = {},
  ) {}

  /** Records C = op(A)·op(B) (or C +=) into `pass`; C holds batch × M × N f32s, A and B f32s or (`half`) f16s. */
  encode(pass: GPUComputePassEncoder, a: Binding, b: Binding, c: Binding, s: MatmulShape): void {
    const { m: M, n: N, k: K } = s;
    const batch = s.batch ?? 1;
    const [lda, ldb] = [s.transposeA ? M : K, s.transposeB ? K : N];
    // A span's elements, less what aligning its start may add (f32s: C's; A's and B's are as many, or f16s).
    const room = Math.floor(this.k.bindingBytes / 4) - 64;
    const bytes = s.half ? 2 : 4; // of A's and B's elements
    const fits = (x: Binding, size: number) => lengthOf(x, size) * size <= this.k.bindingBytes;
    if (fits(a, bytes) && fits(b, bytes) && fits(c, 4)) {
      this.product(pass, [a, b, c], s, [lda, ldb, N], [0, 0, 0], s.accumulate ?? false);
      return;
    }
    if (batch > 1) throw new Error(`webgpu: a batch of ${batch} products too large for one binding each`);
    // Rows of each dimension a block may have: a span holds whole stored rows of its operand.
    const most = (...limits: number[]) => {
      const rows = Math.min(...limits);
      if (rows < 1)
        throw new Error(
          `webgpu: a ${M}×${K}·${K}×${N} product has a row too long for one binding (${this.k.bindingBytes} bytes)`,
        );
      return rows;
    };
    const mRows = most(s.transposeA ? M : Math.floor(room / K), Math.floor(room / N));
    const kRows = most(s.transposeA ? Math.floor(room / M) : K, s.transposeB ? K : Math.floor(room / N));
    const nRows = most(s.transposeB ? Math.floor(room / K) : N);
    for (let m0 = 0; m0 < M; m0 += mRows)
      for (let n0 = 0; n0 < N; n0 += nRows)
        for (let k0 = 0; k0 < K; k0 += kRows) {
          const [m1, n1, k1] = [Math.min(M, m0 + mRows), Math.min(N, n0 + nRows), Math.min(K, k0 + kRows)];
          // Each operand's elements from its block's first to its last, in its stored layout.
          const sa = s.transposeA
            ? span(a, k0 * M + m0, (k1 - 1) * M + m1, bytes)
            : span(a, m0 * K + k0, (m1 - 1) * K + k1, bytes);
          const sb = s.transposeB
            ? span(b, n0 * K + k0, (n1 - 1) * K + k1, bytes)
            : span(b, k0 * N + n0, (k1 - 1) * N + n1, bytes);
          const sc = span(c, m0 * N + n0, (m1 - 1) * N + n1);
          const block = { ...s, m: m1 - m0, n: n1 - n0, k: k1 - k0 };
          const accumulate = (s.accumulate ?? false) || k0 > 0;
          this.product(
            pass,
            [sa.binding, sb.binding, sc.binding],
            block,
            [lda, ldb, N],
            [sa.skip, sb.skip, sc.skip],
            accumulate,
          );
        }
  }

  /** One dispatch: op(A)·op(B) of `s`'s sizes, each operand read with its row length and from its offset. */
  private product(
    pass: GPUComputePassEncoder,
    [a, b, c]: Binding[],
    s: MatmulShape,
    ld: number[],
    offsets: number[],
    accumulate: boolean,
  ): void {
    const constants = {
      TRANS_A: s.transposeA ? 1 : 0,
      TRANS_B: s.transposeB ? 1 : 0,
      ACCUMULATE: accumulate ? 1 : 0,
    };
    const values = [s.m, s.n, s.k, s.m * s.k, s.k * s.n, s.m * s.n, ...ld, ...offsets];
    const t = this.k.tensorCores;
    if (
      s.half &&
      t &&
      this.o.tile === undefined &&
      s.m % (TM * t.m) === 0 &&
      s.n % (TN * t.n) === 0 &&
      s.k % t.k === 0
    ) {
      this.k.dispatch(
        pass,
        this.k.pipeline(tensorShader(t), constants),
        [a!, b!, c!, this.k.uniform(fields(...values.map((u32) => ({ u32 }))))],
        s.n / (TN * t.n),
        s.m / (TM * t.m),
        s.batch ?? 1,
      );
      return;
    }
    const tile = (this.o.tile ?? (s.m >= 128 && s.n >= 128 ? 128 : 64)) as 64 | 128;
    this.k.dispatch(
      pass,
      this.k.pipeline(shader(tile, s.half ?? false), constants),
      [a!, b!, c!, this.k.uniform(fields(...values.map((u32) => ({ u32 }))))],
      Math.ceil(s.n / tile),
      Math.ceil(s.m / tile),
      s.batch ?? 1,
    );
  }
}
