// A policy behind an OpenAI-compatible endpoint (`prefab serve`, or any other): the simulator's users talk to
// a deployed model as real traffic would. Each request carries the tools (so a server that constrains calls
// to their schemas does), the conversation's id as `user` (so a server splitting traffic keeps it on one arm),
// and a seed derived from the conversation and turn (so an episode is reproducible whatever runs beside it).
// The policy's name becomes the version that answered (the response's `model`), so the sessions it logs are
// tagged with the model that acted.
import OpenAI from 'openai';
import { PipelineError } from '../pipeline/errors.ts';
import { hashJson } from '../pipeline/hash.ts';
import type { Message, Policy } from '../core/records.ts';
import { TOOLS } from './env.ts';

export interface RemoteOptions {
  baseUrl: string;
  /** The model asked for (a version, production, candidate). */
  model: string;
  apiKey: string;
  temperature: number;
  maxTokens: number;
  /** Identifies the conversation to the server (sticky A/B arms) and seeds its turns. */
  conversation: string;
}

export class RemotePolicy implements Policy {
  /** The model asked for until a response says which version answered. */
  name: string;
  private turn = 0;

  constructor(
    private readonly client: OpenAI,
    private readonly o: RemoteOptions,
  ) {
    this.name = o.model;
  }

  static client(baseUrl: string, apiKey: string): OpenAI {
    return new OpenAI({ baseURL: baseUrl, apiKey: apiKey || 'none', maxRetries: 4, timeout: 120_000 });
  }

  async respond(messages: Message[]): Promise<Message> {
    const seed = Number.parseInt(hashJson([this.o.conversation, this.turn++]).slice(0, 8), 16);
    let completion;
    try {
      completion = await this.client.chat.completions.create({
        model: this.o.model,
        messages: messages as OpenAI.Chat.ChatCompletionMessageParam[],
        tools: TOOLS as unknown as OpenAI.Chat.ChatCompletionTool[],
        temperature: this.o.temperature,
        max_tokens: this.o.maxTokens,
        user: this.o.conversation,
        seed,
      });
    } catch (error) {
      // A conversation grown past the model's context ends there, with an empty reply, as a client's would.
      if ((error as { status?: number; code?: string }).code === 'context_length_exceeded')
        return { role: 'assistant', content: '' };
      // 401 is the usual first mistake: the server's key was not in the environment.
      const hint =
        (error as { status?: number }).status === 401 ? " (is its API key in --api-key-env's variable?)" : '';
      throw new PipelineError(
        `the agent at ${this.o.baseUrl} (model ${this.o.model}) failed: ${(error as Error).message}${hint}`,
      );
    }
    this.name = completion.model;
    const m = completion.choices[0]?.message;
    if (!m) throw new PipelineError(`the agent at ${this.o.baseUrl} answered without a choice`);
    const calls = (m.tool_calls ?? []).flatMap((c) =>
      c.type === 'function'
        ? [
            {
              id: c.id,
              type: 'function' as const,
              function: { name: c.function.name, arguments: c.function.arguments },
            },
          ]
        : [],
    );
    return { role: 'assistant', content: m.content ?? null, ...(calls.length ? { tool_calls: calls } : {}) };
  }
}
