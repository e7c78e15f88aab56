// `prefab serve`: registry versions behind an OpenAI-compatible HTTP API (POST /v1/chat/completions with
// tools and tool_calls, optional SSE streaming; GET /v1/models), so agents and the simulator talk to the
// deployed model as to any endpoint. This is the HTTP: routes, the API key, bodies, streams and shutting down;
// the protocol's shapes are protocol.ts's, the decoding batcher.ts's. With a split, each conversation goes to
// an arm by a stable hash of its opening messages, and every response says which version answered (its
// `model` field and the x-prefab-version header), so collected sessions come back tagged with the model
// that acted.
import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from '../../pipeline/log.ts';
import { jsonDepth } from '../../pipeline/records.ts';
import type { Message } from '../../core/records.ts';
import { seeded } from '../../core/random.ts';
import { promptOf } from '../../runtime/policy.ts';
import type { ServeSettings } from '../settings.ts';
import type { Catalog } from './batcher.ts';
import {
  ApiError,
  armOf,
  atLeast,
  chatRequest,
  chunkEvent,
  completionBody,
  conversationKey,
  cutAtStop,
  finishReason,
  stopStrings,
  toolsAsked,
  type ChatRequest,
  type CompletionId,
} from './protocol.ts';

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

/** Answers one validated request on the version it names (or its arm of a split): whole, or streamed as it is written. */
async function complete(
  catalog: Catalog,
  settings: ServeSettings,
  request: ChatRequest,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
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
  if ((request.min_tokens ?? 0) > maxTokens)
    throw new ApiError(
      400,
      'invalid_request',
      `min_tokens ${request.min_tokens} is more than the reply's ${maxTokens} tokens`,
      'min_tokens',
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
  const { tools, choice } = toolsAsked(request);
  const stop = request.ignore_eos ? [] : served.chat.stop;
  const constraint = atLeast(request.min_tokens ?? 0, stop, (await served.constraint(tools, choice)) ?? undefined);
  const stops = stopStrings(request);
  // Text that may be the start of a stop string is held back from a stream until the next token says.
  const holdBack = Math.max(0, ...stops.map((x) => x.length - 1));
  let stopHit = false;
  let cancel = () => {};
  const random = request.seed === undefined ? Math.random : seeded(request.seed, 'serve');
  const firstCall = 1 + messages.reduce((n, m) => n + (m.role === 'assistant' ? (m.tool_calls?.length ?? 0) : 0), 0);
  const c: CompletionId = {
    id: `chatcmpl-${randomUUID()}`,
    created: Math.floor(Date.now() / 1000),
    version: served.version,
  };
  const headers = { 'x-prefab-version': served.version, 'x-prefab-arm': arm };
  const stream = request.stream === true;
  let sent = '';
  let chain = Promise.resolve();
  /** A stream's event, unless the client has gone. */
  const emit = (text: string) => void (!res.destroyed && !res.writableEnded && res.write(text));
  if (stream) {
    res.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
      ...headers,
    });
    emit(chunkEvent(c, { role: 'assistant', content: '' }));
  }
  // Streaming: the reply's text so far (values put back) goes out as it grows; calls come whole at the end.
  // With stop strings, a reply is read as it grows even when not streamed, to end it at the first one.
  const onToken =
    stream || stops.length
      ? (out: readonly number[]) => {
          const ids = [...out];
          chain = chain.then(async () => {
            if (stopHit) return;
            const partial = prompt.restore(await served.chat.parseAssistant(ids, firstCall));
            const cut = cutAtStop(partial.content ?? '', stops);
            if (cut.stopped) {
              stopHit = true;
              cancel();
            }
            if (!stream) return;
            // A character whose bytes are split between tokens decodes as U+FFFD until its last byte comes:
            // trailing ones are held back, or the stream would carry a character the reply does not have.
            const settled = cut.text.replace(/\uFFFD+$/, '');
            const content = cut.stopped ? cut.text : settled.slice(0, Math.max(0, settled.length - holdBack));
            if (!partial.tool_calls?.length && content.startsWith(sent) && content.length > sent.length) {
              emit(chunkEvent(c, { content: content.slice(sent.length) }));
              sent = content;
            }
          });
        }
      : undefined;
  const job = served.generate({
    prompt: prompt.ids,
    sampling: { maxTokens, temperature: request.temperature ?? 1, topP: request.top_p ?? 1, random, constraint, stop },
    onToken,
  });
  cancel = () => job.cancel();
  res.on('close', () => job.cancel());
  const out = await job.result;
  await chain;
  let reply = prompt.restore(await served.chat.parseAssistant(out, firstCall));
  const cut = cutAtStop(reply.content ?? '', stops);
  // A stop string in the text ends the reply there: what came after it (calls included) is not returned.
  if (cut.stopped) reply = { role: 'assistant', content: cut.text };
  const finish = finishReason(cut.stopped || (out.length > 0 && stop.includes(out.at(-1)!)), reply);
  if (!stream) {
    const usage = {
      prompt_tokens: prompt.ids.length,
      completion_tokens: out.length,
      total_tokens: prompt.ids.length + out.length,
    };
    return sendJson(res, 200, completionBody(c, reply, finish, usage), headers);
  }
  const rest = (reply.content ?? '').startsWith(sent) ? (reply.content ?? '').slice(sent.length) : '';
  if (rest) emit(chunkEvent(c, { content: rest }));
  if (reply.tool_calls?.length)
    emit(chunkEvent(c, { tool_calls: reply.tool_calls.map((t, index) => ({ index, ...t })) }));
  emit(chunkEvent(c, {}, finish));
  emit(`data: [DONE]\n\n`);
  if (!res.writableEnded) res.end();
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
    await complete(catalog, settings, parsed.data, req, res);
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
