// The trained model as a policy in the environment: it reads the conversation through the chat template,
// with values as placeholders and cut to its context as in training, and writes the next assistant message,
// whose placeholders are put back before the environment reads it. One KV cache is kept across
// turns and episodes: each prompt extends the last one (and all start with the same system prompt), so
// only the new messages are read. With `--backend webgpu` the cache and the model's steps are on the GPU.
import { safePoint } from '../pipeline/interrupt.ts';
import type { Random } from '../core/random.ts';
import type { Message, Policy } from '../core/records.ts';
import type { Chat } from '../model/chat.ts';
import type { ToolCallConstraint, ToolSchema } from '../model/constrain.ts';
import { KVCache, type TokenCache } from './decode.ts';
import { SharedDecoder } from './shared-decoder.ts';
import { GpuCache, GpuDecoder } from './webgpu/decode.ts';
import type { Kernels } from './webgpu/kernel.ts';
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
  /** `--backend webgpu`'s kernels: generate on the GPU (runtime/webgpu/decode.ts); absent, on the CPU. */
  gpu?: Kernels;
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

export class ModelPolicy implements Policy {
  private readonly cache: TokenCache;
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
    readonly name: string,
    model: Llama,
    /** The sequence length it was trained at: prompts are cut to leave room for a reply within it. */
    private readonly context: number,
    private readonly chat: Chat,
    /** How the model was trained to read values (the checkpoint's `placeholders`). */
    private readonly placeholders: Placeholders,
    private readonly sampling: SamplingOptions,
    /** The sampler's randomness: set a fresh seeded stream per episode for reproducible episodes. */
    public random: Random,
  ) {
    // Shared: the players' decoder (theirs to free); alone: its own, on the GPU or the CPU.
    this.cache =
      sampling.shared?.cache() ?? (sampling.gpu ? new GpuDecoder(model, sampling.gpu).create() : new KVCache(model));
  }

  /** Frees what the policy holds on the GPU (nothing on the CPU): call when its episodes are over. */
  dispose(): void {
    if (this.sampling.shared) this.sampling.shared.free(this.cache);
    else if (this.cache instanceof GpuCache) {
      this.cache.dispose();
      this.cache.decoder.dispose();
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
 * (on the GPU with `sampling.gpu`: one upload of the weights for them all), so their tokens are decoded
 * together. Free them with `dispose` once the episodes are over.
 */
export class EpisodePlayers {
  private readonly shared: SharedDecoder;
  private readonly made: ModelPolicy[] = [];

  constructor(
    private readonly name: string,
    private readonly model: Llama,
    private readonly context: number,
    private readonly chat: Chat,
    private readonly placeholders: Placeholders,
    private readonly sampling: SamplingOptions,
  ) {
    this.shared = new SharedDecoder(model, sampling.gpu ? new GpuDecoder(model, sampling.gpu) : undefined);
  }

  /** The policy for one episode, drawing from `random`. */
  player(random: Random): ModelPolicy {
    const sampling = { ...this.sampling, shared: this.shared };
    const policy = new ModelPolicy(this.name, this.model, this.context, this.chat, this.placeholders, sampling, random);
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
