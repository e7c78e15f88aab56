// An OpenAI-compatible chat-completions endpoint, as judges and the sampler use it: personal data masked
// before a request leaves the machine, a bounded number of requests in flight, retries on 429, 5xx and
// timeouts, a request budget, and every answer kept on disk so that a rerun sends nothing.
import type OpenAI from 'openai';
import pLimit from 'p-limit';
import { z } from 'zod';
import { AnswerCache } from '../pipeline/answer-cache.ts';
import { PipelineError, errorMessage } from '../pipeline/errors.ts';
import { hashJson } from '../pipeline/hash.ts';
import type { Logger } from '../pipeline/log.ts';
import { retryAfterMs, withRetry, type RetryDecision } from '../pipeline/retry.ts';
import type { Message, ToolCall } from '../core/records.ts';
import { redactorFactory, type RedactionConfig } from '../core/redact.ts';

/** An endpoint's section of the config. The key itself is only ever read from the environment. */
export const endpointConfig = z.strictObject({
  base_url: z
    .string()
    .url()
    .nullable()
    .default(null)
    .describe("Default: the OPENAI_BASE_URL environment variable, else OpenAI's own."),
  model: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "The model name; the stage's environment variable (PREFAB_JUDGE_MODEL, PREFAB_SAMPLE_MODEL or PREFAB_REWRITE_MODEL) overrides it; one of the two must be set.",
    ),
  api_key_env: z
    .string()
    .min(1)
    .default('OPENAI_API_KEY')
    .describe('Name of the environment variable holding the API key.'),
  concurrency: z.number().int().min(1).max(256).default(8).describe('Requests in flight at once.'),
  timeout_s: z
    .number()
    .positive()
    .default(60)
    .describe('Seconds before a request times out; a timeout is retried like a 5xx.'),
  attempts: z
    .number()
    .int()
    .min(1)
    .max(20)
    .default(6)
    .describe('Tries per request, the first included (429, 5xx and timeouts are retried).'),
  backoff_ms: z
    .number()
    .int()
    .min(0)
    .default(500)
    .describe('Backoff before the first retry, doubled each time, with jitter; a Retry-After header wins.'),
  max_backoff_ms: z
    .number()
    .int()
    .min(0)
    .default(60_000)
    .describe('Longest wait before a retry, in milliseconds, whatever a Retry-After header asks.'),
  max_requests: z
    .number()
    .int()
    .min(0)
    .nullable()
    .default(null)
    .describe('Most requests this stage may send in one run (retries count); null: no limit.'),
  max_consecutive_failures: z
    .number()
    .int()
    .min(1)
    .default(5)
    .describe('Consecutive failed requests (after their retries) that stop the stage: the endpoint is down.'),
});
export type EndpointConfig = z.infer<typeof endpointConfig>;

export interface ChatRequest {
  messages: Message[];
  temperature: number;
  max_tokens?: number;
  logprobs?: boolean;
  top_logprobs?: number;
  tools?: readonly unknown[];
  seed?: number;
}

interface TokenLogprob {
  token: string;
  logprob: number;
  top: { token: string; logprob: number }[];
}

export interface ChatReply {
  content: string | null;
  tool_calls: ToolCall[] | null;
  /** Per generated token, when logprobs were asked for and the server gave them. */
  logprobs: TokenLogprob[] | null;
}

/** Masks what leaves the machine; `restore` puts the masked values back into a reply (for the sampler). */
interface Redaction {
  messages(messages: Message[]): Message[];
  restore(text: string): string;
}

export type Answer =
  | { reply: ChatReply; from: 'cache' | 'endpoint'; retries: number; restore(text: string): string }
  | { reply: null; over_budget: true };

export interface EndpointCounts {
  requests: number;
  cached: number;
  retries: number;
  /** Requests that still failed after their retries. */
  failures: number;
  /** Answers not asked for because the budget was spent. */
  over_budget: number;
}

/** A request that failed after every retry: the caller abstains or skips, and a rerun asks again. */
export class RequestFailed extends Error {
  override name = 'RequestFailed';
}

export interface EndpointOptions {
  config: EndpointConfig;
  /** What the answers are for (`judge:llm`, `sample`): part of the cache key. */
  cachePath: string;
  redaction: (() => Redaction) | null;
  log: Logger;
  env?: NodeJS.ProcessEnv;
}

/** Statuses that a retry will not change: a bad request, key or model. */
const NOT_RETRIED = new Set([400, 401, 403, 404, 422]);

/** How servers say a request is longer than the model's context (OpenAI, vLLM, llama.cpp's llama-server). */
const TOO_LONG = /context[_ ]length|maximum context|context size|too many tokens|exceeds the (available )?context/i;

/** The openai package, loaded when the first endpoint opens: it takes a fifth of a second, which commands that open none do not pay. */
let SDK: typeof OpenAI | null = null;

export class ChatEndpoint {
  readonly counts: EndpointCounts = { requests: 0, cached: 0, retries: 0, failures: 0, over_budget: 0 };
  private readonly limit: ReturnType<typeof pLimit>;
  private readonly inFlight = new Map<string, Promise<Answer>>();
  private consecutiveFailures = 0;
  /** Set when the endpoint failed for good: every request still waiting fails with it at once. */
  private fatal: PipelineError | null = null;

  private constructor(
    private readonly client: OpenAI,
    readonly model: string,
    readonly baseURL: string,
    private readonly options: EndpointOptions,
    private readonly cache: AnswerCache<ChatReply>,
  ) {
    this.limit = pLimit(options.config.concurrency);
  }

  /** Resolves model, URL and key as the openai client's users expect; names what is missing. */
  static async open(options: EndpointOptions, what: string, modelEnv: string): Promise<ChatEndpoint> {
    const { config } = options;
    const env = options.env ?? process.env;
    const model = env[modelEnv] || config.model;
    if (!model)
      throw new PipelineError(
        `${what}: no model name; set \`model\` in the config or the ${modelEnv} environment variable`,
      );
    const apiKey = env[config.api_key_env];
    const baseURL = config.base_url || env.OPENAI_BASE_URL || 'https://api.openai.com/v1';
    if (!apiKey && /api\.openai\.com/.test(baseURL)) {
      throw new PipelineError(
        `${what}: no API key; set the ${config.api_key_env} environment variable (or point base_url / OPENAI_BASE_URL at a server that needs none)`,
      );
    }
    SDK ??= (await import('openai')).default;
    const client = new SDK({
      apiKey: apiKey || 'none',
      baseURL,
      maxRetries: 0,
      timeout: config.timeout_s * 1000,
      fetch: boundedFetch(MAX_REPLY_BYTES),
    });
    const cache = await AnswerCache.open<ChatReply>(options.cachePath);
    return new ChatEndpoint(client, model, baseURL, options, cache);
  }

  /**
   * The answer to `request`. The cache key is (purpose, version, model, index, the request as sent), so a
   * changed prompt, input, order or sample index asks again, and nothing else does.
   */
  /**
   * `key.readable`: whether a reply is one the caller can use; one that is not is never cached, and a cached
   * one that is not is asked again (a judge that answered nonsense and was fixed is not replayed for ever).
   */
  async complete(
    request: ChatRequest,
    key: { purpose: string; version: string; index: number; readable?: (reply: ChatReply) => boolean },
  ): Promise<Answer> {
    const redaction = this.options.redaction?.() ?? null;
    const messages = redaction ? redaction.messages(request.messages) : request.messages;
    const body = { ...request, messages, model: this.model };
    const cacheKey = hashJson({ purpose: key.purpose, version: key.version, index: key.index, body });
    const readable = key.readable ?? (() => true);
    const restore = redaction ? (text: string) => redaction.restore(text) : (text: string) => text;

    if (this.fatal) throw this.fatal;
    const hit = this.cache.get(cacheKey);
    if (hit && readable(hit)) {
      this.counts.cached++;
      return { reply: hit, from: 'cache', retries: 0, restore };
    }
    const pending = this.inFlight.get(cacheKey);
    if (pending) {
      // The same request is already on its way: share its answer, which costs this caller nothing.
      const shared = await pending;
      if (shared.reply === null) return shared;
      this.counts.cached++;
      return { ...shared, from: 'cache', retries: 0, restore };
    }
    const answer = this.limit(() => this.send(body, cacheKey, restore, readable));
    this.inFlight.set(cacheKey, answer);
    try {
      return await answer;
    } finally {
      this.inFlight.delete(cacheKey);
    }
  }

  private async send(
    body: ChatRequest & { model: string },
    cacheKey: string,
    restore: (t: string) => string,
    readable: (reply: ChatReply) => boolean,
  ): Promise<Answer> {
    const { config, log } = this.options;
    let retries = 0;
    const overBudget = () => config.max_requests !== null && this.counts.requests >= config.max_requests;
    if (overBudget()) {
      this.counts.over_budget++;
      return { reply: null, over_budget: true };
    }
    try {
      const reply = await withRetry(
        async () => {
          if (this.fatal) throw this.fatal;
          if (overBudget()) throw new BudgetSpent();
          this.counts.requests++;
          const response = await this.client.chat.completions.create({
            ...(body as object),
            stream: false,
          } as OpenAI.ChatCompletionCreateParamsNonStreaming);
          return readReply(response);
        },
        { attempts: config.attempts, baseMs: config.backoff_ms, maxMs: config.max_backoff_ms },
        classify,
        (event) => {
          retries++;
          this.counts.retries++;
          log.info('endpoint retry', {
            url: this.baseURL,
            reason: event.reason,
            attempt: event.attempt,
            wait_ms: Math.round(event.waitMs),
          });
        },
      );
      this.consecutiveFailures = 0;
      if (readable(reply)) await this.cache.put(cacheKey, reply);
      return { reply, from: 'endpoint', retries, restore };
    } catch (error) {
      if (error instanceof BudgetSpent) {
        this.counts.over_budget++;
        return { reply: null, over_budget: true };
      }
      if (error === this.fatal) throw error;
      // A request longer than the model's context is this request's fault, not the endpoint's: it fails
      // alone (the comparison abstains), counted as a failure like a 5xx, so that only an endpoint that
      // refuses everything (max_consecutive_failures in a row) stops the stage.
      const tooLong = error instanceof SDK!.APIError && error.status === 400 && TOO_LONG.test(error.message);
      if (!tooLong && error instanceof SDK!.APIError && error.status !== undefined && NOT_RETRIED.has(error.status)) {
        throw (this.fatal = new PipelineError(
          `${this.baseURL} answered ${error.status} for model ${this.model}: ${error.message}${hint(error.status, config)}`,
        ));
      }
      this.counts.failures++;
      if (++this.consecutiveFailures >= config.max_consecutive_failures) {
        throw (this.fatal = new PipelineError(
          `${this.baseURL} failed ${this.consecutiveFailures} requests in a row, each after ${config.attempts} tries; last: ${errorMessage(error)}`,
        ));
      }
      throw new RequestFailed(
        `request to ${this.baseURL} failed after ${config.attempts} tries: ${errorMessage(error)}`,
      );
    }
  }

  async close(): Promise<void> {
    await this.cache.close();
  }
}

class BudgetSpent extends Error {}

/**
 * The largest reply body read from an endpoint. A judge's verdict with its top log-probs is a few KB; a server
 * that answers far more than it was asked for would otherwise be held whole in memory, and in the cache.
 */
const MAX_REPLY_BYTES = 8 << 20;

/** fetch whose response body fails past `maxBytes` (by its Content-Length, or as it streams in). */
function boundedFetch(maxBytes: number): typeof fetch {
  const tooLarge = (bytes: string) =>
    new Error(`the reply is ${bytes} bytes, more than the ${maxBytes} an endpoint's reply may be`);
  return async (input, init) => {
    const response = await fetch(input, init);
    const declared = Number(response.headers.get('content-length') ?? 0);
    if (declared > maxBytes) {
      await response.body?.cancel();
      throw tooLarge(String(declared));
    }
    if (!response.body) return response;
    let seen = 0;
    const body = response.body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          seen += chunk.byteLength;
          if (seen > maxBytes) controller.error(tooLarge(`over ${seen}`));
          else controller.enqueue(chunk);
        },
      }),
    );
    return new Response(body, { status: response.status, statusText: response.statusText, headers: response.headers });
  };
}

function hint(status: number, config: EndpointConfig): string {
  if (status === 401 || status === 403) return ` (check the key in ${config.api_key_env})`;
  if (status === 404) return ' (check base_url and the model name)';
  return '';
}

function classify(error: unknown): RetryDecision {
  if (error instanceof SDK!.APIConnectionTimeoutError) return { retry: true, reason: 'timeout' };
  if (error instanceof SDK!.APIConnectionError) return { retry: true, reason: 'connection' };
  if (error instanceof SDK!.APIError && error.status !== undefined) {
    const retry = error.status === 408 || error.status === 409 || error.status === 429 || error.status >= 500;
    const afterMs = error.headers ? retryAfterMs((name) => error.headers!.get(name)) : undefined;
    return { retry, reason: String(error.status), ...(afterMs === undefined ? {} : { afterMs }) };
  }
  return { retry: false, reason: 'error' };
}

function readReply(response: OpenAI.ChatCompletion): ChatReply {
  const choice = response.choices?.[0];
  if (!choice?.message) throw new RequestFailed('the reply has no choices[0].message');
  const calls = (choice.message.tool_calls ?? []).filter(
    (c) => c.type === 'function',
  ) as OpenAI.ChatCompletionMessageFunctionToolCall[];
  return {
    content: choice.message.content ?? null,
    tool_calls: calls.length
      ? calls.map((c) => ({
          id: c.id,
          type: 'function',
          function: { name: c.function.name, arguments: c.function.arguments },
        }))
      : null,
    logprobs:
      choice.logprobs?.content?.map((t) => ({
        token: t.token,
        logprob: t.logprob,
        top: (t.top_logprobs ?? []).map((x) => ({ token: x.token, logprob: x.logprob })),
      })) ?? null,
  };
}

/** Where a stage configures an endpoint: its config key (named in errors) and the variable that overrides its model. */
export interface EndpointSite {
  key: string;
  modelEnv: string;
}

/** The environment variables that are settings of the endpoint at `site`: part of its stage's fingerprint. */
export const endpointEnvironment = (site: EndpointSite): string[] => [site.modelEnv, 'OPENAI_BASE_URL'];

/** Opens a stage's endpoint with its redaction and an answer cache at `cachePath` (in the stage's cache folder). */
export function openEndpoint(
  site: EndpointSite,
  config: EndpointConfig,
  redaction: RedactionConfig,
  cachePath: string,
  log: Logger,
): Promise<ChatEndpoint> {
  return ChatEndpoint.open({ config, cachePath, redaction: redactorFactory(redaction), log }, site.key, site.modelEnv);
}

/** What a stage counts of its endpoint's work. */
export const requestCounts = (e: ChatEndpoint) => ({
  requests: e.counts.requests,
  cached: e.counts.cached,
  retries: e.counts.retries,
});
