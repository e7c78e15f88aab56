// The default run's stages, tiny, with DAPO on, through the CLI with `--backend webgpu` against the same run
// on WASM: SFT, DPO and DAPO take their updates on the GPU, DAPO's rollouts and validation and eval's episodes
// are generated there, the reference and eval are scored there, and every figure logged and the eval table
// are the WASM run's. Tolerance: every figure within 1e-4·(1 + |WASM's|) (f32 on both sides, summed in other
// orders; the episodes' sampling is seeded, so the same logits draw the same tokens).
import { appendFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { prefab } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { tinyConfig } from '../fixtures/tiny.ts';
import { absent, relativeError } from '../fixtures/webgpu.ts';

const lines = (path: string) =>
  readFileSync(path, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, number | string>);

/** Every number in `got` within tolerance of the one at the same place in `want`, and nothing missing. */
function near(got: unknown, want: unknown, where: string): void {
  if (typeof want === 'number') {
    expect(typeof got, where).toBe('number');
    expect(relativeError([got as number], [want]), where).toBeLessThan(1e-4);
  } else if (want && typeof want === 'object') {
    for (const [k, v] of Object.entries(want)) near((got as Record<string, unknown>)[k], v, `${where}.${k}`);
  } else expect(got, where).toEqual(want);
}

describe('the run with --backend webgpu', () => {
  it.skipIf(absent)('trains SFT, DPO and DAPO on the GPU to the figures and eval table of the run on WASM', () => {
    const dir = tempDir();
    const config = tinyConfig(dir, {
      vocab: 512,
      context: 640,
      sessions: 40,
      sftSteps: 3,
      dpo: 'loss: dpo\nmax_steps: 3',
      examples: 24,
      checkpointEvery: 2,
      pairs: 12,
      nllSessions: 6,
      tasks: 2,
      maxTokens: 16,
    });
    appendFileSync(
      config,
      'dapo:\n  enabled: true\n  steps: 2\n  tasks_per_step: 1\n  group_size: 2\n  reward: partial\n  max_generation_batches: 2\n  mode: feedback\n  max_calls: 1\n  simulator: { max_tokens: 12, max_turns: 2 }\n  validation: { every: 1, tasks: 1, tries: 2 }\n',
    );
    const run = (backend: string) =>
      prefab([
        '--workdir',
        join(dir, backend),
        '--config',
        config,
        '--log-format',
        'json',
        '--backend',
        backend,
        'run',
      ]);
    const [onCpu, onGpu] = [run('wasm'), run('webgpu')];
    expect(onCpu.code, onCpu.stderr).toBe(0);
    expect(onGpu.code, onGpu.stderr).toBe(0);
    expect(onGpu.stderr).toMatch(/"backend":"webgpu on [^"]+ trains, scores and decodes, in f32/);
    expect(onGpu.stderr).not.toMatch(/this run trains on wasm/);
    expect(JSON.parse(onGpu.stdout).stages.find((s: { stage: string }) => s.stage === 'sft').summary).toMatch(
      /on webgpu$/,
    );
    for (const [stage, steps] of [
      ['sft', 3],
      ['dpo', 3],
      ['dapo', 2],
    ] as const) {
      const [want, got] = [
        lines(join(dir, 'wasm', stage, 'metrics.jsonl')),
        lines(join(dir, 'webgpu', stage, 'metrics.jsonl')),
      ];
      expect(got).toHaveLength(steps);
      // At step 1 DPO's policy is its reference: every margin is 0 on WASM and within rounding of 0 on the GPU, so
      // rewards/accuracies (the share of margins above 0) is a tie that rounding breaks.
      const skip = (i: number) => ({
        'tokens/s': 0,
        ...(i === 0 && stage === 'dpo' ? { 'rewards/accuracies': 0 } : {}),
      });
      want.forEach((row, i) => near({ ...got[i], ...skip(i) }, { ...row, ...skip(i) }, `${stage} step ${i + 1}`));
    }
    const evalOf = (backend: string) =>
      JSON.parse(readFileSync(join(dir, backend, 'eval', 'eval.json'), 'utf8')).models;
    const [want, got] = [evalOf('wasm'), evalOf('webgpu')];
    expect(Object.keys(want)).toEqual(['untrained', 'sft', 'dpo', 'dapo']);
    near(got, want, 'eval');
  });

  it.skipIf(absent)(
    'with --precision f16: trains in mixed precision, logs the loss scale, and saves f32 models',
    () => {
      const dir = tempDir();
      const config = tinyConfig(dir, {
        vocab: 512,
        context: 640,
        sessions: 40,
        sftSteps: 3,
        dpo: 'loss: dpo\nmax_steps: 2',
        examples: 16,
        checkpointEvery: 2,
        pairs: 8,
        nllSessions: 4,
        tasks: 1,
        maxTokens: 8,
      });
      const args = ['--workdir', dir, '--config', config, '--log-format', 'json', '--backend', 'webgpu'];
      const run = prefab([...args, '--precision', 'f16', 'run']);
      expect(run.code, run.stderr).toBe(0);
      expect(run.stderr).toMatch(/"backend":"webgpu on [^"]+ trains, scores and decodes, in mixed precision/);
      for (const stage of ['sft', 'dpo']) {
        const rows = lines(join(dir, stage, 'metrics.jsonl'));
        expect(rows.length).toBeGreaterThan(1);
        for (const row of rows) expect(row, stage).toMatchObject({ loss_scale: 2 ** 16, skipped: 0 });
        // A Hugging Face folder of f32 weights, whatever the GEMMs multiplied in.
        const file = readFileSync(join(dir, stage, 'model', 'model.safetensors'));
        const header = JSON.parse(file.subarray(8, 8 + Number(file.readBigUInt64LE(0))).toString('utf8'));
        const dtypes = new Set(
          Object.entries(header).flatMap(([k, v]) => (k === '__metadata__' ? [] : [(v as { dtype: string }).dtype])),
        );
        expect([...dtypes], stage).toEqual(['F32']);
      }
      const refused = prefab([...args, '--precision', 'f64', 'run']);
      expect(refused.code).not.toBe(0);
      expect(refused.stderr).toMatch(
        /option '--precision <name>' argument 'f64' is invalid\. Allowed choices are auto, f32, f16/,
      );
    },
  );
});
