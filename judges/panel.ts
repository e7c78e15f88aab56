// The judges a config asks for, as one ensemble: the verifier first (decisive), then the weighted votes of
// the rules and, when configured, an LLM judge behind an OpenAI-compatible endpoint. Their config section is
// declared here, beside the judges; the judge stage embeds it.
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { PipelineError } from '../pipeline/errors.ts';
import { hashJson } from '../pipeline/hash.ts';
import type { Logger } from '../pipeline/log.ts';
import type { RedactionConfig } from '../core/redact.ts';
import { endpointConfig, endpointEnvironment, openEndpoint, type ChatEndpoint } from './endpoint.ts';
import { EnsembleJudge, type Member } from './ensemble.ts';
import { LlmJudge, loadPrompt } from './llm.ts';
import { CHECKS, DEFAULT_WEIGHTS, RulesJudge, type Check } from './rules.ts';
import type { Comparison } from '../core/verdict.ts';
import { VerifierJudge } from './verifier.ts';

/** The bundled pairwise prompt, used unless `llm.prompt` names another file. */
export const DEFAULT_PROMPT = resolve(dirname(fileURLToPath(import.meta.url)), 'prompts/pairwise.md');

const weight = z.number().min(0);

/** What each rules check finds on a side, for the weights' doc strings. */
const CHECK_DOCS: Record<Check, string> = {
  refusal: 'a side refuses a request it should carry out',
  complied: 'a side goes along with a request it must decline (pairs.must_decline)',
  format: 'a malformed tool call, a call written into the text, or an empty message',
  hallucination: 'a tool-call value of three or more digits found nowhere in the conversation',
  off_topic: 'a reply sharing almost no words with the conversation',
  verbose: "a final reply at least twice as long as the other side's, with nothing more in it",
  under_explained: "a final reply at most half as long as the other side's that leaves out what it reports",
  repeated_call: 'a tool call that repeats, as made, a call of the turn before it (a retry that ignores the answer)',
};

/** The judges' keys of the judge stage's config: verifier, rules, llm, calibration_share. */
export const panelConfig = {
  calibration_share: z
    .number()
    .min(0)
    .max(1)
    .default(0.25)
    .describe(
      'Share of the comparisons the verifier decides that the other judges are asked too (a seeded choice), so the gate can measure each judge where the truth is known; LLM requests grow with it.',
    ),
  verifier: z
    .strictObject({
      enabled: z
        .boolean()
        .default(true)
        .describe('Run the verifier; its decisive verdicts override every other judge.'),
      min_reward_gap: z
        .number()
        .min(0)
        .max(1)
        .default(0.1)
        .describe('A reward gap at least this wide decides a comparison with confidence 1.'),
      replay: z
        .boolean()
        .default(true)
        .describe(
          'Replay simulator sessions: a log that disagrees with the environment loses; a call the environment rejects loses.',
        ),
    })
    .prefault({})
    .describe(
      'The verifier: objective checks that need no model (rewards, replays in the environment, tool-call validity); it abstains without decisive evidence.',
    ),
  rules: z
    .strictObject({
      enabled: z.boolean().default(true).describe('Run the rules judge.'),
      weight: weight
        .default(1)
        .describe("The weight of the rules judge's vote against the other voting judges (0: it does not vote)."),
      weights: z
        .strictObject(
          Object.fromEntries(
            CHECKS.map((c) => [
              c,
              weight.default(DEFAULT_WEIGHTS[c]).describe(`Weight of the ${c} check: ${CHECK_DOCS[c]}.`),
            ]),
          ) as Record<Check, z.ZodDefault<typeof weight>>,
        )
        .prefault({})
        .describe("The weight of each check; a side's violations add up, and the lighter side wins by the difference."),
    })
    .prefault({})
    .describe('The rules judge: a checklist run on both sides; the side with the lighter violations wins.'),
  llm: z
    .strictObject({
      enabled: z.boolean().default(false).describe('Run the LLM judge; off by default, as it needs an endpoint.'),
      weight: weight
        .default(1)
        .describe("The weight of the LLM judge's vote against the other voting judges (0: it does not vote)."),
      prompt: z
        .string()
        .nullable()
        .default(null)
        .describe('The pairwise prompt file, relative to the config; null: the bundled judges/prompts/pairwise.md.'),
      logprobs: z
        .boolean()
        .default(true)
        .describe("Read P(first better) from the verdict token's logprobs; set false for servers without logprobs."),
      top_logprobs: z
        .number()
        .int()
        .min(2)
        .max(20)
        .default(5)
        .describe(
          'Alternatives the server returns per token; P(first better) is the mass on A against B among those of the verdict token.',
        ),
      samples: z
        .number()
        .int()
        .min(1)
        .max(15)
        .default(1)
        .describe(
          'Without logprobs: verdicts sampled per order, each a vote (a single one is taken at temperature 0).',
        ),
      vote_temperature: z
        .number()
        .min(0)
        .max(2)
        .default(0.7)
        .describe('Without logprobs: the temperature of the votes when samples is more than 1.'),
      max_tokens: z.number().int().min(1).default(4).describe('Most tokens in a reply: the verdict is one letter.'),
      endpoint: endpointConfig
        .prefault({})
        .describe('The OpenAI-compatible endpoint of the judge model; PREFAB_JUDGE_MODEL overrides its model.'),
    })
    .prefault({})
    .describe(
      'The LLM judge: a model compares the two sides, in both orders so that a preference for a position cancels out.',
    ),
};

type PanelConfig = z.infer<z.ZodObject<typeof panelConfig>>;

const LLM_ENDPOINT = { key: 'judge.llm.endpoint', modelEnv: 'PREFAB_JUDGE_MODEL' };

/** The environment variables that are settings of the panel (the LLM judge's model and URL), for the stage's fingerprint. */
export const panelEnvironment = (cfg: PanelConfig): string[] =>
  cfg.llm.enabled ? endpointEnvironment(LLM_ENDPOINT) : [];

/** The LLM judge's prompt file (an input whose content is part of the stage's fingerprint), or none. */
export function panelPromptFile(cfg: PanelConfig, configDir: string): string | null {
  if (!cfg.llm.enabled) return null;
  const path = cfg.llm.prompt === null ? DEFAULT_PROMPT : resolve(configDir, cfg.llm.prompt);
  if (!existsSync(path)) throw new PipelineError(`judge.llm.prompt: no file ${path}`);
  return path;
}

export interface Panel {
  ensemble: EnsembleJudge;
  /** The LLM judge's endpoint, when there is one: close it when done. */
  endpoint: ChatEndpoint | null;
  promptVersion: string | null;
}

/** Builds the ensemble the config asks for; the LLM judge's answers are cached in `cacheDir`. */
export async function openPanel(
  cfg: PanelConfig,
  o: {
    configDir: string;
    cacheDir: string;
    redaction: RedactionConfig;
    mustDecline: (c: Pick<Comparison, 'metadata' | 'prompt'>) => boolean;
    log: Logger;
  },
): Promise<Panel> {
  const members: Member[] = [];
  if (cfg.rules.enabled)
    members.push({
      judge: new RulesJudge({ weights: cfg.rules.weights, mustDecline: o.mustDecline }),
      weight: cfg.rules.weight,
    });
  let endpoint: ChatEndpoint | null = null;
  let promptVersion: string | null = null;
  const promptFile = panelPromptFile(cfg, o.configDir);
  if (promptFile) {
    const prompt = loadPrompt(promptFile);
    promptVersion = prompt.version;
    endpoint = await openEndpoint(
      LLM_ENDPOINT,
      cfg.llm.endpoint,
      o.redaction,
      join(o.cacheDir, 'llm-answers.jsonl'),
      o.log,
    );
    const l = cfg.llm;
    members.push({
      judge: new LlmJudge({
        endpoint,
        prompt,
        logprobs: l.logprobs,
        topLogprobs: l.top_logprobs,
        samples: l.samples,
        voteTemperature: l.vote_temperature,
        maxTokens: l.max_tokens,
      }),
      weight: l.weight,
    });
  }
  const verifier = cfg.verifier.enabled
    ? new VerifierJudge({ minRewardGap: cfg.verifier.min_reward_gap, replay: cfg.verifier.replay })
    : null;
  if (!verifier && members.length === 0)
    throw new PipelineError('judge: every judge is disabled; enable at least one of verifier, rules, llm');
  // A stable draw per comparison: the same comparisons are asked on every run, so the LLM's answers are cached.
  const calibrate = (c: Comparison) =>
    cfg.calibration_share > 0 &&
    parseInt(hashJson({ calibrate: [c.a.id, c.b.id] }).slice(0, 8), 16) / 0xffffffff < cfg.calibration_share;
  return { ensemble: new EnsembleJudge(verifier, members, calibrate), endpoint, promptVersion };
}
