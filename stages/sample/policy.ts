// A model behind an OpenAI-compatible endpoint as a policy: it acts in the environment through the same
// loop as the scripted agents. Masked values in its replies are put back before the environment sees them.
import { RequestFailed, type ChatEndpoint, type ChatRequest } from '../../judges/endpoint.ts';
import type { Message, Policy } from '../../core/records.ts';
import { mapMessageText } from '../../core/redact.ts';

/** Bumped when what the sampler sends changes meaning: part of every sample's cache key. */
const SAMPLER_VERSION = '1';

/** The budget ran out in the middle of a candidate: it is left out, not written half-done. */
export class BudgetSpent extends Error {
  override name = 'BudgetSpent';
}

export interface SamplingOptions {
  temperature: number;
  maxTokens: number;
  /** Which of a task's candidates this is: part of the cache key, and the request's seed. */
  index: number;
  tools?: readonly unknown[];
}

/** One sampled assistant message for `messages`. */
export async function sampleMessage(
  endpoint: ChatEndpoint,
  messages: Message[],
  options: SamplingOptions,
): Promise<Message> {
  const request: ChatRequest = {
    messages,
    temperature: options.temperature,
    max_tokens: options.maxTokens,
    seed: options.index,
    ...(options.tools ? { tools: options.tools } : {}),
  };
  const answer = await endpoint.complete(request, {
    purpose: 'sample',
    version: SAMPLER_VERSION,
    index: options.index,
  });
  if (answer.reply === null) throw new BudgetSpent('the request budget is spent');
  const { reply, restore } = answer;
  if (reply.content === null && !reply.tool_calls)
    throw new RequestFailed('the reply has neither content nor tool calls');
  return mapMessageText(
    { role: 'assistant', content: reply.content, ...(reply.tool_calls ? { tool_calls: reply.tool_calls } : {}) },
    restore,
  );
}

export class EndpointPolicy implements Policy {
  readonly name: string;
  constructor(
    private readonly endpoint: ChatEndpoint,
    private readonly options: SamplingOptions,
  ) {
    this.name = endpoint.model;
  }

  respond(messages: Message[]): Promise<Message> {
    return sampleMessage(this.endpoint, messages, this.options);
  }
}
