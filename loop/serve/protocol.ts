// The OpenAI chat-completions protocol as prefab serve speaks it: the request, validated; errors in OpenAI's
// shape; the reply whole or as server-sent events, and why it ended; and which arm of an A/B split a
// conversation goes to. The HTTP around it is http.ts, the decoding behind it batcher.ts.
import { createHash } from 'node:crypto';
import { z } from 'zod';
import type { Message } from '../../core/records.ts';
import type { TokenConstraint, ToolChoice, ToolSchema } from '../../model/constrain.ts';
import type { Arm } from '../settings.ts';

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
export const chatRequest = z.object({
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
  /** Up to 4 strings: the reply ends before the first of them, which is not returned (OpenAI's `stop`). */
  stop: z
    .union([z.string(), z.array(z.string()).max(4)])
    .nullable()
    .optional(),
  /** vLLM's extension for benchmarks: write max_tokens tokens, past the end of the reply. */
  ignore_eos: z.boolean().optional(),
  /** vLLM's: the reply's end token is not drawn before this many tokens. */
  min_tokens: z.number().int().min(0).optional(),
});
export type ChatRequest = z.infer<typeof chatRequest>;

/** An error answered in OpenAI's shape: {"error": {message, type, param, code}}. */
export class ApiError extends Error {
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

/** The request's stop strings, the empty ones left out. */
export function stopStrings(request: ChatRequest): string[] {
  const stop = request.stop ?? [];
  return (typeof stop === 'string' ? [stop] : stop).filter((s) => s.length > 0);
}

/** `content` up to the first of `stops`, and whether one was found there. */
export function cutAtStop(content: string, stops: readonly string[]): { text: string; stopped: boolean } {
  let at = -1;
  for (const s of stops) {
    const i = content.indexOf(s);
    if (i >= 0 && (at < 0 || i < at)) at = i;
  }
  return at < 0 ? { text: content, stopped: false } : { text: content.slice(0, at), stopped: true };
}

/**
 * The tools a reply may call and what it must do about them, from `tools` and `tool_choice`: no tools (or
 * `none`) is text only; a named function is a call of that one tool.
 */
export function toolsAsked(request: ChatRequest): { tools: ToolSchema[]; choice: ToolChoice } {
  const tools = (request.tools ?? []) as ToolSchema[];
  const choice = request.tool_choice ?? 'auto';
  if (choice === 'none') return { tools: [], choice: 'none' };
  if (tools.length === 0) {
    if (choice === 'auto') return { tools: [], choice: 'none' };
    throw new ApiError(
      400,
      'invalid_request',
      'tool_choice asks for a call, and the request has no tools',
      'tool_choice',
    );
  }
  if (typeof choice === 'string') return { tools, choice };
  const named = tools.filter((t) => t.function.name === choice.function.name);
  if (named.length === 0)
    throw new ApiError(
      400,
      'invalid_request',
      `tool_choice names ${choice.function.name}, which is not one of the request's tools`,
      'tool_choice',
    );
  return { tools: named, choice: 'required' };
}

/** A reply as the model wrote it, its values put back: text, and calls where it made any. */
interface Reply {
  content?: string | null;
  tool_calls?: Message['tool_calls'];
}

/** What names one completion in every body and event: its id, when it was made, and the version that answered. */
export interface CompletionId {
  id: string;
  created: number;
  version: string;
}

/**
 * Why a reply ended, as OpenAI's API says it: cut by max_tokens is 'length' even where its text already parses
 * as a call; after a stop token, 'tool_calls' where it made calls, else 'stop'.
 */
export function finishReason(stopped: boolean, reply: Reply): 'length' | 'tool_calls' | 'stop' {
  return !stopped ? 'length' : reply.tool_calls?.length ? 'tool_calls' : 'stop';
}

/** The assistant message of a reply. */
const assistantMessage = (reply: Reply) => ({
  role: 'assistant',
  content: reply.content ?? null,
  ...(reply.tool_calls?.length ? { tool_calls: reply.tool_calls } : {}),
});

/** A whole reply's body (`chat.completion`). */
export function completionBody(
  c: CompletionId,
  reply: Reply,
  finish: string,
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number },
) {
  return {
    id: c.id,
    object: 'chat.completion',
    created: c.created,
    model: c.version,
    system_fingerprint: c.version,
    choices: [{ index: 0, message: assistantMessage(reply), finish_reason: finish, logprobs: null }],
    usage,
  };
}

/** One server-sent event of a streamed reply (`chat.completion.chunk`). */
export const chunkEvent = (c: CompletionId, delta: Record<string, unknown>, finish: string | null = null) =>
  `data: ${JSON.stringify({ id: c.id, object: 'chat.completion.chunk', created: c.created, model: c.version, system_fingerprint: c.version, choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }] })}\n\n`;

/** What may be drawn next: `inner`'s choice (a tool constraint), and no `stop` token before `min` tokens (vLLM's min_tokens). */
export function atLeast(min: number, stop: readonly number[], inner?: TokenConstraint): TokenConstraint | undefined {
  if (min <= 0 || stop.length === 0) return inner;
  return {
    allows: (generated, candidate) =>
      !(generated.length < min && stop.includes(candidate)) && (inner?.allows(generated, candidate) ?? true),
  };
}
