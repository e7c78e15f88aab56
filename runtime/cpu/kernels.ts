// The CPU path's kernels in C (runtime/cpu/prefab_cpu.c), where `npm ci` could build them (node-gyp, a C
// compiler) and OpenBLAS is found: every GEMM by OpenBLAS on every core, the steps between them as C loops
// shared between the cores (docs/trainer.md, "The CPU path"). Without them (or with PREFAB_CPU_KERNELS=off),
// the reference model trains on TensorFlow.js's WebAssembly backend, several times slower, and the log says so.
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';

type F32 = Float32Array;
type Maybe = Float32Array | null;
/** Sequences, their length, query heads, key/value heads, head size. */
type Heads = [B: number, T: number, H: number, K: number, hd: number];

/** The addon's functions (their contracts are in prefab_cpu.c, above each). */
export interface CpuKernels {
  /** The BLAS library opened, e.g. libopenblas.so.0. */
  blas: string;
  sgemm(
    transA: number,
    transB: number,
    m: number,
    n: number,
    k: number,
    alpha: number,
    a: F32,
    lda: number,
    b: F32,
    ldb: number,
    beta: number,
    c: F32,
    ldc: number,
  ): void;
  rmsnormForward(x: F32, r: Maybe, s: Maybe, w: F32, y: F32, rstd: F32, rows: number, dim: number, eps: number): void;
  rmsnormBackward(x: F32, w: F32, rstd: F32, dy: F32, dxIn: Maybe, dx: F32, dw: Maybe, rows: number, dim: number): void;
  rope(
    x: F32,
    cos: F32,
    sin: F32,
    out: F32,
    rows: number,
    length: number,
    heads: number,
    hd: number,
    sign: number,
  ): void;
  swigluForward(g: F32, u: F32, m: F32, n: number): void;
  swigluBackward(g: F32, u: F32, dm: F32, dg: F32, du: F32, n: number): void;
  attentionForward(q: F32, k: F32, v: F32, p: F32, out: F32, ...shape: Heads): void;
  attentionBackward(q: F32, k: F32, v: F32, p: F32, dout: F32, dq: F32, dk: F32, dv: F32, ...shape: Heads): void;
  logprobsForward(z: F32, targets: Int32Array, logp: F32, lse: F32, entropy: Maybe, rows: number, V: number): void;
  logprobsBackward(z: F32, targets: Int32Array, lse: F32, dlogp: F32, rows: number, V: number): void;
  adamw(
    p: F32,
    g: F32,
    m: F32,
    v: F32,
    n: number,
    lr: number,
    beta1: number,
    beta2: number,
    eps: number,
    decay: number,
    c1: number,
    c2: number,
  ): void;
  sumSquares(x: F32, n: number): number;
  scale(x: F32, n: number, factor: number): void;
  /** w (n, k) row-major into panels of 16 rows, each column by column (out: ceil(n / 16)·16·k floats), for panelTimes. */
  packPanels(w: F32, n: number, k: number, out: F32): void;
  /** y (m, n) = x (m, k) · wᵀ (y += it with `add`) for w (n, k) packed by packPanels: a decoding step's rows through a layer's weights. */
  panelTimes(x: F32, m: number, panels: F32, n: number, k: number, y: F32, add: boolean): void;
  /**
   * A layer's attention for R rows read together (runtime/decode.ts KVCache.readRows): each row of qkv (R,
   * (H + 2K)·hd) gets `bias` (or none), its query's and key's heads rotated at its position (cos, sin: hd floats
   * a position), its key and value written into its cache mems[r]; then each attends to its cache up to its
   * position. meta[4r..4r+3]: the layer's keys' and values' offsets in mems[r], the row's position + 1, the
   * floats between two heads; a head's positions hp apart. out (R, H·hd).
   */
  decodeAttentionRows(
    mems: F32[],
    qkv: F32,
    meta: Float64Array,
    cos: F32,
    sin: F32,
    bias: F32 | null,
    H: number,
    K: number,
    hd: number,
    hp: number,
    out: F32,
  ): void;
  /** out (R, F) = silu(gate) ⊙ up for each row of gateUp (R, 2F), its gate then its up. */
  swigluRows(gateUp: F32, R: number, F: number, out: F32): void;
  /**
   * tokens[r] = runtime/sampling.ts sampleToken(logits[r], temperature, topP) for each row, its random number
   * given: draws[3r..3r+2] are the row's temperature, topP and u (the rand() sampleToken would call).
   */
  drawRows(logits: F32[], draws: Float64Array, tokens: Int32Array): void;
  /** The threads of its loops and of OpenBLAS, for the whole process. */
  setThreads(n: number): void;
}

const built = new URL('./build/Release/prefab_cpu.node', import.meta.url).pathname;

/** Every function of CpuKernels (the type keeps the list whole): an addon from an older checkout lacks some. */
const FUNCTIONS = Object.keys({
  sgemm: 1,
  rmsnormForward: 1,
  rmsnormBackward: 1,
  rope: 1,
  swigluForward: 1,
  swigluBackward: 1,
  attentionForward: 1,
  attentionBackward: 1,
  logprobsForward: 1,
  logprobsBackward: 1,
  adamw: 1,
  sumSquares: 1,
  scale: 1,
  packPanels: 1,
  panelTimes: 1,
  decodeAttentionRows: 1,
  swigluRows: 1,
  drawRows: 1,
  setThreads: 1,
} satisfies Record<Exclude<keyof CpuKernels, 'blas'>, 1>) as Exclude<keyof CpuKernels, 'blas'>[];
let loaded: { kernels: CpuKernels | null; why: string } | null = null;

/**
 * The addon with its BLAS, or null and why not (not built, no OpenBLAS, turned off). Loaded once a process, as
 * any native library is; a device (runtime/device.ts) takes it from here and hands it on.
 */
export function loadCpuKernels(): { kernels: CpuKernels | null; why: string } {
  if (loaded) return loaded;
  if (process.env.PREFAB_CPU_KERNELS === 'off') loaded = { kernels: null, why: 'turned off by PREFAB_CPU_KERNELS=off' };
  else if (!existsSync(built))
    loaded = { kernels: null, why: 'not built: npm ci builds them where node-gyp finds a C compiler and Python' };
  else {
    try {
      const addon = createRequire(import.meta.url)(built) as Omit<CpuKernels, 'blas'> & { blas: string | null };
      const missing = FUNCTIONS.filter((name) => typeof addon[name] !== 'function');
      loaded =
        missing.length > 0
          ? {
              kernels: null,
              why: `built by an older checkout, without ${missing.join(', ')} (npm ci builds them again)`,
            }
          : addon.blas
            ? { kernels: addon as CpuKernels, why: `GEMMs by OpenBLAS (${addon.blas})` }
            : { kernels: null, why: 'no OpenBLAS found (Debian and Ubuntu: apt-get install libopenblas0-pthread)' };
    } catch (error) {
      loaded = { kernels: null, why: `they do not load (${(error as Error).message.split('\n')[0]})` };
    }
  }
  return loaded;
}
