// The default run's stages, tiny, through the CLI with `--backend webgpu` against the same run on WASM: SFT
// and DPO take their updates on the GPU and log the same figures, and eval's table is the same. Tolerance:
// every figure within 1e-4·(1 + |WASM's|) (f32 on both sides, summed in other orders).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { prefab } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { tinyConfig } from '../fixtures/tiny.ts';
import { absent } from '../fixtures/webgpu.ts';

const lines = (path: string) =>
  readFileSync(path, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, number | string>);

/** Every number in `got` within tolerance of the one at the same place in `want`, and nothing missing. */
function near(got: unknown, want: unknown, where: string): void {
  if (typeof want === 'number') {
    expect(typeof got, where).toBe('number');
    expect(Math.abs((got as number) - want) / (1 + Math.abs(want)), where).toBeLessThan(1e-4);
  } else if (want && typeof want === 'object') {
    for (const [k, v] of Object.entries(want)) near((got as Record<string, unknown>)[k], v, `${where}.${k}`);
  } else expect(got, where).toEqual(want);
}

describe('the run with --backend webgpu', () => {
  it.skipIf(absent)('trains SFT and DPO on the GPU to the figures and eval table of the run on WASM', () => {
    const dir = tempDir();
    const config = tinyConfig(dir, { vocab: 512, context: 640, sessions: 40, sftSteps: 3, dpo: 'loss: dpo\nmax_steps: 3', examples: 24, checkpointEvery: 2, pairs: 12, nllSessions: 6, tasks: 2, maxTokens: 16 });
    const run = (backend: string) => prefab(['--workdir', join(dir, backend), '--config', config, '--log-format', 'json', '--backend', backend, 'run']);
    const [onCpu, onGpu] = [run('wasm'), run('webgpu')];
    expect(onCpu.code, onCpu.stderr).toBe(0);
    expect(onGpu.code, onGpu.stderr).toBe(0);
    expect(onGpu.stderr).toMatch(/"backend":"webgpu on [^"]+ for training updates/);
    expect(onGpu.stderr).not.toMatch(/this run trains on wasm/);
    expect(JSON.parse(onGpu.stdout).stages.find((s: { stage: string }) => s.stage === 'sft').summary).toMatch(/on webgpu$/);
    for (const stage of ['sft', 'dpo']) {
      const [want, got] = [lines(join(dir, 'wasm', stage, 'metrics.jsonl')), lines(join(dir, 'webgpu', stage, 'metrics.jsonl'))];
      expect(got).toHaveLength(3);
      // At step 1 DPO's policy is its reference: every margin is 0 on WASM and within rounding of 0 on the GPU, so
      // rewards/accuracies (the share of margins above 0) is a tie that rounding breaks.
      const skip = (i: number) => ({ 'tokens/s': 0, ...(i === 0 && stage === 'dpo' ? { 'rewards/accuracies': 0 } : {}) });
      want.forEach((row, i) => near({ ...got[i], ...skip(i) }, { ...row, ...skip(i) }, `${stage} step ${i + 1}`));
    }
    const evalOf = (backend: string) => JSON.parse(readFileSync(join(dir, backend, 'eval', 'eval.json'), 'utf8')).models;
    const [want, got] = [evalOf('wasm'), evalOf('webgpu')];
    expect(Object.keys(want)).toEqual(['untrained', 'sft', 'dpo']);
    near(got, want, 'eval');
  });
});
