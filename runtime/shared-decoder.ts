// Many episodes' generations stepped together. Episodes played side by side (DAPO's groups, the validation
// tasks, eval's episodes) each ask for a continuation; one loop reads every live sequence's next token, and
// any prompt just asked for, in one pass through the model (a CachePool's readMany: on the CPU a matMul per
// projection for all rows, on the GPU a dispatch a kernel and layer; with the C kernels or on the GPU the
// tokens drawn there too, readAndDraw), as the server steps its requests in flight. On the CPU a sequence
// alone is read as KVCache.generate reads it.
import { Decoding, readDecodings, type CachePool, type GenerateOptions, type TokenCache } from './decode.ts';
import type { Llama } from '../model/llama.ts';

interface Job {
  cache: TokenCache;
  decoding: Decoding<TokenCache>;
  resolve: (ids: number[]) => void;
  reject: (error: unknown) => void;
}

export class SharedDecoder {
  /** Asked for since the last step: their prompts are read in the next one. */
  private asked: {
    cache: TokenCache;
    prompt: number[];
    options: GenerateOptions;
    job: Omit<Job, 'cache' | 'decoding'>;
  }[] = [];
  /** Sequences whose logits are set: each draws its next token at the next step. */
  private live: Job[] = [];
  private running = false;

  /**
   * Over a pool of caches (runtime/engines.ts cachePool): the CPU's (cpuCaches: the model's weights as they are
   * now, copied, so training the model on changes nothing here), or the GPU's (runtime/webgpu/decode.ts GpuDecoder).
   */
  constructor(
    readonly model: Llama,
    readonly pool: CachePool,
  ) {}

  /** A cache of the shared weights, for one sequence at a time (a policy's, kept across its turns). */
  cache(): TokenCache {
    return this.pool.create();
  }

  /** Frees a cache made by cache(). */
  free(cache: TokenCache): void {
    this.pool.free(cache);
  }

  /** The continuation of `prompt` on `cache` (as KVCache.generate gives it), decoded together with the other sequences asked for meanwhile. */
  generate(cache: TokenCache, prompt: number[], options: GenerateOptions): Promise<number[]> {
    return new Promise((resolve, reject) => {
      this.asked.push({ cache, prompt, options, job: { resolve, reject } });
      if (!this.running) {
        this.running = true;
        void this.run();
      }
    });
  }

  dispose(): void {
    this.pool.dispose();
  }

  private async run(): Promise<void> {
    try {
      while (this.asked.length > 0 || this.live.length > 0) {
        // The other episodes reach their next generation before the step: they join it.
        await new Promise((resolve) => setImmediate(resolve));
        await this.step();
      }
    } catch (error) {
      for (const job of [...this.live, ...this.asked.map((a) => a.job)]) job.reject(error);
      this.live = [];
      this.asked = [];
    } finally {
      this.running = false;
    }
  }

  /** One pass: every live sequence draws a token, those not finished read it, new ones read their prompts. */
  private async step(): Promise<void> {
    const reading: Job[] = [];
    const reads: number[][] = [];
    for (const job of this.live) {
      const next = job.decoding.next();
      if (next === null || job.decoding.finished) job.resolve(job.decoding.out);
      else {
        reading.push(job);
        reads.push([next]);
      }
    }
    for (const { cache, prompt, options, job } of this.asked.splice(0)) {
      const decoding = new Decoding(cache, prompt, options, false);
      if (decoding.finished) job.resolve(decoding.out);
      else {
        reading.push({ ...job, cache, decoding });
        reads.push(decoding.unread.splice(0));
      }
    }
    this.live = reading;
    if (reading.length === 0) return;
    await readDecodings(
      this.pool,
      reading.map((j) => j.decoding),
      reads,
    );
  }
}
