// Generation with a KV cache on the GPU: runtime/decode.ts's KVCache and its batched read, with the rows of a
// step (one token a sequence while decoding, a prompt's new tokens when a sequence starts) going through
// the model in one command buffer, and only the next-token logits of each sequence's last row read back.
// The keys and values are paged: a layer's pool holds pages of PAGE positions, a sequence lists the pages it
// holds (the same in every layer), and a step's rows of every sequence store their keys and attend in one
// dispatch a layer (vLLM's PagedAttention, without sharing pages between sequences). Tested against KVCache:
// test/runtime/webgpu/decode.test.ts.
//
// Shapes as in model/llama.ts: R rows in a step, D hidden, H query and K key/value heads of hd, F the MLP's
// width, V the vocabulary. A layer's pool holds (pages, keys | values, PAGE, K·hd) f32s.
/// <reference types="@webgpu/types" />
import {
  DecodeWeights,
  Decoding,
  readDecodings,
  type CachePool,
  type Drawn,
  type GenerateOptions,
  type TokenCache,
} from '../decode.ts';
import type { Draw } from '../sampling.ts';
import type { Llama } from '../../model/llama.ts';
import { allocate, download, submit, upload } from './buffers.ts';
import { RopeTables } from './elementwise.ts';
import type { GpuKernels } from './kernel.ts';
import { llamaKernels } from './llama.ts';
import { Sampler, drawParams } from './sampling.ts';

/** Positions a page of keys and values holds. */
const PAGE = 16;

/** The most tokens one pass of a decoding step reads (prompts just taken in are split between passes). */
const STEP_ROWS = 512;

/** One sequence's tokens read so far, and the pages that hold their keys and values, on the GPU. */
export class GpuCache {
  readonly tokens: number[] = [];
  /** Its pages in the decoder's pools, in order: position t is in pages[t / PAGE]. */
  readonly pages: number[] = [];

  constructor(readonly decoder: GpuDecoder) {}

  /** Positions its pages have room for. */
  get capacity(): number {
    return this.pages.length * PAGE;
  }

  get model(): Llama {
    return this.decoder.model;
  }

  /** Forgets all but the first n tokens. */
  truncate(n: number): void {
    if (n < this.tokens.length) this.tokens.length = n;
  }

  /** Samples a continuation of `prompt` as KVCache.generate does, reusing the longest prefix read before. */
  async generate(prompt: number[], options: GenerateOptions): Promise<number[]> {
    const d = new Decoding(this, prompt, options, false);
    if (d.finished) return d.out;
    await readDecodings(this.decoder, [d], [d.unread.splice(0)]);
    for (;;) {
      const next = d.next();
      if (next === null || d.finished) return d.out;
      await readDecodings(this.decoder, [d], [[next]]);
    }
  }

  /** Gives its pages back to the decoder. */
  dispose(): void {
    this.decoder.release(this);
  }
}

/**
 * The model's weights on the GPU as they were when it was made (adapters folded in, as DecodeWeights does), or
 * the buffers it is being trained in (`trained`: a run's, trainers/run.ts), and the caches' steps.
 */
export class GpuDecoder implements CachePool {
  private readonly weights: Map<string, GPUBuffer>;
  /** Whether the weights are the trainer's (not the decoder's to free). */
  private readonly borrowed: boolean;
  /** A pool of pages a layer, each layer's page p for the same positions of the same cache. */
  private pools: GPUBuffer[] = [];
  /** Pages no cache holds. */
  private readonly spare: number[] = [];
  private readonly activations = new Map<string, { buffer: GPUBuffer; length: number }>();
  private readonly rope: RopeTables;
  private readonly ops: ReturnType<typeof llamaKernels>;
  private readonly sampler: Sampler;

  /**
   * `trained`: the GPU buffers `model` is being trained in (a run's, without LoRA): the decoder reads the
   * weights there, as they are at each step, rather than an upload of the tfjs model's (which the run copies
   * back only for checkpoints).
   */
  constructor(
    readonly model: Llama,
    private readonly k: GpuKernels,
    trained?: Map<string, GPUBuffer>,
  ) {
    this.borrowed = trained !== undefined;
    this.weights =
      trained ?? new Map([...new DecodeWeights(model, null).w].map(([name, data]) => [name, upload(k.gpu, data)]));
    this.ops = llamaKernels(k);
    this.sampler = new Sampler(k);
    this.rope = new RopeTables(k.gpu, model.config);
  }

  /** A new, empty cache over these weights. */
  create(): GpuCache {
    return new GpuCache(this);
  }

  /** A new cache holding the first n tokens of `source`: their pages' keys and values copied, layer by layer. */
  fork(source: TokenCache, n: number): GpuCache {
    const from = source as GpuCache;
    const fork = this.create();
    const count = Math.min(n, from.tokens.length);
    this.reserve(fork, count);
    const pages = Math.ceil(count / PAGE);
    if (pages > 0) {
      // A buffer cannot be copied into itself: through a staging buffer, a page at a time.
      const bytes = this.pageFloats * 4;
      const staging = allocate(this.k.gpu, pages * this.pageFloats * 4);
      const encoder = this.k.gpu.device.createCommandEncoder();
      for (const pool of this.pools) {
        for (let i = 0; i < pages; i++)
          encoder.copyBufferToBuffer(pool, from.pages[i]! * bytes, staging, i * bytes, bytes);
        for (let i = 0; i < pages; i++)
          encoder.copyBufferToBuffer(staging, i * bytes, pool, fork.pages[i]! * bytes, bytes);
      }
      this.k.gpu.device.queue.submit([encoder.finish()]);
      staging.destroy();
    }
    fork.tokens.push(...from.tokens.slice(0, count));
    return fork;
  }

  /** Frees a cache's pages. */
  free(cache: TokenCache): void {
    (cache as GpuCache).dispose();
  }

  /** Takes a cache's pages back, for other caches (once the pools are freed, there is nothing to take back). */
  release(cache: GpuCache): void {
    const pages = cache.pages.splice(0);
    if (this.pools.length) this.spare.push(...pages);
    cache.tokens.length = 0;
  }

  /** Pages in each layer's pool, held or spare. */
  get pooled(): number {
    return this.pools.length ? this.pools[0]!.size / 4 / this.pageFloats : 0;
  }

  /** A page's f32s in a layer's pool: its keys, then its values, PAGE positions of K·hd each. */
  private get pageFloats(): number {
    const c = this.model.config;
    return 2 * PAGE * c.kvHeads * c.headDim;
  }

  private act(name: string, length: number): GPUBuffer {
    const held = this.activations.get(name);
    if (held && held.length >= length) return held.buffer;
    held?.buffer.destroy();
    const grown = Math.max(length, 2 * (held?.length ?? 0));
    const buffer = allocate(this.k.gpu, grown * 4);
    this.activations.set(name, { buffer, length: grown });
    return buffer;
  }

  /** Pages in `cache` for n positions: spare ones, or the pools grown (doubled, the pages held copied over). */
  private reserve(cache: GpuCache, n: number): void {
    const max = this.model.config.maxPositions;
    if (n > max) throw new Error(`${n} tokens do not fit in the model's ${max} positions (max_position_embeddings)`);
    const wanted = Math.ceil(n / PAGE) - cache.pages.length;
    if (wanted <= 0) return;
    if (this.spare.length < wanted) {
      // Doubled, but never past what one binding holds: a layer's pool is one binding of the attention.
      const most = Math.floor(this.k.bindingBytes / (this.pageFloats * 4));
      const needed = this.pooled + wanted - this.spare.length;
      if (needed > most)
        throw new Error(
          `webgpu: the decoder's keys and values would take ${needed} pages of ${PAGE} positions a layer, more than one binding holds (${most}): decode fewer or shorter sequences together`,
        );
      const [was, now] = [this.pooled, Math.min(most, Math.max(2 * this.pooled, needed, 16))];
      const [encoder, old] = [this.k.gpu.device.createCommandEncoder(), this.pools];
      this.pools = [];
      for (let l = 0; l < this.model.config.layers; l++) {
        const pool = allocate(this.k.gpu, now * this.pageFloats * 4);
        if (old[l]) encoder.copyBufferToBuffer(old[l]!, 0, pool, 0, old[l]!.size);
        this.pools.push(pool);
      }
      this.k.gpu.device.queue.submit([encoder.finish()]);
      for (const buffer of old) buffer.destroy(); // freed once the copies are done
      for (let p = now - 1; p >= was; p--) this.spare.push(p);
    }
    cache.pages.push(...this.spare.splice(this.spare.length - wanted));
  }

  /**
   * Reads `reads[b]` into caches[b] (KVCache.readMany's step) and returns each cache's next-token logits, read
   * back whole (B × V f32s): readAndDraw reads back a token a cache instead.
   */
  async readMany(all: TokenCache[], reads: number[][]): Promise<Float32Array[]> {
    const V = this.model.config.vocabSize;
    const logits: Float32Array[] = new Array(all.length);
    for (const { which, buffer } of this.passes(all, reads, null)) {
      const got = await download(this.k.gpu, buffer, which.length * V);
      which.forEach((b, i) => (logits[b] = got.slice(i * V, (i + 1) * V)));
    }
    return logits;
  }

  /** Reads as readMany, and draws each cache's next token on the GPU with draws[b] (sampling.ts): a token a cache comes back. */
  async readAndDraw(all: TokenCache[], reads: number[][], draws: Draw[]): Promise<Drawn> {
    const V = this.model.config.vocabSize;
    const tokens: number[] = new Array(all.length);
    const rows: { buffer: GPUBuffer; row: number }[] = new Array(all.length);
    for (const { which, buffer } of this.passes(all, reads, draws)) {
      const got = new Uint32Array((await download(this.k.gpu, this.act('tokens', which.length), which.length)).buffer);
      which.forEach((b, i) => {
        tokens[b] = got[i]!;
        rows[b] = { buffer, row: i };
      });
    }
    const read = this.reads;
    return {
      tokens,
      logits: (b) => {
        if (this.reads !== read) throw new Error('GpuDecoder: logits asked for after the next read');
        return download(this.k.gpu, rows[b]!.buffer, V, rows[b]!.row * V);
      },
    };
  }

  /** Reads and draws so far: a readAndDraw's logits are there until the next. */
  private reads = 0;

  /**
   * The passes of a read, in order, each submitted as it is taken: at most STEP_ROWS tokens a pass (a
   * sequence's prompt split between passes where it must), since the scratch of a pass, and its workgroups,
   * grow with its rows. Each pass's caches (their indices in `all`) and the buffer of their logits, one a
   * pass (a readAndDraw's logits stay there for its rows to be read back).
   */
  private *passes(
    all: TokenCache[],
    reads: number[][],
    draws: Draw[] | null,
  ): Generator<{ which: number[]; buffer: GPUBuffer }> {
    const caches = all as GpuCache[];
    if (caches.some((cache) => !(cache instanceof GpuCache) || cache.decoder !== this))
      throw new Error('GpuDecoder.readMany: a cache of another decoder');
    if (reads.some((r) => r.length === 0)) throw new Error('GpuDecoder.readMany: no tokens to read');
    this.reads++;
    // A read's logits past its first pass are kept for that read alone (its rows' logits(b)).
    for (const [name, held] of this.activations)
      if (/^logits [1-9]/.test(name)) {
        held.buffer.destroy();
        this.activations.delete(name);
      }
    const left = reads.map((r) => [...r]);
    for (let n = 0; left.some((r) => r.length > 0); n++) {
      let room = STEP_ROWS;
      const which: number[] = [];
      const part: number[][] = [];
      left.forEach((r, b) => {
        if (r.length === 0 || room === 0) return;
        part.push(r.splice(0, room));
        room -= part.at(-1)!.length;
        which.push(b);
      });
      const logits = draws ? `logits ${n}` : 'logits';
      this.pass(
        which.map((b) => caches[b]!),
        part,
        logits,
        draws && which.map((b) => draws[b]!),
      );
      yield { which, buffer: this.act(logits, which.length * this.model.config.vocabSize) };
    }
  }

  /**
   * One pass, submitted: every token of `reads` is a row through each projection, each sequence's rows attend
   * to its own pages up to their positions, and only each sequence's last row goes through the head, its
   * logits to the buffer `logits`; with `draws`, each sequence's next token drawn from them into `tokens`.
   */
  private pass(caches: GpuCache[], reads: number[][], logits: string, draws: Draw[] | null): void {
    const c = this.model.config;
    const [D, H, K, hd, F, V] = [c.hiddenSize, c.heads, c.kvHeads, c.headDim, c.intermediateSize, c.vocabSize];
    const gpu = this.k.gpu;
    caches.forEach((cache, b) => this.reserve(cache, cache.tokens.length + reads[b]!.length));
    // Sequence b's rows start at r0[b]; row r reads ids[r] at positions[r], its sequence's pages listed in
    // `pages` from list[r] on.
    const r0: number[] = [];
    const ids: number[] = [];
    const positions: number[] = [];
    const list: number[] = [];
    const pages: number[] = [];
    caches.forEach((cache, b) => {
      r0.push(ids.length);
      reads[b]!.forEach((token, i) => {
        ids.push(token);
        positions.push(cache.tokens.length + i);
        list.push(pages.length);
      });
      pages.push(...cache.pages);
    });
    const R = ids.length;
    const B = caches.length;
    const { cos, sin } = this.rope.get(Math.max(...positions) + 1);
    const a = (name: string, length: number) => this.act(name, length);
    const w = (name: string) => this.weights.get(name)!;
    const write = (name: string, data: Int32Array | Uint32Array) => {
      const buffer = a(name, data.length);
      gpu.device.queue.writeBuffer(buffer, 0, data);
      return buffer;
    };
    const idsBuffer = write('ids', Int32Array.from(ids));
    const positionsBuffer = write('positions', Uint32Array.from(positions));
    let drawing: GPUBuffer | null = null;
    if (draws) drawing = write('draws', new Uint32Array(drawParams(draws).buffer));
    const paged = {
      positions: positionsBuffer,
      list: write('list', Uint32Array.from(list)),
      pages: write('pages', Uint32Array.from(pages)),
    };
    const project = (
      pass: GPUComputePassEncoder,
      x: GPUBuffer,
      name: string,
      y: GPUBuffer,
      rows: number,
      out: number,
      inner: number,
    ) => this.ops.mm.encode(pass, x, w(name), y, { m: rows, n: out, k: inner, transposeB: true });
    const rows = { rows: R, dim: D, eps: c.rmsNormEps };
    // The attention's scores: a row for each (row, head), as long as the longest row's positions.
    const longest = Math.max(...positions) + 1;
    const shape = { rows: R, heads: H, kvHeads: K, headDim: hd, page: PAGE, longest };
    submit(gpu, (pass) => {
      // The residual stream goes back and forth between x and y (a kernel may not read and write one buffer).
      let [x, y] = [a('x', R * D), a('y', R * D)];
      this.ops.embedding.forward(pass, w('model.embed_tokens.weight'), idsBuffer, x, R, D);
      for (let l = 0; l < c.layers; l++) {
        const p = `model.layers.${l}.`;
        this.ops.norm.forward(pass, x, w(`${p}input_layernorm.weight`), a('h', R * D), a('rstd', R), rows);
        project(pass, a('h', R * D), `${p}self_attn.q_proj.weight`, a('q', R * H * hd), R, H * hd, D);
        project(pass, a('h', R * D), `${p}self_attn.k_proj.weight`, a('k', R * K * hd), R, K * hd, D);
        project(pass, a('h', R * D), `${p}self_attn.v_proj.weight`, a('v', R * K * hd), R, K * hd, D);
        if (c.attentionBias) {
          this.ops.bias.forward(pass, w(`${p}self_attn.q_proj.bias`), a('q', R * H * hd), R, H * hd);
          this.ops.bias.forward(pass, w(`${p}self_attn.k_proj.bias`), a('k', R * K * hd), R, K * hd);
          this.ops.bias.forward(pass, w(`${p}self_attn.v_proj.bias`), a('v', R * K * hd), R, K * hd);
        }
        this.ops.rope.at(pass, a('q', R * H * hd), cos, sin, positionsBuffer, a('qr', R * H * hd), {
          rows: R,
          heads: H,
          headDim: hd,
        });
        this.ops.rope.at(pass, a('k', R * K * hd), cos, sin, positionsBuffer, a('kr', R * K * hd), {
          rows: R,
          heads: K,
          headDim: hd,
        });
        this.ops.attention.store(pass, a('kr', R * K * hd), a('v', R * K * hd), this.pools[l]!, paged, shape);
        this.ops.attention.decode(
          pass,
          a('qr', R * H * hd),
          this.pools[l]!,
          paged,
          a('scores', R * H * longest),
          a('att', R * H * hd),
          shape,
        );
        project(pass, a('att', R * H * hd), `${p}self_attn.o_proj.weight`, a('o', R * D), R, D, H * hd);
        this.ops.add.encode(pass, x, a('o', R * D), y, R * D);
        [x, y] = [y, x];
        this.ops.norm.forward(pass, x, w(`${p}post_attention_layernorm.weight`), a('h', R * D), a('rstd', R), rows);
        project(pass, a('h', R * D), `${p}mlp.gate_proj.weight`, a('g', R * F), R, F, D);
        project(pass, a('h', R * D), `${p}mlp.up_proj.weight`, a('u', R * F), R, F, D);
        this.ops.swiglu.forward(pass, a('g', R * F), a('u', R * F), a('m', R * F), R * F);
        project(pass, a('m', R * F), `${p}mlp.down_proj.weight`, a('o', R * D), R, D, F);
        this.ops.add.encode(pass, x, a('o', R * D), y, R * D);
        [x, y] = [y, x];
      }
      // Each sequence's last row, normed, through the head.
      caches.forEach((_, b) =>
        this.ops.copy.encode(pass, x, (r0[b]! + reads[b]!.length - 1) * D, a('last', B * D), b * D, D),
      );
      this.ops.norm.forward(pass, a('last', B * D), w('model.norm.weight'), a('lastNormed', B * D), a('rstd', R), {
        ...rows,
        rows: B,
      });
      project(
        pass,
        a('lastNormed', B * D),
        c.tiedEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight',
        a(logits, B * V),
        B,
        V,
        D,
      );
      if (drawing) this.sampler.encode(pass, a(logits, B * V), drawing, a('tokens', B), B, V);
    });
    this.k.release();
    caches.forEach((cache, b) => cache.tokens.push(...reads[b]!));
  }

  /** Frees the weights, the pools of keys and values, and the step's buffers. */
  dispose(): void {
    for (const buffer of [
      ...(this.borrowed ? [] : this.weights.values()),
      ...this.pools,
      ...[...this.activations.values()].map((x) => x.buffer),
    ])
      buffer.destroy();
    this.pools = [];
    this.spare.length = 0;
    this.rope.dispose();
    if (!this.borrowed) this.weights.clear();
    this.activations.clear();
  }
}
