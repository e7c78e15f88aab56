// RPO's NLL anchor on the pairwise losses (trainers/dpo.ts with rpo_alpha, as TRL's): a step's loss is the
// pairwise loss plus α × the chosen sides' NLL as one mean over the whole batch's chosen tokens, however the
// batch is cut into micro-batches; trained with it, the chosen side ends likelier than under DPO alone; ORPO
// and KTO refuse it.
import { beforeAll, describe, expect, it } from 'vitest';
import { seeded } from '../../core/random.ts';
import { Llama } from '../../model/llama.ts';
import type { Sequence } from '../../model/windows.ts';
import { openDevice } from '../../runtime/device.ts';
import { dpoTrainer, lossOf, referenceScores, type Example, type PreferenceSettings } from '../../trainers/dpo.ts';
import { ktoTrainer } from '../../trainers/kto.ts';
import { ADAMW_DEFAULTS, AdamW } from '../../trainers/optimizer.ts';
import { onModel, optimizerStep, type MicroBatch } from '../../trainers/step.ts';
import { NEVER } from '../../pipeline/interrupt.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { quietLogger } from '../fixtures/toy-stages.ts';
import { join } from 'node:path';

const config = tinyLlama({ vocabSize: 30 });
const start = () => Llama.create(config, 'rpo');
const random = seeded('rpo');
const draw = (n: number) => Array.from({ length: n }, () => 1 + Math.floor(random() * 29));
/** Two sides after one prompt that differ in their last few tokens: long, similar sides, where DPO lowers both. */
const pair = (): Example => {
  const [prompt, shared] = [draw(4), draw(6)];
  const side = (): Sequence => {
    const reply = [...shared, ...draw(2)];
    return { ids: [...prompt, ...reply], mask: [...prompt.map(() => 0), ...reply.map(() => 1)] };
  };
  return { sequences: [side(), side()] };
};
const pairs = Array.from({ length: 8 }, pair);
const cfg = (rpo_alpha: number | null, micro_batch_tokens = 2048) =>
  ({
    seed: 'rpo',
    batch_size: 8,
    epochs: 10,
    max_steps: 10,
    lr: 0.01,
    warmup: 0,
    min_lr_ratio: 1,
    weight_decay: 0,
    max_grad_norm: 1,
    checkpoint_every: 100,
    micro_batch_tokens,
    label_smoothing: 0,
    gamma_beta_ratio: 0.5,
    desirable_weight: 1,
    undesirable_weight: 1,
    rpo_alpha,
  }) as unknown as PreferenceSettings;

beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
});

/** A step's parts, their losses and metrics added up, on `model`. */
function stepOf(parts: MicroBatch[], model: Llama): { loss: number; metrics: Record<string, number> } {
  const out = { loss: 0, metrics: {} as Record<string, number> };
  for (const part of parts) {
    const r = onModel(part, model)();
    out.loss += r.loss.dataSync()[0]!;
    for (const [k, v] of Object.entries(r.metrics ?? {})) out.metrics[k] = (out.metrics[k] ?? 0) + v.dataSync()[0]!;
  }
  return out;
}

/** The chosen sides' NLL over the step's parts: −Σ log p over their trained tokens / how many there are. */
function chosenNll(parts: MicroBatch[], model: Llama): number {
  let [sum, tokens] = [0, 0];
  for (const part of parts) {
    const b = part.blocks[0]! as MicroBatch['blocks'][number] & { mask: Float32Array };
    const logp = model.tokenLogprobs(b.ids, b.targets, b.batch, b.length).dataSync();
    b.mask.forEach((m, t) => ((sum += m * logp[t]!), (tokens += m)));
  }
  return -sum / tokens;
}

describe('RPO: DPO anchored by the chosen side’s NLL (rpo_alpha)', () => {
  it('adds α × the whole batch’s chosen-token NLL to the pairwise loss, the same in one micro-batch or many', async () => {
    const model = start();
    const dir = tempDir();
    const scores = await referenceScores(model, pairs, {
      pad: 0,
      maxTokens: 2048,
      path: join(dir, 'reference.json'),
      signal: NEVER,
      log: quietLogger(),
    });
    for (const loss of [lossOf('dpo', 0.1), lossOf('simpo', null)]) {
      const reference = loss.reference ? scores : null;
      const trainer = (alpha: number | null, micro?: number) =>
        dpoTrainer({ examples: pairs, reference, loss, cfg: cfg(alpha, micro), pad: 0, start });
      const plain = (await trainer(null).batch(0, model, {})).parts;
      const [whole, pieces] = [
        (await trainer(0.5).batch(0, model, {})).parts,
        (await trainer(0.5, 40).batch(0, model, {})).parts,
      ];
      expect(whole).toHaveLength(1);
      expect(pieces.length).toBeGreaterThan(2);
      const nll = chosenNll(plain, model);
      for (const parts of [whole, pieces]) {
        const step = stepOf(parts, model);
        expect(step.loss, loss.name).toBeCloseTo(stepOf(plain, model).loss + 0.5 * nll, 5);
        expect(step.metrics.nll_loss, loss.name).toBeCloseTo(nll, 5);
      }
      expect(stepOf(plain, model).metrics.nll_loss).toBeUndefined(); // TRL logs it only with rpo_alpha
    }
    model.dispose();
  });

  it('ends with the chosen side likelier than DPO alone leaves it, on long sides that differ in a few tokens', async () => {
    /** The chosen sides' NLL before and after the run's steps of DPO with `alpha`. */
    const trained = async (alpha: number | null) => {
      const model = start();
      const log = quietLogger();
      const path = join(tempDir(), 'reference.json');
      const scores = await referenceScores(model, pairs, { pad: 0, maxTokens: 2048, path, signal: NEVER, log });
      const loss = lossOf('dpo', 0.1);
      const trainer = dpoTrainer({ examples: pairs, reference: scores, loss, cfg: cfg(alpha), pad: 0, start });
      const nll = async () => chosenNll((await trainer.batch(0, model, {})).parts, model);
      const before = await nll();
      const optimizer = new AdamW(model.params, ADAMW_DEFAULTS);
      for (let step = 0; step < trainer.steps; step++) {
        const { parts } = await trainer.batch(step, model, {});
        optimizerStep(
          model,
          optimizer,
          parts.map((p) => onModel(p, model)),
          0.01,
          1,
        );
      }
      const after = await nll();
      model.dispose();
      return { before, after };
    };
    const [dpo, rpo] = [await trained(null), await trained(1)];
    expect(rpo.before).toBe(dpo.before);
    expect(rpo.after).toBeLessThan(rpo.before);
    expect(rpo.after).toBeLessThan(dpo.after - 0.1); // the anchor's pull, beyond what DPO's margin gave
  });

  it('is refused where the loss has no chosen side to anchor or anchors it itself', () => {
    const orpo = () =>
      dpoTrainer({ examples: pairs, reference: null, loss: lossOf('orpo', null), cfg: cfg(0.5), pad: 0, start });
    expect(orpo).toThrow(/rpo_alpha: ORPO adds the chosen side’s NLL itself/);
    const kto = () =>
      ktoTrainer({ examples: pairs, reference: [], loss: lossOf('kto', null), cfg: cfg(0.5), pad: 0, start });
    expect(kto).toThrow(/rpo_alpha: KTO has no chosen side/);
  });
});
