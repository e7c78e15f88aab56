// Fine-tuning a pretrained Hugging Face folder (sft.model.from) with LoRA, through the whole run: its own
// tokenizer and Jinja chat template (Qwen2.5's style), adapters on q_proj and v_proj only, saved in PEFT's
// layout beside the merged model, DPO's adapters on the SFT model with the reference its base, and eval
// comparing the base, SFT and DPO models.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Tokenizer } from 'tokenizers';
import { beforeAll, describe, expect, it } from 'vitest';
import { openDevice } from '../../runtime/device.ts';
import { writeHfModel } from '../../model/hf.ts';
import { Llama } from '../../model/llama.ts';
import { readSafetensors } from '../../model/safetensors.ts';
import { trainTokenizer } from '../../model/tokenizer.ts';
import { REPO, prefab } from '../fixtures/cli.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { tempDir } from '../fixtures/pipeline.ts';

const TEMPLATE = readFileSync(join(REPO, 'test', 'fixtures', 'chat-templates', 'qwen2.5-style.jinja'), 'utf8');

/** A small "pretrained" Qwen2 folder: random weights, a byte-level BPE with ChatML's markers, and the template. */
function pretrainedFolder(dir: string): void {
  const json = JSON.parse(
    trainTokenizer(['You call companies for the user. Please cancel my gym membership, thank you.'], 300),
  );
  const next = Object.keys(json.model.vocab).length + json.added_tokens.length;
  json.added_tokens.push(
    ...['<|im_start|>', '<|im_end|>', '<|endoftext|>'].map((content, i) => ({
      id: next + i,
      content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true,
    })),
  );
  const tokenizerJson = JSON.stringify(json);
  const vocabSize = Tokenizer.fromString(tokenizerJson).getVocabSize(true);
  const config = tinyLlama({
    modelType: 'qwen2',
    vocabSize,
    hiddenSize: 32,
    heads: 2,
    kvHeads: 1,
    headDim: 16,
    intermediateSize: 64,
    layers: 1,
    attentionBias: true,
    tiedEmbeddings: false,
    maxPositions: 8192,
    eosTokenId: next + 1,
  });
  const model = Llama.create(config, 'pretrained');
  writeHfModel(dir, model);
  model.dispose();
  writeFileSync(join(dir, 'tokenizer.json'), tokenizerJson);
  writeFileSync(
    join(dir, 'tokenizer_config.json'),
    JSON.stringify({ chat_template: TEMPLATE, eos_token: '<|im_end|>', pad_token: '<|endoftext|>' }),
  );
}

const weights = (dir: string) => readSafetensors(join(dir, 'model.safetensors')).tensors;
const same = (a: Float32Array, b: Float32Array) => a.length === b.length && a.every((v, i) => v === b[i]);

let dir: string;
let workdir: string;
let pretrained: string;
let run: { code: number; stdout: string; stderr: string };
beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
  dir = tempDir();
  workdir = join(dir, 'workspace');
  pretrained = join(dir, 'pretrained');
  mkdirSync(pretrained);
  pretrainedFolder(pretrained);
  writeFileSync(
    join(dir, 'config.yaml'),
    `ingest:
  inputs: [${join(REPO, 'data', 'sample')}]
tokenizer:
  vocab_size: 512
sft:
  model: { from: ./pretrained, context: 3072 }
  lora: { r: 4, alpha: 8, dropout: 0.1, target_modules: [q_proj, v_proj] }
  max_sessions: 12
  max_steps: 3
  batch_size: 2
  checkpoint_every: 2
  micro_batch_tokens: 4096
dpo:
  lora: { r: 4, alpha: 8, target_modules: [q_proj, v_proj] }
  max_steps: 2
  max_examples: 8
  batch_size: 2
  micro_batch_tokens: 4096
eval:
  max_pairs: 4
  max_sessions: 2
  micro_batch_tokens: 4096
  simulator: { tasks: 1, k: 1, max_tokens: 12 }
`,
  );
  run = prefab(['--workdir', workdir, '--config', join(dir, 'config.yaml'), '--log-format', 'json', 'run']);
});

describe('sft.model.from: a pretrained folder, with LoRA', () => {
  it('runs to the end, reading the sessions through the folder’s own tokenizer and chat template', () => {
    expect(run.code, run.stderr).toBe(0);
    const sft = JSON.parse(readFileSync(join(workdir, 'sft', 'manifest.json'), 'utf8'));
    expect(sft.summary).toMatch(/from .*pretrained \(LoRA r 4\)/);
    // The trained model is the pretrained architecture, with its tokenizer files carried over.
    const config = JSON.parse(readFileSync(join(workdir, 'sft', 'model', 'config.json'), 'utf8'));
    expect(config).toMatchObject({
      architectures: ['Qwen2ForCausalLM'],
      hidden_size: 32,
      num_key_value_heads: 1,
      tie_word_embeddings: false,
      prefab_context: 3072,
    });
    expect(readFileSync(join(workdir, 'sft', 'model', 'tokenizer_config.json'), 'utf8')).toBe(
      readFileSync(join(pretrained, 'tokenizer_config.json'), 'utf8'),
    );
  });

  it('trains the adapters alone: only q_proj and v_proj move, and the adapters are saved in PEFT’s layout', () => {
    const before = weights(pretrained);
    const after = weights(join(workdir, 'sft', 'model'));
    for (const [name, t] of before) {
      const moved = !same(t.data, after.get(name)!.data);
      expect(moved, name).toBe(/self_attn\.(q|v)_proj\.weight$/.test(name));
    }
    const adapter = JSON.parse(readFileSync(join(workdir, 'sft', 'adapter', 'adapter_config.json'), 'utf8'));
    expect(adapter).toMatchObject({
      peft_type: 'LORA',
      r: 4,
      lora_alpha: 8,
      target_modules: ['q_proj', 'v_proj'],
      base_model_name_or_path: pretrained,
    });
    expect(
      [...readSafetensors(join(workdir, 'sft', 'adapter', 'adapter_model.safetensors')).tensors.keys()].sort(),
    ).toEqual([
      'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight',
      'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight',
      'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight',
      'base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight',
    ]);
  });

  it('tunes DPO adapters on the SFT model, and eval compares the base it started from', () => {
    const sft = weights(join(workdir, 'sft', 'model'));
    const dpo = weights(join(workdir, 'dpo', 'model'));
    expect(
      same(sft.get('model.layers.0.mlp.up_proj.weight')!.data, dpo.get('model.layers.0.mlp.up_proj.weight')!.data),
    ).toBe(true);
    expect(
      same(
        sft.get('model.layers.0.self_attn.q_proj.weight')!.data,
        dpo.get('model.layers.0.self_attn.q_proj.weight')!.data,
      ),
    ).toBe(false);
    expect(
      JSON.parse(readFileSync(join(workdir, 'dpo', 'adapter', 'adapter_config.json'), 'utf8')).base_model_name_or_path,
    ).toBe('../../sft/model');
    const report = JSON.parse(readFileSync(join(workdir, 'eval', 'eval.json'), 'utf8'));
    expect(Object.keys(report.models)).toEqual(['base', 'sft', 'dpo']);
    expect(report.held_out.pairs).toBeGreaterThan(0);
  });

  it('refuses LoRA on a new model, and names a folder that is not a model', () => {
    const bad = join(dir, 'bad.yaml');
    writeFileSync(bad, `sft:\n  lora: { r: 4 }\n`);
    const r = prefab(['--workdir', join(dir, 'other'), '--config', bad, 'status']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/lora needs model\.from/);
    const missing = join(dir, 'missing.yaml');
    writeFileSync(
      missing,
      readFileSync(join(dir, 'config.yaml'), 'utf8').replace('from: ./pretrained', 'from: ./nowhere'),
    );
    // The same workspace under a changed config file: it says so (--switch-config), and the stage names the folder.
    const m = prefab(['--workdir', workdir, '--config', missing, '--switch-config', 'run']);
    expect(m.code).toBe(1);
    expect(m.stderr).toMatch(/nowhere is not a model folder: it has no config\.json/);
  });
});
