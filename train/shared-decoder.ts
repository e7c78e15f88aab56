// Many episodes' generations stepped together on the CPU. Episodes played side by side (DAPO's groups, the
// validation tasks) each ask for a continuation; one loop reads every live sequence's next token, and any
// prompt just asked for, in one pass through the model (KVCache.readMany: a matMul per projection for all
// rows), as the server steps its requests in flight. A sequence alone is read as KVCache.generate reads it.
import { DecodeWeights, Decoding, KVCache, type GenerateOptions } from './decode.ts';
import { cpuKernels } from './backend.ts';
import type { Llama } from './model.ts';
import type { NativeKernels } from './ort/native.ts';

interface Job {
  cache: KVCache;
  decoding: Decoding;
  resolve: (ids: number[]) => void;
  reject: (error: unknown) => void;
}

export class SharedDecoder {
  private readonly weights: DecodeWeights;
  /** Asked for since the last step: their prompts are read in the next one. */
  private asked: {
    cache: KVCache;
    prompt: number[];
    options: GenerateOptions;
    job: Omit<Job, 'cache' | 'decoding'>;
  }[] = [];
  /** Sequences whose logits are set: each draws its next token at the next step. */
  private live: Job[] = [];
  private running = false;

  /**
   * Over the model's weights as they are now (copied: training the model on changes nothing here); `native`:
   * the CPU path's C kernels, as DecodeWeights takes them (by default where the backend in use has them).
   */
  constructor(
    readonly model: Llama,
    native?: NativeKernels | null,
  ) {
    this.weights = new DecodeWeights(model, native === undefined ? cpuKernels() : native);
  }

  /** A cache of the shared weights, for one sequence at a time (a policy's, kept across its turns). */
  cache(): KVCache {
    return new KVCache(this.model, this.weights);
  }

  /** What KVCache.generate(prompt, options) gives on `cache`, decoded together with the other sequences asked for meanwhile. */
  generate(cache: KVCache, prompt: number[], options: GenerateOptions): Promise<number[]> {
    return new Promise((resolve, reject) => {
      this.asked.push({ cache, prompt, options, job: { resolve, reject } });
      if (!this.running) {
        this.running = true;
        void this.run();
      }
    });
  }

  dispose(): void {
    this.weights.dispose();
  }

  private async run(): Promise<void> {
    try {
      while (this.asked.length > 0 || this.live.length > 0) {
        // The other episodes reach their next generation before the step: they join it.
        await new Promise((resolve) => setImmediate(resolve));
        this.step();
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
  private step(): void {
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
    const logits = KVCache.readMany(
      reading.map((j) => j.cache),
      reads,
    );
    reading.forEach((job, i) => (job.decoding.logits = logits[i]!));
  }
}
