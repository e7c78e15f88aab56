// The device a command runs on: where training, scoring and decoding go, chosen once at the command's start
// (`--backend`, `--precision`) and handed to whatever trains, scores or decodes. Three engines run a model
// (docs/trainer.md, "Backends"):
// - the GPU: prefab's WGSL kernels through WebGPU (Dawn), runtime/webgpu/;
// - the CPU path: prefab's C kernels, OpenBLAS's GEMM and C loops on every core, runtime/cpu/;
// - the reference: the readable model of model/llama.ts on TensorFlow.js's WebAssembly backend, which every
//   engine is tested against, and which trains (slowly) where the C kernels were not built.
// TensorFlow.js runs on WebAssembly beside either engine: every trainer's loss is its code (trainers/step.ts).
// This module is loaded by every command (it adds the options): what it opens is imported when it opens.
import { availableParallelism } from 'node:os';
import { Option, type Command } from 'commander';
import type { CommandFactory } from '../pipeline/commands.ts';
import type { StageOptions } from '../pipeline/stage.ts';
import type { Logger } from '../pipeline/log.ts';
import type { CpuKernels } from './cpu/kernels.ts';
import type { GpuKernels } from './webgpu/kernel.ts';

const BACKENDS = ['auto', 'cpu', 'webgpu', 'wasm'] as const;
export type BackendChoice = (typeof BACKENDS)[number];

/** How the GPU multiplies: `f16` is mixed precision (runtime/webgpu/precision.ts); `auto` picks it where it is faster. */
const PRECISIONS = ['auto', 'f32', 'f16'] as const;
export type PrecisionChoice = (typeof PRECISIONS)[number];

declare module '../pipeline/stage.ts' {
  interface StageOptions {
    /** `--backend`, one of BACKENDS (commander refuses any other); absent: auto. */
    readonly backend?: BackendChoice;
    /** `--precision`, one of PRECISIONS; absent: auto. */
    readonly precision?: PrecisionChoice;
    /** The command's device, opened at its first use (a command that trains nothing never opens it): addBackendOption. */
    readonly device?: () => Promise<Device>;
  }
}

/** Where one phase of the work runs. */
export type Engine =
  { kind: 'gpu'; kernels: GpuKernels } | { kind: 'cpu'; kernels: CpuKernels } | { kind: 'reference' };

/** Where a command's work runs, and why: made once by openDevice, passed to what trains, scores and decodes. */
export interface Device {
  /** What `--backend` asked for. */
  readonly backend: BackendChoice;
  /** The GPU's kernels where it was opened: `webgpu`, or `auto` on a GPU of hardware. */
  readonly gpu: GpuKernels | null;
  /** The C kernels for the CPU's share (`cpu`, or `auto` where they are built); null: the reference runs it. */
  readonly cpu: CpuKernels | null;
  /** `auto` with a GPU: each phase is timed on the GPU and the CPU and runs where faster (runtime/placement.ts). */
  readonly placesEachPhase: boolean;
  /** What runs where, and why, for the log. */
  readonly description: string;
  /** auto's measurements, one a phase and shape, made once for this device (runtime/placement.ts). */
  readonly probes: Map<string, Promise<boolean>>;
}

/**
 * A device that runs every phase on `engine` (what `--backend cpu`, `webgpu` and `wasm` open), for a caller that
 * holds its kernels already (a bench, a test). The C kernels' loops and OpenBLAS are set to every core.
 */
export function deviceOn(engine: Engine, description: string = engineName(engine)): Device {
  const backend = engine.kind === 'gpu' ? 'webgpu' : engine.kind === 'cpu' ? 'cpu' : 'wasm';
  const cpu = engine.kind === 'cpu' ? engine.kernels : null;
  cpu?.setThreads(availableParallelism());
  const gpu = engine.kind === 'gpu' ? engine.kernels : null;
  return { backend, gpu, cpu, placesEachPhase: false, description, probes: new Map() };
}

/** The engine of the CPU's share of the work: the C kernels where the device has them, else the reference. */
export const cpuEngine = (device: Device): Engine =>
  device.cpu ? { kind: 'cpu', kernels: device.cpu } : { kind: 'reference' };

/** The engine every phase runs on unless auto places it elsewhere: the GPU where it is open, else the CPU's. */
export const mainEngine = (device: Device): Engine =>
  device.gpu ? { kind: 'gpu', kernels: device.gpu } : cpuEngine(device);

/** An engine's name as the logs and summaries say it: webgpu, cpu (the C kernels) or wasm (the reference). */
export const engineName = (engine: Engine): string =>
  engine.kind === 'gpu' ? 'webgpu' : engine.kind === 'cpu' ? 'cpu' : 'wasm';

/**
 * TensorFlow.js on its WebAssembly backend, which the reference model and every loss run on: loaded when a
 * device is first opened rather than with this module, so commands that train nothing never pay for it.
 * Returns why not where WebAssembly does not start (tfjs's plain-JavaScript backend then runs instead).
 */
async function startTf(): Promise<string | null> {
  const tf = await import('@tensorflow/tfjs-core');
  await import('@tensorflow/tfjs-backend-wasm');
  await import('@tensorflow/tfjs'); // the CPU backend, and in its Node bundle the gradients of tfjs's ops
  let fallback: string | null = null;
  if (!(await tf.setBackend('wasm').catch(() => false))) {
    fallback = "TensorFlow.js's WebAssembly backend failed to start: its plain-JavaScript one runs instead";
    if (!(await tf.setBackend('cpu'))) throw new Error('TensorFlow.js: no backend starts here');
  }
  await tf.ready();
  tf.env().set('PROD', true); // no per-op NaN checks or debug warnings
  if (!fallback) (await import('../model/ops.ts')).patchWasmSlice();
  return fallback;
}

/**
 * Opens the device `--backend` asks for (auto when absent): `webgpu` the GPU, `cpu` the C kernels, `wasm` the
 * reference; `auto` a GPU of hardware where WebGPU finds one (a CPU implementation of Vulkan, such as lavapipe,
 * does not count), else the C kernels where they are built, else the reference. `precision` is the GPU's.
 */
export async function openDevice(o: { backend?: BackendChoice; precision?: PrecisionChoice } = {}): Promise<Device> {
  const backend = o.backend ?? 'auto';
  const precision = o.precision ?? 'auto';
  const tfNote = await startTf();
  const cpu = (await import('./cpu/kernels.ts')).loadCpuKernels();
  const threads = availableParallelism();
  const said = (description: string) => (tfNote ? `${description}; ${tfNote}` : description);
  const made = (d: Omit<Device, 'backend' | 'probes'>): Device => {
    // The C kernels' loops and OpenBLAS share every core.
    d.cpu?.setThreads(threads);
    return { ...d, description: said(d.description), backend, probes: new Map() };
  };
  const onCpu = cpu.kernels
    ? `prefab's C kernels on ${threads} threads (${cpu.why}) train, score and decode`
    : `the reference model on TensorFlow.js's WebAssembly backend trains, scores and decodes, on one thread and several times slower than the C kernels, which are not here (${cpu.why})`;
  if (backend === 'wasm')
    return deviceOn(
      { kind: 'reference' },
      said('wasm: the reference model on TensorFlow.js’s WebAssembly backend trains, scores and decodes'),
    );
  if (backend === 'cpu') {
    if (!cpu.kernels)
      throw new Error(
        `--backend cpu: the C kernels are not here (${cpu.why}). Use --backend wasm (the reference model, several times slower).`,
      );
    return deviceOn({ kind: 'cpu', kernels: cpu.kernels }, said(`cpu: ${onCpu}`));
  }
  if (backend === 'auto') {
    const probe = await (await import('./webgpu/device.ts')).probeGpu();
    if (!probe.hardware)
      return made({
        gpu: null,
        cpu: cpu.kernels,
        placesEachPhase: false,
        description: `${cpu.kernels ? 'cpu' : 'wasm'}: ${onCpu} (auto: ${probe.why})`,
      });
  }
  const gpu = await openGpuKernels(precision).catch((error: Error) => {
    throw new Error(`--backend ${backend}: ${error.message}`);
  });
  const auto = backend === 'auto';
  return made({
    gpu: gpu.kernels,
    cpu: auto ? cpu.kernels : null,
    placesEachPhase: auto,
    description:
      `webgpu on ${gpu.adapter} trains, scores and decodes, ${gpu.how}` +
      (auto
        ? `; each phase is timed there and on the CPU, where ${cpu.kernels ? "prefab's C kernels run it" : `the reference model runs it (the C kernels: ${cpu.why})`}, and runs where faster`
        : ''),
  });
}

/**
 * The GPU's kernels at `precision`: auto is mixed precision where the tensor cores (subgroup matrices) multiply
 * it, checked against the ordinary cores when the device opens, and f32 elsewhere, where f16 has not been shown
 * faster. Returns the adapter's name and how it multiplies, for the log.
 */
async function openGpuKernels(
  precision: PrecisionChoice,
): Promise<{ kernels: GpuKernels; adapter: string; how: string }> {
  const gpu = await (await import('./webgpu/device.ts')).openGpu();
  const { GpuKernels } = await import('./webgpu/kernel.ts');
  const { useTensorCores } = await import('./webgpu/precision.ts');
  const wanted = precision === 'f16' || (precision === 'auto' && gpu.f16 && gpu.subgroupMatrix !== null);
  let kernels = new GpuKernels(gpu, { precision: wanted ? 'f16' : 'f32' });
  const on = await useTensorCores(kernels);
  if (precision === 'auto' && kernels.precision === 'f16' && !kernels.tensorCores)
    kernels = new GpuKernels(gpu, { precision: 'f32' });
  const how =
    kernels.precision === 'f16'
      ? `in mixed precision (f16 products summed in f32, dynamic loss scaling; tensor cores: ${on})`
      : `in f32${precision === 'auto' ? ` (auto: f16 on tensor cores only; ${on})` : ''}`;
  return { kernels, adapter: gpu.adapter.description, how };
}

/**
 * A stage's or a command's device: the one its command opened (StageOptions.device), else one opened here for
 * it (a stage run outside the CLI); said in the log once a stage.
 */
export async function deviceFor(options: StageOptions, log: Logger): Promise<Device> {
  const device = await (options.device?.() ?? openDevice(options));
  log.info('backend', { backend: device.description });
  if (options.precision === 'f16' && !device.gpu)
    log.warn('precision', { precision: 'f16 is for the GPU (--backend webgpu); this device trains in f32' });
  return device;
}

/** A command's global options, `--backend` and its device among them, as the stages get them. */
export const commandOptions = (program: Command): StageOptions => program.opts<StageOptions>();

/**
 * `--backend` and `--precision` on every command, and the device they name: opened once a command, at its first
 * use, and handed to the stages and commands in their options (StageOptions.device).
 */
export const addBackendOption: CommandFactory = (program) => {
  program.addOption(
    new Option(
      '--backend <name>',
      "where training, scoring and decoding run (auto: a GPU of hardware through WebGPU, else prefab's C kernels on every CPU core, else the reference model on WebAssembly; cpu: the C kernels; webgpu: the GPU; wasm: the reference model, the slowest)",
    ).choices([...BACKENDS]),
  );
  program.addOption(
    new Option(
      '--precision <name>',
      "the GPU's arithmetic (f16: mixed precision, f16 products summed in f32 with f32 weights and dynamic loss scaling, where the adapter offers shader-f16; auto: f16 where its products run on the tensor cores, checked when the GPU opens, else f32)",
    ).choices([...PRECISIONS]),
  );
  program.hook('preAction', (root) => {
    const o = root.opts<StageOptions>();
    let opened: Promise<Device> | null = null;
    root.setOptionValue('device', () => (opened ??= openDevice({ backend: o.backend, precision: o.precision })));
  });
};
