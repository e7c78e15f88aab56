// A device error (here a shader that does not compile) ends no process: it is kept and thrown, with
// WebGPU's own words, where results are read back. Its own file: the GPU is one a process, and the error stays.
import { describe, expect, it } from 'vitest';
import { download, submit, upload } from '../../../runtime/webgpu/buffers.ts';
import { absent, gpu as here } from '../../fixtures/webgpu.ts';

describe('errors on the GPU', () => {
  it.skipIf(absent)('are thrown where results are read, saying what WebGPU said', async () => {
    const gpu = here!;
    const buffer = upload(gpu, new Float32Array([1, 2, 3]));
    expect(await download(gpu, buffer, 3)).toEqual(new Float32Array([1, 2, 3]));
    const module = gpu.device.createShaderModule({
      code: '@compute @workgroup_size(1) fn main() { let x: f32 = target; }',
    });
    submit(gpu, (pass) =>
      pass.setPipeline(gpu.device.createComputePipeline({ layout: 'auto', compute: { module, entryPoint: 'main' } })),
    );
    await expect(download(gpu, buffer, 3)).rejects.toThrow(
      /^WebGPU: Error while parsing WGSL: .*unresolved value 'target'/s,
    );
  });
});
