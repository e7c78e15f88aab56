// Which backend the trainer runs on. `auto` takes the fastest that works here: a GPU through WebGPU (a
// hardware adapter, not a CPU implementation of Vulkan), then the CPU path through ONNX Runtime (the optional
// onnxruntime-node package), then TensorFlow.js's native GPU build, then its native CPU build (both optional
// dependencies, whose install downloads libtensorflow and fails without internet), then WebAssembly, then
// plain JavaScript. `webgpu` opens the GPU for prefab's own kernels (runtime/webgpu/: every trainer's updates),
// `onnxruntime` ONNX Runtime for the CPU path's (runtime/cpu/: the updates and scoring, on every core); either
// runs TensorFlow.js on WebAssembly beside them.
import { availableParallelism } from 'node:os';
import { Option, type Command } from 'commander';
import type { CommandFactory } from '../pipeline/commands.ts';
import type { StageOptions } from '../pipeline/stage.ts';
import type { Logger } from '../pipeline/log.ts';
import type { Llama } from '../model/llama.ts';
import { nativeKernels, type NativeKernels } from './cpu/kernels.ts';
import type { OrtRuntime } from './onnx/onnx.ts';
import type { Kernels } from './webgpu/kernel.ts';
import type { BlockScorer } from './scoring.ts';

export const BACKENDS = ['auto', 'onnxruntime', 'tensorflow', 'wasm', 'cpu', 'webgpu'] as const;
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
  }
}

export interface Backend {
  /** The tfjs backend's name: tensorflow, wasm or cpu (wasm beside webgpu and onnxruntime). */
  name: string;
  /** What was chosen and why, for the log. */
  description: string;
  /** `webgpu`: the GPU's kernels, for the training updates; TensorFlow.js runs on WASM beside it. */
  gpu?: Kernels;
  /** `onnxruntime`: ONNX Runtime, for the training updates and scoring on the CPU; TensorFlow.js runs on WASM beside it. */
  ort?: OrtRuntime;
  /** Chosen by `auto`: then each phase goes where it is faster, the GPU or the CPU (runtime/placement.ts). */
  auto?: boolean;
}

type Tf = typeof import('@tensorflow/tfjs-core');

/**
 * TensorFlow.js, loaded when a backend is first chosen rather than with this module: commands that train
 * nothing (status, the data stages) never pay for loading it. The umbrella package registers the CPU backend
 * and, in its Node bundle, the gradients of tfjs's ops.
 */
async function loadTf(): Promise<Tf> {
  const tf = await import('@tensorflow/tfjs-core');
  await import('@tensorflow/tfjs-backend-wasm');
  await import('@tensorflow/tfjs');
  return tf;
}

async function loadNative(tf: Tf): Promise<string | null> {
  for (const pkg of ['@tensorflow/tfjs-node-gpu', '@tensorflow/tfjs-node']) {
    try {
      await import(pkg);
      if (tf.findBackend('tensorflow')) return pkg;
    } catch {
      // not installed, or libtensorflow missing: try the next one
    }
  }
  return null;
}

/** The backend `--backend` asks for in a stage's or a command's options (auto when absent), started, and said in the log. */
export async function chosenBackend(options: StageOptions, log: Logger): Promise<Backend> {
  const backend = await useBackend(options.backend ?? 'auto', options.precision ?? 'auto');
  log.info('backend', { backend: backend.description });
  if (options.precision === 'f16' && !backend.gpu)
    log.warn('precision', { precision: 'f16 is for the GPU (--backend webgpu); this backend trains in f32' });
  return backend;
}

/** A command's global options, `--backend` among them, as the stages get them. */
export const commandOptions = (program: Command): StageOptions => program.opts<StageOptions>();

let current: Backend | null = null;

/**
 * The CPU path's C kernels where the backend in use is the CPU path with them (or the GPU chosen by auto, whose
 * decoding may be placed on the CPU), else null: the decoder takes them too (runtime/decode.ts), so that
 * `--backend wasm` decodes as it always has.
 */
export const cpuKernels = (): NativeKernels | null =>
  current?.ort?.native ?? (current?.auto && current.gpu ? nativeKernels() : null);

/**
 * Loads and selects a backend; later calls with the same choice return the one already chosen. `precision`
 * is the GPU's (f16 elsewhere is said in the description, and ignored).
 */
export async function useBackend(
  choice: BackendChoice = 'auto',
  precision: PrecisionChoice = 'auto',
): Promise<Backend> {
  if (
    current &&
    (choice === 'auto' ||
      choice === current.name ||
      (choice === 'webgpu' && current.gpu && (precision === 'auto' || current.gpu.precision === precision)) ||
      (choice === 'onnxruntime' && current.ort))
  )
    return current;
  // A GPU of hardware goes first; a CPU implementation of Vulkan (lavapipe) is no faster than WASM. Then ONNX
  // Runtime on the CPU, several times WASM's speed where it loads.
  let noGpu = '';
  let ort: OrtRuntime | null = null;
  const auto = choice === 'auto';
  if (choice === 'auto') {
    const gpu = await (await import('./webgpu/device.ts')).probeGpu();
    if (gpu.hardware) choice = 'webgpu';
    else {
      noGpu = gpu.why;
      ort = await openOrt().catch((error: Error) => {
        noGpu += `; ${error.message}`;
        return null;
      });
      if (ort) choice = 'onnxruntime';
    }
  }
  const tf = await loadTf();
  if (choice === 'onnxruntime') {
    ort ??= await openOrt().catch((error: Error) => {
      throw new Error(`--backend onnxruntime: ${error.message}. Use --backend wasm.`);
    });
    await tf.setBackend('wasm');
    await tf.ready();
    tf.env().set('PROD', true);
    (await import('../model/ops.ts')).patchWasmSlice();
    current = {
      name: 'wasm',
      description: `onnxruntime on ${ort.threads} threads for training updates and scoring (${await nativeWhy()}), wasm for the rest${noGpu ? ` (${noGpu})` : ''}`,
      ort,
    };
    return current;
  }
  let description: string;
  let name: string;
  if (choice === 'auto' || choice === 'tensorflow') {
    const pkg = await loadNative(tf);
    if (pkg) {
      name = 'tensorflow';
      description = `tensorflow (${pkg})`;
    } else if (choice === 'tensorflow') {
      throw new Error(
        '--backend tensorflow: neither @tensorflow/tfjs-node-gpu nor @tensorflow/tfjs-node loads here (their install needs internet to fetch libtensorflow). Use --backend wasm.',
      );
    } else {
      name = 'wasm';
      description = `wasm (${noGpu ? `${noGpu}; ` : ''}no @tensorflow/tfjs-node here)`;
    }
  } else if (choice === 'webgpu') {
    const { openGpu } = await import('./webgpu/device.ts');
    const gpu = await openGpu().catch((error: Error) => {
      throw new Error(`--backend webgpu: ${error.message}`);
    });
    const { Kernels } = await import('./webgpu/kernel.ts');
    const { useTensorCores } = await import('./webgpu/precision.ts');
    // auto: mixed precision where the tensor cores (subgroup matrices) multiply it, checked against the ordinary
    // cores when the device opens; f32 elsewhere, where f16 has not been shown faster.
    const wanted = precision === 'f16' || (precision === 'auto' && gpu.f16 && gpu.subgroupMatrix !== null);
    let kernels = new Kernels(gpu, { precision: wanted ? 'f16' : 'f32' });
    const on = await useTensorCores(kernels);
    if (precision === 'auto' && kernels.precision === 'f16' && !kernels.tensorCores)
      kernels = new Kernels(gpu, { precision: 'f32' });
    await tf.setBackend('wasm');
    await tf.ready();
    (await import('../model/ops.ts')).patchWasmSlice();
    // A phase auto places on the CPU decodes with the C kernels, on every core as ONNX Runtime would set them.
    if (auto) nativeKernels()?.setThreads(availableParallelism());
    const how =
      kernels.precision === 'f16'
        ? `in mixed precision (f16 products summed in f32, dynamic loss scaling) on ${on}`
        : `in f32${precision === 'auto' ? ` (auto: f16 on tensor cores only; ${on})` : ''}`;
    // TensorFlow.js's backend is what `name` says; the run says where its steps went (RunResult.device).
    current = {
      name: 'wasm',
      description: `webgpu on ${gpu.adapter.description} for training updates ${how}, wasm for the rest${auto ? ' (each phase timed there and on the CPU, and run where faster)' : ''}`,
      gpu: kernels,
      auto,
    };
    return current;
  } else {
    name = choice;
    description = choice;
  }
  if (name === 'wasm' && !(await tf.setBackend('wasm').catch(() => false))) {
    if (choice === 'wasm') throw new Error('--backend wasm: the WebAssembly backend failed to start');
    name = 'cpu';
    description = 'cpu (the WebAssembly backend failed to start)';
  }
  if (!(await tf.setBackend(name))) throw new Error(`backend ${name} failed to start`);
  await tf.ready();
  tf.env().set('PROD', true); // no per-op NaN checks or debug warnings
  if (name === 'wasm') (await import('../model/ops.ts')).patchWasmSlice();
  current = { name, description };
  return current;
}

/** ONNX Runtime with this machine's cores, or why it does not load. */
const openOrt = async () => (await import('./onnx/onnx.ts')).OrtRuntime.open();
/** Whether the CPU path's C kernels run beside ONNX Runtime, and why not. */
const nativeWhy = async () => {
  const { kernels, why } = (await import('./cpu/kernels.ts')).nativeStatus();
  return kernels ? `its GEMMs by ${why}, the rest by the C kernels` : `the C kernels: ${why}`;
};

/** The block a scorer is placed by where its caller does not say (placement.ts trainingDevice). */
const SCORED = { rows: 4, length: 512 };

/**
 * What scores token blocks with `model`'s weights where `backend` trains: the GPU with webgpu (under auto where
 * a forward pass of `block` is faster there than on the CPU path: placement.ts), ONNX Runtime with onnxruntime
 * (a copy of the weights there, freed by dispose), else the tfjs model's.
 */
export async function scorerOn(
  backend: Backend | null,
  model: Llama,
  log: Logger,
  block = SCORED,
): Promise<{ score: BlockScorer; dispose(): void }> {
  const device = backend?.auto
    ? await (await import('./placement.ts')).trainingDevice(backend, model, block, log)
    : (backend ?? {});
  if (device.gpu) return (await import('./webgpu/llama.ts')).gpuScorer(model, device.gpu);
  if (device.ort) return (await import('./cpu/llama.ts')).ortScorer(model, device.ort);
  return { score: (await import('./scoring.ts')).tfjsScorer(model), dispose: () => {} };
}

/** `use` with a scorer of `model` (scorerOn), freed after. */
export async function withScorer<T>(
  backend: Backend | null,
  model: Llama,
  log: Logger,
  use: (score: BlockScorer) => Promise<T>,
  block = SCORED,
): Promise<T> {
  const scorer = await scorerOn(backend, model, log, block);
  try {
    return await use(scorer.score);
  } finally {
    scorer.dispose();
  }
}

/** `--backend` and `--precision` on every command: the CLI hands them to the training stages in their options. */
export const addBackendOption: CommandFactory = (program) => {
  program.addOption(
    new Option(
      '--backend <name>',
      'backend for the training stages (auto: webgpu on a hardware GPU, else onnxruntime where it loads, else the fastest TensorFlow.js backend that loads; webgpu: training updates on the GPU, the rest on wasm; onnxruntime: training updates and scoring on every CPU core, the rest on wasm)',
    ).choices([...BACKENDS]),
  );
  program.addOption(
    new Option(
      '--precision <name>',
      "the GPU's arithmetic (f16: mixed precision, f16 products summed in f32 with f32 weights and dynamic loss scaling, where the adapter offers shader-f16; auto: f16 where its products run on the tensor cores, checked when the GPU opens, else f32)",
    ).choices([...PRECISIONS]),
  );
};
