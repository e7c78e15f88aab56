// The Llama of model/llama.ts on the GPU: its weights in GPU buffers, the forward pass to every position's
// log p(target) and its backward from d loss / d logp, written out layer by layer from the kernels beside this
// file, every weight's gradient left in `grads`. Every loss of the trainer is a function of those token
// log-probs (trainers/step.ts MicroBatch), so one backward serves SFT, DPO and friends, KTO and DAPO alike.
// The same arithmetic as the tfjs model (RMSNorm, RoPE, grouped-query causal attention, SwiGLU, tied or
// untied head, Qwen2's q/k/v biases), tested against it on small shapes: test/runtime/held-llama.test.ts.
//
// Shapes: N = B·T rows, D hidden, H query and K key/value heads of hd, F the MLP's width, V the vocabulary.
// A weight is stored (out, in) as transformers stores it, so a projection is x·Wᵀ (the GEMM reads W
// transposed in place), its input gradient dy·W and its weight gradient dyᵀ·x.
/// <reference types="@webgpu/types" />
import type { Llama } from '../../model/llama.ts';
import type { GpuParameter } from './adamw.ts';
import { Attention } from './attention.ts';
import { allocate, download, submit, upload } from './buffers.ts';
import { Add, Bias, Copy, Embedding, Mul, Norms, Rope, RopeTables, SwiGlu, byToken } from './elementwise.ts';
import { part, type Binding, type GpuKernels } from './kernel.ts';
import { Cast, LossScaler, OVERFLOW } from './precision.ts';
import { TargetLogprobs } from './logprobs.ts';
import { Matmul } from './matmul.ts';
import { RmsNorm } from './rmsnorm.ts';
import type { TokenBlock } from '../../model/windows.ts';
import type { LlamaConfig } from '../../model/config.ts';
import { heldWeights, type HeldModel, type LoraWeights } from '../held.ts';
import { heldScorer } from '../scoring.ts';

/**
 * The most bytes of logits a chunk of the head holds (and as many of their gradient): chunks of a few hundred
 * rows even at a vocabulary of 152k, large enough that the head's GEMMs stay wide.
 */
const LOGIT_BYTES = 256 * 2 ** 20;

/** An adapter on the GPU: the names of its A and B among the weights, and the rest of LoraWeights. */
type GpuAdapter = Omit<LoraWeights, 'a' | 'b'> & { a: string; b: string };

/** What a slot's forward leaves for its backward besides its activations: the block's shape and token buffers. */
interface Slot {
  batch: number;
  length: number;
  /** Whether LoRA's dropout masks were drawn for this forward. */
  dropped: boolean;
  ids: GPUBuffer;
  targets: GPUBuffer;
  /** The block's positions grouped by token (byToken), for the embedding's backward. */
  starts: GPUBuffer;
  positions: GPUBuffer;
}

/** The kernels a Llama's passes are written with, made once for a model on the GPU (decode.ts's too). */
export function llamaKernels(k: GpuKernels) {
  return {
    mm: new Matmul(k),
    norm: new RmsNorm(k),
    rope: new Rope(k),
    attention: new Attention(k),
    swiglu: new SwiGlu(k),
    add: new Add(k),
    embedding: new Embedding(k),
    logprobs: new TargetLogprobs(k),
    bias: new Bias(k),
    copy: new Copy(k),
    mul: new Mul(k),
    norms: new Norms(k),
  };
}

export class GpuLlama {
  readonly weights = new Map<string, GPUBuffer>();
  readonly grads = new Map<string, GPUBuffer>();
  private readonly sizes = new Map<string, number>();
  private readonly activations = new Map<string, { buffer: GPUBuffer; length: number }>();
  private readonly ops: ReturnType<typeof llamaKernels>;
  private readonly tables: RopeTables;
  private readonly slots = new Map<number, Slot>();

  /** Mixed precision (GpuKernels.precision f16): the GEMMs read f16 copies of their weights and operands. */
  private readonly half: boolean;
  /** f16 copies of the weights the GEMMs read, written by AdamW with each update (mixed precision). */
  private readonly f16Weights = new Map<string, GPUBuffer>();
  /** f16 scratch for the GEMMs' other operands, by name and length. */
  private readonly halfActs = new Map<string, GPUBuffer>();
  /** Two u32s: whether a forward's (0) or a backward's (1) cast to f16 met a value f16 cannot hold. */
  private readonly overflow: GPUBuffer | null;
  private readonly scaler: LossScaler | null;
  /** Whether the last clipGradients found the scaled gradients overflowed f16: the step is not taken. */
  skipped = false;

  /** LoRA's adapters by module (model.layers.0.self_attn.q_proj): only they are trained then. */
  private readonly adapters: Map<string, GpuAdapter>;
  /** The weights trained, in order, and whether AdamW decays them. */
  private readonly trained: [string, boolean][];
  /**
   * LoRA's dropout for this step's forward passes: the run's seed (model/llama.ts dropoutSeed), and the mask
   * of (rows, cols) that TensorFlow.js's dropout draws at a seed (model/lora.ts dropoutMask), each adapter's at
   * the seed plus its index, so the GPU drops what WASM drops; null: no dropout.
   */
  dropout: HeldModel['dropout'] = null;

  /**
   * `trainable` false: forward passes only (scoring), with no buffers for gradients. With `adapters` (LoRA),
   * the base weights are frozen and only the adapters' A and B get gradients, named as PEFT names them.
   */
  constructor(
    readonly config: LlamaConfig,
    weights: Map<string, Float32Array>,
    private readonly k: GpuKernels,
    o: {
      trainable?: boolean;
      adapters?: Map<string, LoraWeights>;
      logitBytes?: number;
      /** Mixed precision's loss scale: where it starts, and after how many steps without overflow it doubles. */
      lossScale?: { initial: number; interval: number };
    } = {},
  ) {
    const held = heldWeights(config, weights, 'webgpu', o);
    for (const w of held.weights) {
      this.sizes.set(w.name, w.data.length);
      this.weights.set(w.name, upload(k.gpu, w.data));
      if (w.trained) this.grads.set(w.name, upload(k.gpu, new Float32Array(w.data.length)));
    }
    this.trained = held.weights.filter((w) => w.trained).map((w) => [w.name, w.decays]);
    this.adapters = held.adapters;
    this.ops = llamaKernels(k);
    this.tables = new RopeTables(k.gpu, config);
    this.logitBytes = Math.min(o.logitBytes ?? LOGIT_BYTES, k.bindingBytes);
    this.half = k.precision === 'f16';
    this.cast = new Cast(k);
    this.overflow = this.half ? allocate(k.gpu, 4 * Object.keys(OVERFLOW).length) : null;
    this.scaler = this.half && this.grads.size ? new LossScaler(o.lossScale) : null;
    if (this.half) {
      // The weights a GEMM reads: the projections and the head (the embedding only where it is the head).
      const read = held.weights.filter(
        (w) =>
          w.name.endsWith('_proj.weight') ||
          w.name === 'lm_head.weight' ||
          (config.tiedEmbeddings && w.name === 'model.embed_tokens.weight'),
      );
      for (const w of read) this.f16Weights.set(w.name, allocate(k.gpu, w.data.length * 2));
      submit(k.gpu, (pass) => {
        for (const w of read)
          this.cast.encode(
            pass,
            this.w(w.name),
            this.f16Weights.get(w.name)!,
            w.data.length,
            this.overflow!,
            OVERFLOW.weights,
          );
      });
    }
  }

  private readonly cast: Cast;

  /** For each of `slots` (OVERFLOW), whether a cast to f16 there met a value f16 cannot hold since it was cleared: one readback. */
  private async overflowed(...slots: number[]): Promise<boolean[]> {
    const flags = new Uint32Array((await download(this.k.gpu, this.overflow!, Object.keys(OVERFLOW).length)).buffer);
    return slots.map((slot) => flags[slot] !== 0);
  }

  /** The loss scale mixed precision multiplies the backward's gradients by (undefined in f32). */
  get lossScale(): number | undefined {
    return this.scaler?.scale;
  }

  /**
   * A GEMM's operand: in f32 `x` itself; in mixed precision `x` (`length` f32s) cast to f16 in scratch `name`,
   * a value f16 cannot hold counted as the forward's overflow, or with `gradient` the backward's. The
   * backward casts the forward's activations again rather than keeping f16 copies of them a slot.
   */
  private operand(pass: GPUComputePassEncoder, x: Binding, length: number, name: string, gradient = false): Binding {
    if (!this.half) return x;
    const key = `${name}.${length}`;
    let y = this.halfActs.get(key);
    if (!y) this.halfActs.set(key, (y = allocate(this.k.gpu, length * 2)));
    this.cast.encode(pass, x, y, length, this.overflow!, gradient ? OVERFLOW.backward : OVERFLOW.forward);
    return y;
  }

  /** A weight as a GEMM reads it: its f16 copy in mixed precision. */
  private gemmWeight(name: string): GPUBuffer {
    return this.f16Weights.get(name) ?? this.w(name);
  }

  /** The most bytes of logits (and of their gradient) held at once. */
  private readonly logitBytes: number;

  /** Rows of logits a chunk: a multiple of 64 (so that a chunk's rows start where a binding may), within logitBytes, no more than N needs. */
  private chunkRows(N: number): number {
    const fit = Math.max(64, Math.floor(this.logitBytes / (this.config.vocabSize * 4) / 64) * 64);
    return Math.min(fit, Math.ceil(N / 64) * 64);
  }

  /** The chunks of N rows: [first row, rows]. */
  private chunks(N: number): [number, number][] {
    const size = this.chunkRows(N);
    const out: [number, number][] = [];
    for (let r0 = 0; r0 < N; r0 += size) out.push([r0, Math.min(size, N - r0)]);
    return out;
  }

  /** An activation's buffer of `length` f32s, kept from step to step while the shape stays. */
  private act(name: string, length: number): GPUBuffer {
    const held = this.activations.get(name);
    if (held && held.length === length) return held.buffer;
    held?.buffer.destroy();
    if (length * 4 > this.k.bindingBytes) {
      const mib = (bytes: number) =>
        bytes < 2 ** 20 ? `${(bytes / 2 ** 10).toFixed(0)} KiB` : `${(bytes / 2 ** 20).toFixed(0)} MiB`;
      throw new Error(
        `webgpu: the activation ${name} needs ${mib(length * 4)} in one binding, more than this GPU's largest (${mib(this.k.bindingBytes)}): train with a smaller batch or shorter sequences`,
      );
    }
    const buffer = upload(this.k.gpu, new Float32Array(length));
    this.activations.set(name, { buffer, length });
    return buffer;
  }

  private w(name: string): GPUBuffer {
    return this.weights.get(name)!;
  }

  private g(name: string): GPUBuffer {
    return this.grads.get(name)!;
  }

  /** A frozen weight's gradient is not kept: its kernel writes into scratch instead. */
  private gOrScratch(name: string, length: number): GPUBuffer {
    return this.grads.get(name) ?? this.act('frozen', length);
  }

  /** A block's sizes (N = B·T rows), the names and shapes every pass of it uses, and its slot's activations. */
  private sizesOf({ batch: B, length: T }: { batch: number; length: number }, slot: number) {
    const c = this.config;
    const N = B * T;
    return {
      c,
      B,
      T,
      N,
      D: c.hiddenSize,
      H: c.heads,
      K: c.kvHeads,
      hd: c.headDim,
      F: c.intermediateSize,
      V: c.vocabSize,
      head: c.tiedEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight',
      l: (i: number, n: string) => `model.layers.${i}.${n}`,
      rows: { rows: N, dim: c.hiddenSize, eps: c.rmsNormEps },
      heads: { batch: B, length: T, heads: c.heads, kvHeads: c.kvHeads, headDim: c.headDim },
      ...this.tables.get(T),
      a: (n: string, length: number) => this.act(`${slot}/${n}`, length),
    };
  }

  /**
   * The forward pass of a block into slot `slot`: every position's log p(target) (B·T), as f32s, and with
   * `entropy` each position's entropy of the next token written there. The slot keeps what its backward reads
   * until its next forward, so a loss over several blocks (DPO's chosen and rejected sides) has each block in
   * a slot of its own.
   */
  async forward(b: TokenBlock, slot = 0, entropy?: Float32Array): Promise<Float32Array> {
    const { c, B, T, N, D, H, K, hd, F, V, head, l, rows, heads, cos, sin, a } = this.sizesOf(b, slot);
    const gpu = this.k.gpu;
    const dropped = this.dropout !== null;
    const project = (
      pass: GPUComputePassEncoder,
      x: GPUBuffer,
      w: string,
      y: GPUBuffer,
      m: number,
      n: number,
      k: number,
    ) => {
      const x16 = this.operand(pass, x, m * k, 'in');
      this.ops.mm.encode(pass, x16, this.gemmWeight(w), y, { m, n, k, transposeB: true, half: this.half });
      const module = w.slice(0, -'.weight'.length);
      if (this.adapters.has(module)) this.adapterForward(pass, module, dropped, a, x, y, m, n, k);
    };
    // The block's tokens go into the slot's buffers in queue order: a backward submitted before still reads the old ones.
    const write = (name: string, data: Int32Array | Uint32Array) => {
      const buffer = a(name, data.length);
      gpu.device.queue.writeBuffer(buffer, 0, data);
      return buffer;
    };
    const sorted = byToken(b.ids, V);
    const s: Slot = {
      batch: B,
      length: T,
      dropped,
      ids: write('ids', b.ids),
      targets: write('targets', b.targets),
      starts: write('starts', sorted.starts),
      positions: write('positions', sorted.positions),
    };
    this.slots.set(slot, s);
    if (this.overflow) gpu.device.queue.writeBuffer(this.overflow, OVERFLOW.forward * 4, new Uint32Array(1));

    submit(gpu, (pass) => {
      this.ops.embedding.forward(pass, this.w('model.embed_tokens.weight'), s.ids, a('x0', N * D), N, D);
      for (let i = 0; i < c.layers; i++) {
        const x = a(`x${i}`, N * D);
        this.ops.norm.forward(
          pass,
          x,
          this.w(l(i, 'input_layernorm.weight')),
          a(`h1.${i}`, N * D),
          a(`r1.${i}`, N),
          rows,
        );
        project(pass, a(`h1.${i}`, N * D), l(i, 'self_attn.q_proj.weight'), a(`q.${i}`, N * H * hd), N, H * hd, D);
        project(pass, a(`h1.${i}`, N * D), l(i, 'self_attn.k_proj.weight'), a(`k.${i}`, N * K * hd), N, K * hd, D);
        project(pass, a(`h1.${i}`, N * D), l(i, 'self_attn.v_proj.weight'), a(`v.${i}`, N * K * hd), N, K * hd, D);
        if (c.attentionBias) {
          this.ops.bias.forward(pass, this.w(l(i, 'self_attn.q_proj.bias')), a(`q.${i}`, N * H * hd), N, H * hd);
          this.ops.bias.forward(pass, this.w(l(i, 'self_attn.k_proj.bias')), a(`k.${i}`, N * K * hd), N, K * hd);
          this.ops.bias.forward(pass, this.w(l(i, 'self_attn.v_proj.bias')), a(`v.${i}`, N * K * hd), N, K * hd);
        }
        this.ops.rope.forward(pass, a(`q.${i}`, N * H * hd), cos, sin, a(`qr.${i}`, N * H * hd), {
          rows: N,
          heads: H,
          headDim: hd,
          length: T,
        });
        this.ops.rope.forward(pass, a(`k.${i}`, N * K * hd), cos, sin, a(`kr.${i}`, N * K * hd), {
          rows: N,
          heads: K,
          headDim: hd,
          length: T,
        });
        this.ops.attention.forward(
          pass,
          a(`qr.${i}`, N * H * hd),
          a(`kr.${i}`, N * K * hd),
          a(`v.${i}`, N * K * hd),
          a(`att.${i}`, N * H * hd),
          a(`lse.${i}`, N * H),
          heads,
        );
        project(pass, a(`att.${i}`, N * H * hd), l(i, 'self_attn.o_proj.weight'), this.act('ao', N * D), N, D, H * hd);
        this.ops.add.encode(pass, x, this.act('ao', N * D), a(`xm.${i}`, N * D), N * D);
        this.ops.norm.forward(
          pass,
          a(`xm.${i}`, N * D),
          this.w(l(i, 'post_attention_layernorm.weight')),
          a(`h2.${i}`, N * D),
          a(`r2.${i}`, N),
          rows,
        );
        project(pass, a(`h2.${i}`, N * D), l(i, 'mlp.gate_proj.weight'), a(`g.${i}`, N * F), N, F, D);
        project(pass, a(`h2.${i}`, N * D), l(i, 'mlp.up_proj.weight'), a(`u.${i}`, N * F), N, F, D);
        this.ops.swiglu.forward(pass, a(`g.${i}`, N * F), a(`u.${i}`, N * F), a(`m.${i}`, N * F), N * F);
        project(pass, a(`m.${i}`, N * F), l(i, 'mlp.down_proj.weight'), this.act('mo', N * D), N, D, F);
        this.ops.add.encode(pass, a(`xm.${i}`, N * D), this.act('mo', N * D), a(`x${i + 1}`, N * D), N * D);
      }
      this.ops.norm.forward(
        pass,
        a(`x${c.layers}`, N * D),
        this.w('model.norm.weight'),
        a('hf', N * D),
        a('rf', N),
        rows,
      );
      // The head and log-softmax a chunk of rows at a time: the N×V logits never exist (Liger's fused linear
      // cross-entropy); the backward computes each chunk's logits again.
      const logits = this.act('logits', this.chunkRows(N) * V);
      for (const [r0, n] of this.chunks(N)) {
        const hf = this.operand(pass, part(a('hf', N * D), r0 * D, n * D), n * D, 'in');
        this.ops.mm.encode(pass, hf, this.gemmWeight(head), logits, {
          m: n,
          n: V,
          k: D,
          transposeB: true,
          half: this.half,
        });
        const [targets, logp, lse] = [s.targets, a('logp', N), a('lse', N)].map((b) => part(b, r0, n));
        this.ops.logprobs.forward(pass, logits, targets!, logp!, lse!, { rows: n, vocab: V });
        if (entropy) this.ops.logprobs.entropy(pass, logits, lse!, part(a('entropy', N), r0, n), { rows: n, vocab: V });
      }
    });
    const logp = await download(gpu, a('logp', N), N);
    if (entropy) entropy.set(await download(gpu, a('entropy', N), N));
    const [weights, activations] = this.overflow
      ? await this.overflowed(OVERFLOW.weights, OVERFLOW.forward)
      : [false, false];
    if (weights) throw new Error('precision f16: a weight is beyond f16 (above 65504); train with --precision f32');
    if (activations)
      throw new Error(
        'precision f16: an activation of this block overflows f16 (above 65504); train with --precision f32',
      );
    return logp;
  }

  /**
   * LoRA's term of a projection's forward: y += (α/r)·(drop(x)·Aᵀ)·Bᵀ, for x (rows × inner) and y (rows × out).
   * Keeps drop(x) (the mask's product) and low = (α/r)·drop(x)·Aᵀ in the slot for the backward.
   */
  private adapterForward(
    pass: GPUComputePassEncoder,
    module: string,
    dropped: boolean,
    a: (n: string, length: number) => GPUBuffer,
    x: GPUBuffer,
    y: GPUBuffer,
    rows: number,
    out: number,
    inner: number,
  ): void {
    const ad = this.adapters.get(module)!;
    let input = x;
    if (dropped && ad.dropout > 0) {
      const mask = a(`mask.${module}`, rows * inner);
      this.k.gpu.device.queue.writeBuffer(
        mask,
        0,
        this.dropout!.mask(rows, inner, ad.dropout, this.dropout!.seed + ad.index),
      );
      input = a(`xd.${module}`, rows * inner);
      this.ops.mul.encode(pass, x, mask, input, rows * inner);
    }
    const low = a(`low.${module}`, rows * ad.r);
    this.ops.mm.encode(pass, input, this.w(ad.a), low, { m: rows, n: ad.r, k: inner, transposeB: true });
    this.ops.norms.scale(pass, low, rows * ad.r, ad.scale);
    this.ops.mm.encode(pass, low, this.w(ad.b), y, { m: rows, n: out, k: ad.r, transposeB: true, accumulate: true });
  }

  /**
   * LoRA's term of a projection's backward, from dy (rows × out): dB += dyᵀ·low, dlow = (α/r)·dy·B,
   * dA += dlowᵀ·drop(x), and dx += drop'(dlow·A) (the mask again).
   */
  private adapterBackward(
    pass: GPUComputePassEncoder,
    module: string,
    s: Slot,
    a: (n: string, length: number) => GPUBuffer,
    dy: GPUBuffer,
    x: GPUBuffer,
    dx: GPUBuffer,
    rows: number,
    out: number,
    inner: number,
  ): void {
    const ad = this.adapters.get(module)!;
    const masked = s.dropped && ad.dropout > 0;
    const input = masked ? a(`xd.${module}`, rows * inner) : x;
    const dlow = this.act('dlow', rows * ad.r);
    this.ops.mm.encode(pass, dy, a(`low.${module}`, rows * ad.r), this.g(ad.b), {
      m: out,
      n: ad.r,
      k: rows,
      transposeA: true,
      accumulate: true,
    });
    this.ops.mm.encode(pass, dy, this.w(ad.b), dlow, { m: rows, n: ad.r, k: out });
    this.ops.norms.scale(pass, dlow, rows * ad.r, ad.scale);
    this.ops.mm.encode(pass, dlow, input, this.g(ad.a), {
      m: ad.r,
      n: inner,
      k: rows,
      transposeA: true,
      accumulate: true,
    });
    if (!masked) this.ops.mm.encode(pass, dlow, this.w(ad.a), dx, { m: rows, n: inner, k: ad.r, accumulate: true });
    else {
      const through = this.act(`dlowA.${inner}`, rows * inner); // one a width: a pass may not see its buffer remade
      this.ops.mm.encode(pass, dlow, this.w(ad.a), through, { m: rows, n: inner, k: ad.r });
      this.ops.mul.encode(pass, through, a(`mask.${module}`, rows * inner), dx, rows * inner, true);
    }
  }

  /** Clears every weight's gradient: a step's backward passes then add to them. */
  zeroGradients(): void {
    const encoder = this.k.gpu.device.createCommandEncoder();
    for (const grad of this.grads.values()) encoder.clearBuffer(grad);
    if (this.overflow) encoder.clearBuffer(this.overflow, OVERFLOW.backward * 4, 4);
    this.k.gpu.device.queue.submit([encoder.finish()]);
  }

  /**
   * The backward pass of slot `slot`'s last forward, from the loss's gradient with respect to each of its
   * positions' log-probabilities (B·T): every weight's gradient is added to `grads` (a tied table gets the
   * head's and the embedding's); dx carries the residual stream's gradient down the layers. Submitted, not
   * awaited: reading anything back waits for it.
   */
  backward(slot: number, dlogp: Float32Array): void {
    const s = this.slots.get(slot);
    if (!s) throw new Error(`webgpu: no forward pass in slot ${slot} to take the backward of`);
    const { c, T, N, D, H, K, hd, F, V, head, l, rows, heads, cos, sin, a } = this.sizesOf(s, slot);
    const gpu = this.k.gpu;
    const t = (n: string, length: number) => this.act(n, length); // scratch shared by every slot's backward
    const dlogps = t('dlogp', N);
    // Mixed precision: the gradients scaled up so that small ones survive the casts to f16 (clipGradients scales back).
    gpu.device.queue.writeBuffer(dlogps, 0, this.scaler ? dlogp.map((x) => x * this.scaler!.scale) : dlogp);
    // A projection y = x·Wᵀ (N rows, W stored (out, in)) taken back from dy: dx = dy·W (written, or added to),
    // W's gradient dyᵀ·x where W is trained, and its adapter's where it has one.
    const through = (
      pass: GPUComputePassEncoder,
      dy: GPUBuffer,
      w: string,
      x: GPUBuffer,
      dx: GPUBuffer,
      rows: number,
      out: number,
      inner: number,
      accumulate = false,
    ) => {
      const dy16 = this.operand(pass, dy, rows * out, 'dy', true);
      this.ops.mm.encode(pass, dy16, this.gemmWeight(w), dx, {
        m: rows,
        n: inner,
        k: out,
        accumulate,
        half: this.half,
      });
      if (this.grads.has(w))
        this.ops.mm.encode(pass, dy16, this.operand(pass, x, rows * inner, 'in'), this.g(w), {
          m: out,
          n: inner,
          k: rows,
          transposeA: true,
          accumulate: true,
          half: this.half,
        });
      const module = w.slice(0, -'.weight'.length);
      if (this.adapters.has(module)) this.adapterBackward(pass, module, s, a, dy, x, dx, rows, out, inner);
    };
    const frozenOr = (name: string) => this.gOrScratch(name, D);
    submit(gpu, (pass) => {
      const dx = t('dx', N * D);
      // The head a chunk of rows at a time, its logits computed again (the forward's were not kept):
      // dlogits = dlogp·(onehot − softmax), dh = dlogits·W, dW += dlogitsᵀ·hf.
      const [logits, dlogits] = [t('logits', this.chunkRows(N) * V), t('dlogits', this.chunkRows(N) * V)];
      for (const [r0, n] of this.chunks(N)) {
        const [hf, dh] = [a('hf', N * D), t('dh', N * D)].map((b) => part(b, r0 * D, n * D));
        const hf16 = this.operand(pass, hf!, n * D, 'in');
        const half = this.half;
        this.ops.mm.encode(pass, hf16, this.gemmWeight(head), logits, { m: n, n: V, k: D, transposeB: true, half });
        const [targets, lse, dlogp] = [s.targets, a('lse', N), dlogps].map((b) => part(b, r0, n));
        this.ops.logprobs.backward(pass, logits, targets!, lse!, dlogp!, dlogits, { rows: n, vocab: V });
        const dlogits16 = this.operand(pass, dlogits, n * V, 'dy', true);
        this.ops.mm.encode(pass, dlogits16, this.gemmWeight(head), dh!, { m: n, n: D, k: V, half });
        if (this.grads.has(head))
          this.ops.mm.encode(pass, dlogits16, hf16, this.g(head), {
            m: V,
            n: D,
            k: n,
            half,
            transposeA: true,
            accumulate: true,
          });
      }
      this.ops.norm.backward(
        pass,
        a(`x${c.layers}`, N * D),
        this.w('model.norm.weight'),
        a('rf', N),
        t('dh', N * D),
        dx,
        frozenOr('model.norm.weight'),
        rows,
      );
      for (let i = c.layers - 1; i >= 0; i--) {
        // The MLP: dx is the gradient of x_{i+1} = xm + down(swiglu(gate(h2), up(h2))).
        through(pass, dx, l(i, 'mlp.down_proj.weight'), a(`m.${i}`, N * F), t('dm', N * F), N, D, F);
        this.ops.swiglu.backward(
          pass,
          a(`g.${i}`, N * F),
          a(`u.${i}`, N * F),
          t('dm', N * F),
          t('dg', N * F),
          t('du', N * F),
          N * F,
        );
        through(pass, t('dg', N * F), l(i, 'mlp.gate_proj.weight'), a(`h2.${i}`, N * D), t('dh', N * D), N, F, D);
        through(pass, t('du', N * F), l(i, 'mlp.up_proj.weight'), a(`h2.${i}`, N * D), t('dh', N * D), N, F, D, true);
        this.ops.norm.backward(
          pass,
          a(`xm.${i}`, N * D),
          this.w(l(i, 'post_attention_layernorm.weight')),
          a(`r2.${i}`, N),
          t('dh', N * D),
          dx,
          frozenOr(l(i, 'post_attention_layernorm.weight')),
          { ...rows, accumulate: true },
        );
        // Attention: dx is now the gradient of xm = x_i + o_proj(attention(q, k, v)).
        through(
          pass,
          dx,
          l(i, 'self_attn.o_proj.weight'),
          a(`att.${i}`, N * H * hd),
          t('datt', N * H * hd),
          N,
          D,
          H * hd,
        );
        this.ops.attention.backward(
          pass,
          {
            q: a(`qr.${i}`, N * H * hd),
            k: a(`kr.${i}`, N * K * hd),
            v: a(`v.${i}`, N * K * hd),
            out: a(`att.${i}`, N * H * hd),
            lse: a(`lse.${i}`, N * H),
          },
          t('datt', N * H * hd),
          t('delta', N * H),
          { dq: t('dqr', N * H * hd), dk: t('dkr', N * K * hd), dv: t('dv', N * K * hd) },
          heads,
        );
        this.ops.rope.backward(pass, t('dqr', N * H * hd), cos, sin, t('dq', N * H * hd), {
          rows: N,
          heads: H,
          headDim: hd,
          length: T,
        });
        this.ops.rope.backward(pass, t('dkr', N * K * hd), cos, sin, t('dk', N * K * hd), {
          rows: N,
          heads: K,
          headDim: hd,
          length: T,
        });
        through(
          pass,
          t('dq', N * H * hd),
          l(i, 'self_attn.q_proj.weight'),
          a(`h1.${i}`, N * D),
          t('dh', N * D),
          N,
          H * hd,
          D,
        );
        through(
          pass,
          t('dk', N * K * hd),
          l(i, 'self_attn.k_proj.weight'),
          a(`h1.${i}`, N * D),
          t('dh', N * D),
          N,
          K * hd,
          D,
          true,
        );
        through(
          pass,
          t('dv', N * K * hd),
          l(i, 'self_attn.v_proj.weight'),
          a(`h1.${i}`, N * D),
          t('dh', N * D),
          N,
          K * hd,
          D,
          true,
        );
        for (const [which, dy, out] of [
          ['q', 'dq', H * hd],
          ['k', 'dk', K * hd],
          ['v', 'dv', K * hd],
        ] as const) {
          const bias = l(i, `self_attn.${which}_proj.bias`);
          if (c.attentionBias && this.grads.has(bias))
            this.ops.bias.backward(pass, t(dy, N * out), this.g(bias), N, out);
        }
        this.ops.norm.backward(
          pass,
          a(`x${i}`, N * D),
          this.w(l(i, 'input_layernorm.weight')),
          a(`r1.${i}`, N),
          t('dh', N * D),
          dx,
          frozenOr(l(i, 'input_layernorm.weight')),
          { ...rows, accumulate: true },
        );
      }
      if (this.grads.has('model.embed_tokens.weight'))
        this.ops.embedding.backward(pass, dx, s.starts, s.positions, this.g('model.embed_tokens.weight'), D);
    });
  }

  private optimizerState: GpuParameter[] | null = null;

  /** Every weight trained (the adapters' with LoRA) with its gradient and AdamW's moments (made at first use, zero), for GpuAdamW. */
  parameters(): GpuParameter[] {
    this.optimizerState ??= this.trained.map(([name, decays]) => {
      const length = this.sizes.get(name)!;
      return {
        name,
        value: this.w(name),
        grad: this.g(name),
        m: upload(this.k.gpu, new Float32Array(length)),
        v: upload(this.k.gpu, new Float32Array(length)),
        length,
        decays,
        half: this.f16Weights.has(name) ? { copy: this.f16Weights.get(name)!, overflow: this.overflow! } : undefined,
      };
    });
    return this.optimizerState;
  }

  /**
   * Scales every gradient so that their global L2 norm is at most `maxNorm` (trainers/optimizer.ts
   * clipByGlobalNorm); returns the norm before. The sums of squares are added up here in doubles. In mixed
   * precision the loss scale is taken out too; gradients that overflowed f16 set `skipped` (the caller
   * takes no step), halve the scale and return Infinity. Once a step: each call moves the loss scale on.
   */
  async clipGradients(maxNorm: number): Promise<number> {
    const gpu = this.k.gpu;
    const norms = new Norms(this.k);
    const partials = [...this.grads.keys()].map((name) => ({
      name,
      n: this.sizes.get(name)!,
      out: this.act(`norm.${name}`, norms.partials(this.sizes.get(name)!)),
    }));
    submit(gpu, (pass) => {
      for (const p of partials) norms.squares(pass, this.g(p.name), p.out, p.n);
    });
    let sum = 0;
    for (const p of partials) for (const v of await download(gpu, p.out, norms.partials(p.n))) sum += v;
    // Mixed precision: the gradients are the loss scale's multiple. One that overflowed f16 skips the step.
    const scale = this.scaler?.scale ?? 1;
    this.skipped = !!this.scaler && (!Number.isFinite(sum) || (await this.overflowed(OVERFLOW.backward))[0]!);
    this.scaler?.update(this.skipped);
    if (this.skipped) return Infinity;
    const norm = Math.sqrt(sum) / scale;
    const factor = (maxNorm > 0 && norm > maxNorm ? maxNorm / (norm + 1e-6) : 1) / scale;
    if (factor !== 1)
      submit(gpu, (pass) => {
        for (const p of partials) norms.scale(pass, this.g(p.name), p.n, factor);
      });
    return norm;
  }

  /** AdamW's first or second moment of a weight, as it is now. */
  moment(name: string, which: 'm' | 'v'): Promise<Float32Array> {
    const p = this.parameters().find((q) => q.name === name)!;
    return download(this.k.gpu, p[which], p.length);
  }

  /** A weight as it is now, as f32s in its layout. */
  weight(name: string): Promise<Float32Array> {
    return download(this.k.gpu, this.w(name), this.sizes.get(name)!);
  }

  /** A weight's gradient from the last step, as f32s in the weight's layout. */
  gradient(name: string): Promise<Float32Array> {
    return download(this.k.gpu, this.g(name), this.sizes.get(name)!);
  }

  /** Frees every buffer the model holds on the GPU. */
  dispose(): void {
    const moments = (this.optimizerState ?? []).flatMap((p) => [p.m, p.v]);
    for (const buffer of [
      ...this.weights.values(),
      ...this.grads.values(),
      ...[...this.activations.values()].map((a) => a.buffer),
      ...moments,
      ...this.f16Weights.values(),
      ...this.halfActs.values(),
      ...(this.overflow ? [this.overflow] : []),
    ])
      buffer.destroy();
    this.tables.dispose();
    this.activations.clear();
  }
}

/** A scorer of token blocks (trainers/data.ts) by `model`'s weights as they are now, on the GPU; dispose() frees them there. */
export const gpuScorer = (model: Llama, k: GpuKernels) =>
  heldScorer(model, 'webgpu', (weights) => new GpuLlama(model.config, weights, k, { trainable: false }));
