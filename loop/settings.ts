// The online loop's settings, as schemas and option parsers only: the config is checked and the commands'
// options parsed without loading the trainer, the decoder or TensorFlow.js.
import { z } from 'zod';
import { DEFAULT_WORLD } from '../env/world.ts';
import { PAIRWISE_LOSSES, anchorOnlyPairs, preferenceKnobs } from '../trainers/settings.ts';
import { dapoKnobs, maxCalls } from '../rl/settings.ts';
import { gateConfig } from './paired.ts';

export const refreshConfig = z
  .strictObject({
    inbox: z
      .string()
      .default('../inbox')
      .describe(
        'The folder new sessions land in, relative to this file; it must be one of ingest.inputs or inside one of their folders. `refresh --days` writes its simulated days there.',
      ),
    seed: z
      .string()
      .default('prefab')
      .describe('The buffer’s draws, the training order and the paired episodes’ sampling.'),
    compound: z
      .boolean()
      .default(false)
      .describe(
        'Nights that compound: train each candidate from the last night’s, where that night kept the same production and did not promote it, so that gains too small for one night’s paired test add up until it sees them; what is promoted is compared with production either way. false: every candidate from production.',
      ),
    buffer: z
      .strictObject({
        size: z
          .number()
          .int()
          .min(1)
          .default(256)
          .describe(
            'Pairs a night trains on: every pair new tonight first (a seeded sample of them when there are more), then older ones.',
          ),
        half_life_nights: z
          .number()
          .positive()
          .default(3)
          .describe('An older pair is drawn with weight ½^(nights since it first appeared / half_life_nights).'),
      })
      .prefault({})
      .describe('The replay buffer: new sessions’ pairs mixed with older ones, bounded, recency weighted.'),
    dpo: z
      .strictObject({
        ...preferenceKnobs({ lr: 2e-5, losses: PAIRWISE_LOSSES }),
        batch_size: z.number().int().min(1).default(4).describe('Pairs per optimiser step.'),
        warmup: z.number().int().min(0).default(0).describe('Steps of linear warmup.'),
        checkpoint_every: z
          .number()
          .int()
          .min(1)
          .default(10)
          .describe('Steps between checkpoints; a killed night resumes from the latest.'),
      })
      .superRefine(anchorOnlyPairs)
      .prefault({})
      .describe(
        'The candidate: DPO continued from production (its frozen reference too), one epoch over the buffer, at a learning rate well below the offline run’s: small steps from the deployed model on its own new sessions.',
      ),
    eval: z
      .strictObject({
        tasks: z.number().int().min(1).default(20).describe('Validation tasks both models play.'),
        k: z
          .number()
          .int()
          .min(1)
          .default(2)
          .describe('Tries per task: the twins are (task, try), with the same sampler seed for both models.'),
        world_seed: z.number().int().default(DEFAULT_WORLD.seed).describe('The simulator world.'),
        companies: z.number().int().min(1).default(DEFAULT_WORLD.companies).describe('Companies in that world.'),
        temperature: z.number().min(0).default(0.5).describe('Sampling temperature of the paired episodes.'),
        top_p: z.number().gt(0).max(1).default(0.95).describe('Nucleus sampling of the paired episodes.'),
        max_tokens: z.number().int().min(1).default(160).describe('Most tokens in one assistant message.'),
        max_turns: z.number().int().min(1).default(12).describe('Most assistant messages in one episode.'),
        max_calls: maxCalls(
          'Only validation tasks with at most this many departments to call; null: every difficulty.',
        ),
      })
      .prefault({})
      .describe('The paired evaluation of candidate against production.'),
    dapo: z
      .strictObject({
        enabled: z
          .boolean()
          .default(false)
          .describe(
            'Continue the candidate by DAPO in the simulator after its DPO (the dapo stage’s knobs); off, the candidate is the DPO model.',
          ),
        ...dapoKnobs,
      })
      .prefault({})
      .describe(
        'The feedback-guided (or standard) DAPO stage of the night, after DPO: the loop reintegrates new sessions alongside it.',
      ),
    gate: gateConfig.describe('When a candidate is promoted (loop/paired.ts).'),
    rollback: z
      .strictObject({
        ratio: z
          .number()
          .gt(0)
          .max(1)
          .default(0.95)
          .describe(
            'Production is rolled back when its live success falls below its baseline × ratio: a model that does worse on live traffic than the one it replaced does not stay.',
          ),
        min_sessions: z
          .number()
          .int()
          .min(1)
          .default(20)
          .describe(
            'Sessions a version must have served before its live success counts (for it and for its baseline).',
          ),
        success_reward: z
          .number()
          .min(0)
          .max(1)
          .default(1)
          .describe('A served session succeeded when its metadata says so, else when its reward is at least this.'),
      })
      .prefault({})
      .describe(
        "Live success: each version's share of successful sessions among those it served (sessions' `model`); the baseline is the production it replaced.",
      ),
    days: z
      .strictObject({
        tasks: z
          .number()
          .int()
          .min(1)
          .default(25)
          .describe('Tasks of a simulated day: each a conversation of the simulator’s users with production.'),
        trials: z
          .number()
          .int()
          .min(1)
          .default(2)
          .describe('Conversations per task (several, so the pairs stage finds groups).'),
        first_task: z
          .number()
          .int()
          .min(0)
          .default(10_000)
          .describe(
            'Training-split task index of day 1’s first task (each day takes the next ones: tasks never seen before).',
          ),
        start: z
          .string()
          .regex(/^\d{4}-\d{2}-\d{2}$/)
          .default('2026-06-01')
          .describe('Day 1’s date.'),
        temperature: z.number().min(0).default(0.5).describe("Production's sampling temperature on the day's traffic."),
        concurrency: z
          .number()
          .int()
          .min(1)
          .default(8)
          .describe('Conversations in flight at once (the server decodes them together).'),
      })
      .prefault({})
      .describe(
        '`prefab refresh --days N`: each day serves production, the simulator’s users talk to it, and the night refreshes.',
      ),
  })
  .prefault({})
  .describe(
    'read by `prefab refresh` (the online loop, docs/loop.md): a night takes in the inbox, trains a candidate from production, and promotes it only when it is better with confidence',
  );
export type RefreshConfig = z.infer<typeof refreshConfig>;

export interface ServeSettings {
  host: string;
  /** 0: any free port. */
  port: number;
  /** Required as `Authorization: Bearer …` when set (PREFAB_SERVE_API_KEY). */
  apiKey: string | null;
  /** Requests decoded together, per version. */
  maxBatch: number;
  /** Requests waiting beyond those, per version; one more is answered 429. */
  maxQueue: number;
  /** Largest request body, in bytes (413 beyond). */
  maxBodyBytes: number;
  /** Tokens in a reply when the request does not say, and the most it may ask for. */
  maxTokens: number;
  /** What a request for `prefab` gets. */
  defaultModel: string;
  /** Conversations asking for `production` are shared among these arms by a stable hash; null: no split. */
  split: Arm[] | null;
}

export const SERVE_DEFAULTS: Omit<ServeSettings, 'split' | 'apiKey'> = {
  defaultModel: 'production',
  host: '127.0.0.1',
  port: 8000,
  maxBatch: 16,
  maxQueue: 64,
  maxBodyBytes: 1 << 20,
  maxTokens: 160,
};

/** Addresses only this machine can reach: a server there may go without a key. */
const LOOPBACK = /^(127\.\d+\.\d+\.\d+|::1|localhost)$/;

/**
 * The key `prefab serve` requires, from PREFAB_SERVE_API_KEY. A server never opens without one by accident: a
 * variable set but empty (a `KEY=` in a unit file whose value went missing) is an error, and so is listening
 * beyond this machine without a key unless `noAuth` says so. Null: no key (the caller logs that).
 */
export function serveApiKey(env: string | undefined, opts: { host: string; noAuth: boolean }): string | null {
  if (env !== undefined && env.trim() === '')
    throw new Error(
      'PREFAB_SERVE_API_KEY is set but empty: set it to the key clients must send, or unset it (with --no-auth beyond 127.0.0.1)',
    );
  if (env !== undefined) {
    if (opts.noAuth) throw new Error('--no-auth and PREFAB_SERVE_API_KEY contradict each other: choose one');
    return env;
  }
  if (!opts.noAuth && !LOOPBACK.test(opts.host))
    throw new Error(
      `serving on ${opts.host} without a key: set PREFAB_SERVE_API_KEY, or pass --no-auth to let anyone who can reach it call it`,
    );
  return null;
}

/** An arm of the split: a version or alias, and its share of conversations. */
export interface Arm {
  name: string;
  share: number;
}

/** `production=0.8,candidate=0.2` → arms whose shares add up to 1. */
export function parseSplit(text: string): Arm[] {
  const arms = text.split(',').map((part) => {
    const [name, share] = part.split('=');
    const n = Number(share);
    if (!name || !(n > 0 && n <= 1))
      throw new Error(
        `--split ${text}: expected name=share pairs with shares in (0, 1], e.g. production=0.8,candidate=0.2`,
      );
    return { name: name.trim(), share: n };
  });
  const total = arms.reduce((s, a) => s + a.share, 0);
  if (Math.abs(total - 1) > 1e-9) throw new Error(`--split ${text}: the shares add up to ${total}, not 1`);
  return arms;
}
