// pairs: preference pairs from the split sessions, one bucket of tasks in memory at a time: outcome pairs
// (successes against failures) and hard negatives (a successful session's turn against a worse version of it).
// Hard negatives come from deterministic transforms and, when configured, from an LLM rewriter.
// Best-of-N pairs need the judges to pick the best, so the judge stage builds them.
import { existsSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { endpointEnvironment, openEndpoint, requestCounts, type ChatEndpoint } from '../../judges/endpoint.ts';
import { PipelineError } from '../../pipeline/errors.ts';
import { JsonlWriter } from '../../pipeline/jsonl.ts';
import { safePoint } from '../../pipeline/interrupt.ts';
import { defineStage } from '../../pipeline/stage.ts';
import { mustDeclineTest } from '../../judges/rules.ts';
import { NEGATIVE_TYPES, type NegativeType, type SplitSession } from '../../core/records.ts';
import { SPLITS, bucketFile, readSplitInfo, readTaskGroups, type PairsInfo } from '../layout.ts';
import { pairBucket } from './bucket.ts';
import { REWRITE_TYPES, Rewriter, activeTypes, loadRewritePrompt, rewritePromptPath, rewriterConfig } from './rewriter.ts';

const ratio = z.number().min(0).max(1);

/** The transforms' default ratios, per type. */
const HARD_NEGATIVE_RATIOS: Record<NegativeType, number> = { refusal: 0.25, hallucination: 0.25, off_topic: 0.15, format: 0.25, verbose: 0.15, under_explained: 0.15 };

/** What each type's transform does to a chosen session, for the ratios' doc strings. */
const NEGATIVE_DOCS: Record<NegativeType, string> = {
  refusal: 'its first assistant turn replaced by an unwarranted refusal',
  hallucination: 'one identifier in a tool call (a phone or account number) changed to a value found nowhere in the conversation',
  off_topic: 'one assistant turn replaced by an unrelated remark',
  format: 'one tool call broken (arguments cut off, a misspelt tool, a required argument left out, or the call written as text)',
  verbose: 'its last reply padded with pleasantries and restatements',
  under_explained: 'its last reply cut to a curt line ("Done.")',
};

const config = z.strictObject({
  outcome: z
    .strictObject({
      enabled: z.boolean().default(true).describe('Build outcome pairs: within a task, a successful session against a failed one.'),
      success_min: z.number().min(0).max(1).default(0.7).describe('A session with at least this reward is a success.'),
      failure_max: z.number().min(0).max(1).default(0.3).describe('A session with at most this reward is a failure.'),
      max_pairs_per_task: z.number().int().min(1).nullable().default(16).describe('Most outcome pairs per task (null: every success against every failure); under a cap, pairs with the widest reward gaps come first and each session is used about equally often.'),
    })
    .refine((c) => c.failure_max < c.success_min, { message: 'failure_max must be below success_min' })
    .prefault({}).describe("Outcome pairs: a task's successes against its failures, the reward gap as margin."),
  hard_negatives: z
    .strictObject({
      enabled: z.boolean().default(true).describe('Build hard negatives: one turn of a successful session against a worse version of it.'),
      from_min_reward: z.number().min(0).max(1).default(0.7).describe('Sessions with at least this reward are the chosen side that negatives are made from.'),
      ratios: z
        .strictObject(
          Object.fromEntries(
            NEGATIVE_TYPES.map((t) => [t, ratio.optional().describe(`Share of the chosen sessions (reward ≥ from_min_reward) that get a negative of this type: ${NEGATIVE_DOCS[t]}. Default ${HARD_NEGATIVE_RATIOS[t]}; a ratios section given without it makes it 0.`)]),
          ) as Record<NegativeType, z.ZodOptional<typeof ratio>>,
        )
        .default(HARD_NEGATIVE_RATIOS).describe('Per type, the share of those sessions that get a negative of that type.'),
      salt: z.string().default('prefab').describe('Decides which sessions, turns and templates are drawn (the rewriter uses it too); changing it draws others.'),
      rewriter: rewriterConfig.prefault({}).describe('More negatives of the text types, written by a model behind an OpenAI-compatible endpoint (off by default).'),
    })
    .prefault({}).describe('Hard negatives: a worse version of one turn of a successful session, made by deterministic transforms of six types.'),
  must_decline: z
    .array(z.string())
    .default([])
    .refine((ps) => ps.every((p) => validRegex(p)), { message: 'each must_decline entry must be a valid regular expression' }).describe("Requests the agent must decline, as regular expressions over the user's turns (case-insensitive); a session whose metadata says `must_decline: true` counts too. For those, a refusal is the chosen side."),
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

export const pairs = defineStage({
  name: 'pairs',
  description: 'build preference pairs: successes against failures of a task (outcome), and hard negatives of six types (by transforms; optionally by an LLM rewriter)',
  version: 2,
  inputs: ['split'],
  outputs: ['train.jsonl', 'test.jsonl', 'dropped.jsonl', 'info.json'],
  config,
  environment: (cfg) => (rewriting(cfg) ? endpointEnvironment(REWRITER_ENDPOINT) : []),

  async external(cfg, configDir) {
    if (!rewriting(cfg)) return [];
    const path = rewritePromptPath(cfg.hard_negatives.rewriter, configDir);
    if (!existsSync(path)) throw new PipelineError(`pairs.hard_negatives.rewriter.prompt: no file ${path}`);
    return [path];
  },

  async run({ config: cfg, configDir, out, input, cache, log, signal }) {
    const splitDir = input('split');
    const info = await readSplitInfo(splitDir);
    await mkdir(out, { recursive: true });
    const dropped = new JsonlWriter(join(out, 'dropped.jsonl'));
    const counts: Record<string, number> = { train: 0, test: 0, outcome: 0, hard_negative: 0, tasks: 0, tasks_with_pairs: 0, tasks_without_success: 0, tasks_without_failure: 0, dropped: 0 };
    for (const t of NEGATIVE_TYPES) counts[`hard_negative_${t}`] = 0;
    // hard_negative counts both kinds; hard_negative_<type> the transforms', hard_negative_llm_<type> the rewriter's.
    Object.assign(counts, { hard_negative_llm: 0, rewrite_skipped: 0, rewrite_failed: 0, rewrite_over_budget: 0, rewrite_must_decline: 0, requests: 0, cached: 0, retries: 0 });
    for (const t of REWRITE_TYPES) counts[`hard_negative_llm_${t}`] = 0;
    const r = cfg.hard_negatives.rewriter;
    let endpoint: ChatEndpoint | null = null;
    let rewriter: Rewriter | null = null;
    if (rewriting(cfg)) {
      const prompt = loadRewritePrompt(rewritePromptPath(r, configDir), activeTypes(r.ratios));
      endpoint = await openEndpoint(REWRITER_ENDPOINT, r.endpoint, r.redaction, join(cache, 'rewrites.jsonl'), log);
      rewriter = new Rewriter(endpoint, prompt, { temperature: r.temperature, maxTokens: r.max_tokens });
    }
    const mustDecline = mustDeclineTest(cfg.must_decline);
    const bucketOptions = { outcome: cfg.outcome, hardNegatives: cfg.hard_negatives, rewriter, mustDecline: (s: SplitSession) => mustDecline({ metadata: s.metadata, prompt: s.messages }) };
    try {
      for (const side of SPLITS) {
        const writer = new JsonlWriter(join(out, `${side}.jsonl`));
        const progress = log.progress(`pairs ${side}`, info.buckets);
        for (let b = 0; b < info.buckets; b++) {
          await safePoint(signal, () => `pairs: stopped at ${side} bucket ${b + 1} of ${info.buckets}; the next run makes pairs again${rewriter ? ' (rewrites received are cached)' : ''}`);
          await pairBucket(await readTaskGroups(bucketFile(splitDir, side, b)), side, bucketOptions, { pairs: writer, dropped }, counts, log);
          progress.tick();
        }
        progress.done();
        await writer.close();
      }
    } finally {
      await endpoint?.close();
    }
    if (endpoint) Object.assign(counts, requestCounts(endpoint));
    if (counts.rewrite_failed! > 0) log.warn('some rewrites failed', { failed: counts.rewrite_failed, hint: 'rerun `prefab stage pairs`: rewrites already received are cached' });
    await dropped.close();
    await writeFile(join(out, 'info.json'), JSON.stringify({ must_decline: cfg.must_decline } satisfies PairsInfo, null, 2) + '\n');
    return {
      counts,
      summary:
        `${counts.train} train / ${counts.test} test pairs (${counts.outcome} outcome, ${counts.hard_negative} hard negatives) from ${counts.tasks_with_pairs} of ${counts.tasks} tasks ` +
        `(${counts.tasks_without_success} without a success, ${counts.tasks_without_failure} without a failure, ${counts.dropped} pairs dropped)` +
        (endpoint
          ? `; ${counts.hard_negative_llm} hard negatives rewritten by ${endpoint.model} (${counts.requests} requests, ${counts.cached} from cache, ` +
            `${counts.rewrite_skipped} skipped, ${counts.rewrite_failed} failed, ${counts.rewrite_over_budget} over budget)`
          : ''),
    };
  },
});
