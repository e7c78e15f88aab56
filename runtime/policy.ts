// The trained model as a policy in the environment: it reads the conversation through the chat template,
// with values as placeholders and cut to its context as in training, and writes the next assistant message,
// whose placeholders are put back before the environment reads it. One KV cache is kept across
// turns and episodes: each prompt extends the last one (and all start with the same system prompt), so
// only the new messages are read, where the sampling's engine decodes (the GPU's pages, or a KVCache).
import { safePoint } from '../pipeline/interrupt.ts';
import type { Random } from '../core/random.ts';
import type { Message, Policy } from '../core/records.ts';
import type { Chat } from '../model/chat.ts';
import type { ToolCallConstraint, ToolSchema } from '../model/constrain.ts';
import type { KVCache, TokenCache } from './decode.ts';
import type { Engine } from './device.ts';
import { cachePool } from './engines.ts';
import { SharedDecoder } from './shared-decoder.ts';
import type { GpuCache } from './webgpu/decode.ts';
import type { Llama } from '../model/llama.ts';
import { modelView, type Placeholders } from '../model/placeholders.ts';
import { headLength, recentWindow } from '../model/windows.ts';

/** One assistant turn the policy played: what it read and what it wrote, as token ids (what reinforcement learning trains on). */
export interface Turn {
  prompt: number[];
  generated: number[];
  /** A feedback-guided rollout's turn: the prompt without the notes it was shown (the plain task). */
  base?: number[];
}

export interface SamplingOptions {
  /** Most tokens in one assistant message. */
  maxTokens: number;
  temperature: number;
  topP: number;
  /** Tools whose JSON schemas the model's calls are decoded under (model/constrain.ts); absent: calls are free text. */
  tools?: readonly ToolSchema[];
  /** Aborted, the next assistant message is not written (Interrupted): each one is a safe point. */
  signal?: AbortSignal;
  /** Keep every turn's tokens in `turns` (for reinforcement learning); off, nothing is kept. */
  recordTurns?: boolean;
  /** Where the tokens are decoded (runtime/placement.ts decodingEngine): the GPU, the C kernels, or the reference. */
  engine: Engine;
  /** The GPU buffers the model is being trained in (a run's, trainers/run.ts): a GPU decoder reads the weights there. */
  trained?: Map<string, GPUBuffer>;
  /** A decoder shared with policies playing side by side (on the CPU or the GPU): their tokens are decoded together. */
  shared?: SharedDecoder;
}

/** A conversation as the model reads it, with the header of its reply open, and how to put values back into the reply. */
export interface Prompt {
  ids: number[];
  restore: (reply: Message) => Message;
  /** Tokens of the messages that always stay (up to the user's request), the latest message and the reply's header: the least the prompt can be. */
  least: number;
}

/**
 * How the model reads a conversation: through the chat template, with values as placeholders (as it was
 * trained), and cut to `room` tokens as in training: the messages up to the user's request, then as many of
 * the latest as fit.
 */
export async function promptOf(
  chat: Chat,
  placeholders: Placeholders,
  room: number,
  conversation: Message[],
): Promise<Prompt> {
  const view = modelView(conversation, placeholders);
  const [encoded] = await chat.encode([view.messages], true);
  const e = encoded!;
  const head = headLength(view.messages);
  const n = view.messages.length;
  const least = e.starts[head]! + (n > head ? e.starts[n]! - e.starts[n - 1]! : 0) + (e.ids.length - e.starts[n]!);
  return { ids: recentWindow(e, head, n, room).ids, restore: view.restore, least };
}

/** A model as a policy: what it is, how it reads, and how it samples. */
export interface PolicyOptions {
  name: string;
  model: Llama;
  /** The sequence length it was trained at: prompts are cut to leave room for a reply within it. */
  context: number;
  chat: Chat;
  /** How the model was trained to read values (the checkpoint's `placeholders`). */
  placeholders: Placeholders;
  sampling: SamplingOptions;
}

export class ModelPolicy implements Policy {
  readonly name: string;
  private readonly cache: TokenCache;
  /** Its own decoder's caches where it plays alone (freed with it); null where it shares one. */
  private readonly own: ReturnType<typeof cachePool> | null = null;
  private readonly context: number;
  private readonly chat: Chat;
  private readonly placeholders: Placeholders;
  private readonly sampling: SamplingOptions;
  private calls = 0;
  private constraint: Promise<ToolCallConstraint | null> | undefined;
  /** Tokens read and written, for throughput figures. */
  generated = 0;
  /** With `recordTurns`, every turn so far as the tokens read and the tokens written (what reinforcement learning trains on); the caller clears it between episodes. */
  readonly turns: Turn[] = [];
  /**
   * Feedback-guided rollouts: what the policy reads in place of the conversation (it with notes from earlier
   * attempts, env/feedback.ts), set per episode. The recorded turns then keep the plain conversation's prompt
   * too (`base`), for training on it.
   */
  reads: ((conversation: Message[]) => Message[]) | null = null;

  constructor(
    o: PolicyOptions,
    /** The sampler's randomness: set a fresh seeded stream per episode for reproducible episodes. */
    public random: Random,
  ) {
    ({ name: this.name, context: this.context, chat: this.chat, placeholders: this.placeholders } = o);
    this.sampling = o.sampling;
    // Shared: the players' decoder (theirs to free); alone: its own, where the sampling's engine decodes.
    if (o.sampling.shared) this.cache = o.sampling.shared.cache();
    else {
      this.own = cachePool(o.sampling.engine, o.model, o.sampling.trained);
      this.cache = this.own.create();
    }
  }

  /** Frees what the policy holds (its pages on the GPU): call when its episodes are over. */
  dispose(): void {
    if (this.sampling.shared) this.sampling.shared.free(this.cache);
    else {
      this.own!.free(this.cache);
      this.own!.dispose();
    }
  }

  async respond(conversation: Message[]): Promise<Message> {
    if (this.sampling.signal)
      await safePoint(
        this.sampling.signal,
        () =>
          `${this.name} in the simulator: stopped after ${this.generated} generated tokens; the next run evaluates again`,
      );
    const read = (shown: Message[]) =>
      promptOf(this.chat, this.placeholders, this.context - this.sampling.maxTokens, shown);
    const { ids: prompt, restore } = await read(this.reads ? this.reads(conversation) : conversation);
    if (this.sampling.tools) this.constraint ??= this.chat.toolConstraint(this.sampling.tools);
    const constraint = (await this.constraint) ?? undefined;
    const options = { ...this.sampling, stop: this.chat.stop, random: this.random, constraint };
    const ids = this.sampling.shared
      ? await this.sampling.shared.generate(this.cache, prompt, options)
      : await (this.cache as KVCache | GpuCache).generate(prompt, options);
    this.generated += ids.length;
    if (this.sampling.recordTurns)
      this.turns.push({ prompt, generated: ids, ...(this.reads ? { base: (await read(conversation)).ids } : {}) });
    const reply = restore(await this.chat.parseAssistant(ids, this.calls + 1));
    this.calls += reply.tool_calls?.length ?? 0;
    return reply;
  }
}

/**
 * Policies for episodes played side by side: each episode gets a ModelPolicy of its own over one SharedDecoder
 * (on the GPU: one upload of the weights for them all), so their tokens are decoded together. Free them with
 * `dispose` once the episodes are over.
 */
export class EpisodePlayers {
  private readonly shared: SharedDecoder;
  private readonly made: ModelPolicy[] = [];

  constructor(private readonly o: PolicyOptions) {
    this.shared = new SharedDecoder(o.model, cachePool(o.sampling.engine, o.model, o.sampling.trained));
  }

  /** The policy for one episode, drawing from `random`. */
  player(random: Random): ModelPolicy {
    const policy = new ModelPolicy({ ...this.o, sampling: { ...this.o.sampling, shared: this.shared } }, random);
    this.made.push(policy);
    return policy;
  }

  /** Tokens the players generated. */
  get generated(): number {
    return this.made.reduce((n, p) => n + p.generated, 0);
  }

  dispose(): void {
    for (const p of this.made) p.dispose();
    this.shared.dispose();
  }
}
