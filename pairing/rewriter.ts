// Hard negatives by an LLM rewriter (SPEC §4: "by deterministic transforms and optionally by an LLM
// rewriter"). A model behind an OpenAI-compatible endpoint rewrites one assistant turn of a successful
// session into a worse one of a given type; the pair is that turn against the rewrite, turn-level like the
// transforms' pairs, so the sides differ only in what the type changes. The rewriter writes more varied
// negatives than the transforms' templates, at the price of a request each; every answer is cached, so a
// rerun pays nothing.
//
// Only the types whose fault lies in the text are rewritten: refusal, off_topic, verbose, under_explained.
// Hallucination and format stay with the transforms: a value perturbed in a tool call, or a call broken
// in a known way, is exact and checkable by the verifier and the rules judge, and a model rewriting JSON is
// neither. A made-up value in the text (a wrong reference code in the summary) is left out too: only an
// LLM judge could confirm it, since the rules judge grounds tool-call values alone.
import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { RequestFailed, endpointConfig, type ChatEndpoint } from '../judges/endpoint.ts';
import { transcript, type PromptTemplate } from '../judges/llm.ts';
import { PipelineError } from '../pipeline/errors.ts';
import { sha256, unitHash } from '../pipeline/hash.ts';
import { pick, seeded } from '../core/random.ts';
import { REWRITE_TYPES, type Message, type Pair, type RewriteType } from '../core/records.ts';
import type { StoredMessages, StoredSession } from '../store/messages.ts';
import { PLACEHOLDERS, redactionConfig } from '../core/redact.ts';
import {
  UNDER_EXPLAINED_MIN_TEXT,
  VERBOSE_MIN_TEXT,
  hardNegativePair,
  type SkippedNegative,
} from './hard-negatives.ts';

/** The bundled rewrite prompt, used unless `rewriter.prompt` names another file. */
export const DEFAULT_REWRITE_PROMPT = resolve(dirname(fileURLToPath(import.meta.url)), '../judges/prompts/rewrite.md');

const ratio = z.number().min(0).max(1);

/** The rewriter's default ratios, per type. */
const REWRITE_RATIOS: Record<RewriteType, number> = {
  refusal: 0.25,
  off_topic: 0.15,
  verbose: 0.15,
  under_explained: 0.15,
};

/** What the model is asked to make of a chosen turn, per type, for the ratios' doc strings (the prompt says it in full). */
const REWRITE_DOCS: Record<RewriteType, string> = {
  refusal: 'its first assistant turn rewritten as a refusal of a reasonable request',
  off_topic: 'one assistant turn rewritten as a few sentences on an unrelated subject',
  verbose: 'the text of its last reply padded to at least twice the length, saying nothing new',
  under_explained: 'the text of its last reply cut to a curt line that leaves out what the user needs to know',
};

/** `pairs.hard_negatives.rewriter` in the config. */
export const rewriterConfig = z.strictObject({
  enabled: z.boolean().default(false).describe('Off by default: the default run needs no endpoint.'),
  ratios: z
    .strictObject(
      Object.fromEntries(
        REWRITE_TYPES.map((t) => [
          t,
          ratio
            .optional()
            .describe(
              `Share of the chosen sessions (reward ≥ from_min_reward) that get a rewritten negative of this type: ${REWRITE_DOCS[t]}. Default ${REWRITE_RATIOS[t]}; a ratios section given without it makes it 0.`,
            ),
        ]),
      ) as Record<RewriteType, z.ZodOptional<typeof ratio>>,
    )
    .default(REWRITE_RATIOS)
    .describe('Per type, the share of the chosen sessions (reward ≥ from_min_reward) that get a rewritten negative.'),
  temperature: z.number().min(0).max(2).default(0.5).describe('Sampling temperature of the rewrites.'),
  max_tokens: z
    .number()
    .int()
    .min(1)
    .default(1024)
    .describe('Most tokens in one rewrite; a rewrite cut off by it is dropped as unreadable.'),
  prompt: z
    .string()
    .nullable()
    .default(null)
    .describe('The rewrite prompt file, relative to the config; null: the bundled judges/prompts/rewrite.md.'),
  endpoint: endpointConfig
    .prefault({})
    .describe('The OpenAI-compatible endpoint of the rewriting model; PREFAB_REWRITE_MODEL overrides its model.'),
  redaction: redactionConfig
    .prefault({})
    .describe(
      'Personal data masked in a rewrite request before it leaves the machine; the values are put back into the rewrite.',
    ),
});
export type RewriterConfig = z.infer<typeof rewriterConfig>;

export const rewritePromptPath = (cfg: RewriterConfig, configDir: string) =>
  cfg.prompt === null ? DEFAULT_REWRITE_PROMPT : resolve(configDir, cfg.prompt);

/** The types the config asks for (a ratio above 0), in their fixed order. */
export const activeTypes = (ratios: RewriterConfig['ratios']) => REWRITE_TYPES.filter((t) => (ratios[t] ?? 0) > 0);

// ---- the prompt file: a template with three slots, then one section per type --------------------------

export interface RewritePrompt extends PromptTemplate {
  /** The file up to its first type section: the request, with {{context}}, {{original}} and {{instruction}}. */
  template: string;
  /** Per type, its section's text (under `## type: <name>`): what goes into {{instruction}}. */
  instructions: Partial<Record<RewriteType, string>>;
}

const SECTION = /^## type: *([A-Za-z_]+) *$/gm;
const SLOTS = ['{{context}}', '{{original}}', '{{instruction}}'];

/** Reads and checks the prompt file; its content hash is its version, part of every cache key. */
export function loadRewritePrompt(path: string, types: readonly RewriteType[]): RewritePrompt {
  const text = readFileSync(path, 'utf8');
  const heads = [...text.matchAll(SECTION)];
  const template = text.slice(0, heads[0]?.index ?? text.length).trimEnd();
  for (const slot of SLOTS)
    if (!template.includes(slot))
      throw new PipelineError(`${path}: the rewrite prompt needs the slot ${slot} before its first "## type:" section`);
  const instructions: Partial<Record<RewriteType, string>> = {};
  heads.forEach((head, i) => {
    const name = head[1]! as RewriteType;
    if (!REWRITE_TYPES.includes(name))
      throw new PipelineError(
        `${path}: "## type: ${name}" is not a type the rewriter makes (${REWRITE_TYPES.join(', ')})`,
      );
    instructions[name] = text.slice(head.index + head[0].length, heads[i + 1]?.index ?? text.length).trim();
  });
  for (const t of types)
    if (!instructions[t])
      throw new PipelineError(`${path}: no "## type: ${t}" section, and the config asks for ${t} rewrites`);
  return { path, text, version: sha256(text).slice(0, 16), template, instructions };
}

function renderRewritePrompt(prompt: RewritePrompt, type: RewriteType, context: Message[], original: Message): string {
  // One pass, so that text inside a message that looks like a slot is never substituted.
  const slots: Record<string, string> = {
    context: transcript(context),
    original: transcript([original]),
    instruction: prompt.instructions[type]!,
  };
  return prompt.template.replace(/\{\{(context|original|instruction)\}\}/g, (_, name: string) => slots[name]!);
}

// ---- which sessions, which turn ---------------------------------------------------------------------------

/** One turn of one session to rewrite into a negative of one type. */
export interface RewriteJob {
  session: StoredSession;
  type: RewriteType;
  /** Index of the assistant turn in the session's messages. */
  at: number;
}

// The transforms' thresholds, so both kinds of negative start from the same turns.
const MIN_TEXT: Record<RewriteType, number> = {
  refusal: 0,
  off_topic: 0,
  verbose: VERBOSE_MIN_TEXT,
  under_explained: UNDER_EXPLAINED_MIN_TEXT,
};

/**
 * The rewrites of one session: per type, the session is selected when its stable hash falls under that
 * type's ratio (with a salt of its own, so the selection is independent of the transforms'); a selected
 * session with no turn to rewrite is reported, not dropped.
 */
export function planRewrites(
  session: StoredSession,
  options: { ratios: RewriterConfig['ratios']; salt: string },
): { jobs: RewriteJob[]; skipped: SkippedNegative[] } {
  const jobs: RewriteJob[] = [];
  const skipped: SkippedNegative[] = [];
  for (const type of REWRITE_TYPES) {
    if (unitHash(`${type}:${session.session_id}`, `rewrite:${options.salt}`) >= (options.ratios[type] ?? 0)) continue;
    const at = targetTurn(session, type, options.salt);
    if (at < 0)
      skipped.push({
        session_id: session.session_id,
        type,
        reason: MIN_TEXT[type]
          ? `no assistant turn with ${MIN_TEXT[type]} or more characters of text`
          : 'no assistant turn',
      });
    else jobs.push({ session, type, at });
  }
  return { jobs, skipped };
}

/** As the transforms choose: the first assistant turn (refusal), one by lot (off_topic), the last with enough text (verbose, under_explained). */
function targetTurn(session: StoredSession, type: RewriteType, salt: string): number {
  const { messages } = session;
  const turns = messages.indicesOf('assistant');
  if (type === 'refusal') return turns[0] ?? -1;
  if (type === 'off_topic') return turns.length ? pick(seeded('rewrite', salt, session.session_id, type), turns) : -1;
  return turns.findLast((i) => (messages.at(i).content?.length ?? 0) >= MIN_TEXT[type]) ?? -1;
}

// ---- the reply, and the pair ------------------------------------------------------------------------------

const squash = (text: string) => text.replace(/\s+/g, ' ').trim();
const clip = (text: string) => (text.length > 80 ? `${text.slice(0, 80)}…` : text);

/**
 * The rewritten text of a reply, with masked values put back; or why it cannot be used: empty, not
 * between <reply> tags (garbage, or cut off by max_tokens), the same as the original, or holding a
 * placeholder that stands for nothing in the conversation.
 */
function readRewrite(
  content: string | null,
  job: RewriteJob,
  restore: (text: string) => string,
): { text: string } | { skip: string } {
  if (content === null || !content.trim()) return { skip: 'the rewrite came back empty' };
  const tagged = /<reply>([\s\S]*?)<\/reply>/i.exec(content);
  if (!tagged) return { skip: `unreadable rewrite, no <reply>…</reply> in "${clip(squash(content))}"` };
  const text = restore(tagged[1]!.trim());
  if (!text) return { skip: 'the rewrite came back empty' };
  const original = job.session.messages.at(job.at);
  if (squash(text) === squash(original.content ?? '')) return { skip: 'the rewrite is identical to the original' };
  const conversation = job.session.messages.slice(0, job.at + 1);
  // A placeholder left after restoring was never issued: the model made it up (placeholders are ASCII).
  const invented = (text.match(PLACEHOLDERS) ?? []).find((p) => !conversation.jsonIncludes(p));
  if (invented)
    return { skip: `the rewrite holds ${invented}, a placeholder that stands for nothing in the conversation` };
  return { text };
}

/**
 * The rewritten turn. Refusal and off_topic replace the whole turn with text, as their transforms do: a
 * refusal that still makes the call says one thing and does another, and the rules judge (rightly) sees a
 * refusal or a digression only in a turn without tool calls. Verbose and under_explained change the text
 * alone and keep the turn's tool calls untouched.
 */
function rewrittenTurn(original: Message, type: RewriteType, text: string): Message {
  const turn: Message = { ...original, content: text };
  if (type === 'refusal' || type === 'off_topic') delete turn.tool_calls;
  return turn;
}

function rewritePair(job: RewriteJob, turn: Message): Pair<StoredMessages> {
  return hardNegativePair(job.session, job.type, { at: job.at, message: turn }, false, 'llm');
}

// ---- the requests -----------------------------------------------------------------------------------------

/** A pair, or why there is none: an unusable rewrite, a request that failed after its retries, or no budget left. */
export type RewriteOutcome =
  { pair: Pair<StoredMessages> } | { skip: string; cause: 'unusable' | 'failed' | 'over_budget' };

export class Rewriter {
  constructor(
    private readonly endpoint: ChatEndpoint,
    private readonly prompt: RewritePrompt,
    private readonly options: { temperature: number; maxTokens: number },
  ) {}

  /** planRewrites, for the pairs stage's buckets: a worker thread, which never rewrites, loads none of this file. */
  plan(
    session: StoredSession,
    options: { ratios: RewriterConfig['ratios']; salt: string },
  ): ReturnType<typeof planRewrites> {
    return planRewrites(session, options);
  }

  async rewrite(job: RewriteJob): Promise<RewriteOutcome> {
    const original = job.session.messages.at(job.at);
    const content = renderRewritePrompt(this.prompt, job.type, job.session.messages.slice(0, job.at).all(), original);
    let answer;
    try {
      answer = await this.endpoint.complete(
        {
          messages: [{ role: 'user', content }],
          temperature: this.options.temperature,
          max_tokens: this.options.maxTokens,
        },
        { purpose: `rewrite:${job.type}`, version: this.prompt.version, index: 0 },
      );
    } catch (error) {
      if (error instanceof RequestFailed) return { skip: error.message, cause: 'failed' };
      throw error;
    }
    if (answer.reply === null) return { skip: 'the request budget is spent', cause: 'over_budget' };
    const read = readRewrite(answer.reply.content, job, answer.restore);
    if ('skip' in read) return { skip: read.skip, cause: 'unusable' };
    return { pair: rewritePair(job, rewrittenTurn(original, job.type, read.text)) };
  }
}
