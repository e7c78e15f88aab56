// Generation with a KV cache on the GPU: train/decode.ts's KVCache and its batched read, with the rows of a
// step (one token a sequence while decoding, a prompt's new tokens when a sequence starts) going through
// the model in one command buffer, every sequence's keys and values kept in a GPU buffer of its own, and
// only the next-token logits of each sequence's last row read back. Tested against KVCache:
// test/train/webgpu-decode.test.ts.
//
// Shapes as in train/model.ts: R rows in a step, D hidden, H query and K key/value heads of hd, F the MLP's
// width, V the vocabulary. A cache holds (layers, keys | values, capacity, K·hd) f32s.
/// <reference types="@webgpu/types" />
import { DecodeWeights, Decoding, type CachePool, type GenerateOptions, type TokenCache } from '../decode.ts';
import type { Llama } from '../model.ts';
import { download, submit, upload } from './buffers.ts';
import { RopeTables } from './elementwise.ts';
import type { Kernels } from './kernel.ts';
import { llamaKernels } from './llama.ts';

/** One sequence's tokens read so far and their keys and values in every layer, on the GPU. */
export class GpuCache {
  readonly tokens: number[] = [];
  buffer: GPUBuffer | null = null;
  capacity = 0;

  constructor(readonly decoder: GpuDecoder) {}

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
    d.logits = (await this.decoder.readMany([this], [d.unread.splice(0)]))[0]!;
    for (let next = d.next(); next !== null && !d.finished; next = d.next())
      d.logits = (await this.decoder.readMany([this], [[next]]))[0]!;
    return d.out;
  }

  /** Frees the cache's buffer. */
  dispose(): void {
    this.buffer?.destroy();
    this.buffer = null;
    this.capacity = 0;
  }
}

/** The model's weights on the GPU as they were when it was made (adapters folded in, as DecodeWeights does), and the caches' steps. */
export class GpuDecoder implements CachePool {
  private readonly weights = new Map<string, GPUBuffer>();
  private readonly activations = new Map<string, { buffer: GPUBuffer; length: number }>();
  private readonly tables: RopeTables;
  private readonly ops: ReturnType<typeof llamaKernels>;

  constructor(
    readonly model: Llama,
    private readonly k: Kernels,
  ) {
    for (const [name, data] of new DecodeWeights(model).w) this.weights.set(name, upload(k.gpu, data));
    this.ops = llamaKernels(k);
    this.tables = new RopeTables(k.gpu, model.config);
  }

  /** A new, empty cache over these weights. */
  create(): GpuCache {
    return new GpuCache(this);
  }

  /** A new cache holding the first n tokens of `source`: their keys and values copied, layer by layer. */
  fork(source: TokenCache, n: number): GpuCache {
    const from = source as GpuCache;
    const fork = this.create();
    const count = Math.min(n, from.tokens.length);
    this.reserve(fork, count);
    if (count > 0) this.copyPositions(from.buffer!, from.capacity, fork.buffer!, fork.capacity, count);
    fork.tokens.push(...from.tokens.slice(0, count));
    return fork;
  }

  /** Frees a cache's buffer. */
  free(cache: TokenCache): void {
    (cache as GpuCache).dispose();
  }

  private act(name: string, length: number): GPUBuffer {
    const held = this.activations.get(name);
    if (held && held.length >= length) return held.buffer;
    held?.buffer.destroy();
    const buffer = upload(this.k.gpu, new Float32Array(Math.max(length, 2 * (held?.length ?? 0))));
    this.activations.set(name, { buffer, length: Math.max(length, 2 * (held?.length ?? 0)) });
    return buffer;
  }

  /** The first `count` positions of every layer's keys and values, from a cache buffer of one capacity to one of another. */
  private copyPositions(from: GPUBuffer, fromCapacity: number, to: GPUBuffer, toCapacity: number, count: number): void {
    const c = this.model.config;
    const row = c.kvHeads * c.headDim * 4;
    const encoder = this.k.gpu.device.createCommandEncoder();
    for (let block = 0; block < 2 * c.layers; block++)
      encoder.copyBufferToBuffer(from, block * fromCapacity * row, to, block * toCapacity * row, count * row);
    this.k.gpu.device.queue.submit([encoder.finish()]);
  }

  /** Room in `cache` for n positions: a larger buffer, the positions in use copied over, layer by layer. */
  private reserve(cache: GpuCache, n: number): void {
    const max = this.model.config.maxPositions;
    if (n > max) throw new Error(`${n} tokens do not fit in the model's ${max} positions (max_position_embeddings)`);
    if (n <= cache.capacity) return;
    const c = this.model.config;
    const capacity = Math.min(max, Math.max(n, 2 * cache.capacity, 64));
    const buffer = upload(this.k.gpu, new Float32Array(c.layers * 2 * capacity * c.kvHeads * c.headDim));
    if (cache.buffer) {
      this.copyPositions(cache.buffer, cache.capacity, buffer, capacity, cache.tokens.length);
      cache.buffer.destroy();
    }
    cache.buffer = buffer;
    cache.capacity = capacity;
  }

  /**
   * Reads `reads[b]` into caches[b], all in one pass (KVCache.readMany's step): every token is a row through
   * each projection, each sequence's rows attend to its own cache up to their positions, and only each
   * sequence's last row goes through the head. Returns each cache's next-token logits.
   */
  async readMany(all: TokenCache[], reads: number[][]): Promise<Float32Array[]> {
    const caches = all as GpuCache[];
    if (caches.some((cache) => !(cache instanceof GpuCache) || cache.decoder !== this))
      throw new Error('GpuDecoder.readMany: a cache of another decoder');
    if (reads.some((r) => r.length === 0)) throw new Error('GpuDecoder.readMany: no tokens to read');
    const c = this.model.config;
    const [D, H, K, hd, F, V] = [c.hiddenSize, c.heads, c.kvHeads, c.headDim, c.intermediateSize, c.vocabSize];
    const gpu = this.k.gpu;
    caches.forEach((cache, b) => this.reserve(cache, cache.tokens.length + reads[b]!.length));
    // Sequence b's rows start at r0[b]; row r reads ids[r] at positions[r].
    const r0: number[] = [];
    const ids: number[] = [];
    const positions: number[] = [];
    caches.forEach((cache, b) => {
      r0.push(ids.length);
      reads[b]!.forEach((token, i) => {
        ids.push(token);
        positions.push(cache.tokens.length + i);
      });
    });
    const R = ids.length;
    const B = caches.length;
    const { cos, sin } = this.tables.get(Math.max(...positions) + 1);
    const a = (name: string, length: number) => this.act(name, length);
    const w = (name: string) => this.weights.get(name)!;
    const write = (name: string, data: Int32Array | Uint32Array) => {
      const buffer = a(name, data.length);
      gpu.device.queue.writeBuffer(buffer, 0, data);
      return buffer;
    };
    const idsBuffer = write('ids', Int32Array.from(ids));
    const positionsBuffer = write('positions', Uint32Array.from(positions));
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
    // The attention's scores: a row for each (new row, head) of one sequence at a time, as long as its cache.
    const scores = Math.max(...reads.map((r) => r.length)) * H * Math.max(...caches.map((cache) => cache.capacity));
    const block = (cache: GpuCache) => cache.capacity * K * hd;
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
        caches.forEach((cache, b) => {
          const n = reads[b]!.length;
          const [keys, values] = [2 * l * block(cache), (2 * l + 1) * block(cache)];
          const at0 = cache.tokens.length;
          this.ops.copy.encode(
            pass,
            a('kr', R * K * hd),
            r0[b]! * K * hd,
            cache.buffer!,
            keys + at0 * K * hd,
            n * K * hd,
          );
          this.ops.copy.encode(
            pass,
            a('v', R * K * hd),
            r0[b]! * K * hd,
            cache.buffer!,
            values + at0 * K * hd,
            n * K * hd,
          );
          this.ops.attention.decode(
            pass,
            a('qr', R * H * hd),
            cache.buffer!,
            a('scores', scores),
            a('att', R * H * hd),
            { r0: r0[b]!, rows: n, at0, heads: H, kvHeads: K, headDim: hd, capacity: cache.capacity, keys, values },
          );
        });
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
        a('logits', B * V),
        B,
        V,
        D,
      );
    });
    this.k.release();
    const logits = await download(gpu, a('logits', B * V), B * V);
    caches.forEach((cache, b) => cache.tokens.push(...reads[b]!));
    return caches.map((_, b) => logits.slice(b * V, (b + 1) * V));
  }

  /** Frees the weights and the step's buffers (caches are freed on their own). */
  dispose(): void {
    for (const buffer of [...this.weights.values(), ...[...this.activations.values()].map((x) => x.buffer)])
      buffer.destroy();
    this.tables.dispose();
    this.weights.clear();
    this.activations.clear();
  }
}
