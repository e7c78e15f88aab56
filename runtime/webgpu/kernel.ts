// What every kernel's host side shares: pipelines made once for each shader and its constants, uniform
// buffers made once for each value, and a dispatch with its bind group; and WGSL's sum or max over a
// workgroup of 256 threads.
/// <reference types="@webgpu/types" />
import type { Gpu } from './device.ts';

/** What a GEMM's operands are: f32, or f16 (mixed precision, with f32 master weights and sums). */
export type Precision = 'f32' | 'f16';

export class GpuKernels {
  private readonly modules = new Map<string, GPUShaderModule>();
  private readonly pipelines = new Map<string, GPUComputePipeline>();
  private readonly uniforms = new Map<string, GPUBuffer>();

  /**
   * The most bytes a storage binding may hold: the device's maxStorageBufferBindingSize, or fewer where a
   * test asks (so that splitting a tensor across bindings is checked on small models).
   */
  readonly bindingBytes: number;

  /** How the models on these kernels multiply: f32, or f16 products summed in f32 (precision.ts). */
  readonly precision: Precision;

  /** Mixed precision's GEMMs on the tensor cores, once precision.ts useTensorCores found them right there; null: the ordinary cores. */
  tensorCores: Gpu['subgroupMatrix'] = null;

  constructor(
    readonly gpu: Gpu,
    o: { bindingBytes?: number; precision?: Precision } = {},
  ) {
    this.bindingBytes = Math.min(o.bindingBytes ?? Infinity, gpu.device.limits.maxStorageBufferBindingSize);
    this.precision = o.precision ?? 'f32';
    if (this.precision === 'f16' && !gpu.f16)
      throw new Error(`precision f16: the adapter ${gpu.adapter.description} offers no shader-f16; use f32`);
  }

  /** The pipeline of `code` (entry point main) with its `override` constants set. */
  pipeline(code: string, constants: Record<string, number> = {}): GPUComputePipeline {
    const key = `${JSON.stringify(constants)}\n${code}`;
    let pipeline = this.pipelines.get(key);
    if (!pipeline) {
      let module = this.modules.get(code);
      if (!module) this.modules.set(code, (module = this.gpu.device.createShaderModule({ code })));
      pipeline = this.gpu.device.createComputePipeline({
        layout: 'auto',
        compute: { module, entryPoint: 'main', constants },
      });
      this.pipelines.set(key, pipeline);
    }
    return pipeline;
  }

  /** A uniform buffer holding `bytes`, made once for each content (a training step repeats its shapes). */
  uniform(bytes: ArrayBuffer): GPUBuffer {
    const key = Buffer.from(bytes).toString('hex');
    let buffer = this.uniforms.get(key);
    if (!buffer) {
      buffer = this.gpu.device.createBuffer({
        size: Math.max(16, bytes.byteLength),
        usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
      });
      this.gpu.device.queue.writeBuffer(buffer, 0, bytes);
      this.uniforms.set(key, buffer);
    }
    return buffer;
  }

  private readonly spent: GPUBuffer[] = [];

  /**
   * A uniform buffer holding `bytes` for work submitted next, not kept for reuse (a decoding step's positions
   * change every step): release() frees it once that work is submitted.
   */
  transient(bytes: ArrayBuffer): GPUBuffer {
    const buffer = this.gpu.device.createBuffer({
      size: Math.max(16, bytes.byteLength),
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST,
    });
    this.gpu.device.queue.writeBuffer(buffer, 0, bytes);
    this.spent.push(buffer);
    return buffer;
  }

  /** Frees the transient uniforms, once the work that uses them is submitted: WebGPU keeps a destroyed buffer's memory until submitted work that uses it is done. */
  release(): void {
    for (const buffer of this.spent.splice(0)) buffer.destroy();
  }

  /** Records `pipeline` over `buffers` (bindings 0, 1, … in order; a buffer whole or a part of one) on a grid of workgroups. */
  dispatch(
    pass: GPUComputePassEncoder,
    pipeline: GPUComputePipeline,
    buffers: Binding[],
    x: number,
    y = 1,
    z = 1,
  ): void {
    pass.setPipeline(pipeline);
    pass.setBindGroup(
      0,
      this.gpu.device.createBindGroup({
        layout: pipeline.getBindGroupLayout(0),
        entries: buffers.map((b, binding) => ({ binding, resource: 'buffer' in b ? b : { buffer: b } })),
      }),
    );
    pass.dispatchWorkgroups(x, y, z);
  }
}

/** A storage buffer bound whole, or a range of one (its offset a multiple of 256 bytes, WebGPU's largest alignment). */
export type Binding = GPUBuffer | GPUBufferBinding;

/** The f32s (or elements of `bytes` each) from `at` for `length` of them in `buffer`, as a binding: `at` must start on 256 bytes. */
export function part(buffer: GPUBuffer, at: number, length: number, bytes = 4): GPUBufferBinding {
  if ((at * bytes) % 256 !== 0)
    throw new Error(`webgpu: a part of a buffer must start at a multiple of 256 bytes, not ${at * bytes}`);
  return { buffer, offset: at * bytes, size: Math.max(4, Math.ceil((length * bytes) / 4) * 4) };
}

/**
 * A vector of `n` f32s in pieces that each fit a binding of `bindingBytes`, each starting at a multiple of 128
 * elements (where a binding may start, for its f32s and for an f16 copy's): [at, length].
 */
export function pieces(bindingBytes: number, n: number): [number, number][] {
  const size = Math.max(128, Math.floor(bindingBytes / 4 / 128) * 128);
  const out: [number, number][] = [];
  for (let at = 0; at < Math.max(1, n); at += size) out.push([at, Math.min(size, n - at)]);
  return out;
}

/** How many elements (f32s, or of `bytes` each) a binding holds. */
export const lengthOf = (b: Binding, bytes = 4) =>
  ('buffer' in b ? (b.size ?? b.buffer.size - (b.offset ?? 0)) : b.size) / bytes;

/**
 * The elements [from, to) of a binding (f32s, or of `bytes` each) as a binding of their own: its start moved
 * back to where a binding may start (a multiple of 256 bytes), and `skip`, how many elements into it `from` lies.
 */
export function span(b: Binding, from: number, to: number, bytes = 4): { binding: GPUBufferBinding; skip: number } {
  const [buffer, base] = 'buffer' in b ? [b.buffer, b.offset ?? 0] : [b, 0];
  const start = base + from * bytes;
  const offset = start - (start % 256);
  const end = base + to * bytes;
  return { binding: { buffer, offset, size: Math.ceil((end - offset) / 4) * 4 }, skip: (start - offset) / bytes };
}

/**
 * Workgroups for `n` elements at 256 threads each, as a 2-D grid past 65,535 of them; a shader finds its
 * element as id.x + id.y · num_workgroups.x · 256.
 */
export function grid(n: number): [number, number] {
  const groups = Math.ceil(n / 256);
  const x = Math.min(groups, 65535);
  return [x, Math.ceil(groups / x)];
}

/**
 * WGSL of a kernel from what differs between kernels: its storage `buffers` in binding order (`name: type`,
 * `mut name: type` for those it writes; arrays of that type), then a uniform `d` of struct Dims { `dims` },
 * and `body` inside main, laid out by `threads`:
 * - `element`: a thread an element, dispatched with grid(n); Dims starts with n, and `body` sees `i` < d.n;
 * - `row`: a workgroup of 256 threads a row (workgroup x), `body` sees `row` and `lid` and can reduce();
 * - `block`: workgroups on three axes, `body` sees `wg` and `lid` and can reduce().
 * `head`: declarations before (override constants, helper functions).
 */
export function kernel(o: {
  threads: 'element' | 'row' | 'block';
  buffers: string[];
  dims: string;
  body: string;
  head?: string;
}): string {
  const bindings = o.buffers.map((b, k) => {
    const [, mut, name, type] = /^(mut )?(\w+): ([\w<>]+)$/.exec(b)!;
    return `@group(0) @binding(${k}) var<storage, ${mut ? 'read_write' : 'read'}> ${name}: array<${type}>;`;
  });
  const main =
    o.threads === 'element'
      ? `fn main(@builtin(global_invocation_id) id: vec3u, @builtin(num_workgroups) groups: vec3u) {
  let i = id.x + id.y * groups.x * 256u;
  if (i >= d.n) { return; }`
      : `fn main(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_id) lid: vec3u) {${o.threads === 'row' ? '\n  let row = wg.x;' : ''}`;
  return `struct Dims { ${o.dims} }
${o.threads === 'element' ? '' : WORKGROUP_REDUCE}
${o.head ?? ''}
${bindings.join('\n')}
@group(0) @binding(${o.buffers.length}) var<uniform> d: Dims;

@compute @workgroup_size(256)
${main}
${o.body}
}
`;
}

/** kernel() with a thread an element: Dims is n, then `dims`. */
export const elementwise = (o: { buffers: string[]; dims?: string; body: string; head?: string }) =>
  kernel({ ...o, threads: 'element', dims: `n: u32${o.dims ? `, ${o.dims}` : ''}` });

/** Bytes of u32 and f32 fields in order, for a uniform struct of 4-byte fields. */
export function fields(...values: ({ u32: number } | { f32: number })[]): ArrayBuffer {
  const bytes = new ArrayBuffer(values.length * 4);
  const view = new DataView(bytes);
  values.forEach((v, i) => ('u32' in v ? view.setUint32(i * 4, v.u32, true) : view.setFloat32(i * 4, v.f32, true)));
  return bytes;
}

/** WGSL: reduce(t, value, is_max) sums (or takes the max of) one value from each of 256 threads. */
export const WORKGROUP_REDUCE = /* wgsl */ `
var<workgroup> partial: array<f32, 256>;

fn reduce(t: u32, value: f32, is_max: bool) -> f32 {
  partial[t] = value;
  workgroupBarrier();
  for (var stride = 128u; stride > 0u; stride >>= 1u) {
    if (t < stride) {
      if (is_max) { partial[t] = max(partial[t], partial[t + stride]); } else { partial[t] += partial[t + stride]; }
    }
    workgroupBarrier();
  }
  let total = partial[0];
  workgroupBarrier();
  return total;
}
`;
