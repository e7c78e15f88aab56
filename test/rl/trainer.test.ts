// The DAPO trainer's core: rollouts trained on exactly the tokens the policy wrote, with GRPO advantages, and
// one step that makes the better rollout of a group likelier and the worse one less likely.
import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';
import { NEVER } from '../../pipeline/interrupt.ts';
import { openDevice } from '../../runtime/device.ts';
import { chainTurns, dapoParts, dapoTrainer, rolloutBatch, turnSequence, type Rollout } from '../../rl/trainer.ts';
import { trainingRun } from '../../trainers/run.ts';
import { tempDir } from '../fixtures/pipeline.ts';
import { DAPO_CLIP } from '../../trainers/losses/index.ts';
import { Llama } from '../../model/llama.ts';
import { ADAMW_DEFAULTS, AdamW } from '../../trainers/optimizer.ts';
import { onModel, optimizerStep } from '../../trainers/step.ts';
import { tinyLlama } from '../fixtures/llama.ts';
import { runSettings } from '../fixtures/held.ts';
import type { Message } from '../../core/records.ts';
import { seeded } from '../../core/random.ts';
import { prefabChat } from '../../model/chat.ts';
import { renderText } from '../../model/chat-template.ts';
import { ModelPolicy } from '../../runtime/policy.ts';
import { TextTokenizer, trainTokenizer } from '../../model/tokenizer.ts';
import type { Engine } from '../../runtime/device.ts';

/** The policies decode with the reference model's loops. */
const REFERENCE: Engine = { kind: 'reference' };

beforeAll(async () => {
  await openDevice({ backend: 'wasm' });
});

/** log p of `generated` after `prompt`, summed. */
function logp(model: Llama, prompt: number[], generated: number[]): number {
  const ids = [...prompt, ...generated];
  const lp = tf.tidy(() =>
    model.tokenLogprobs(Int32Array.from(ids.slice(0, -1)), Int32Array.from(ids.slice(1)), 1, ids.length - 1).dataSync(),
  );
  return Array.from(lp)
    .slice(prompt.length - 1)
    .reduce((a, b) => a + b, 0);
}

/** Two turns after the same prompt: the one a rewarded rollout wrote, and the one an unrewarded rollout wrote. */
const good = { prompt: [1, 2, 3], generated: [5, 6] };
const bad = { prompt: [1, 2, 3], generated: [7, 8] };
const pair: [Rollout, Rollout] = [
  { group: 't', reward: 1, turns: [good] },
  { group: 't', reward: 0, turns: [bad] },
];

describe('DAPO trainer core', () => {
  it('trains only the generated tokens of each turn', () => {
    expect(turnSequence({ prompt: [1, 2, 3], generated: [7, 8] })).toEqual({
      ids: [1, 2, 3, 7, 8],
      mask: [0, 0, 0, 1, 1],
    });
  });

  it('chains turns whose prompts extend each other into one sequence, starts another where the prompt was cut, and drops empty turns', () => {
    const turns = [
      { prompt: [1, 2], generated: [5, 6] },
      { prompt: [1, 2, 5, 6, 3], generated: [9] }, // extends the first: the tool's token 3 is masked out
      { prompt: [2, 5, 6, 3, 9, 4], generated: [8] }, // cut at the front: a sequence of its own
      { prompt: [2, 5, 6, 3, 9, 4, 8], generated: [] },
    ];
    expect(chainTurns(turns)).toEqual([
      { ids: [1, 2, 5, 6, 3, 9], mask: [0, 0, 1, 1, 0, 1] },
      { ids: [2, 5, 6, 3, 9, 4, 8], mask: [0, 0, 0, 0, 0, 0, 1] },
    ]);
  });

  it('records the old log-probabilities of every generated token and each rollout’s advantage', async () => {
    const model = Llama.create(tinyLlama(), 'old');
    const rollouts: Rollout[] = [
      {
        group: 't',
        reward: 1,
        turns: [
          { prompt: [1, 2], generated: [5, 6] },
          { prompt: [1, 2, 5, 6, 3], generated: [9] },
        ],
      },
      {
        group: 't',
        reward: 0,
        turns: [
          { prompt: [1, 2], generated: [7] },
          { prompt: [1, 2, 7, 4], generated: [] },
        ],
      },
    ];
    const batch = await rolloutBatch(model, rollouts, { pad: 0, maxTokens: 64, signal: NEVER });
    expect(batch.sequences).toHaveLength(2);
    expect(batch.advantages[0]).toBeCloseTo(Math.SQRT1_2, 4); // (1 − 0.5) / √0.5
    expect(batch.advantages[1]).toBeCloseTo(-Math.SQRT1_2, 4);
    expect(batch.oldLogps[0]).toHaveLength(5);
    const old = batch.oldLogps[0]!;
    // The chained sequence's log-probabilities of 5, 6 and 9 are those of each turn on its own.
    expect(old[1]! + old[2]!).toBeCloseTo(logp(model, [1, 2], [5, 6]), 4);
    expect(old[4]!).toBeCloseTo(logp(model, [1, 2, 5, 6, 3], [9]), 4);
    expect(old[0]).toBe(0);
    expect(old[3]).toBe(0);
    model.dispose();
  });

  it('makes the better rollout likelier and the worse one less likely over several epochs on one batch', async () => {
    const model = Llama.create(tinyLlama(), 'step');
    const rollouts: Rollout[] = [...pair, ...pair];
    const before = [logp(model, good.prompt, good.generated), logp(model, bad.prompt, bad.generated)];
    const batch = await rolloutBatch(model, rollouts, { pad: 0, maxTokens: 64, signal: NEVER });
    const optimizer = new AdamW(model.params, ADAMW_DEFAULTS);
    for (let epoch = 0; epoch < 3; epoch++) {
      // Micro-batches of one sequence each must add up to the whole batch's token mean.
      const { parts } = dapoParts(batch, [0, 1, 2, 3], 0, 6, DAPO_CLIP);
      expect(parts).toHaveLength(4);
      const step = optimizerStep(
        model,
        optimizer,
        parts.map((p) => onModel(p, model)),
        5e-3,
        1,
      );
      if (epoch === 0) {
        // On-policy the ratio is 1 everywhere: nothing is clipped, and the advantages' token mean is 0.
        expect(step.loss).toBeCloseTo(0, 5);
        expect(step.metrics).toEqual({ clip_low: 0, clip_high: 0, dual_clip: 0, kl: 0 });
      }
    }
    const after = [logp(model, good.prompt, good.generated), logp(model, bad.prompt, bad.generated)];
    expect(after[0]).toBeGreaterThan(before[0]! + 0.05);
    expect(after[1]).toBeLessThan(before[1]! - 0.05);
    model.dispose();
  });

  it('records in the policy the exact tokens each turn read and wrote', async () => {
    const conversation: Message[] = [
      { role: 'system', content: 'You phone companies for the user.' },
      { role: 'user', content: 'Cancel my gym plan.' },
    ];
    const json = trainTokenizer([renderText(conversation)], 300);
    const chat = prefabChat(json);
    const model = Llama.create(
      tinyLlama({ vocabSize: new TextTokenizer(json).vocabSize, maxPositions: 256 }),
      'policy',
    );
    const sampling = { maxTokens: 6, temperature: 1, topP: 1, recordTurns: true, engine: REFERENCE };
    const policy = new ModelPolicy(
      { name: 'm', model, context: 256, chat, placeholders: null, sampling },
      seeded('turns'),
    );
    await policy.respond(conversation);
    const [open] = await chat.encode([conversation], true);
    expect(policy.turns).toHaveLength(1);
    expect(policy.turns[0]!.prompt).toEqual(open!.ids);
    expect(policy.turns[0]!.generated.length).toBeGreaterThan(0);
    expect(policy.turns[0]!.generated.length).toBeLessThanOrEqual(6);
    model.dispose();
  });

  it('feedback-guided turns: recorded with the plain prompt, trained on the notes, on the plain prompt with the notes’ old log-probabilities, or both', async () => {
    const conversation: Message[] = [
      { role: 'system', content: 'You phone companies for the user.' },
      { role: 'user', content: 'Cancel my gym plan.' },
    ];
    const json = trainTokenizer(
      [renderText(conversation), 'Notes from earlier attempts: Gym Billing asked for pin.'],
      300,
    );
    const chat = prefabChat(json);
    const model = Llama.create(
      tinyLlama({ vocabSize: new TextTokenizer(json).vocabSize, maxPositions: 256 }),
      'policy',
    );
    const sampling = { maxTokens: 4, temperature: 1, topP: 1, recordTurns: true, engine: REFERENCE };
    const policy = new ModelPolicy(
      { name: 'm', model, context: 256, chat, placeholders: null, sampling },
      seeded('notes'),
    );
    policy.reads = (c) =>
      c.map((m, i) =>
        i === 1 ? { ...m, content: `${m.content}\n\nNotes from earlier attempts: Gym Billing asked for pin.` } : m,
      );
    await policy.respond(conversation);
    const turn = policy.turns[0]!;
    const [plain] = await chat.encode([conversation], true);
    expect(turn.base).toEqual(plain!.ids);
    expect(turn.prompt.length).toBeGreaterThan(turn.base!.length);
    const rollouts: Rollout[] = [
      { group: 't', reward: 1, turns: [turn] },
      { group: 't', reward: 0, turns: [{ prompt: plain!.ids, generated: [3, 4] }] },
    ];
    const G = turn.generated.length;
    const sampled = logp(model, turn.prompt, turn.generated);
    const sum = (xs: Float32Array, n: number) => Array.from(xs.slice(xs.length - n)).reduce((a, b) => a + b, 0);
    const context = await rolloutBatch(model, rollouts, { pad: 0, maxTokens: 512, signal: NEVER, on: 'context' });
    expect(context.sequences[0]!.ids).toEqual([...turn.prompt, ...turn.generated]);
    const base = await rolloutBatch(model, rollouts, { pad: 0, maxTokens: 512, signal: NEVER, on: 'base' });
    expect(base.sequences[0]!.ids).toEqual([...turn.base!, ...turn.generated]);
    // The old log-probabilities are the sampling policy's, which read the notes: an importance ratio to the plain prompt.
    expect(sum(base.oldLogps[0]!, G)).toBeCloseTo(sampled, 4);
    expect(sum(base.oldLogps[0]!, G)).not.toBeCloseTo(logp(model, turn.base!, turn.generated), 3);
    const both = await rolloutBatch(model, rollouts, { pad: 0, maxTokens: 512, signal: NEVER, on: 'both' });
    expect(both.sequences.map((x) => x.ids.length)).toEqual([
      turn.prompt.length + G,
      turn.base!.length + G,
      plain!.ids.length + 2,
    ]);
    expect(both.advantages.slice(0, 2)).toEqual([both.advantages[0], both.advantages[0]]);
    expect(both.entropy).toBeGreaterThan(0);
    expect(both.entropy).toBeLessThanOrEqual(Math.log(new TextTokenizer(json).vocabSize) + 1e-4);
    model.dispose();
  });

  it('with a KL coefficient, keeps the policy near the reference: the k3 KL is 0 at the start and reported once it moves', async () => {
    const model = Llama.create(tinyLlama(), 'kl');
    const reference = Llama.create(tinyLlama(), 'kl');
    const rollouts: Rollout[] = [...pair];
    const optimizer = new AdamW(model.params, ADAMW_DEFAULTS);
    const clip = { ...DAPO_CLIP, klCoef: 0.1 };
    const kls: number[] = [];
    for (let step = 0; step < 3; step++) {
      const batch = await rolloutBatch(model, rollouts, {
        pad: 0,
        maxTokens: 64,
        signal: NEVER,
        on: 'context',
        reference,
      });
      expect(batch.refLogps).toHaveLength(2);
      kls.push(
        optimizerStep(
          model,
          optimizer,
          dapoParts(batch, [0, 1], 0, 64, clip).parts.map((p) => onModel(p, model)),
          1e-2,
          1,
        ).metrics.kl!,
      );
    }
    expect(kls[0]).toBeCloseTo(0, 6);
    expect(kls[2]).toBeGreaterThan(1e-4);
    model.dispose();
    reference.dispose();
  });

  it('trains as a Trainer: several updates a step, a metrics line per step with the rollouts’ figures, and a resumed run ends where a straight one does', async () => {
    const settings = (cache: string, steps: number) =>
      runSettings(
        {
          seed: 's',
          batch_size: 1,
          epochs: 1,
          max_steps: steps,
          lr: 5e-3,
          warmup: 0,
          min_lr_ratio: 1,
          weight_decay: 0,
          max_grad_norm: 1,
          checkpoint_every: 1,
          micro_batch_tokens: 64,
        },
        { cache },
      );
    const trainer = (steps: number) =>
      dapoTrainer({
        steps,
        start: () => Llama.create(tinyLlama(), 'rl'),
        // The same rollouts every step, whatever the weights: the test looks at the updates, not the sampling.
        rollouts: async () => ({ rollouts: [...pair], metrics: { reward_mean: 0.5, kept_groups: 1 } }),
        pad: 0,
        microBatchTokens: 64,
        clip: DAPO_CLIP,
        ppoEpochs: 2,
        miniBatches: 2,
        seed: 's',
        signal: NEVER,
      });
    const straight = await trainingRun(settings(tempDir(), 3), trainer(3));
    expect(straight.metrics.map((m) => [m.step, m.reward_mean, m.kept_groups])).toEqual([
      [1, 0.5, 1],
      [2, 0.5, 1],
      [3, 0.5, 1],
    ]);
    expect(logp(straight.model, good.prompt, good.generated)).toBeGreaterThan(
      logp(Llama.create(tinyLlama(), 'rl'), good.prompt, good.generated),
    );
    const cache = tempDir();
    (await trainingRun(settings(cache, 3), { ...trainer(3), steps: 2 })).model.dispose();
    const resumed = await trainingRun(settings(cache, 3), trainer(3));
    expect(resumed.resumedFrom).toBe(2);
    const weights = (m: Llama) => [...m.params.values()].map((v) => Array.from(v.dataSync()));
    expect(weights(resumed.model)).toEqual(weights(straight.model));
    expect(resumed.metrics.map((m) => m.loss)).toEqual(straight.metrics.map((m) => m.loss));
  });

  it('makes no update on a step without informative groups', async () => {
    const model = Llama.create(tinyLlama(), 'none');
    const t = dapoTrainer({
      steps: 1,
      start: () => model,
      rollouts: async () => ({ rollouts: [], metrics: { kept_groups: 0 } }),
      pad: 0,
      microBatchTokens: 64,
      clip: DAPO_CLIP,
      ppoEpochs: 2,
      miniBatches: 2,
      seed: 's',
      signal: NEVER,
    });
    expect(await t.batch(0, model, {})).toEqual({ parts: [], tokens: 0, metrics: { kept_groups: 0 } });
  });
});
