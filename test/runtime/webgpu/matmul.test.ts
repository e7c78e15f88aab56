// The GPU GEMM (runtime/webgpu/matmul.ts) against a float64 product on the CPU: every combination of
// transposes, ragged shapes that do not fill a block, both block sizes, batches, accumulation, and products
// split across bindings. It runs wherever a WebGPU adapter is; CI installs lavapipe (a CPU Vulkan driver) so that it always runs there, and fails
// rather than skips when none is found. Elsewhere without one, it is skipped with the reason printed.
import { describe, expect, it } from 'vitest';
import type { Gpu } from '../../../runtime/webgpu/device.ts';
import { absent, gpu as here, f16Values, kernels, noGpu, relativeError } from '../../fixtures/webgpu.ts';
import { allocate, download, submit, upload } from '../../../runtime/webgpu/buffers.ts';
import { Cast } from '../../../runtime/webgpu/precision.ts';
import { Matmul, type MatmulShape } from '../../../runtime/webgpu/matmul.ts';
import { GpuKernels } from '../../../runtime/webgpu/kernel.ts';
import { seeded } from '../../../core/random.ts';

/** One set of pipelines for every product (compiling them is what costs on a CPU driver). */
const matmul = kernels ? new Matmul(kernels) : null;

/** op(A)·op(B) (+ C) in float64, from the stored (row-major) operands. */
function reference(a: Float32Array, b: Float32Array, c: Float32Array, s: MatmulShape): Float64Array {
  const { m, n, k } = s;
  const batch = s.batch ?? 1;
  const out = new Float64Array(batch * m * n);
  for (let z = 0; z < batch; z++) {
    for (let i = 0; i < m; i++) {
      for (let j = 0; j < n; j++) {
        let sum = s.accumulate ? c[z * m * n + i * n + j]! : 0;
        for (let p = 0; p < k; p++) {
          const av = s.transposeA ? a[z * m * k + p * m + i]! : a[z * m * k + i * k + p]!;
          const bv = s.transposeB ? b[z * k * n + j * k + p]! : b[z * k * n + p * n + j]!;
          sum += av * bv;
        }
        out[z * m * n + i * n + j] = sum;
      }
    }
  }
  return out;
}

async function check(gpu: Gpu, s: MatmulShape, seed: string, product = matmul!): Promise<number> {
  const random = seeded('webgpu-matmul', seed);
  const values = (n: number) => Float32Array.from({ length: n }, () => random() * 2 - 1);
  const batch = s.batch ?? 1;
  const [a, b, c] = [values(batch * s.m * s.k), values(batch * s.k * s.n), values(batch * s.m * s.n)];
  const [ga, gb, gc] = [upload(gpu, a), upload(gpu, b), upload(gpu, c)];
  submit(gpu, (pass) => product.encode(pass, ga, gb, gc, s));
  const got = await download(gpu, gc, c.length);
  const want = reference(a, b, c, s);
  let worst = 0;
  for (let i = 0; i < want.length; i++)
    worst = Math.max(worst, Math.abs(got[i]! - want[i]!) / (1 + Math.abs(want[i]!)));
  for (const buffer of [ga, gb, gc]) buffer.destroy();
  return worst;
}

describe('the WebGPU GEMM', () => {
  it.skipIf(absent)('finds an adapter (in CI always: .ci/run installs lavapipe where there is no GPU)', () => {
    expect(noGpu).toBeNull();
    expect(here!.adapter.description.length).toBeGreaterThan(0);
  });

  it.skipIf(absent)('multiplies like float64 within 1e-5 relative, for every transpose and ragged shapes', async () => {
    const gpu = here!;
    const shapes: [number, number, number][] = [
      [1, 1, 1],
      [5, 7, 3],
      [64, 64, 16],
      [70, 130, 33],
      [128, 96, 257],
      [3, 200, 64],
      [130, 257, 70],
      [256, 128, 33],
    ];
    // Each block size on every shape: by default the 64×64 kernel where M or N is under 128.
    for (const [tile, product] of [
      ['by size', matmul!],
      [128, new Matmul(kernels!, { tile: 128 })],
    ] as const)
      for (const [m, n, k] of shapes) {
        for (const transposeA of [false, true]) {
          for (const transposeB of [false, true]) {
            const what = `${m}×${n}×${k} transposeA=${transposeA} transposeB=${transposeB} tile ${tile}`;
            expect(await check(gpu, { m, n, k, transposeA, transposeB }, what, product), what).toBeLessThan(1e-5);
          }
        }
      }
  });

  it.skipIf(absent)('runs a batch of independent products, and adds to C when accumulating', async () => {
    const gpu = here!;
    expect(await check(gpu, { m: 33, n: 17, k: 40, batch: 5 }, 'batch')).toBeLessThan(1e-5);
    expect(await check(gpu, { m: 140, n: 130, k: 20, batch: 2, accumulate: true }, 'batch 128')).toBeLessThan(1e-5);
    expect(
      await check(gpu, { m: 33, n: 17, k: 40, batch: 3, transposeB: true, accumulate: true }, 'accumulate'),
    ).toBeLessThan(1e-5);
  });

  it.skipIf(absent)(
    'splits a product whose operands do not fit one binding into blocks, each operand read from a span',
    async () => {
      const gpu = here!;
      // 2 KiB a binding: a 70×130 matrix is 36 KiB, so M, N and K are cut into blocks whatever the transposes.
      const split = new Matmul(new GpuKernels(gpu, { bindingBytes: 2048 }));
      for (const transposeA of [false, true])
        for (const transposeB of [false, true])
          for (const accumulate of [false, true]) {
            const s = { m: 70, n: 130, k: 33, transposeA, transposeB, accumulate };
            const what = `transposeA=${transposeA} transposeB=${transposeB} accumulate=${accumulate}`;
            expect(await check(gpu, s, `split:${what}`, split), what).toBeLessThan(1e-5);
          }
      expect(() =>
        submit(gpu, (pass) => {
          const one = upload(gpu, new Float32Array(600));
          split.encode(pass, one, one, one, { m: 1, n: 1, k: 600 });
        }),
      ).toThrow(/row too long for one binding/);
    },
  );

  it.skipIf(absent || !here?.f16)(
    'multiplies f16 operands summing in f32 (mixed precision), whole and split across bindings',
    async () => {
      const gpu = here!;
      const flags = upload(gpu, new Uint32Array(2));
      const cast = new Cast(kernels!);
      const random = seeded('webgpu-matmul-f16');
      /** `n` values as f16 on the GPU (cast there) and as the numbers they hold. */
      const operand = async (n: number) => {
        const f32 = upload(
          gpu,
          Float32Array.from({ length: n }, () => random() * 2 - 1),
        );
        const f16 = allocate(gpu, n * 2);
        submit(gpu, (pass) => cast.encode(pass, f32, f16, n, flags, 0));
        const bits = new Uint16Array((await download(gpu, f16, Math.ceil(n / 2))).buffer).slice(0, n);
        return { f16, values: Float32Array.from(f16Values(bits)) };
      };
      // 8 KiB a binding: every operand of both shapes is cut (at 2 KiB the larger takes 134k products).
      const split = new Matmul(new GpuKernels(gpu, { bindingBytes: 8192 }));
      for (const [m, n, k] of [
        [70, 130, 33],
        [130, 257, 70],
      ] as const)
        for (const transposeA of [false, true])
          for (const transposeB of [false, true])
            for (const [how, product] of [
              ['whole', matmul!],
              ['split', split],
            ] as const) {
              const s = { m, n, k, transposeA, transposeB, half: true };
              const [a, b] = [await operand(m * k), await operand(k * n)];
              const c = upload(gpu, new Float32Array(m * n));
              submit(gpu, (pass) => product.encode(pass, a.f16, b.f16, c, s));
              const want = reference(a.values, b.values, new Float32Array(m * n), s);
              const what = `${m}×${n}×${k} transposeA=${transposeA} transposeB=${transposeB} ${how}`;
              expect(relativeError(await download(gpu, c, m * n), want), what).toBeLessThan(1e-5);
            }
    },
  );
});
