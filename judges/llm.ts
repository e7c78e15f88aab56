// The LLM judge: an OpenAI-compatible model compares two completions, pairwise, at temperature 0, in both
// orders (A/B, then B/A) so that a preference for a position cancels out instead of passing as a preference
// for a side. With logprobs, p = P(first is better) is read from the verdict token's top logprobs and
// averaged over the two orders (confidence |2p − 1|); without, the votes of k samples per order decide.
// Orders that disagree abstain. A reply that cannot be read is counted and never taken as a preference.
import { readFileSync } from 'node:fs';
import { sha256 } from '../pipeline/hash.ts';
import type { Message } from '../core/records.ts';
import { RequestFailed, type ChatEndpoint, type ChatReply } from './endpoint.ts';
import {
  NO_COST,
  abstain,
  type Comparison,
  type Completion,
  type Judge,
  type JudgeStats,
  type Judged,
} from '../core/verdict.ts';

export interface PromptTemplate {
  path: string;
  text: string;
  /** Content hash of the file: part of every cache key, so an edited prompt asks again. */
  version: string;
}

export function loadPrompt(path: string): PromptTemplate {
  const text = readFileSync(path, 'utf8');
  for (const slot of ['{{context}}', '{{first}}', '{{second}}']) {
    if (!text.includes(slot)) throw new Error(`${path}: the judge prompt needs the slot ${slot}`);
  }
  return { path, text, version: sha256(text).slice(0, 16) };
}

export interface LlmJudgeOptions {
  endpoint: ChatEndpoint;
  prompt: PromptTemplate;
  /** Read p from the verdict token's logprobs (one request per order); else vote over `samples` per order. */
  logprobs: boolean;
  topLogprobs: number;
  samples: number;
  /** Temperature of the voting samples when `samples` > 1 (one sample is taken at 0). */
  voteTemperature: number;
  maxTokens: number;
}

export type Letter = 'A' | 'B' | 'T';

/** The verdict letter of a reply, or null when the reply says no verdict plainly. */
export function parseVerdict(content: string | null): Letter | null {
  if (!content) return null;
  const text = content.trim().replace(/^[*_`"'\s#>]+/, '');
  const lead =
    /^(?:(?:final\s+)?(?:verdict|answer|winner|better)\s*(?:is)?\s*[:=\-]?\s*)?(?:\*\*)?(?:response\s+)?\(?\[?(A|B|T|tie)\b/i.exec(
      text,
    );
  if (lead) return letterOf(lead[1]!);
  const tagged = /(?:verdict|answer)\s*[:=]\s*\*{0,2}\s*\[?(A|B|T|tie)\b/i.exec(text);
  return tagged ? letterOf(tagged[1]!) : null;
}

/** How far above 0 a log-prob may round (servers print them in float32). */
const LOGPROB_SLACK = 1e-4;

/** A token without spaces, quotes or brackets, upper-cased: ' A', 'A', '**B' all read as the letter. */
const bare = (token: string) => token.replace(/[\s*"'()[\]:.]/g, '').toUpperCase();

const letterOf = (s: string): Letter => (s.toUpperCase().startsWith('T') ? 'T' : (s.toUpperCase() as Letter));

/**
 * P(first is better) from one reply: from the top logprobs of the verdict token when present (the mass on
 * A against B), else 1, 0 or ½ by the letter; null when the reply holds no verdict.
 */
function firstBetterProbability(reply: ChatReply): number | null {
  const letter = parseVerdict(reply.content);
  if (letter === null) return null;
  const at = reply.logprobs?.find((t) => ['A', 'B', 'T', 'TIE'].includes(bare(t.token)));
  if (at) {
    const alts = at.top.length ? at.top : [{ token: at.token, logprob: at.logprob }];
    // A log-prob is at most 0: one above (1000 gives exp = ∞, and ∞/∞ a NaN verdict) or not a number at all
    // is a server's bug, and the reply is unreadable rather than a preference.
    if (alts.some((alt) => !Number.isFinite(alt.logprob) || alt.logprob > LOGPROB_SLACK)) return null;
    let pa = 0;
    let pb = 0;
    for (const alt of alts) {
      if (bare(alt.token) === 'A') pa += Math.exp(alt.logprob);
      if (bare(alt.token) === 'B') pb += Math.exp(alt.logprob);
    }
    if (pa + pb > 0) return pa / (pa + pb);
  }
  return letter === 'A' ? 1 : letter === 'B' ? 0 : 0.5;
}

/** A conversation as the judge reads it: one line per message, tool calls with their arguments. */
export function transcript(messages: Message[]): string {
  if (messages.length === 0) return '(nothing yet)';
  return messages
    .map((m) => {
      const calls = (m.tool_calls ?? []).map((c) => `[${m.role} calls ${c.function.name}] ${c.function.arguments}`);
      const text = m.content?.trim() ? [`[${m.role}] ${m.content.trim()}`] : [];
      const lines = [...text, ...calls];
      return lines.length ? lines.join('\n') : `[${m.role}] (empty message)`;
    })
    .join('\n');
}

export function renderPrompt(
  template: PromptTemplate,
  context: Message[],
  first: Completion,
  second: Completion,
): string {
  // One pass, so that text inside a message that looks like a slot is never substituted.
  const slots: Record<string, string> = {
    context: transcript(context),
    first: transcript(first.messages),
    second: transcript(second.messages),
  };
  return template.text.replace(/\{\{(context|first|second)\}\}/g, (_, name: string) => slots[name]!);
}

export class LlmJudge implements Judge {
  readonly name: string;
  constructor(private readonly options: LlmJudgeOptions) {
    this.name = `llm:${options.endpoint.model}`;
  }

  async judge(c: Comparison): Promise<Judged> {
    const o = this.options;
    const k = o.logprobs ? 1 : o.samples;
    const stats: JudgeStats = { ...NO_COST };
    // P(a is better) per order and sample: order 0 shows a first, order 1 shows b first.
    const orders = await Promise.all(
      [
        [c.a, c.b],
        [c.b, c.a],
      ].map(async ([first, second], order) => {
        const prompt = renderPrompt(o.prompt, c.prompt, first!, second!);
        const ps: number[] = [];
        await Promise.all(
          Array.from({ length: k }, async (_, index) => {
            const p = await this.ask(prompt, index, k, stats);
            if (p !== null) ps.push(order === 0 ? p : 1 - p);
          }),
        );
        return ps;
      }),
    );
    if (stats.over_budget) return { verdict: abstain('the request budget is spent'), stats };
    const [ab, ba] = orders as [number[], number[]];
    if (ab.length === 0 || ba.length === 0)
      return { verdict: abstain(`no readable verdict in ${ab.length === 0 ? 'the A/B' : 'the B/A'} order`), stats };
    const mean = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;
    const pab = mean(ab);
    const pba = mean(ba);
    if ((pab - 0.5) * (pba - 0.5) < 0) {
      stats.flipped = true;
      return {
        verdict: abstain(
          `the orders disagree: P(a better) ${pab.toFixed(3)} shown first, ${pba.toFixed(3)} shown second`,
        ),
        stats,
      };
    }
    const p = (pab + pba) / 2;
    const confidence = Math.abs(2 * p - 1);
    if (confidence < 1e-9)
      return { verdict: { winner: 'tie', confidence: 0, rationale: `P(a better) ${p.toFixed(3)}` }, stats };
    return {
      verdict: {
        winner: p > 0.5 ? 'a' : 'b',
        confidence,
        margin: confidence,
        rationale: `P(a better) ${pab.toFixed(3)} (a first), ${pba.toFixed(3)} (b first)`,
      },
      stats,
    };
  }

  /** P(first better) from one request, or null (unreadable, failed, or over budget: each counted in `stats`). */
  private async ask(prompt: string, index: number, k: number, stats: JudgeStats): Promise<number | null> {
    const o = this.options;
    let answer;
    try {
      answer = await o.endpoint.complete(
        {
          messages: [{ role: 'user', content: prompt }],
          temperature: k > 1 ? o.voteTemperature : 0,
          max_tokens: o.maxTokens,
          ...(o.logprobs ? { logprobs: true, top_logprobs: o.topLogprobs } : {}),
        },
        // An unreadable reply is not kept as the answer: the next run asks again (a judge fixed meanwhile answers).
        { purpose: this.name, version: o.prompt.version, index, readable: (r) => firstBetterProbability(r) !== null },
      );
    } catch (error) {
      if (error instanceof RequestFailed) {
        stats.errors++;
        return null;
      }
      throw error;
    }
    if (answer.reply === null) {
      stats.over_budget = true;
      return null;
    }
    if (answer.from === 'cache') stats.cached++;
    else stats.requests += 1 + answer.retries;
    stats.retries += answer.from === 'cache' ? 0 : answer.retries;
    const p = firstBetterProbability(answer.reply);
    if (p === null) stats.parse_failures++;
    return p;
  }
}
