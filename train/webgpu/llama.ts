// The Llama of train/model.ts on the GPU: its weights in GPU buffers, an SFT step's forward and backward
// written out layer by layer from the kernels beside this file, every weight's gradient left in `grads`.
// The same arithmetic as the tfjs model (RMSNorm, RoPE, grouped-query causal attention, SwiGLU, tied or
// untied head), tested against it on small shapes: test/train/webgpu-llama.test.ts.
//
// Shapes: N = B·T rows, D hidden, H query and K key/value heads of hd, F the MLP's width, V the vocabulary.
// A weight is stored (out, in) as transformers stores it, so a projection is x·Wᵀ (the GEMM reads W
// transposed in place), its input gradient dy·W and its weight gradient dyᵀ·x.
/// <reference types="@webgpu/types" />
import { llamaParameterShapes, ropeTable, type LlamaConfig } from '../model.ts';
import type { GpuParameter } from './adamw.ts';
import { Attention } from './attention.ts';
import { download, submit, upload } from './buffers.ts';
import { Add, Embedding, Norms, Rope, SwiGlu, byToken } from './elementwise.ts';
import type { Kernels } from './kernel.ts';
import { TargetLogprobs } from './logprobs.ts';
import { Matmul, type MatmulShape } from './matmul.ts';
import { RmsNorm } from './rmsnorm.ts';

/** A batch of an SFT step: B rows of T tokens, each position's next token and whether it counts. */
export interface SftBatch {
  ids: Int32Array;
  targets: Int32Array;
  mask: Float32Array;
  batch: number;
  length: number;
}

export class GpuLlama {
  readonly weights = new Map<string, GPUBuffer>();
  readonly grads = new Map<string, GPUBuffer>();
  private readonly sizes = new Map<string, number>();
  private readonly activations = new Map<string, { buffer: GPUBuffer; length: number }>();
  private readonly mm: Matmul;
  private readonly norm: RmsNorm;
  private readonly rope: Rope;
  private readonly attention: Attention;
  private readonly swiglu: SwiGlu;
  private readonly add: Add;
  private readonly embedding: Embedding;
  private readonly logprobs: TargetLogprobs;
  private tables: { cos: GPUBuffer; sin: GPUBuffer; positions: number } | null = null;

  constructor(readonly config: LlamaConfig, weights: Map<string, Float32Array>, private readonly k: Kernels) {
    if (config.attentionBias) throw new Error('webgpu: attention biases (Qwen2) are not supported yet; train this model with --backend wasm');
    for (const [name, shape] of llamaParameterShapes(config)) {
      const size = shape.reduce((a, b) => a * b, 1);
      const data = weights.get(name);
      if (!data || data.length !== size) throw new Error(`webgpu: weight ${name} is missing or not of shape ${shape.join('×')}`);
      this.sizes.set(name, size);
      this.weights.set(name, upload(k.gpu, data));
      this.grads.set(name, upload(k.gpu, new Float32Array(size)));
    }
    [this.mm, this.norm, this.rope, this.attention, this.swiglu, this.add, this.embedding, this.logprobs] = [new Matmul(k), new RmsNorm(k), new Rope(k), new Attention(k), new SwiGlu(k), new Add(k), new Embedding(k), new TargetLogprobs(k)];
  }

  /** An activation's buffer of `length` f32s, kept from step to step while the shape stays. */
  private act(name: string, length: number): GPUBuffer {
    const held = this.activations.get(name);
    if (held && held.length === length) return held.buffer;
    held?.buffer.destroy();
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

  private rotation(positions: number): { cos: GPUBuffer; sin: GPUBuffer } {
    if (!this.tables || this.tables.positions < positions) {
      this.tables?.cos.destroy();
      this.tables?.sin.destroy();
      const table = ropeTable(positions, this.config.headDim, this.config.ropeTheta);
      this.tables = { cos: upload(this.k.gpu, table.cos), sin: upload(this.k.gpu, table.sin), positions };
    }
    return this.tables;
  }

  /**
   * One SFT step's loss, −Σ mask·log p(target) / max(Σ mask, 1) as train/losses/sft.ts defines it, and every
   * weight's gradient of it into `grads`: replacing what they held, or, with `accumulate`, added to it (a
   * batch in micro-batches, each gradient weighted by `scale`, its share of the batch's tokens).
   */
  async sftStep(b: SftBatch, o: { accumulate?: boolean; scale?: number } = {}): Promise<number> {
    const c = this.config;
    const { batch: B, length: T } = b;
    const [N, D, H, K, hd, F, V] = [B * T, c.hiddenSize, c.heads, c.kvHeads, c.headDim, c.intermediateSize, c.vocabSize];
    const gpu = this.k.gpu;
    const eps = c.rmsNormEps;
    const head = c.tiedEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight';
    const l = (i: number, n: string) => `model.layers.${i}.${n}`;
    const a = (n: string, length: number) => this.act(n, length);
    const project = (pass: GPUComputePassEncoder, x: GPUBuffer, w: string, y: GPUBuffer, m: number, n: number, k: number) => this.mm.encode(pass, x, this.w(w), y, { m, n, k, transposeB: true });
    const rows = { rows: N, dim: D, eps };
    const heads = { batch: B, length: T, heads: H, kvHeads: K, headDim: hd };
    const { cos, sin } = this.rotation(T);
    const ids = upload(gpu, b.ids);
    const targets = upload(gpu, b.targets);

    // Forward, keeping what the backward reads.
    submit(gpu, (pass) => {
      this.embedding.forward(pass, this.w('model.embed_tokens.weight'), ids, a('x0', N * D), N, D);
      for (let i = 0; i < c.layers; i++) {
        const x = a(`x${i}`, N * D);
        this.norm.forward(pass, x, this.w(l(i, 'input_layernorm.weight')), a(`h1.${i}`, N * D), a(`r1.${i}`, N), rows);
        project(pass, a(`h1.${i}`, N * D), l(i, 'self_attn.q_proj.weight'), a(`q.${i}`, N * H * hd), N, H * hd, D);
        project(pass, a(`h1.${i}`, N * D), l(i, 'self_attn.k_proj.weight'), a(`k.${i}`, N * K * hd), N, K * hd, D);
        project(pass, a(`h1.${i}`, N * D), l(i, 'self_attn.v_proj.weight'), a(`v.${i}`, N * K * hd), N, K * hd, D);
        this.rope.forward(pass, a(`q.${i}`, N * H * hd), cos, sin, a(`qr.${i}`, N * H * hd), { rows: N, heads: H, headDim: hd, length: T });
        this.rope.forward(pass, a(`k.${i}`, N * K * hd), cos, sin, a(`kr.${i}`, N * K * hd), { rows: N, heads: K, headDim: hd, length: T });
        this.attention.forward(pass, a(`qr.${i}`, N * H * hd), a(`kr.${i}`, N * K * hd), a(`v.${i}`, N * K * hd), a(`p.${i}`, B * H * T * T), a(`att.${i}`, N * H * hd), heads);
        project(pass, a(`att.${i}`, N * H * hd), l(i, 'self_attn.o_proj.weight'), a('ao', N * D), N, D, H * hd);
        this.add.encode(pass, x, a('ao', N * D), a(`xm.${i}`, N * D), N * D);
        this.norm.forward(pass, a(`xm.${i}`, N * D), this.w(l(i, 'post_attention_layernorm.weight')), a(`h2.${i}`, N * D), a(`r2.${i}`, N), rows);
        project(pass, a(`h2.${i}`, N * D), l(i, 'mlp.gate_proj.weight'), a(`g.${i}`, N * F), N, F, D);
        project(pass, a(`h2.${i}`, N * D), l(i, 'mlp.up_proj.weight'), a(`u.${i}`, N * F), N, F, D);
        this.swiglu.forward(pass, a(`g.${i}`, N * F), a(`u.${i}`, N * F), a(`m.${i}`, N * F), N * F);
        project(pass, a(`m.${i}`, N * F), l(i, 'mlp.down_proj.weight'), a('mo', N * D), N, D, F);
        this.add.encode(pass, a(`xm.${i}`, N * D), a('mo', N * D), a(`x${i + 1}`, N * D), N * D);
      }
      this.norm.forward(pass, a(`x${c.layers}`, N * D), this.w('model.norm.weight'), a('hf', N * D), a('rf', N), rows);
      project(pass, a('hf', N * D), head, a('logits', N * V), N, V, D);
      this.logprobs.forward(pass, a('logits', N * V), targets, a('logp', N), a('lse', N), { rows: N, vocab: V });
    });

    // The loss and its gradient with respect to each position's log-probability.
    const logp = await download(gpu, a('logp', N), N);
    const count = Math.max(b.mask.reduce((s, m) => s + m, 0), 1);
    let loss = 0;
    for (let t = 0; t < N; t++) loss -= b.mask[t]! * logp[t]!;
    const scale = o.scale ?? 1;
    const dlogp = upload(gpu, b.mask.map((m) => (-m / count) * scale));

    // Backward. Weight gradients are cleared, then every product adds to them (a tied table gets the head's
    // and the embedding's); dx carries the residual stream's gradient down the layers.
    if (!o.accumulate) {
      const encoder = gpu.device.createCommandEncoder();
      for (const grad of this.grads.values()) encoder.clearBuffer(grad);
      gpu.device.queue.submit([encoder.finish()]);
    }
    const sorted = byToken(b.ids, V);
    const grouped = { starts: upload(gpu, sorted.starts), positions: upload(gpu, sorted.positions) };
    const grad = (pass: GPUComputePassEncoder, dy: GPUBuffer, x: GPUBuffer, w: string, s: Omit<MatmulShape, 'transposeA' | 'accumulate'>) => this.mm.encode(pass, dy, x, this.g(w), { ...s, transposeA: true, accumulate: true });
    const back = (pass: GPUComputePassEncoder, dy: GPUBuffer, w: string, dx: GPUBuffer, m: number, n: number, k: number, accumulate = false) => this.mm.encode(pass, dy, this.w(w), dx, { m, n, k, accumulate });
    submit(gpu, (pass) => {
      const dx = a('dx', N * D);
      this.logprobs.backward(pass, a('logits', N * V), targets, a('lse', N), dlogp, a('dlogits', N * V), { rows: N, vocab: V });
      back(pass, a('dlogits', N * V), head, a('dh', N * D), N, D, V);
      grad(pass, a('dlogits', N * V), a('hf', N * D), head, { m: V, n: D, k: N });
      this.norm.backward(pass, a(`x${c.layers}`, N * D), this.w('model.norm.weight'), a('rf', N), a('dh', N * D), dx, this.g('model.norm.weight'), rows);
      for (let i = c.layers - 1; i >= 0; i--) {
        // The MLP: dx is the gradient of x_{i+1} = xm + down(swiglu(gate(h2), up(h2))).
        back(pass, dx, l(i, 'mlp.down_proj.weight'), a('dm', N * F), N, F, D);
        grad(pass, dx, a(`m.${i}`, N * F), l(i, 'mlp.down_proj.weight'), { m: D, n: F, k: N });
        this.swiglu.backward(pass, a(`g.${i}`, N * F), a(`u.${i}`, N * F), a('dm', N * F), a('dg', N * F), a('du', N * F), N * F);
        back(pass, a('dg', N * F), l(i, 'mlp.gate_proj.weight'), a('dh', N * D), N, D, F);
        back(pass, a('du', N * F), l(i, 'mlp.up_proj.weight'), a('dh', N * D), N, D, F, true);
        grad(pass, a('dg', N * F), a(`h2.${i}`, N * D), l(i, 'mlp.gate_proj.weight'), { m: F, n: D, k: N });
        grad(pass, a('du', N * F), a(`h2.${i}`, N * D), l(i, 'mlp.up_proj.weight'), { m: F, n: D, k: N });
        this.norm.backward(pass, a(`xm.${i}`, N * D), this.w(l(i, 'post_attention_layernorm.weight')), a(`r2.${i}`, N), a('dh', N * D), dx, this.g(l(i, 'post_attention_layernorm.weight')), { ...rows, accumulate: true });
        // Attention: dx is now the gradient of xm = x_i + o_proj(attention(q, k, v)).
        back(pass, dx, l(i, 'self_attn.o_proj.weight'), a('datt', N * H * hd), N, H * hd, D);
        grad(pass, dx, a(`att.${i}`, N * H * hd), l(i, 'self_attn.o_proj.weight'), { m: D, n: H * hd, k: N });
        this.attention.backward(pass, a(`qr.${i}`, N * H * hd), a(`kr.${i}`, N * K * hd), a(`v.${i}`, N * K * hd), a(`p.${i}`, B * H * T * T), a('datt', N * H * hd), a('ds', B * H * T * T), a('dqr', N * H * hd), a('dkr', N * K * hd), a('dv', N * K * hd), heads);
        this.rope.backward(pass, a('dqr', N * H * hd), cos, sin, a('dq', N * H * hd), { rows: N, heads: H, headDim: hd, length: T });
        this.rope.backward(pass, a('dkr', N * K * hd), cos, sin, a('dk', N * K * hd), { rows: N, heads: K, headDim: hd, length: T });
        back(pass, a('dq', N * H * hd), l(i, 'self_attn.q_proj.weight'), a('dh', N * D), N, D, H * hd);
        back(pass, a('dk', N * K * hd), l(i, 'self_attn.k_proj.weight'), a('dh', N * D), N, D, K * hd, true);
        back(pass, a('dv', N * K * hd), l(i, 'self_attn.v_proj.weight'), a('dh', N * D), N, D, K * hd, true);
        grad(pass, a('dq', N * H * hd), a(`h1.${i}`, N * D), l(i, 'self_attn.q_proj.weight'), { m: H * hd, n: D, k: N });
        grad(pass, a('dk', N * K * hd), a(`h1.${i}`, N * D), l(i, 'self_attn.k_proj.weight'), { m: K * hd, n: D, k: N });
        grad(pass, a('dv', N * K * hd), a(`h1.${i}`, N * D), l(i, 'self_attn.v_proj.weight'), { m: K * hd, n: D, k: N });
        this.norm.backward(pass, a(`x${i}`, N * D), this.w(l(i, 'input_layernorm.weight')), a(`r1.${i}`, N), a('dh', N * D), dx, this.g(l(i, 'input_layernorm.weight')), { ...rows, accumulate: true });
      }
      this.embedding.backward(pass, dx, grouped.starts, grouped.positions, this.g('model.embed_tokens.weight'), V, D);
    });
    await gpu.device.queue.onSubmittedWorkDone();
    for (const buffer of [ids, targets, dlogp, grouped.starts, grouped.positions]) buffer.destroy();
    return loss / count;
  }

  private optimizerState: GpuParameter[] | null = null;

  /** Every weight with its gradient and AdamW's moments (made at first use, zero), for GpuAdamW. */
  parameters(): GpuParameter[] {
    this.optimizerState ??= llamaParameterShapes(this.config).map(([name, shape]) => {
      const length = this.sizes.get(name)!;
      return { name, value: this.w(name), grad: this.g(name), m: upload(this.k.gpu, new Float32Array(length)), v: upload(this.k.gpu, new Float32Array(length)), length, decays: shape.length >= 2 };
    });
    return this.optimizerState;
  }

  /**
   * Scales every gradient so that their global L2 norm is at most `maxNorm` (train/optimizer.ts
   * clipByGlobalNorm); returns the norm before. The sums of squares are added up here in doubles.
   */
  async clipGradients(maxNorm: number): Promise<number> {
    const gpu = this.k.gpu;
    const norms = new Norms(this.k);
    const partials = [...this.grads.keys()].map((name) => ({ name, n: this.sizes.get(name)!, out: this.act(`norm.${name}`, Norms.partials(this.sizes.get(name)!)) }));
    submit(gpu, (pass) => {
      for (const p of partials) norms.squares(pass, this.g(p.name), p.out, p.n);
    });
    let sum = 0;
    for (const p of partials) for (const v of await download(gpu, p.out, Norms.partials(p.n))) sum += v;
    const norm = Math.sqrt(sum);
    if (maxNorm > 0 && norm > maxNorm) {
      const factor = maxNorm / (norm + 1e-6);
      submit(gpu, (pass) => {
        for (const p of partials) norms.scale(pass, this.g(p.name), p.n, factor);
      });
    }
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
}
