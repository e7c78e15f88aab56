// pairs: preference pairs from the split sessions, one bucket of tasks in memory at a time: outcome pairs
// (successes against failures) and hard negatives (a successful session's turn against a worse version of it).
// Hard negatives come from deterministic transforms and, when configured, from an LLM rewriter.
// Best-of-N pairs need the judges to pick the best, so the judge stage builds them.
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { z } from 'zod';
import { endpointEnvironment } from '../../judges/endpoint.ts';
import { PipelineError } from '../../pipeline/errors.ts';
import { defineStage } from '../../pipeline/stage.ts';
import { NEGATIVE_TYPES, type NegativeType } from '../../core/records.ts';
import { rewritePromptPath, rewriterConfig } from '../../pairing/rewriter.ts';

const ratio = z.number().min(0).max(1);

/** The transforms' default ratios, per type. */
const HARD_NEGATIVE_RATIOS: Record<NegativeType, number> = {
  refusal: 0.25,
  hallucination: 0.25,
  off_topic: 0.15,
  format: 0.25,
  verbose: 0.15,
  under_explained: 0.15,
  repeated_call: 0, // off unless asked for: measured only from the recipe's model so far (docs/experiments.md)
};

/** What each type's transform does to a chosen session, for the ratios' doc strings. */
const NEGATIVE_DOCS: Record<NegativeType, string> = {
  refusal: 'its first assistant turn replaced by an unwarranted refusal',
  hallucination:
    'one identifier in a tool call (a phone or account number) changed to a value found nowhere in the conversation',
  off_topic: 'one assistant turn replaced by an unrelated remark',
  format:
    'one tool call broken (arguments cut off, a misspelt tool, a required argument left out, or the call written as text)',
  verbose: 'its last reply padded with pleasantries and restatements',
  under_explained: 'its last reply cut to a curt line ("Done.")',
  repeated_call:
    'a retry (a tool call keeping most of the arguments of the call to the same tool before it) made with the earlier arguments again, as if the answer had not been read',
};

const config = z.strictObject({
  outcome: z
    .strictObject({
      enabled: z
        .boolean()
        .default(true)
        .describe('Build outcome pairs: within a task, a successful session against a failed one.'),
      success_min: z.number().min(0).max(1).default(0.7).describe('A session with at least this reward is a success.'),
      failure_max: z.number().min(0).max(1).default(0.3).describe('A session with at most this reward is a failure.'),
      max_pairs_per_task: z
        .number()
        .int()
        .min(1)
        .nullable()
        .default(16)
        .describe(
          'Most outcome pairs per task (null: every success against every failure); under a cap, pairs with the widest reward gaps come first and each session is used about equally often.',
        ),
    })
    .refine((c) => c.failure_max < c.success_min, { message: 'failure_max must be below success_min' })
    .prefault({})
    .describe("Outcome pairs: a task's successes against its failures, the reward gap as margin."),
  steps: z
    .strictObject({
      enabled: z
        .boolean()
        .default(false)
        .describe(
          "Build step pairs: where a task's sessions part, the turn after which more of them succeeded against a sibling turn after the same messages, masked on that one turn. They want several sessions of a task by one policy that start alike (a refresh loop's days, a policy's own rollouts); logged trials of different agents seldom part on the same prefix.",
        ),
      margin: z
        .number()
        .gt(0)
        .max(1)
        .default(0.5)
        .describe(
          'Two sibling turns make a pair where the success rates of the sessions through them differ by at least this.',
        ),
      min_visits: z
        .number()
        .int()
        .min(1)
        .default(1)
        .describe('Sessions a turn needs through it to be valued (a success counts by outcome.success_min).'),
    })
    .prefault({})
    .describe('Step pairs (pairing/steps.ts), source `step`: off by default.'),
  hard_negatives: z
    .strictObject({
      enabled: z
        .boolean()
        .default(true)
        .describe('Build hard negatives: one turn of a successful session against a worse version of it.'),
      from_min_reward: z
        .number()
        .min(0)
        .max(1)
        .default(0.7)
        .describe('Sessions with at least this reward are the chosen side that negatives are made from.'),
      ratios: z
        .strictObject(
          Object.fromEntries(
            NEGATIVE_TYPES.map((t) => [
              t,
              ratio
                .optional()
                .describe(
                  `Share of the chosen sessions (reward ≥ from_min_reward) that get a negative of this type: ${NEGATIVE_DOCS[t]}. Default ${HARD_NEGATIVE_RATIOS[t]}; a ratios section given without it makes it 0.`,
                ),
            ]),
          ) as Record<NegativeType, z.ZodOptional<typeof ratio>>,
        )
        .default(HARD_NEGATIVE_RATIOS)
        .describe('Per type, the share of those sessions that get a negative of that type.'),
      templates: z
        .string()
        .nullable()
        .default(null)
        .describe(
          "A YAML file (relative to this file) of the texts the transforms write: lists under refusal (each must read as a refusal), off_topic, verbose_openers, verbose_fillers and terse (no digits). null: prefab's, pairing/negatives.yaml, written to fit any agent. An off-topic remark that shares a word with the session is passed over.",
        ),
      salt: z
        .string()
        .default('prefab')
        .describe(
          'Decides which sessions, turns and templates are drawn (the rewriter uses it too); changing it draws others.',
        ),
      rewriter: rewriterConfig
        .prefault({})
        .describe(
          'More negatives of the text types, written by a model behind an OpenAI-compatible endpoint (off by default).',
        ),
    })
    .prefault({})
    .describe(
      'Hard negatives: a worse version of one turn of a successful session, made by deterministic transforms of seven types.',
    ),
  must_decline: z
    .array(z.string())
    .default([])
    .refine((ps) => ps.every((p) => validRegex(p)), {
      message: 'each must_decline entry must be a valid regular expression',
    })
    .describe(
      "Requests the agent must decline, as regular expressions over the user's turns (case-insensitive); a session whose metadata says `must_decline: true` counts too. For those, a refusal is the chosen side.",
    ),
});

function validRegex(pattern: string): boolean {
  try {
    new RegExp(pattern, 'i');
    return true;
  } catch {
    return false;
  }
}

type PairsConfig = z.infer<typeof config>;

const rewriting = (cfg: PairsConfig) => cfg.hard_negatives.enabled && cfg.hard_negatives.rewriter.enabled;

const REWRITER_ENDPOINT = { key: 'pairs.hard_negatives.rewriter.endpoint', modelEnv: 'PREFAB_REWRITE_MODEL' };

/** The stage's config, as its section of the config file gives it. */
export type Config = z.infer<typeof config>;

export const pairs = defineStage({
  name: 'pairs',
  description:
    'build preference pairs: successes against failures of a task (outcome), the turns where its sessions part (step, when asked), and hard negatives of seven types (by transforms; optionally by an LLM rewriter)',
  version: 5,
  inputs: ['ingest', 'split'],
  outputs: ['train.jsonl', 'test.jsonl', 'dropped.jsonl', 'info.json'],
  config,
  environment: (cfg) => (rewriting(cfg) ? endpointEnvironment(REWRITER_ENDPOINT) : []),

  // Files whose content the pairs depend on: the rewriter's prompt and the user's templates.
  async external(cfg, configDir) {
    const files: string[] = [];
    if (rewriting(cfg)) {
      const path = rewritePromptPath(cfg.hard_negatives.rewriter, configDir);
      if (!existsSync(path)) throw new PipelineError(`pairs.hard_negatives.rewriter.prompt: no file ${path}`);
      files.push(path);
    }
    const templates = cfg.hard_negatives.templates;
    if (templates !== null) {
      const path = resolve(configDir, templates);
      if (!existsSync(path)) throw new PipelineError(`pairs.hard_negatives.templates: no file ${path}`);
      files.push(path);
    }
    return files;
  },

  run: (ctx) => import('./run.ts').then((m) => m.run(ctx)),
  shard: (parts, out) => import('./run.ts').then((m) => m.merge(parts, out)),
});
