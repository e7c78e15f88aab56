// LoRA on the Llama-family model: a fresh adapter changes nothing, training moves the adapters alone, the
// adapters off give the base back, PEFT's layout round-trips, and merging gives the adapted model's numbers.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';
import { deviceOn, openDevice } from '../../runtime/device.ts';
import { readHfModel, writeHfModel } from '../../model/hf.ts';
import { KVCache } from '../../runtime/decode.ts';
import { Llama } from '../../model/llama.ts';
import { attachLora, loadAdapter, mergeLora, saveAdapter, trainableParameters } from '../../model/lora.ts';
import { ADAMW_DEFAULTS, AdamW } from '../../trainers/optimizer.ts';
import { readSafetensors } from '../../model/safetensors.ts';
import { optimizerStep } from '../../trainers/step.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { quietLogger } from '../fixtures/toy-stages.ts';
import { NEVER } from '../../pipeline/interrupt.ts';
import { sftLoss } from '../../trainers/losses/index.ts';
import { trainingRun } from '../../trainers/run.ts';
import type { LoraConfig } from '../../model/config.ts';

const BASE = join(import.meta.dirname, '..', 'fixtures', 'hf-tiny', 'llama-tiny');
const IDS = Int32Array.from([165, 299, 204, 8, 63, 73, 11, 261, 79, 192]);
const TARGETS = Int32Array.from([299, 204, 8, 63, 73, 11, 261, 79, 192, 208]);
const CONFIG: LoraConfig = { r: 4, alpha: 8, dropout: 0, targetModules: ['q_proj', 'v_proj', 'down_proj'] };

const load = () => {
  const hf = readHfModel(BASE);
  return new Llama(hf.config, hf.weights);
};
const logits = (m: Llama) => tf.tidy(() => m.forward(IDS, 1, IDS.length).dataSync() as Float32Array);
const maxDiff = (a: Float32Array, b: Float32Array) => a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i]!)), 0);
const weightsOf = (m: Llama) => new Map([...m.params].map(([n, v]) => [n, v.dataSync().slice()]));

/** A few AdamW steps on the adapters alone, toward the targets. */
function train(m: Llama, steps = 4): void {
  const params = trainableParameters(m);
  const optimizer = new AdamW(params, ADAMW_DEFAULTS);
  for (let i = 0; i < steps; i++)
    optimizerStep(
      { params },
      optimizer,
      [() => ({ loss: tf.neg(tf.mean(m.tokenLogprobs(IDS, TARGETS, 1, IDS.length))) as tf.Scalar })],
      0.01,
      1,
    );
}

beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
});

describe('LoRA', () => {
  it('starts as the base model, trains only its adapters, and with them off is the base again', () => {
    const m = load();
    const base = logits(m);
    const before = weightsOf(m);
    attachLora(m, CONFIG, 'seed');
    expect([...trainableParameters(m).keys()].sort()).toEqual(
      [0, 1]
        .flatMap((l) =>
          ['self_attn.q_proj', 'self_attn.v_proj', 'mlp.down_proj'].flatMap((p) =>
            ['A', 'B'].map((x) => `base_model.model.model.layers.${l}.${p}.lora_${x}.weight`),
          ),
        )
        .sort(),
    );
    expect(maxDiff(logits(m), base)).toBe(0);
    const lossBefore = tf.tidy(() => tf.neg(tf.mean(m.tokenLogprobs(IDS, TARGETS, 1, IDS.length))).dataSync()[0]!);
    train(m);
    const lossAfter = tf.tidy(() => tf.neg(tf.mean(m.tokenLogprobs(IDS, TARGETS, 1, IDS.length))).dataSync()[0]!);
    expect(lossAfter).toBeLessThan(lossBefore);
    for (const [name, w] of weightsOf(m)) expect(w, name).toEqual(before.get(name));
    m.adaptersOn = false;
    expect(maxDiff(logits(m), base)).toBe(0);
    m.adaptersOn = true;
    expect(maxDiff(logits(m), base)).toBeGreaterThan(1e-3);
    m.dispose();
  });

  it('saves in PEFT’s layout, loads onto a fresh base with the same numbers, and merges into a plain checkpoint', () => {
    const m = load();
    attachLora(m, CONFIG, 'seed');
    train(m);
    const adapted = logits(m);
    const dir = join(tempDir(), 'adapter');
    saveAdapter(dir, m, CONFIG, 'llama-tiny');
    const config = JSON.parse(readFileSync(join(dir, 'adapter_config.json'), 'utf8'));
    expect(config).toMatchObject({
      peft_type: 'LORA',
      task_type: 'CAUSAL_LM',
      r: 4,
      lora_alpha: 8,
      target_modules: ['q_proj', 'v_proj', 'down_proj'],
      base_model_name_or_path: 'llama-tiny',
    });
    // PEFT's shapes: A (r, in), B (out, r); in and out of q_proj are the hidden size 64 and 4 heads × 16.
    const saved = readSafetensors(join(dir, 'adapter_model.safetensors')).tensors;
    expect(saved.get('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight')!.shape).toEqual([4, 64]);
    expect(saved.get('base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight')!.shape).toEqual([64, 4]);
    expect(saved.get('base_model.model.model.layers.1.mlp.down_proj.lora_A.weight')!.shape).toEqual([4, 176]);
    expect(saved.get('base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight')!.shape).toEqual([32, 4]);

    const again = load();
    expect(loadAdapter(dir, again)).toEqual(CONFIG);
    expect(maxDiff(logits(again), adapted)).toBe(0);

    mergeLora(again);
    expect(again.adapters.size).toBe(0);
    expect(maxDiff(logits(again), adapted)).toBeLessThan(1e-4);
    const merged = join(tempDir(), 'merged');
    writeHfModel(merged, again);
    const reread = readHfModel(merged);
    const plain = new Llama(reread.config, reread.weights);
    expect(maxDiff(logits(plain), adapted)).toBeLessThan(1e-4);
    for (const x of [m, again, plain]) x.dispose();
  });

  it('names a target that is not a projection', () => {
    const m = load();
    expect(() => attachLora(m, { ...CONFIG, targetModules: ['qkv'] }, 's')).toThrow(
      /lora target_modules: qkv is not a projection of the Llama family/,
    );
    m.dispose();
  });
});

describe('LoRA in a training run', () => {
  it('checkpoints its adapters with the run, resumes to the weights of a straight run (dropout included), and saves them beside the merged model', async () => {
    const settings = (cache: string) => ({
      config: {
        seed: 'lora-run',
        batch_size: 1,
        epochs: 1,
        max_steps: 4,
        lr: 1e-2,
        warmup: 0,
        min_lr_ratio: 1,
        weight_decay: 0,
        max_grad_norm: 1,
        checkpoint_every: 1,
        micro_batch_tokens: 64,
      },
      cache,
      key: 'k',
      tokenizer: { 'tokenizer.json': '{}' },
      context: 16,
      placeholders: null,
      lora: { ...CONFIG, dropout: 0.2 },
      base: BASE,
      signal: NEVER,
      log: quietLogger(),
      device: deviceOn({ kind: 'reference' }),
    });
    const trainer = (steps: number) => ({
      steps,
      label: 'lora steps',
      start: () => {
        const m = load();
        attachLora(m, { ...CONFIG, dropout: 0.2 }, 'lora-run');
        return m;
      },
      batch: () => ({
        tokens: IDS.length,
        parts: [
          {
            blocks: [{ ids: IDS, targets: TARGETS, batch: 1, length: IDS.length }],
            loss: ([logps]: tf.Tensor2D[]) => ({ loss: sftLoss(logps!, tf.ones([1, IDS.length]) as tf.Tensor2D) }),
          },
        ],
      }),
    });
    const straight = await trainingRun(settings(tempDir()), trainer(4));
    const cache = tempDir();
    (await trainingRun(settings(cache), trainer(2))).model.dispose();
    const resumed = await trainingRun(settings(cache), trainer(4));
    expect(resumed.resumedFrom).toBe(2);
    expect(resumed.model.adapters.size).toBe(straight.model.adapters.size);
    const adapters = (m: Llama) => [...trainableParameters(m).values()].map((v) => Array.from(v.dataSync()));
    expect(adapters(resumed.model)).toEqual(adapters(straight.model));
    // Generation reads the adapted weights: the KV cache's logits are the forward pass's, token by token and batched.
    const forward = logits(straight.model).slice(-straight.model.config.vocabSize);
    const prompt = Array.from(IDS);
    expect(maxDiff(new KVCache(straight.model).read(prompt), forward)).toBeLessThan(1e-4);
    const stepwise = new KVCache(straight.model);
    let last: Float32Array = new Float32Array(0);
    for (const id of prompt) last = stepwise.read([id]);
    expect(maxDiff(last, forward)).toBeLessThan(1e-4);
    expect(maxDiff(forward, logits(load()).slice(-straight.model.config.vocabSize))).toBeGreaterThan(1e-3);
    const out = tempDir();
    await straight.save(out, {});
    expect(JSON.parse(readFileSync(join(out, 'adapter', 'adapter_config.json'), 'utf8'))).toMatchObject({
      r: 4,
      base_model_name_or_path: BASE,
    });
    // The merged model carries what the adapters learnt in their projections, and the base elsewhere.
    const merged = readSafetensors(join(out, 'model', 'model.safetensors')).tensors;
    const base = readSafetensors(join(BASE, 'model.safetensors')).tensors;
    const same = (name: string) => maxDiff(merged.get(name)!.data, base.get(name)!.data) === 0;
    expect(same('model.layers.0.self_attn.q_proj.weight')).toBe(false);
    expect(same('model.layers.0.self_attn.k_proj.weight')).toBe(true);
    resumed.model.dispose();
  });
});
