import { appendFileSync, cpSync, existsSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { DuckDBInstance } from '@duckdb/node-api';
import { REPO, prefab, prefabAsync } from '../fixtures/cli.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { tinyConfig as tinyConfigOf } from '../fixtures/tiny.ts';
import { openDevice } from '../../runtime/device.ts';
import { loadCheckpoint } from '../../model/checkpoint.ts';
import { PREFAB_CHAT_TEMPLATE } from '../../model/chat-template.ts';
import { Registry } from '../../loop/registry.ts';
import { readSafetensors } from '../../model/safetensors.ts';

/** The default run's stages, tiny; `dpo` is the dpo section's own lines. */
const tinyConfig = (dir: string, dpo = 'loss: dpo\nmax_steps: 4') =>
  tinyConfigOf(dir, {
    vocab: 512,
    context: 640,
    sessions: 80,
    resampleCopies: 0.5,
    sftSteps: 4,
    dpo,
    examples: 48,
    checkpointEvery: 2,
    pairs: 12,
    nllSessions: 6,
    tasks: 2,
    maxTokens: 16,
  });

/** prefab with the tiny config whose dpo section is `dpo`, in the suite's workspace. */
const withDpo = (dpo: string, ...args: string[]) =>
  prefab(['--workdir', workdir, '--config', tinyConfig(join(workdir, '..'), dpo), ...args]);

const metricsOf = (path: string) =>
  readFileSync(path, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, number>);

/** Kills `child` with SIGKILL as soon as a checkpoint of step `step` appears in the stage's cache folder. */
async function killAtCheckpoint(child: ChildProcess, cache: string, step: number): Promise<void> {
  const name = `step-${String(step).padStart(6, '0')}`;
  const checkpointed = () =>
    existsSync(cache) &&
    readdirSync(cache).some((f) => f.startsWith('run-') && readdirSync(join(cache, f)).includes(name));
  await new Promise<void>((resolve, reject) => {
    const timer = setInterval(() => {
      if (checkpointed()) {
        clearInterval(timer);
        child.kill('SIGKILL');
        resolve();
      }
    }, 20);
    child.once('exit', () => {
      clearInterval(timer);
      reject(new Error('the run finished before it could be killed'));
    });
  });
  await new Promise((r) => child.once('exit', r));
}

let workdir: string;
let config: string;
let runLog: string;
beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
  const dir = tempDir();
  workdir = join(dir, 'workspace');
  config = tinyConfig(dir);
  const r = prefab(['--workdir', workdir, '--config', config, '--log-format', 'json', 'run']);
  expect(r.code, r.stderr).toBe(0);
  runLog = r.stderr;
});

describe('what a run says on stderr', () => {
  it("is prefab's JSON log alone, saying once a stage which backend it chose and why, and nothing of Dawn's", () => {
    const lines = runLog.trim().split('\n');
    // Dawn writes warnings of its own (no Vulkan loader; a CPU driver's reduced limits) where it is loaded.
    for (const line of lines) expect(() => JSON.parse(line), line).not.toThrow();
    const backends = lines.map((l) => JSON.parse(l) as Record<string, string>).filter((e) => e.event === 'backend');
    // The tiny config leaves DAPO off: that stage passes the model on without a backend.
    expect(backends.map((e) => e.stage)).toEqual(['sft', 'dpo', 'eval']);
    // The C kernels where they are built (in CI they are), else the reference model on WASM, saying why; either
    // says why no GPU.
    for (const e of backends)
      expect(e.backend).toMatch(
        /^(cpu: prefab's C kernels on \d+ threads \(GEMMs by OpenBLAS .*?\) train, score and decode|wasm: the reference model on TensorFlow.js's WebAssembly backend trains, scores and decodes, .*? which are not here \(.*?\)) \(auto: (WebGPU|the only adapter|the optional package)/,
      );
  });
});

describe('a machine without the C kernels', () => {
  it('trains on the reference model, and says why and how much slower, in the log and the summary', () => {
    const copy = join(tempDir(), 'workspace');
    cpSync(workdir, copy, { recursive: true });
    const args = ['--workdir', copy, '--config', config, '--log-format', 'json', 'stage', 'sft'];
    const r = prefab(args, REPO, { PREFAB_CPU_KERNELS: 'off' });
    expect(r.code, r.stderr).toBe(0);
    const events = r.stderr
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, string>);
    expect(events.find((e) => e.event === 'backend')!.backend).toMatch(
      /^wasm: the reference model on TensorFlow.js's WebAssembly backend trains, scores and decodes, on one thread and several times slower than the C kernels, which are not here \(turned off by PREFAB_CPU_KERNELS=off\)/,
    );
    expect(events.find((e) => e.event === 'done' && e.stage === 'sft')!.summary).toMatch(/tokens\/s on wasm$/);
  });
});

describe('training stages (tiny model)', () => {
  it('registers the run’s model as the first version, production, with its data, config and eval table; a run with nothing new registers nothing', () => {
    const registry = new Registry(join(workdir, 'registry'));
    expect(registry.aliases()).toEqual({ production: 'v0001', candidate: null });
    const v = registry.version('v0001');
    expect(v.source).toMatchObject({
      stage: 'dpo',
      folder: 'dapo',
      sessions: expect.any(Number),
      fingerprint: JSON.parse(readFileSync(join(workdir, 'dapo', 'manifest.json'), 'utf8')).fingerprint,
    });
    expect((v.eval as { models: Record<string, unknown> }).models).toHaveProperty('dpo');
    expect((v.config as { sft: { max_steps: number } }).sft.max_steps).toBe(4);
    expect(readFileSync(join(registry.folder('v0001'), 'model', 'model.safetensors'))).toEqual(
      readFileSync(join(workdir, 'dapo', 'model', 'model.safetensors')),
    );
    const list = prefab(['--workdir', workdir, 'models', 'list']);
    expect(list.stdout).toMatch(/^v0001 .* production +dpo +success\/mean@1 /m);
    const again = prefab(['--workdir', workdir, '--config', config, 'run', '--until', 'export']);
    expect(again.code, again.stderr).toBe(0);
    expect(registry.versions()).toHaveLength(1);
  });

  it('trains a tokenizer, then SFT, then DPO from the SFT model, and evaluates all three', () => {
    for (const stage of ['tokenizer', 'sft', 'dpo', 'eval'])
      expect(existsSync(join(workdir, stage, 'manifest.json')), stage).toBe(true);
    const tokenizer = JSON.parse(readFileSync(join(workdir, 'tokenizer', 'tokenizer.json'), 'utf8'));
    expect(Object.keys(tokenizer.model.vocab).length + tokenizer.added_tokens.length).toBe(512);
    const sft = loadCheckpoint(join(workdir, 'sft', 'model'));
    // A tiny Llama in Hugging Face's layout: the configured shape, SwiGLU at 8/3 of the width, trained at the configured context.
    expect(sft.model.config).toMatchObject({
      modelType: 'llama',
      vocabSize: 512,
      hiddenSize: 32,
      intermediateSize: 96,
      layers: 1,
      heads: 2,
      kvHeads: 2,
      headDim: 16,
      maxPositions: 640,
      tiedEmbeddings: true,
    });
    expect(sft.context).toBe(640);
    expect(JSON.parse(readFileSync(join(workdir, 'sft', 'model', 'config.json'), 'utf8'))).toMatchObject({
      architectures: ['LlamaForCausalLM'],
      eos_token_id: tokenizer.added_tokens.find((t: { content: string }) => t.content === '<|end|>').id,
    });
    // Both folders carry the chat template prefab trains with, in Jinja, for transformers' apply_chat_template.
    for (const stage of ['sft', 'dpo'])
      expect(JSON.parse(readFileSync(join(workdir, stage, 'model', 'tokenizer_config.json'), 'utf8'))).toMatchObject({
        chat_template: PREFAB_CHAT_TEMPLATE,
        eos_token: '<|end|>',
        pad_token: '<|pad|>',
        model_max_length: 640,
      });
    // About half the sessions trained on had their copied values replaced.
    const counts = JSON.parse(readFileSync(join(workdir, 'sft', 'manifest.json'), 'utf8')).counts;
    expect(counts.sessions).toBe(80);
    expect(counts.resampled).toBeGreaterThan(25);
    expect(counts.resampled).toBeLessThan(55);
    // Digits are tokens of their own.
    expect(Object.keys(tokenizer.model.vocab).filter((t) => /\d\d/.test(t))).toEqual([]);
    // The tokenizer read the copied values as placeholders ([PHONE_3]), and both models say so in config.json.
    const placeholders = JSON.parse(readFileSync(join(workdir, 'tokenizer', 'placeholders.json'), 'utf8'));
    expect(placeholders.keys).toEqual(expect.arrayContaining(['account_number', 'pin', 'zip_code']));
    // The most frequent placeholders are tokens of their own, and BPE learnt no merges inside them.
    expect(
      tokenizer.added_tokens.filter((t: { special: boolean }) => !t.special).map((t: { content: string }) => t.content),
    ).toEqual(expect.arrayContaining(['[PHONE_1]', '[ACCOUNT_1]']));
    expect(Object.keys(tokenizer.model.vocab).some((t) => t.includes('PHONE'))).toBe(false);
    expect(sft.placeholders).toEqual(placeholders);
    expect(JSON.parse(readFileSync(join(workdir, 'dpo', 'model', 'config.json'), 'utf8')).prefab_placeholders).toEqual(
      placeholders,
    );
    // DPO starts from the SFT weights and moves them.
    const before = readSafetensors(join(workdir, 'sft', 'model', 'model.safetensors')).tensors.get(
      'model.layers.0.mlp.up_proj.weight',
    )!.data;
    const after = readSafetensors(join(workdir, 'dpo', 'model', 'model.safetensors')).tensors.get(
      'model.layers.0.mlp.up_proj.weight',
    )!.data;
    expect(after).not.toEqual(before);
    const meanShift = before.reduce((s, v, i) => s + Math.abs(v - after[i]!), 0) / before.length;
    expect(meanShift).toBeLessThan(0.01);
    sft.model.dispose();
  });

  it("logs a metrics line per step with TRL's names", () => {
    const sft = metricsOf(join(workdir, 'sft', 'metrics.jsonl'));
    expect(sft.map((r) => r.step)).toEqual([1, 2, 3, 4]);
    expect(sft[3]!.loss).toBeLessThan(sft[0]!.loss!);
    const dpo = metricsOf(join(workdir, 'dpo', 'metrics.jsonl'));
    expect(dpo).toHaveLength(4);
    for (const key of [
      'loss',
      'rewards/chosen',
      'rewards/rejected',
      'rewards/accuracies',
      'rewards/margins',
      'logps/chosen',
      'logps/rejected',
      'learning_rate',
      'tokens/s',
      'grad_norm',
    ]) {
      for (const row of dpo) expect(Number.isFinite(row[key]), `${key} at step ${row.step}`).toBe(true);
    }
    // Step 1 starts at the reference: its rewards are 0 and its loss ln 2.
    expect(dpo[0]!['rewards/margins']).toBeCloseTo(0, 4);
    expect(dpo[0]!.loss).toBeCloseTo(Math.log(2), 4);
    expect(dpo[0]!.learning_rate).toBeLessThan(dpo[1]!.learning_rate!);
  });

  it('writes the evaluation table as JSON for the untrained, SFT and DPO models', () => {
    const report = JSON.parse(readFileSync(join(workdir, 'eval', 'eval.json'), 'utf8'));
    expect(Object.keys(report.models)).toEqual(['untrained', 'sft', 'dpo']);
    for (const row of Object.values(report.models) as Record<string, number | null>[]) {
      expect(row.nll).toBeGreaterThan(0);
      expect(row['success/mean@1']).toBeGreaterThanOrEqual(0);
      expect(row['turns/mean']).toBeGreaterThanOrEqual(1);
    }
    // SFT is the reference: its own implicit rewards are not defined.
    expect(report.models.sft['rewards/accuracies']).toBeNull();
    expect(report.models.dpo['rewards/accuracies']).toBeGreaterThanOrEqual(0);
    expect(report.models.untrained.nll).toBeGreaterThan(report.models.sft.nll);
    expect(readFileSync(join(workdir, 'eval', 'table.txt'), 'utf8')).toMatch(/^nll\s+\d/m);
    // Beside each model's accuracy per pair type, what preferring the shorter side scores there.
    const all = report.pairs_by_type.all;
    expect(all.pairs).toBe(report.held_out.pairs);
    expect(all.shorter_chosen).toBeGreaterThanOrEqual(0);
    expect(all.accuracy.sft).toBeCloseTo(report.models.sft['pairs/accuracy'], 10);
    const types = Object.keys(report.pairs_by_type).filter((t) => t !== 'all');
    expect(types.length).toBeGreaterThan(0);
    expect(types.reduce((n, t) => n + report.pairs_by_type[t].pairs, 0)).toBe(all.pairs);
    expect(readFileSync(join(workdir, 'eval', 'table.txt'), 'utf8')).toMatch(
      /^pairs\/accuracy by type\s+pairs\s+shorter\s+untrained\s+sft\s+dpo$/m,
    );
  });

  it('compares DPO with SFT on twin validation episodes (the same tasks, tries and sampler draws)', () => {
    const report = JSON.parse(readFileSync(join(workdir, 'eval', 'eval.json'), 'utf8'));
    const episodes = report.held_out.val_tasks * report.held_out.k;
    const p = report.against_sft.dpo;
    expect(Object.keys(report.against_sft)).toEqual(['dpo']);
    expect(p.difference).toBeCloseTo(report.models.dpo['success/mean@1'] - report.models.sft['success/mean@1'], 12);
    expect(p.better - p.worse).toBe(Math.round(p.difference * episodes));
    expect(p.p).toBeGreaterThan(0);
    expect(readFileSync(join(workdir, 'eval', 'table.txt'), 'utf8')).toMatch(
      /^dpo against sft, twin episodes: [+-]\d\.\d{3} \(\d+ better, \d+ worse; one-sided sign test p = /m,
    );
  });

  it('reuses the cached reference log-probabilities when only the loss settings change', () => {
    const r = withDpo('loss: ipo\nmax_steps: 2', '--log-format', 'json', 'run');
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/"event":"reference log-probabilities from the cache"/);
    expect(
      JSON.parse(r.stdout)
        .stages.map((s: { action: string }) => s.action)
        .slice(-5),
    ).toEqual(['fresh', 'fresh', 'ran', 'ran', 'ran']); // tokenizer, sft, then dpo, dapo (off: passes the new dpo model on), eval
    expect(metricsOf(join(workdir, 'dpo', 'metrics.jsonl'))).toHaveLength(2);
    // Another seed draws other pairs from max_examples: their reference values are computed, not loaded.
    const seeded = withDpo('loss: ipo\nmax_steps: 2\nseed: other', '--log-format', 'json', 'run');
    expect(seeded.code, seeded.stderr).toBe(0);
    expect(seeded.stderr).not.toMatch(/"event":"reference log-probabilities from the cache"/);
  });

  it('trains on the pair kinds dpo.pair_kinds names, says so when there are none, and refuses a kind that does not exist', async () => {
    const r = withDpo('loss: dpo\nmax_steps: 2\npair_kinds: [outcome, hard_negative/format]', 'run');
    expect(r.code, r.stderr).toBe(0);
    const db = await DuckDBInstance.create(':memory:');
    const c = await db.connect();
    const [row] = (
      await c.runAndReadAll(
        `SELECT count(*)::INTEGER AS n FROM '${join(workdir, 'export', 'pairs', 'train.parquet')}'
         WHERE source = 'outcome' OR (source = 'hard_negative' AND negative_type = 'format')`,
      )
    ).getRowObjects();
    c.closeSync();
    const counts = JSON.parse(readFileSync(join(workdir, 'dpo', 'manifest.json'), 'utf8')).counts;
    expect(counts.examples + counts.too_long).toBe(Math.min(row!.n as number, 48)); // the tiny config's max_examples
    // A kind the data has none of (the tiny run imports no pairs) stops the stage saying so; a misspelt one is
    // refused with the config.
    const none = withDpo('loss: dpo\nmax_steps: 2\npair_kinds: [imported]', 'run');
    expect(none.code).not.toBe(0);
    expect(none.stderr).toMatch(/no pair of the kinds imported \(dpo\.pair_kinds\)/);
    const misspelt = withDpo('loss: dpo\npair_kinds: [hard_negative/nothing]', 'status');
    expect(misspelt.code).toBe(2);
    expect(misspelt.stderr).toMatch(/dpo\.pair_kinds/);
  });

  it('trains iterative on-policy DPO when dpo.iterative is on: rounds of its own rollouts, step pairs, a model and a row a round', () => {
    const r = withDpo(
      'loss: dpo\nrpo_alpha: 1\niterative: { enabled: true, rounds: 2, tasks_per_round: 2, rollouts_per_task: 3, max_calls: 1, simulator: { max_tokens: 12, max_turns: 2 }, validation: { tasks: 2, tries: 1 } }',
      '--log-format',
      'json',
      'run',
      '--until',
      'dpo',
    );
    expect(r.code, r.stderr).toBe(0);
    const manifest = JSON.parse(readFileSync(join(workdir, 'dpo', 'manifest.json'), 'utf8'));
    expect(manifest.summary).toMatch(
      /^iterative dpo \(reference fixed\): 2 rounds, \d+ step pairs; validation first-try \d\.\d{3} at the start, \d\.\d{3} /,
    );
    expect(manifest.counts).toMatchObject({ rounds: 2 });
    expect([0, 1, 2]).toContain(manifest.counts.kept_round);
    const rows = metricsOf(join(workdir, 'dpo', 'metrics.jsonl'));
    expect(rows.map((m) => m.round)).toEqual([0, 1, 2]);
    expect(rows.map((m) => m.episodes)).toEqual([0, 6, 12]);
    expect(loadCheckpoint(join(workdir, 'dpo', 'model')).model.config.layers).toBe(1);
    // What it would silently ignore is refused with the config, before any stage runs.
    const kto = withDpo('loss: kto\niterative: { enabled: true }', 'status');
    expect(kto.code).toBe(2);
    expect(kto.stderr).toMatch(/dpo\.iterative trains on step pairs: set dpo\.loss to a pairwise loss, not kto/);
    const kinds = withDpo('loss: dpo\npair_kinds: [outcome]\niterative: { enabled: true }', 'status');
    expect(kinds.code).toBe(2);
    expect(kinds.stderr).toMatch(/set pair_kinds to null/);
  });

  it('refuses a label smoothing of 0.5 or more, where the robust loss divides by zero', () => {
    const r = withDpo('loss: robust\nlabel_smoothing: 0.5', 'status');
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/dpo\.label_smoothing: .*0\.5/);
  });

  it('refuses RPO’s NLL anchor where the loss has no chosen side or anchors it itself', () => {
    for (const loss of ['orpo', 'kto']) {
      const r = withDpo(`loss: ${loss}\nrpo_alpha: 0.5`, 'status');
      expect(r.code, loss).toBe(2);
      expect(r.stderr).toMatch(/dpo\.rpo_alpha: RPO's NLL anchor is for the pairwise losses/);
    }
  });

  it('trains with SimPO, ORPO and KTO too, each logging its metrics', () => {
    for (const loss of ['simpo', 'orpo', 'kto']) {
      const r = withDpo(`loss: ${loss}\nmax_steps: 2`, '--log-format', 'json', 'run');
      expect(r.code, r.stderr).toBe(0);
      const rows = metricsOf(join(workdir, 'dpo', 'metrics.jsonl'));
      expect(rows, loss).toHaveLength(2);
      for (const key of [
        'loss',
        'rewards/chosen',
        'rewards/rejected',
        'rewards/margins',
        'logps/chosen',
        'logps/rejected',
        ...(loss === 'kto' ? ['kl'] : ['rewards/accuracies']),
      ]) {
        expect(Number.isFinite(rows[1]![key]), `${loss}: ${key}`).toBe(true);
      }
      const report = JSON.parse(readFileSync(join(workdir, 'eval', 'eval.json'), 'utf8'));
      expect(Object.keys(report.models)).toEqual(['untrained', 'sft', loss]);
      expect(report.preference_loss.loss).toBe(loss);
    }
  });

  it('reads the exported pairs the trainer used with DuckDB too', async () => {
    const db = await DuckDBInstance.create(':memory:');
    const c = await db.connect();
    const [row] = (
      await c.runAndReadAll(`SELECT count(*)::INTEGER AS n FROM '${join(workdir, 'export', 'pairs', 'train.parquet')}'`)
    ).getRowObjectsJson();
    expect(Number(row!.n)).toBeGreaterThanOrEqual(48);
  });

  it('passes the dpo model on when DAPO is off, and with it on plays groups in the simulator and logs every step', () => {
    const off = JSON.parse(readFileSync(join(workdir, 'dapo', 'manifest.json'), 'utf8'));
    expect(off.summary).toMatch(/DAPO is off/);
    expect(readFileSync(join(workdir, 'dapo', 'model', 'model.safetensors'))).toEqual(
      readFileSync(join(workdir, 'dpo', 'model', 'model.safetensors')),
    );
    const cfg = tinyConfig(join(workdir, '..'));
    appendFileSync(
      cfg,
      'dapo:\n  enabled: true\n  steps: 2\n  tasks_per_step: 1\n  group_size: 2\n  reward: partial\n  max_generation_batches: 2\n  mode: feedback\n  max_calls: 1\n  simulator: { max_tokens: 12, max_turns: 2 }\n  validation: { every: 1, tasks: 1, tries: 2 }\n',
    );
    const r = prefab(['--workdir', workdir, '--config', cfg, '--log-format', 'json', 'run', '--until', 'dapo']);
    expect(r.code, r.stderr).toBe(0);
    const rows = metricsOf(join(workdir, 'dapo', 'metrics.jsonl'));
    expect(rows.map((m) => m.step)).toEqual([1, 2]);
    for (const m of rows) {
      expect(m.episodes).toBe(m.groups! * 2);
      expect(m.groups).toBeGreaterThanOrEqual(1);
      expect(m.kept_groups).toBeLessThanOrEqual(1);
      expect(m.reward_mean).toBeGreaterThanOrEqual(-1);
      expect(Number.isFinite(m.response_length)).toBe(true);
      // Validated after every step: first try without notes, then within two tries reading them.
      expect(m['val/success_first']).toBeGreaterThanOrEqual(0);
      expect(m['val/success_feedback']).toBeGreaterThanOrEqual(m['val/success_first']!);
    }
    expect(JSON.parse(readFileSync(join(workdir, 'dapo', 'model', 'config.json'), 'utf8'))).toMatchObject({
      architectures: ['LlamaForCausalLM'],
    });
    // The eval table gains a dapo column.
    const evaluated = prefab(['--workdir', workdir, '--config', cfg, '--log-format', 'json', 'run', '--from', 'eval']);
    expect(evaluated.code, evaluated.stderr).toBe(0);
    expect(Object.keys(JSON.parse(readFileSync(join(workdir, 'eval', 'eval.json'), 'utf8')).models)).toEqual([
      'untrained',
      'sft',
      'dpo',
      'dapo',
    ]);
  });
});

describe('kill -9 during dpo', () => {
  it('resumes from the last checkpoint and ends with the same metrics as an uninterrupted run', async () => {
    const dir = tempDir();
    const cfg = tinyConfig(dir, 'loss: dpo\nmax_steps: 12');
    const killed = join(dir, 'killed');
    const args = ['--config', cfg, '--log-format', 'json'];
    const child = prefabAsync(['--workdir', killed, ...args, 'run']);
    await killAtCheckpoint(child, join(killed, '.cache', 'dpo'), 4);
    expect(existsSync(join(killed, 'dpo', 'manifest.json'))).toBe(false);

    const resumed = prefab(['--workdir', killed, ...args, 'run']);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(resumed.stderr).toMatch(/"event":"resuming from checkpoint".*"step":(4|6|8|10)/);
    const whole = prefab(['--workdir', join(dir, 'whole'), ...args, 'run']);
    expect(whole.code, whole.stderr).toBe(0);

    // Everything but the timing is bit-identical: same batches, same RNG, same optimiser state.
    const strip = (rows: Record<string, number>[]) => rows.map(({ 'tokens/s': _, ...rest }) => rest);
    expect(strip(metricsOf(join(killed, 'dpo', 'metrics.jsonl')))).toEqual(
      strip(metricsOf(join(dir, 'whole', 'dpo', 'metrics.jsonl'))),
    );
    expect(readFileSync(join(killed, 'dpo', 'model', 'model.safetensors'))).toEqual(
      readFileSync(join(dir, 'whole', 'dpo', 'model', 'model.safetensors')),
    );
    expect(JSON.parse(readFileSync(join(killed, 'eval', 'eval.json'), 'utf8')).models).toEqual(
      JSON.parse(readFileSync(join(dir, 'whole', 'eval', 'eval.json'), 'utf8')).models,
    );
  });
});

describe('kill -9 during dapo', () => {
  it('resumes from the last checkpoint and ends where an uninterrupted run does: same rollouts, metrics and weights', async () => {
    const cfg = tinyConfig(join(workdir, '..'));
    appendFileSync(
      cfg,
      'dapo:\n  enabled: true\n  steps: 5\n  tasks_per_step: 1\n  group_size: 2\n  reward: partial\n  mode: feedback\n  simulator: { max_tokens: 12, max_turns: 2 }\n',
    );
    const common = ['--workdir', workdir, '--config', cfg, '--log-format', 'json'];
    const args = [...common, 'run', '--until', 'dapo'];
    const cache = join(workdir, '.cache', 'dapo');
    const fresh = () => rmSync(cache, { recursive: true, force: true });
    fresh();
    const child = prefabAsync(args);
    await killAtCheckpoint(child, cache, 2);
    const resumed = prefab(args);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(resumed.stderr).toMatch(/"event":"resuming from checkpoint".*"step":[234]/);
    const killed = {
      metrics: metricsOf(join(workdir, 'dapo', 'metrics.jsonl')),
      weights: readFileSync(join(workdir, 'dapo', 'model', 'model.safetensors')),
    };
    fresh();
    const whole = prefab([...common, 'stage', 'dapo']);
    expect(whole.code, whole.stderr).toBe(0);
    expect(whole.stderr).not.toMatch(/resuming from checkpoint/);
    const strip = (rows: Record<string, number>[]) => rows.map(({ 'tokens/s': _, ...rest }) => rest);
    expect(strip(killed.metrics)).toEqual(strip(metricsOf(join(workdir, 'dapo', 'metrics.jsonl'))));
    expect(killed.metrics).toHaveLength(5);
    expect(killed.weights).toEqual(readFileSync(join(workdir, 'dapo', 'model', 'model.safetensors')));
  });
});
