// The GPU against transformers: `prefab --backend webgpu model score` and `model generate` on the three tiny
// checkpoints transformers saved (Llama with grouped-query heads, tied Llama, Qwen2 with q/k/v biases) give
// transformers' token log-probs (to 1e-4) and its greedy continuation (test/fixtures/hf-tiny/*/reference.json).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { prefab } from '../../fixtures/cli.ts';
import { absent } from '../../fixtures/webgpu.ts';

const FIXTURES = join(import.meta.dirname, '..', '..', 'fixtures', 'hf-tiny');

describe.each(['llama-tiny', 'llama-tiny-tied', 'qwen2-tiny'])('%s on the GPU', (name) => {
  const dir = join(FIXTURES, name);
  const ref = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as {
    input_ids: number[][];
    token_logprobs: number[][];
    greedy_prompt: number[];
    greedy_continuation: number[];
  };

  it.skipIf(absent)('scores as transformers does and continues greedily as it does', () => {
    const score = prefab(['--backend', 'webgpu', 'model', 'score', dir, '--ids', JSON.stringify(ref.input_ids)]);
    expect(score.code, score.stderr).toBe(0);
    const out = JSON.parse(score.stdout) as { token_logprobs: number[][] };
    expect(out.token_logprobs.map((row) => row.length)).toEqual(ref.token_logprobs.map((row) => row.length));
    out.token_logprobs.forEach((row, b) =>
      row.forEach((v, t) => expect(Math.abs(v - ref.token_logprobs[b]![t]!), `${b}, ${t}`).toBeLessThan(1e-4)),
    );
    const generate = prefab([
      '--backend',
      'webgpu',
      'model',
      'generate',
      dir,
      '--ids',
      JSON.stringify(ref.greedy_prompt),
      '--max-new-tokens',
      String(ref.greedy_continuation.length),
    ]);
    expect(generate.code, generate.stderr).toBe(0);
    expect(JSON.parse(generate.stdout)).toEqual({ continuation: ref.greedy_continuation });
  });
});
