// The GPU, through WebGPU: Dawn's `dawn.node` from the optional `webgpu` package, which drives the GPU through
// Vulkan on Linux (Metal on macOS, D3D12 on Windows). Without a GPU, Mesa's lavapipe is a Vulkan driver on
// the CPU: the same kernels run there, slowly, which is how CI tests them (.ci/run installs it).
/// <reference types="@webgpu/types" />

export interface Gpu {
  /** Dawn's instance: held for as long as the device lives (dawn.node crashes when it is collected first). */
  instance: GPU;
  device: GPUDevice;
  /** What the adapter says it is, for logs and test output. */
  adapter: { vendor: string; architecture: string; description: string };
  /** A CPU implementation of Vulkan (lavapipe, SwiftShader): right, but no faster than the CPU paths. */
  software: boolean;
  /** The first error the device reported (a shader that does not compile, a binding that does not fit), or null: reading results back throws it. */
  failure: string | null;
  /** Whether shaders may use f16 (the adapter offers `shader-f16`, and the device was asked for it): mixed precision's products. */
  f16: boolean;
  /**
   * The tensor cores, as WebGPU's subgroup matrices (Dawn's chromium-experimental-subgroup-matrix, behind its
   * allow_unsafe_apis toggle): the tile sizes of an f16 × f16 → f32 product a subgroup makes, and the largest
   * subgroup; null where the adapter offers none (then mixed precision multiplies on the ordinary cores).
   */
  subgroupMatrix: { m: number; n: number; k: number; subgroup: number } | null;
  /** Bytes of storage buffers held now and at most so far (buffers.ts allocate() counts them; uniforms are not). */
  memory: { now: number; peak: number };
}

/** Why there is no GPU here, when there is none: for the log and the error a user sees. */
class NoGpu extends Error {}

/** An adapter found, before a device is asked of it. */
interface Found {
  instance: GPU;
  adapter: GPUAdapter;
  description: Gpu['adapter'];
  software: boolean;
}

let found: Promise<Found> | null = null;
let opened: Promise<Gpu> | null = null;

/** The adapter WebGPU offers here, looked for once a process; throws NoGpu, saying what to install, where there is none. */
function findAdapter(): Promise<Found> {
  found ??= find();
  return found;
}

/**
 * Whether a GPU of hardware is here (not a CPU implementation of Vulkan), and if not why: what `--backend auto`
 * asks before choosing webgpu. Asked in a child process, so that Dawn's own warnings on stderr (no Vulkan
 * loader, a software driver's reduced limits) never reach the user's terminal: the log says what was chosen
 * and why, once. Never throws.
 */
export async function probeGpu(): Promise<{ hardware: boolean; why: string }> {
  let webgpu: string;
  try {
    webgpu = import.meta.resolve('webgpu');
  } catch {
    return { hardware: false, why: 'the optional package webgpu is not installed' };
  }
  const script = [
    `const webgpu = await import(${JSON.stringify(webgpu)});`,
    "const adapter = await webgpu.create([]).requestAdapter({ powerPreference: 'high-performance' });",
    'const i = adapter?.info;',
    'process.stdout.write(JSON.stringify(i ? { vendor: i.vendor, architecture: i.architecture, device: i.device, description: i.description } : null));',
    'process.exit(0);',
  ].join('\n');
  const { execFile } = await import('node:child_process');
  return new Promise((done) => {
    execFile(
      process.execPath,
      ['--input-type=module', '-e', script],
      { timeout: 60_000, encoding: 'utf8' },
      (error, stdout) => {
        let info: GPUAdapterInfo | null | undefined;
        try {
          info = JSON.parse(stdout) as GPUAdapterInfo | null;
        } catch {
          info = undefined;
        }
        if (info === undefined)
          return done({
            hardware: false,
            why: `WebGPU did not start here (${error?.message.split('\n')[0] ?? 'no answer'})`,
          });
        if (info === null) return done({ hardware: false, why: 'WebGPU found no adapter (no Vulkan driver)' });
        const description = describe(info);
        if (isSoftware(info, description))
          return done({ hardware: false, why: `the only adapter, ${description}, is a CPU implementation of Vulkan` });
        done({ hardware: true, why: `a GPU: ${description}` });
      },
    );
  });
}

/** What an adapter says it is. */
const describe = (info: GPUAdapterInfo) => info.description || `${info.vendor} ${info.device}`.trim();

/** Whether an adapter is a CPU implementation of Vulkan (lavapipe, SwiftShader). */
const isSoftware = (info: GPUAdapterInfo, description: string) =>
  info.architecture === 'software' || /llvmpipe|lavapipe|swiftshader/i.test(`${description} ${info.device}`);

/**
 * The GPU device, opened once a process. Asks for the adapter's own limits on storage buffers a stage and
 * workgroup memory (the defaults are lower). Throws NoGpu, saying what to install, where there is none.
 */
export function openGpu(): Promise<Gpu> {
  opened ??= findAdapter().then(open);
  return opened;
}

async function find(): Promise<Found> {
  let webgpu: { create(flags: string[]): GPU; globals: object };
  try {
    webgpu = (await import('webgpu')) as typeof webgpu;
  } catch (error) {
    throw new NoGpu(
      `the optional package webgpu is not installed or does not load here (${(error as Error).message}); run npm ci on linux-x64, macOS or Windows`,
    );
  }
  // GPUBufferUsage, GPUMapMode and the rest, as a browser has them.
  for (const [name, value] of Object.entries(webgpu.globals))
    if (!(name in globalThis)) Object.assign(globalThis, { [name]: value });
  // Unsafe APIs allowed: the subgroup matrices (tensor cores) are among them.
  const instance = webgpu.create(['enable-dawn-features=allow_unsafe_apis']);
  const adapter = await instance.requestAdapter({ powerPreference: 'high-performance' });
  if (!adapter)
    throw new NoGpu(
      "WebGPU found no adapter: install the Vulkan loader and a driver (on Debian: libvulkan1 and your GPU vendor's driver; without a GPU, mesa-vulkan-drivers 25 or later from bookworm-backports is a CPU one)",
    );
  const info = adapter.info;
  const description = describe(info);
  return {
    instance,
    adapter,
    description: { vendor: info.vendor, architecture: info.architecture, description },
    software: isSoftware(info, description),
  };
}

async function open({ instance, adapter, description, software }: Found): Promise<Gpu> {
  const limits = adapter.limits;
  const f16 = adapter.features.has('shader-f16');
  const matrices = f16 && adapter.features.has('subgroups') ? tensorTiles(adapter) : null;
  const device = await adapter.requestDevice({
    requiredFeatures: [
      ...(f16 ? ['shader-f16' as const] : []),
      ...(matrices ? (['subgroups', 'chromium-experimental-subgroup-matrix'] as unknown as GPUFeatureName[]) : []),
    ],
    requiredLimits: {
      maxStorageBuffersPerShaderStage: limits.maxStorageBuffersPerShaderStage,
      maxComputeWorkgroupStorageSize: limits.maxComputeWorkgroupStorageSize,
      maxComputeInvocationsPerWorkgroup: limits.maxComputeInvocationsPerWorkgroup,
      maxStorageBufferBindingSize: limits.maxStorageBufferBindingSize,
      maxBufferSize: limits.maxBufferSize,
    },
  });
  const gpu: Gpu = {
    instance,
    device,
    adapter: description,
    software,
    failure: null,
    f16,
    subgroupMatrix: matrices,
    memory: { now: 0, peak: 0 },
  };
  // Thrown from here, an error would end the process: it is kept, and thrown where results are read.
  device.addEventListener('uncapturederror', (event) => {
    gpu.failure ??= (event as GPUUncapturedErrorEvent).error.message;
  });
  return gpu;
}

/** The adapter's subgroup matrix of f16 × f16 → f32 with the largest tiles, if it offers one (Gpu.subgroupMatrix). */
function tensorTiles(adapter: GPUAdapter): Gpu['subgroupMatrix'] {
  if (!adapter.features.has('chromium-experimental-subgroup-matrix' as GPUFeatureName)) return null;
  type Config = { componentType: string; resultComponentType: string; M: number; N: number; K: number };
  const info = adapter.info as GPUAdapterInfo & { subgroupMatrixConfigs?: Config[] };
  const configs = (info.subgroupMatrixConfigs ?? []).filter(
    (c) => c.componentType === 'f16' && c.resultComponentType === 'f32',
  );
  const best = configs.sort((x, y) => y.M * y.N * y.K - x.M * x.N * x.K)[0];
  // The GEMM's workgroup is one subgroup: only where every subgroup has the one size (NVIDIA's 32).
  const size = info.subgroupMaxSize;
  if (!best || !size || info.subgroupMinSize !== size) return null;
  return { m: best.M, n: best.N, k: best.K, subgroup: size };
}
