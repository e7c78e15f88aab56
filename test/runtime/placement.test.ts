// Where auto runs each phase (runtime/placement.ts): the probes time the same work on the GPU (lavapipe here)
// and the CPU (a forward pass for training and scoring, decoding steps); under auto the faster is kept, once a
// device for each shape, and the log says both times; a side that fails loses, with a warning; a device of one
// engine keeps it without a probe.
import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { Logger } from '../../pipeline/log.ts';
import { loadCpuKernels } from '../../runtime/cpu/kernels.ts';
import { cpuCaches } from '../../runtime/decode.ts';
import { deviceOn, type Device } from '../../runtime/device.ts';
import { Llama } from '../../model/llama.ts';
import { decodingEngine, decodingTime, decodingTimes, forwardTimes, trainingEngine } from '../../runtime/placement.ts';
import { GpuDecoder } from '../../runtime/webgpu/decode.ts';
import { GpuKernels } from '../../runtime/webgpu/kernel.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { absent, gpu, kernels } from '../fixtures/webgpu.ts';

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

const model = (seed: string, maxPositions = 128) => Llama.create(tinyLlama({ maxPositions }), seed);

/** A device as auto opens it on a GPU of hardware: each phase placed, the CPU's share on the C kernels where built. */
const auto = (k: GpuKernels): Device => ({
  ...deviceOn({ kind: 'gpu', kernels: k }),
  backend: 'auto',
  cpu: loadCpuKernels().kernels,
  placesEachPhase: true,
});

describe('where auto runs each phase', () => {
  it.skipIf(absent)('times a forward pass and decoding steps on both sides', async () => {
    const m = model('placement-times');
    const device = auto(kernels!);
    const forward = await forwardTimes(device, kernels!, m, 4, 64);
    const decoding = await decodingTimes(device, kernels!, m, 4);
    for (const t of [forward.gpu, forward.cpu, decoding.gpu]) expect(t).toBeGreaterThan(0);
    expect(Number.isFinite(forward.cpu) && Number.isFinite(decoding.gpu)).toBe(true);
    // The CPU's decoding time, or Infinity where it stopped past the GPU's.
    expect(decoding.cpu).toBeGreaterThan(0);
    m.dispose();
  });

  it.skipIf(absent)('stops timing decoding once past the limit', async () => {
    const m = model('placement-limit');
    expect(await decodingTime(cpuCaches(m, null), 4, 0)).toBe(Infinity);
    expect(await decodingTime(new GpuDecoder(m, kernels!), 4, Infinity)).toBeLessThan(Infinity);
    m.dispose();
  });

  it.skipIf(absent)('under auto keeps the faster side, probes a shape once, and says both times', async () => {
    const m = model('placement-auto', 96); // a shape of its own: no other test has probed it
    const { log, lines } = recorder();
    const device = auto(kernels!);
    const decodes = await decodingEngine(device, m, 3, log);
    const trains = await trainingEngine(device, m, { rows: 2, length: 48 }, log);
    expect(await decodingEngine(device, m, 3, log)).toEqual(decodes);
    expect(await trainingEngine(device, m, { rows: 2, length: 48 }, log)).toEqual(trains);
    const placed = lines().filter((l) => l.event === 'placed');
    expect(placed.map((l) => l.phase)).toEqual(['decoding', 'training and scoring']);
    const [d, t] = placed as { on: string; gpu_ms: number; cpu_ms: number | string }[];
    const cpuKind = device.cpu ? 'cpu' : 'reference';
    expect(decodes.kind).toBe(d!.on === 'gpu' ? 'gpu' : cpuKind);
    expect(trains.kind).toBe(t!.on === 'gpu' ? 'gpu' : cpuKind);
    for (const line of placed) expect(line.gpu_ms).toBeGreaterThan(0);
    m.dispose();
  });

  it.skipIf(absent)('places a phase on the CPU where its GPU side fails, saying why, once', async () => {
    const m = model('placement-fails');
    const { log, lines } = recorder();
    // Bindings too small for a page of keys and values: the GPU's decoding fails.
    const cramped = auto(new GpuKernels(gpu!, { bindingBytes: 64 }));
    expect((await decodingEngine(cramped, m, 2, log)).kind).not.toBe('gpu');
    expect((await decodingEngine(cramped, m, 2, log)).kind).not.toBe('gpu');
    expect(lines()).toHaveLength(1);
    expect(lines()[0]).toMatchObject({
      level: 'warn',
      event: 'placed',
      phase: 'decoding',
      on: 'cpu',
      gpu_ms: 'failed',
    });
    expect(String(lines()[0]!.why)).toMatch(/^gpu: webgpu: the decoder's keys and values/);
    m.dispose();
  });

  it.skipIf(absent)('keeps a GPU asked for (--backend webgpu), and the CPU where there is none, unprobed', async () => {
    const m = model('placement-asked');
    const { log, lines } = recorder();
    const asked = deviceOn({ kind: 'gpu', kernels: kernels! });
    expect(await decodingEngine(asked, m, 8, log)).toEqual({ kind: 'gpu', kernels });
    expect(await decodingEngine(deviceOn({ kind: 'reference' }), m, 8, log)).toEqual({ kind: 'reference' });
    expect(await trainingEngine(asked, m, { rows: 4, length: 64 }, log)).toEqual({ kind: 'gpu', kernels });
    expect(lines()).toEqual([]);
    m.dispose();
  });
});
