// What a training stage's config section holds, as schemas only: the config is read and checked, and
// `prefab config-reference` written, without loading a trainer or TensorFlow.js.
import { z } from 'zod';
import { PROJECTIONS, type LoraConfig } from '../model/config.ts';

/**
 * The settings every training stage's config has: seed, batch and run length, checkpoints, micro-batches,
 * and the optimiser's (`lr` is the peak, reached after `warmup` steps, then decayed along a cosine to
 * lr · min_lr_ratio).
 */
export function trainingConfig(lr: number) {
  return {
    seed: z.string().default('prefab').describe('Initial weights, data order, which examples a max_* draws.'),
    batch_size: z
      .number()
      .int()
      .min(1)
      .default(8)
      .describe(
        'Examples per optimiser step: windows of a session for SFT, pairs (KTO: rows) for preference training.',
      ),
    epochs: z
      .number()
      .positive()
      .default(1)
      .describe(
        'Passes over the data (a fraction is allowed): steps = epochs × examples / batch_size, rounded up, at most max_steps.',
      ),
    max_steps: z
      .number()
      .int()
      .min(1)
      .nullable()
      .default(null)
      .describe('At most this many steps (null: as many as the epochs take).'),
    lr: z
      .number()
      .positive()
      .default(lr)
      .describe("AdamW's peak learning rate, reached after warmup, then decayed along a cosine."),
    warmup: z.number().int().min(0).default(10).describe('Steps of linear warmup to the peak learning rate.'),
    min_lr_ratio: z
      .number()
      .min(0)
      .max(1)
      .default(0.1)
      .describe('The learning rate at the last step, as a share of lr: where the cosine decay ends.'),
    weight_decay: z
      .number()
      .min(0)
      .default(0.1)
      .describe("AdamW's decoupled weight decay, on weight matrices only (not biases or LayerNorm gains)."),
    max_grad_norm: z.number().positive().default(1).describe('Gradients are clipped to this global norm at each step.'),
    checkpoint_every: z
      .number()
      .int()
      .min(1)
      .default(25)
      .describe('Steps between checkpoints (one is also written at the end); a killed run resumes from the latest.'),
    micro_batch_tokens: z
      .number()
      .int()
      .min(16)
      .default(2048)
      .describe(
        'Largest micro-batch, in padded tokens: a batch is split into micro-batches whose gradients add up (WASM runs out of memory past ~4k).',
      ),
  };
}

/** The settings `trainingConfig` gives a stage's config. */
export type TrainingSettings = z.infer<z.ZodObject<ReturnType<typeof trainingConfig>>>;

/** A training stage's `lora` section: null trains every weight; a section trains adapters only. */
export const loraSettings = z
  .strictObject({
    r: z.number().int().min(1).default(8).describe("The adapters' rank."),
    alpha: z.number().positive().default(16).describe('The update is scaled by alpha / r.'),
    dropout: z
      .number()
      .min(0)
      .lt(1)
      .default(0.05)
      .describe("Dropout on an adapter's input while training (seeded by the run's seed and step)."),
    target_modules: z
      .array(z.enum(PROJECTIONS))
      .min(1)
      .default(['q_proj', 'k_proj', 'v_proj', 'o_proj'])
      .describe('Projections that get adapters: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.'),
  })
  .nullable()
  .default(null)
  .describe(
    "LoRA: train low-rank adapters on these projections instead of every weight (PEFT's format: the stage writes adapter/ beside the merged model/). null: full fine-tuning.",
  );

/** The settings a `lora` section gives, as attachLora takes them. */
export const loraOf = (s: NonNullable<z.infer<typeof loraSettings>>): LoraConfig => ({
  r: s.r,
  alpha: s.alpha,
  dropout: s.dropout,
  targetModules: s.target_modules,
});

/** The loss names a config may give: dpo for DPO's sigmoid loss, and trainers/losses' registry (a test keeps the two alike). */
export const LOSS_NAMES = ['dpo', 'sigmoid', 'robust', 'hinge', 'ipo', 'simpo', 'orpo', 'kto'] as const;

/** The losses of pairs (every one but KTO's, which trains on rows): what a refresh night offers. */
export const PAIRWISE_LOSSES = ['dpo', 'sigmoid', 'robust', 'hinge', 'ipo', 'simpo', 'orpo'] as const;

/**
 * A preference run's knobs (trainers/preference.ts runPreference): the dpo stage's config and a refresh night's
 * `refresh.dpo`, each with its own learning rate and the losses it offers.
 */
export function preferenceKnobs<L extends (typeof LOSS_NAMES)[number]>(o: {
  lr: number;
  losses: readonly [L, ...L[]];
}) {
  return {
    loss: z
      .enum(o.losses)
      .default('dpo' as L)
      .describe(
        `dpo is DPO's sigmoid loss; robust and hinge are its variants; simpo and orpo need no reference${o.losses.includes('kto' as L) ? '; kto trains on the KTO rows' : ''}.`,
      ),
    beta: z
      .number()
      .positive()
      .nullable()
      .default(null)
      .describe("β (ORPO: λ); null takes the loss's paper default: 0.1, SimPO 2.0."),
    label_smoothing: z
      .number()
      .min(0)
      .lt(0.5)
      .default(0)
      .describe(
        'cDPO / robust DPO: the chance a label is wrong, below 0.5 (at 0.5 a label says nothing, and robust DPO divides by 1 − 2ε).',
      ),
    gamma_beta_ratio: z.number().min(0).default(0.5).describe("SimPO's margin γ as a share of β."),
    rpo_alpha: z
      .number()
      .min(0)
      .nullable()
      .default(null)
      .describe(
        "RPO, as TRL's rpo_alpha: add α × the chosen sides' NLL (a mean over their tokens in the batch) to a pairwise loss, so that DPO cannot widen its margins by lowering the chosen side's likelihood, as it does on long, similar sides; null: none. Not for ORPO (which has its own) or KTO.",
      ),
    max_length: z
      .number()
      .int()
      .min(16)
      .nullable()
      .default(null)
      .describe(
        "Tokens of prompt and completion together (null: the model's context), as TRL's max_length: the prompt keeps its head and as many latest messages as leave room for the longer side; a pair that still does not fit is left out.",
      ),
    ...trainingConfig(o.lr),
  };
}

/** A section of preferenceKnobs: its rpo_alpha refused where the loss has no chosen side to anchor or anchors it itself. */
export function anchorOnlyPairs(c: { loss: string; rpo_alpha: number | null }, ctx: z.RefinementCtx): void {
  if (c.rpo_alpha !== null && (c.loss === 'kto' || c.loss === 'orpo'))
    ctx.addIssue({
      code: 'custom',
      path: ['rpo_alpha'],
      message: `RPO's NLL anchor is for the pairwise losses: ${c.loss === 'orpo' ? 'ORPO adds the chosen side’s NLL itself' : 'KTO has no chosen side'}; set it to null`,
    });
}
