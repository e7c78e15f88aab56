// Mixed precision on the GPU, as torch.amp does it with f16: every GEMM multiplies f16 operands and sums in
// f32 (runtime/webgpu/matmul.ts `half`); the weights stay f32 (AdamW keeps an f16 copy beside each one it
// updates), and so do the norms, softmaxes, attention, the gradients and AdamW's moments. f16 holds values
// up to 65504 and loses those below 6e-8: the loss is scaled up before the backward so that small
// gradients survive the cast, down again before clipping, and a step whose gradients overflowed is skipped
// with the scale halved (GradScaler's dynamic loss scaling).
/// <reference types="@webgpu/types" />
import { allocate, download, submit, upload } from './buffers.ts';
import type { Binding, GpuKernels } from './kernel.ts';
import { fields, grid } from './kernel.ts';
import { Matmul } from './matmul.ts';

// f32 → f16. A value beyond f16's range (or not finite) sets `overflow[slot]` and is written as 0: compared
// as bits, since a shader may assume that float arithmetic meets no infinities or NaNs.
/** 65504, f16's largest finite value, as f32 bits: a value above it (or not finite) cannot be cast. */
export const F16_MOST = 0x477fe000;

const CAST = /* wgsl */ `enable f16;
struct Dims { n: u32, slot: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f16>;
@group(0) @binding(2) var<storage, read_write> overflow: array<atomic<u32>>;
@group(0) @binding(3) var<uniform> d: Dims;

const MOST: u32 = ${F16_MOST}u; // 65504, f16's largest finite value, as f32 bits

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  let i = id.x + id.y * groups.x * 256u;
  if (i >= d.n) { return; }
  let v = x[i];
  if ((bitcast<u32>(v) & 0x7fffffffu) > MOST) {
    atomicOr(&overflow[d.slot], 1u);
    y[i] = 0.0h;
    return;
  }
  y[i] = f16(v);
}
`;

/** Where a cast that overflowed says so: the forward's activations, the backward's (scaled) gradients, the weights. */
export const OVERFLOW = { forward: 0, backward: 1, weights: 2 } as const;

export class Cast {
  constructor(private readonly k: GpuKernels) {}

  /** y (n f16s) = x (n f32s); a value f16 cannot hold sets overflow[slot] (a buffer of a u32 for each OVERFLOW). */
  encode(pass: GPUComputePassEncoder, x: Binding, y: GPUBuffer, n: number, overflow: GPUBuffer, slot: number): void {
    const dims = this.k.uniform(fields({ u32: n }, { u32: slot }));
    this.k.dispatch(pass, this.k.pipeline(CAST), [x, y, overflow, dims], ...grid(n));
  }
}

/**
 * The loss scale of torch.amp's GradScaler: it starts at `initial`, halves after a step whose scaled
 * gradients overflowed f16 (that step is skipped), and doubles after `interval` steps in a row that did not.
 */
export class LossScaler {
  scale: number;
  private good = 0;

  constructor(readonly o: { initial: number; interval: number } = { initial: 2 ** 16, interval: 2000 }) {
    this.scale = o.initial;
  }

  /** After a step's backward, whether its gradients overflowed. */
  update(overflowed: boolean): void {
    if (!overflowed) {
      if (++this.good === this.o.interval) [this.scale, this.good] = [this.scale * 2, 0];
      return;
    }
    if (this.scale <= 2 ** -24)
      throw new Error(
        `precision f16: the gradients overflow f16 at every loss scale down to ${this.scale}: train in f32 (--precision f32)`,
      );
    [this.scale, this.good] = [this.scale / 2, 0];
  }
}

/**
 * Turns on `k`'s GEMM on the tensor cores where the adapter has subgroup matrices and, checked here, it makes
 * what the f16 GEMM on the ordinary cores makes (every transpose, written and accumulated, within 1e-4: the
 * same f16 products summed in another order). Says what mixed precision multiplies on, and why.
 */
export async function useTensorCores(k: GpuKernels): Promise<string> {
  const t = k.gpu.subgroupMatrix;
  if (k.precision !== 'f16' || !t) return 'no subgroup matrices (tensor cores) on this adapter';
  const device = k.gpu.device;
  device.pushErrorScope('validation');
  device.pushErrorScope('internal');
  let worst = 0;
  let thrown = '';
  const made: GPUBuffer[] = [];
  const keep = (buffer: GPUBuffer) => (made.push(buffer), buffer);
  try {
    const [M, N, K] = [2 * 4 * t.m, 2 * 2 * t.n, 3 * t.k];
    const flags = keep(upload(k.gpu, new Uint32Array(2)));
    const cast = new Cast(k);
    const half = (n: number, seed: number) => {
      const x = keep(
        upload(
          k.gpu,
          Float32Array.from({ length: n }, (_, i) => Math.sin(i * 12.9898 + seed) / 2),
        ),
      );
      const y = keep(allocate(k.gpu, n * 2));
      submit(k.gpu, (pass) => cast.encode(pass, x, y, n, flags, 0));
      return y;
    };
    const [a, b] = [half(M * K, 1), half(K * N, 2)];
    for (const transposeA of [false, true])
      for (const transposeB of [false, true])
        for (const accumulate of [false, true]) {
          const s = { m: M, n: N, k: K, transposeA, transposeB, accumulate, half: true };
          const start = Float32Array.from({ length: M * N }, (_, i) => (i % 7) - 3);
          const [plain, tensor] = [keep(upload(k.gpu, start)), keep(upload(k.gpu, start))];
          submit(k.gpu, (pass) => new Matmul(k).encode(pass, a, b, plain, s));
          k.tensorCores = t;
          submit(k.gpu, (pass) => new Matmul(k).encode(pass, a, b, tensor, s));
          k.tensorCores = null;
          const [want, got] = [await download(k.gpu, plain, M * N), await download(k.gpu, tensor, M * N)];
          for (let i = 0; i < want.length; i++)
            worst = Math.max(worst, Math.abs(got[i]! - want[i]!) / (1 + Math.abs(want[i]!)));
        }
  } catch (error) {
    thrown = (error as Error).message.split('\n')[0]!;
  } finally {
    k.tensorCores = null;
    for (const buffer of made) buffer.destroy();
  }
  const errors = [await device.popErrorScope(), await device.popErrorScope()].filter((e) => e !== null);
  const tiles = `subgroup matrices of ${t.m}×${t.n}×${t.k}`;
  const failed = errors[0]?.message.split('\n')[0] ?? thrown;
  if (failed) return `the ordinary cores (the tensor cores' GEMM, ${tiles}, failed: ${failed})`;
  if (!(worst < 1e-4)) return `the ordinary cores (the tensor cores' GEMM, ${tiles}, was off by ${worst})`;
  k.tensorCores = t;
  return `the tensor cores (${tiles})`;
}
