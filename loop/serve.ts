// `prefab serve`: registry versions behind an OpenAI-compatible HTTP API (POST /v1/chat/completions with
// tools and tool_calls, optional SSE streaming; GET /v1/models), so agents and the simulator talk to the
// deployed model as to any endpoint. The requests in flight for a version are decoded together: one pass
// through the model per decoding step for all of them (on the GPU with --backend webgpu), new requests' prompts read in the same pass (KVCache.readMany), and a finished request's cache
// waits in a pool for the conversation's next turn, which then reads only its new messages. With a split,
// each conversation goes to an arm by a stable hash of its opening messages, and every response says which
// version answered (its `model` field and the x-prefab-version header), so collected sessions come back
// tagged with the model that acted.
import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { z } from 'zod';
import type { Logger } from '../pipeline/log.ts';
import { jsonDepth } from '../pipeline/records.ts';
import type { Message } from '../core/records.ts';
import { seeded } from '../core/random.ts';
import { openChat, type Chat } from '../model/chat.ts';
import { loadCheckpoint } from '../model/checkpoint.ts';
import type { ToolCallConstraint, ToolSchema } from '../model/constrain.ts';
import { Decoding, readDecodings, type CachePool, type TokenCache } from '../runtime/decode.ts';
import { mainEngine, type Device } from '../runtime/device.ts';
import { cachePool } from '../runtime/engines.ts';
import type { Llama } from '../model/llama.ts';
import { decodingEngine } from '../runtime/placement.ts';
import type { Placeholders } from '../model/placeholders.ts';
import { promptOf } from '../runtime/policy.ts';
import type { Registry } from './registry.ts';
import type { Arm, ServeSettings } from './settings.ts';

/** The arm a conversation goes to: its key hashed to a number in [0, 1), against the arms' cumulative shares. */
export function armOf(key: string, arms: Arm[]): Arm {
  const u = createHash('sha256').update(key).digest().readUInt32BE(0) / 2 ** 32;
  let acc = 0;
  for (const arm of arms) if (u < (acc += arm.share)) return arm;
  return arms.at(-1)!;
}

/** What identifies a conversation across its turns: the request's `user`, else its messages up to the user's first request. */
export function conversationKey(messages: Message[], user?: string): string {
  if (user) return `user:${user}`;
  const first = messages.findIndex((m) => m.role === 'user');
  return JSON.stringify(messages.slice(0, first + 1).map((m) => [m.role, m.content]));
}

// ---- the OpenAI request, validated --------------------------------------------------------------------------

const text = z.union([
  z.string(),
  z
    .array(z.object({ type: z.literal('text'), text: z.string() }))
    .transform((parts) => parts.map((p) => p.text).join('')),
]);
const toolCall = z.object({
  id: z.string(),
  type: z.literal('function'),
  function: z.object({ name: z.string(), arguments: z.string() }),
});
const message = z.object({
  role: z
    .enum(['system', 'developer', 'user', 'assistant', 'tool'])
    .transform((r) => (r === 'developer' ? 'system' : r)),
  content: text.nullable().optional(),
  name: z.string().optional(),
  tool_calls: z.array(toolCall).optional(),
  tool_call_id: z.string().optional(),
});
const chatRequest = z.object({
  model: z.string().min(1),
  messages: z.array(message).min(1),
  tools: z
    .array(
      z.object({
        type: z.literal('function'),
        function: z.object({
          name: z.string().min(1),
          description: z.string().optional(),
          parameters: z.record(z.string(), z.unknown()).optional(),
        }),
      }),
    )
    .optional(),
  tool_choice: z
    .union([
      z.enum(['auto', 'none', 'required']),
      z.object({ type: z.literal('function'), function: z.object({ name: z.string() }) }),
    ])
    .optional(),
  temperature: z.number().min(0).max(2).optional(),
  top_p: z.number().gt(0).max(1).optional(),
  max_tokens: z.number().int().min(1).optional(),
  max_completion_tokens: z.number().int().min(1).optional(),
  stream: z.boolean().optional(),
  n: z.literal(1).optional(),
  seed: z.number().int().optional(),
  user: z.string().optional(),
  /** vLLM's extension for benchmarks: write max_tokens tokens, past the end of the reply. */
  ignore_eos: z.boolean().optional(),
});
type ChatRequest = z.infer<typeof chatRequest>;

/** An error answered in OpenAI's shape: {"error": {message, type, param, code}}. */
class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly param: string | null = null,
    readonly type = status === 401
      ? 'invalid_request_error'
      : status === 429
        ? 'requests'
        : status >= 500
          ? 'server_error'
          : 'invalid_request_error',
  ) {
    super(message);
  }
}

// ---- a version being served: its model, its queue, the decoding loop ------------------------------------------

interface Job {
  decoding: Decoding<TokenCache> | null;
  prompt: number[];
  sampling: {
    maxTokens: number;
    temperature: number;
    topP: number;
    random: () => number;
    constraint?: ToolCallConstraint;
    stop: number[];
  };
  /** Each drawn token, as it comes (streaming). */
  onToken?: (out: readonly number[]) => void;
  done: (result: { out: number[]; error?: Error }) => void;
  cancelled: boolean;
}

/**
 * What a served version is loaded with: its queue's limits, and the device it decodes on (under auto where it
 * is faster at max_batch sequences: runtime/placement.ts, which logs to `log`).
 */
type ServedSettings = Pick<ServeSettings, 'maxBatch' | 'maxQueue'> & { device: Device; log: Logger };

/** The most bytes of tool lists a model keeps constraints for (Model.constraint). */
export const CONSTRAINT_BYTES = 16 << 20;

/** Shared tokens below which a new cache reads the prompt itself rather than copy another's. */
const MIN_FORK = 16;

/** A registry version loaded for serving: requests wait in a queue, and up to maxBatch of them are decoded step by step together. */
class ServedModel {
  readonly chat: Chat;
  readonly context: number;
  readonly placeholders: Placeholders;
  /** The caches and the model's steps, on the GPU or the CPU (placed()). */
  private caches: CachePool | null = null;
  private readonly model: Llama;
  private readonly idle: TokenCache[] = [];
  private readonly waiting: Job[] = [];
  private active: Job[] = [];
  private running = false;
  private readonly constraints = new Map<string, Promise<ToolCallConstraint | null>>();
  /** Tokens generated, for the log at shutdown. */
  generated = 0;

  constructor(
    readonly version: string,
    folder: string,
    private readonly settings: ServedSettings,
  ) {
    const checkpoint = loadCheckpoint(folder);
    this.chat = openChat(checkpoint.tokenizer, checkpoint.model.config.eosTokenId, folder);
    this.context = checkpoint.context;
    this.placeholders = checkpoint.placeholders;
    this.model = checkpoint.model;
    // Made now, as the version loads, unless auto is to time where they go (at the first request).
    if (!settings.device.placesEachPhase) this.caches = cachePool(mainEngine(settings.device), this.model);
  }

  /** The caches: under auto made at the first request, where decodingEngine places maxBatch sequences. */
  private async placed(): Promise<CachePool> {
    if (!this.caches) {
      const { maxBatch, log, device } = this.settings;
      const engine = await decodingEngine(device, this.model, maxBatch, log);
      if (this.disposed) throw new Error(`version ${this.version} was unloaded`);
      this.caches = cachePool(engine, this.model);
    }
    return this.caches;
  }

  private disposed = false;

  /**
   * The constraint of a request's tool list, kept for the next request with the same list: a client sends
   * the same tools every turn. The least recently used are forgotten past CONSTRAINT_BYTES of tool lists (as
   * their JSON: what a constraint holds of its own; the vocabulary's texts are shared), so that clients
   * sending ever new lists cannot grow the server.
   */
  constraint(tools: readonly ToolSchema[]): Promise<ToolCallConstraint | null> {
    const key = JSON.stringify(tools);
    let c = this.constraints.get(key);
    if (c)
      this.constraints.delete(key); // to the most recent end
    else {
      c = this.chat.toolConstraint(tools);
      this.constraintBytes += 2 * key.length;
    }
    this.constraints.set(key, c);
    for (const [old] of this.constraints) {
      if (this.constraintBytes <= CONSTRAINT_BYTES || old === key) break;
      this.constraints.delete(old);
      this.constraintBytes -= 2 * old.length;
    }
    return c;
  }

  /** What the tool lists of `constraints` take, as UTF-16 strings. */
  private constraintBytes = 0;

  /** How many tool lists' constraints are kept, and what their lists take. */
  get heldConstraints(): { lists: number; bytes: number } {
    return { lists: this.constraints.size, bytes: this.constraintBytes };
  }

  /** Queues a prompt; resolves with the drawn tokens. 429 when the queue is full. */
  generate(job: Omit<Job, 'decoding' | 'done' | 'cancelled'>): { result: Promise<number[]>; cancel(): void } {
    if (this.waiting.length >= this.settings.maxQueue)
      throw new ApiError(
        429,
        'rate_limit_exceeded',
        `the server is busy: ${this.active.length} requests decoding and ${this.waiting.length} waiting for ${this.version}; retry shortly`,
      );
    let entry!: Job;
    const result = new Promise<number[]>((resolve, reject) => {
      entry = { ...job, decoding: null, cancelled: false, done: (r) => (r.error ? reject(r.error) : resolve(r.out)) };
    });
    this.waiting.push(entry);
    void this.loop();
    return { result, cancel: () => (entry.cancelled = true) };
  }

  /**
   * A cache for the prompt: the idle one sharing the longest prefix with it (a conversation's earlier turn),
   * else a copy of the shared part of one in flight (the system prompt, read once for all of them), else a new
   * one. Either way only what is not shared is read.
   */
  private cacheFor(prompt: number[], inFlight: { job: Job }[]): TokenCache {
    const shared = (c: TokenCache) => {
      let n = 0;
      while (n < c.tokens.length && n < prompt.length && c.tokens[n] === prompt[n]) n++;
      return n;
    };
    let best: { cache: TokenCache; n: number; idle: boolean } | null = null;
    for (const [cache, idle] of [
      ...this.idle.map((c) => [c, true] as const),
      ...inFlight.map((r) => [r.job.decoding!.cache, false] as const),
    ]) {
      const n = shared(cache);
      if (n > (best?.n ?? 0)) best = { cache, n, idle };
    }
    if (best?.idle) return this.idle.splice(this.idle.indexOf(best.cache), 1)[0]!;
    if (best && best.n >= MIN_FORK) return this.caches!.fork(best.cache, best.n);
    return this.caches!.create();
  }

  private release(job: Job, error?: Error): void {
    if (job.decoding) {
      this.idle.push(job.decoding.cache);
      if (this.idle.length > 2 * this.settings.maxBatch) this.caches!.free(this.idle.shift()!); // the least recently used goes
    }
    job.done({ out: job.decoding?.out ?? [], error });
  }

  /**
   * Until no request is left: draw a token for each request in flight, take waiting ones in, and read them
   * all in one pass: the drawn tokens, and the new requests' prompts (what their caches do not hold yet).
   */
  private async loop(): Promise<void> {
    if (this.running) return;
    this.running = true;
    try {
      const caches = await this.placed();
      while (this.waiting.length > 0 || this.active.length > 0) {
        const reading: { job: Job; tokens: number[] }[] = [];
        for (const job of this.active) {
          const token = job.cancelled ? null : job.decoding!.next();
          if (token !== null) {
            this.generated++;
            job.onToken?.(job.decoding!.out);
          }
          if (token === null || job.decoding!.finished) this.release(job);
          else reading.push({ job, tokens: [token] });
        }
        while (this.waiting.length > 0 && reading.length < this.settings.maxBatch) {
          const job = this.waiting.shift()!;
          if (job.cancelled) {
            this.release(job);
            continue;
          }
          try {
            job.decoding = new Decoding(this.cacheFor(job.prompt, reading), job.prompt, job.sampling, false);
            if (job.decoding.finished) this.release(job);
            else reading.push({ job, tokens: job.decoding.unread.splice(0) });
          } catch (error) {
            this.release(job, error as Error);
          }
        }
        this.active = reading.map((r) => r.job);
        if (reading.length > 0) {
          await readDecodings(
            caches,
            reading.map((r) => r.job.decoding!),
            reading.map((r) => r.tokens),
          );
        }
        await new Promise((resolve) => setImmediate(resolve)); // let the server take requests and send replies
      }
    } catch (error) {
      for (const job of [...this.active, ...this.waiting.splice(0)]) job.done({ out: [], error: error as Error });
      this.active = [];
    } finally {
      this.running = false;
    }
  }

  dispose(): void {
    this.disposed = true;
    for (const cache of this.idle.splice(0)) this.caches?.free(cache);
    this.caches?.dispose();
    this.model.dispose();
  }
}

// ---- HTTP -------------------------------------------------------------------------------------------------

/** The versions served, by every name a request may use: version ids, `production`, `candidate`. */
export type Catalog = Map<string, ServedModel>;

/** Loads the registry's aliases and the versions named, each once. */
export function loadCatalog(registry: Registry, names: string[], settings: ServedSettings): Catalog {
  const aliases = registry.aliases();
  const catalog: Catalog = new Map();
  const byVersion = new Map<string, ServedModel>();
  for (const name of names) {
    const id = name === 'production' || name === 'candidate' ? aliases[name] : name;
    if (!id)
      throw new Error(`the registry in ${registry.dir} has no ${name}: \`prefab models list\` shows what it has`);
    registry.version(id);
    let served = byVersion.get(id);
    if (!served) byVersion.set(id, (served = new ServedModel(id, join(registry.folder(id), 'model'), settings)));
    catalog.set(name, served);
    catalog.set(id, served);
  }
  return catalog;
}

/**
 * Points the catalog's aliases where the registry now says (a promotion or a rollback made while serving):
 * the new version is loaded, and later requests for the alias go to it; requests in flight finish on the
 * version they started on, which stays served under its id. Returns the moves, e.g. `production: v0003 → v0004`.
 */
export function followAliases(catalog: Catalog, registry: Registry, settings: ServedSettings): string[] {
  const aliases = registry.aliases();
  const moves: string[] = [];
  for (const alias of ['production', 'candidate'] as const) {
    const served = catalog.get(alias);
    const id = aliases[alias];
    if (!served || !id || served.version === id) continue;
    const next = catalog.get(id) ?? new ServedModel(id, join(registry.folder(id), 'model'), settings);
    catalog.set(alias, next);
    catalog.set(id, next);
    moves.push(`${alias}: ${served.version} → ${id}`);
  }
  return moves;
}

export interface RunningServer {
  url: string;
  server: Server;
  /** Stops taking connections, lets the requests in flight finish (up to `graceMs`), and resolves when closed. */
  close(graceMs?: number): Promise<void>;
}

function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent) return;
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(JSON.stringify(body));
}

function sendError(res: ServerResponse, e: ApiError): void {
  sendJson(
    res,
    e.status,
    { error: { message: e.message, type: e.type, param: e.param, code: e.code } },
    e.status === 429 ? { 'retry-after': '1' } : {},
  );
}

/** The body, at most `limit` bytes (413 past it; the rest is read and dropped so the client sees the answer). */
function readBody(req: IncomingMessage, limit: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size <= limit) chunks.push(chunk);
    });
    req.on('end', () =>
      size > limit
        ? reject(
            new ApiError(
              413,
              'request_too_large',
              `the request body is ${size} bytes; the most this server takes is ${limit}`,
            ),
          )
        : resolve(Buffer.concat(chunks).toString('utf8')),
    );
    req.on('error', reject);
  });
}

function authorised(req: IncomingMessage, key: string | null): boolean {
  if (key === null) return true;
  const given = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1] ?? '';
  const digest = (s: string) => createHash('sha256').update(s).digest();
  return timingSafeEqual(digest(given), digest(key));
}

/** The deepest a request body may nest (a tool's JSON schema nests a few levels). */
const MAX_BODY_DEPTH = 128;

/** The path of a request target, without trailing slashes; null where it is not one (`http://[`). */
function pathOf(target: string | undefined): string | null {
  try {
    return new URL(target ?? '/', 'http://x').pathname.replace(/\/+$/, '');
  } catch {
    return null;
  }
}

/** Starts the server over `catalog`; resolves once it listens. */
export async function startServer(catalog: Catalog, settings: ServeSettings, log: Logger): Promise<RunningServer> {
  let closing = false;
  const inFlight = new Set<Promise<void>>();
  const server = createServer((req, res) => {
    const task = handle(req, res).catch((error: unknown) => {
      if (res.headersSent) {
        // A stream already begun: end it (the client sees no [DONE]).
        log.error('request failed while streaming', { error: (error as Error).message });
        if (!res.writableEnded) res.end();
        return;
      }
      if (error instanceof ApiError) return sendError(res, error);
      log.error('request failed', { error: (error as Error).message });
      sendError(
        res,
        new ApiError(500, 'server_error', `the server failed on this request: ${(error as Error).message}`),
      );
    });
    inFlight.add(task);
    void task.finally(() => inFlight.delete(task));
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = pathOf(req.url);
    if (path === '/health') return sendJson(res, closing ? 503 : 200, { status: closing ? 'shutting down' : 'ok' });
    if (closing)
      throw new ApiError(503, 'shutting_down', 'the server is shutting down; retry against another instance');
    if (!authorised(req, settings.apiKey))
      throw new ApiError(
        401,
        'invalid_api_key',
        'missing or wrong API key: send it as `Authorization: Bearer <key>` (the server reads PREFAB_SERVE_API_KEY)',
      );
    if (path === null)
      throw new ApiError(400, 'invalid_request', 'the request target is not a path, such as /v1/models');
    if (path === '/v1/models') {
      if (req.method !== 'GET') throw new ApiError(405, 'method_not_allowed', `${req.method} ${path}: use GET`);
      return sendJson(res, 200, {
        object: 'list',
        data: [...catalog].map(([id, served]) => ({
          id,
          object: 'model',
          created: 0,
          owned_by: 'prefab',
          version: served.version,
        })),
      });
    }
    if (path !== '/v1/chat/completions')
      throw new ApiError(404, 'not_found', `no route ${path}: this server answers /v1/chat/completions and /v1/models`);
    if (req.method !== 'POST') throw new ApiError(405, 'method_not_allowed', `${req.method} ${path}: use POST`);
    const body = await readBody(req, settings.maxBodyBytes);
    let json: unknown;
    try {
      json = JSON.parse(body);
    } catch (error) {
      throw new ApiError(400, 'invalid_json', `the body is not JSON: ${(error as Error).message}`);
    }
    // Validating or hashing a value walks it recursively: one nested without end would overflow the stack.
    if (jsonDepth(json, MAX_BODY_DEPTH) > MAX_BODY_DEPTH)
      throw new ApiError(400, 'invalid_request', `the body nests more than ${MAX_BODY_DEPTH} levels deep`);
    const parsed = chatRequest.safeParse(json);
    if (!parsed.success) {
      const issue = parsed.error.issues[0]!;
      const param = issue.path.join('.');
      throw new ApiError(400, 'invalid_request', `${param || 'body'}: ${issue.message}`, param || null);
    }
    await complete(parsed.data, req, res);
  }

  async function complete(request: ChatRequest, req: IncomingMessage, res: ServerResponse): Promise<void> {
    const messages = request.messages as Message[];
    const asked = request.model === 'prefab' ? settings.defaultModel : request.model;
    const arm =
      settings.split && asked === 'production'
        ? armOf(
            conversationKey(messages, request.user ?? (req.headers['x-prefab-conversation'] as string | undefined)),
            settings.split,
          ).name
        : asked;
    const served = catalog.get(arm);
    if (!served)
      throw new ApiError(
        404,
        'model_not_found',
        `the model ${request.model} is not served here; GET /v1/models lists those that are`,
        'model',
      );
    const maxTokens = request.max_completion_tokens ?? request.max_tokens ?? settings.maxTokens;
    if (maxTokens > settings.maxTokens)
      throw new ApiError(
        400,
        'invalid_request',
        `max_tokens ${maxTokens}: the most this server writes in one reply is ${settings.maxTokens}`,
        'max_tokens',
      );
    const room = served.context - maxTokens;
    const prompt = await promptOf(served.chat, served.placeholders, room, messages);
    if (prompt.least > room)
      throw new ApiError(
        413,
        'context_length_exceeded',
        `the conversation needs at least ${prompt.least} tokens (the messages up to the user's request, the latest message and the reply's header) and the reply up to ${maxTokens}: more than the model's context of ${served.context}`,
        'messages',
      );
    const tools = request.tool_choice === 'none' ? undefined : (request.tools as ToolSchema[] | undefined);
    const constraint = tools?.length ? ((await served.constraint(tools)) ?? undefined) : undefined;
    const random = request.seed === undefined ? Math.random : seeded(request.seed, 'serve');
    const firstCall = 1 + messages.reduce((n, m) => n + (m.role === 'assistant' ? (m.tool_calls?.length ?? 0) : 0), 0);
    const id = `chatcmpl-${randomUUID()}`;
    const created = Math.floor(Date.now() / 1000);
    const headers = { 'x-prefab-version': served.version, 'x-prefab-arm': arm };
    const stream = request.stream === true;
    let sent = '';
    let chain = Promise.resolve();
    /** A stream's event, unless the client has gone. */
    const emit = (text: string) => void (!res.destroyed && !res.writableEnded && res.write(text));
    const chunk = (delta: Record<string, unknown>, finish: string | null = null) =>
      `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model: served.version, system_fingerprint: served.version, choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }] })}\n\n`;
    if (stream) {
      res.writeHead(200, {
        'content-type': 'text/event-stream',
        'cache-control': 'no-cache',
        connection: 'keep-alive',
        ...headers,
      });
      emit(chunk({ role: 'assistant', content: '' }));
    }
    // Streaming: the reply's text so far (values put back) goes out as it grows; calls come whole at the end.
    const onToken = stream
      ? (out: readonly number[]) => {
          const ids = [...out];
          chain = chain.then(async () => {
            const partial = prompt.restore(await served.chat.parseAssistant(ids, firstCall));
            const content = partial.content ?? '';
            if (!partial.tool_calls?.length && content.startsWith(sent) && content.length > sent.length) {
              emit(chunk({ content: content.slice(sent.length) }));
              sent = content;
            }
          });
        }
      : undefined;
    const stop = request.ignore_eos ? [] : served.chat.stop;
    const job = served.generate({
      prompt: prompt.ids,
      sampling: {
        maxTokens,
        temperature: request.temperature ?? 1,
        topP: request.top_p ?? 1,
        random,
        constraint,
        stop,
      },
      onToken,
    });
    res.on('close', () => job.cancel());
    const out = await job.result;
    await chain;
    const reply = prompt.restore(await served.chat.parseAssistant(out, firstCall));
    const stopped = out.length > 0 && stop.includes(out.at(-1)!);
    // As OpenAI's API: a reply cut by max_tokens says 'length' even where its text already parses as a call.
    const finish = !stopped ? 'length' : reply.tool_calls?.length ? 'tool_calls' : 'stop';
    const usage = {
      prompt_tokens: prompt.ids.length,
      completion_tokens: out.length,
      total_tokens: prompt.ids.length + out.length,
    };
    const assistant = {
      role: 'assistant',
      content: reply.content ?? null,
      ...(reply.tool_calls?.length ? { tool_calls: reply.tool_calls } : {}),
    };
    if (!stream) {
      sendJson(
        res,
        200,
        {
          id,
          object: 'chat.completion',
          created,
          model: served.version,
          system_fingerprint: served.version,
          choices: [{ index: 0, message: assistant, finish_reason: finish, logprobs: null }],
          usage,
        },
        headers,
      );
      return;
    }
    const rest = (reply.content ?? '').startsWith(sent) ? (reply.content ?? '').slice(sent.length) : '';
    if (rest) emit(chunk({ content: rest }));
    if (reply.tool_calls?.length) emit(chunk({ tool_calls: reply.tool_calls.map((c, index) => ({ index, ...c })) }));
    emit(chunk({}, finish));
    emit(`data: [DONE]\n\n`);
    if (!res.writableEnded) res.end();
  }

  // Idle connections are kept longer than clients keep them (undici: the server's timeout less a second), so a
  // client never reuses one the server is closing.
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 66_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(settings.port, settings.host, () => resolve());
  });
  const address = server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  return {
    url: `http://${host}:${address.port}/v1`,
    server,
    async close(graceMs = 30_000) {
      closing = true;
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeIdleConnections();
      const drained = Promise.allSettled([...inFlight]);
      const timeout = new Promise((resolve) => setTimeout(resolve, graceMs).unref());
      await Promise.race([drained, timeout]);
      server.closeAllConnections();
      await closed;
    },
  };
}
