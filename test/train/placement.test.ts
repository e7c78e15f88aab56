// Where auto runs each phase (train/placement.ts): the probes time the same work on the GPU (lavapipe here)
// and the CPU, keep the faster and log both (a forward pass for training and scoring, decoding steps); the
// CPU's decoding timing stops once past the GPU's; an explicit GPU, or none, is kept without a probe.
import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { Logger } from '../../pipeline/log.ts';
import { cpuCaches } from '../../train/decode.ts';
import { Llama } from '../../train/model.ts';
import { decodingGpu, decodingTime, fasterOnGpu, forwardFasterOnGpu, trainingDevice } from '../../train/placement.ts';
import { GpuDecoder } from '../../train/webgpu/decode.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { absent, kernels } from '../fixtures/webgpu.ts';

/** A logger whose JSON lines are kept. */
function recorder(): { log: Logger; lines: () => Record<string, unknown>[] } {
  const out = new PassThrough();
  const chunks: string[] = [];
  out.on('data', (c: Buffer) => chunks.push(c.toString()));
  return {
    log: new Logger('json', out),
    lines: () =>
      chunks
        .join('')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Record<string, unknown>),
  };
}

describe('where auto decodes', () => {
  it.skipIf(absent)('times both, keeps the faster, and says both times in the log', async () => {
    const model = Llama.create(tinyLlama({ maxPositions: 128 }), 'placement');
    const { log, lines } = recorder();
    const onGpu = await fasterOnGpu(kernels!, model, 4, log);
    const said = lines().find((l) => l.event === 'placed')!;
    expect(said).toMatchObject({ phase: 'decoding', on: onGpu ? 'gpu' : 'cpu', sequences: 4 });
    expect(said.gpu_ms).toBeGreaterThan(0);
    // The CPU's time, or "over" the GPU's where it stopped past it: the GPU's was the faster then.
    if (typeof said.cpu_ms === 'number') expect(onGpu).toBe((said.gpu_ms as number) < said.cpu_ms);
    else expect([onGpu, said.cpu_ms]).toEqual([true, `over ${String(said.gpu_ms)}`]);
    model.dispose();
  });

  it.skipIf(absent)('stops timing once past the limit, and times what it reads otherwise', async () => {
    const model = Llama.create(tinyLlama({ maxPositions: 128 }), 'placement-limit');
    expect(await decodingTime(cpuCaches(model), 4, 0)).toBe(Infinity);
    const took = await decodingTime(new GpuDecoder(model, kernels!), 4, Infinity);
    expect(took).toBeGreaterThan(0);
    expect(took).toBeLessThan(Infinity);
    model.dispose();
  });

  it.skipIf(absent)(
    'times a forward pass of a training block on both, the CPU’s for one row times the rows',
    async () => {
      const model = Llama.create(tinyLlama({ maxPositions: 128 }), 'placement-forward');
      const { log, lines } = recorder();
      const onGpu = await forwardFasterOnGpu(kernels!, model, 4, 64, log);
      const said = lines().find((l) => l.event === 'placed')!;
      expect(said).toMatchObject({ phase: 'training and scoring', on: onGpu ? 'gpu' : 'cpu', block: '4×64' });
      expect(onGpu).toBe((said.gpu_ms as number) < (said.cpu_ms as number));
      model.dispose();
    },
  );

  it.skipIf(absent)('keeps a GPU asked for (--backend webgpu), and the CPU where there is none, unprobed', async () => {
    const model = Llama.create(tinyLlama({ maxPositions: 128 }), 'placement-asked');
    const { log, lines } = recorder();
    expect(await decodingGpu(kernels!, model, 8, log)).toBe(kernels);
    expect(await decodingGpu(undefined, model, 8, log)).toBeUndefined();
    const asked = { gpu: kernels! };
    expect(await trainingDevice(asked, model, { rows: 4, length: 64 }, log)).toBe(asked);
    expect(lines()).toEqual([]);
    model.dispose();
  });
});
