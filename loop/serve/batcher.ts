// A registry version served: its model loaded, requests waiting in a queue, and up to max_batch of them decoded
// step by step together (one pass through the model per decoding step for all of them, new requests' prompts
// read in the same pass), each finished request's cache kept for the conversation's next turn, which then reads
// only its new messages. The catalog maps the names a request may use (version ids, production, candidate)
// to what is served, and follows the registry's aliases.
import { join } from 'node:path';
import type { Logger } from '../../pipeline/log.ts';
import { PipelineError } from '../../pipeline/errors.ts';
import { openChat, type Chat } from '../../model/chat.ts';
import { loadCheckpoint } from '../../model/checkpoint.ts';
import type { TokenConstraint, ToolCallConstraint, ToolChoice, ToolSchema } from '../../model/constrain.ts';
import type { Llama } from '../../model/llama.ts';
import type { Placeholders } from '../../model/placeholders.ts';
import { Decoding, readDecodings, type CachePool, type TokenCache } from '../../runtime/decode.ts';
import { mainEngine, type Device } from '../../runtime/device.ts';
import { cachePool } from '../../runtime/engines.ts';
import { decodingEngine } from '../../runtime/placement.ts';
import type { Registry } from '../registry.ts';
import type { ServeSettings } from '../settings.ts';
import { ApiError } from './protocol.ts';

interface Job {
  decoding: Decoding<TokenCache> | null;
  prompt: number[];
  sampling: {
    maxTokens: number;
    temperature: number;
    topP: number;
    random: () => number;
    constraint?: TokenConstraint;
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
export type ServedSettings = Pick<ServeSettings, 'maxBatch' | 'maxQueue'> & { device: Device; log: Logger };

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
  constraint(tools: readonly ToolSchema[], choice: ToolChoice = 'auto'): Promise<ToolCallConstraint | null> {
    const key = JSON.stringify([choice, tools]);
    let c = this.constraints.get(key);
    if (c)
      this.constraints.delete(key); // to the most recent end
    else {
      c = this.chat.toolConstraint(tools, choice);
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
      throw new PipelineError(
        `the registry in ${registry.dir} has no ${name}: \`prefab models list\` shows what it has`,
      );
    registry.version(id);
    const damage = registry.damage(id);
    if (damage) throw new PipelineError(`${id} (${name}) is damaged: ${damage}; it is not served`);
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
  const refused: string[] = [];
  for (const alias of ['production', 'candidate'] as const) {
    const served = catalog.get(alias);
    const id = aliases[alias];
    if (!served || !id || served.version === id) continue;
    // A version damaged since it was registered is not loaded: the alias stays where it was (the caller
    // warns); the other alias still moves.
    const damage = catalog.has(id) ? null : registry.damage(id);
    if (damage) {
      refused.push(`${alias} moved to ${id}, which is damaged (${damage}): still serving ${served.version}`);
      continue;
    }
    const next = catalog.get(id) ?? new ServedModel(id, join(registry.folder(id), 'model'), settings);
    catalog.set(alias, next);
    catalog.set(id, next);
    moves.push(`${alias}: ${served.version} → ${id}`);
  }
  if (refused.length) throw new Error(`${refused.join('; ')}${moves.length ? ` (moved: ${moves.join(', ')})` : ''}`);
  return moves;
}
