// Moving f32 arrays to and from the GPU, and one command buffer of compute work: the few calls every
// kernel's host side and its tests share.
/// <reference types="@webgpu/types" />
import type { Gpu } from './device.ts';

/** A storage buffer holding `data`, f32, i32 or u32 (kernels read and write it; it can be copied out). */
export function upload(gpu: Gpu, data: Float32Array | Int32Array | Uint32Array): GPUBuffer {
  const buffer = allocate(gpu, data.byteLength);
  gpu.device.queue.writeBuffer(buffer, 0, data);
  return buffer;
}

/** A storage buffer of `bytes` (rounded up to 4), zero as WebGPU makes every buffer: an f16 array's, which upload cannot write. */
export function allocate(gpu: Gpu, bytes: number): GPUBuffer {
  const buffer = gpu.device.createBuffer({
    size: Math.max(4, Math.ceil(bytes / 4) * 4),
    usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
  });
  // Counted while it lives: what the benches report beside PyTorch's max_memory_allocated.
  gpu.memory.now += buffer.size;
  gpu.memory.peak = Math.max(gpu.memory.peak, gpu.memory.now);
  const destroy = buffer.destroy.bind(buffer);
  let held = true;
  buffer.destroy = () => {
    if (held) gpu.memory.now -= buffer.size;
    held = false;
    destroy();
  };
  return buffer;
}

/** `length` f32s of `buffer` (from the `at`-th on), once the work submitted before has finished. */
export async function download(gpu: Gpu, buffer: GPUBuffer, length: number, at = 0): Promise<Float32Array> {
  const staging = gpu.device.createBuffer({
    size: Math.max(4, length * 4),
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const encoder = gpu.device.createCommandEncoder();
  encoder.copyBufferToBuffer(buffer, at * 4, staging, 0, length * 4);
  gpu.device.queue.submit([encoder.finish()]);
  // dawn.node: a mapAsync issued behind long work may never settle (the process then ends and crashes on
  // the way out); waiting for the queue first always does.
  await gpu.device.queue.onSubmittedWorkDone();
  if (gpu.failure) throw new Error(`WebGPU: ${gpu.failure}`);
  await staging.mapAsync(GPUMapMode.READ);
  const out = new Float32Array(staging.getMappedRange().slice(0));
  staging.unmap();
  staging.destroy();
  return out;
}

/** Records `work` into one compute pass of one command buffer and submits it: many dispatches, one submission. */
export function submit(gpu: Gpu, work: (pass: GPUComputePassEncoder) => void): void {
  const encoder = gpu.device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  work(pass);
  pass.end();
  gpu.device.queue.submit([encoder.finish()]);
}
