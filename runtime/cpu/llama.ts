// The Llama of model/llama.ts on the CPU path: its weights as f32 arrays, the forward pass to every position's
// log p(target) and its backward from d loss / d logp, written out layer by layer as runtime/webgpu/llama.ts
// writes them for the GPU, every weight's gradient left in `grads`. Its kernels are small ONNX graphs that ONNX
// Runtime runs on every core (the GEMM, attention, RMSNorm, RoPE, SwiGLU, the head with the log-probs, the MLP's
// backward), or the C kernels where they are here (runtime/cpu/kernels.ts: each kernel class takes the runtime's
// `native` in place of its graph); the embedding and biases are loops. Every loss of the trainer is a function of those token
// log-probs (trainers/step.ts MicroBatch), so one backward serves SFT, DPO and friends, KTO and DAPO alike.
// Tested against the tfjs model: test/runtime/held-llama.test.ts, held-trainers.test.ts, ort-kernels.test.ts.
//
// Shapes: N = B·T rows, D hidden, H query and K key/value heads of hd, F the MLP's width, V the vocabulary.
// A weight is stored (out, in) as transformers stores it, so a projection is x·Wᵀ, its input gradient dy·W
// and its weight gradient dyᵀ·x.
import { ropeTable, type Llama } from '../../model/llama.ts';
import type { TokenBlock } from '../../model/windows.ts';
import type { CpuParameter } from './adamw.ts';
import { Attention } from '../onnx/attention.ts';
import * as ew from '../onnx/elementwise.ts';
import { HeadLogprobs } from '../onnx/logprobs.ts';
import { Matmul } from '../onnx/matmul.ts';
import { MlpBackward } from '../onnx/mlp.ts';
import type { NativeKernels } from './kernels.ts';
import type { OrtRuntime } from '../onnx/onnx.ts';
import { RmsNorm } from '../onnx/rmsnorm.ts';
import type { LlamaConfig } from '../../model/config.ts';
import { heldWeights, type HeldModel, type LoraWeights } from '../held.ts';
import { heldScorer } from '../scoring.ts';

/** An adapter's A and B by their PEFT names among the weights, and the rest of LoraWeights. */
type CpuAdapter = Omit<LoraWeights, 'a' | 'b'> & { a: string; b: string };

/** What a slot's forward leaves for its backward besides its activations. */
interface Slot {
  batch: number;
  length: number;
  ids: Int32Array;
  targets: Int32Array;
  /** Whether LoRA's dropout masks were drawn for this forward. */
  dropped: boolean;
}

export class OrtLlama {
  readonly weights = new Map<string, Float32Array>();
  readonly grads = new Map<string, Float32Array>();
  private readonly activations = new Map<string, Float32Array>();
  private readonly slots = new Map<number, Slot>();
  private readonly mm: Matmul;
  private readonly native: NativeKernels | null;
  private readonly attention: Attention;
  private readonly norm: RmsNorm;
  private readonly rope: ew.Rope;
  private readonly swiglu: ew.SwiGlu;
  private readonly head: HeadLogprobs;
  private readonly mlp: MlpBackward;
  private table: { cos: Float32Array; sin: Float32Array; positions: number } = {
    cos: new Float32Array(0),
    sin: new Float32Array(0),
    positions: 0,
  };
  private readonly adapters: Map<string, CpuAdapter>;
  /** The weights trained, in order, and whether AdamW decays them. */
  private readonly trained: [string, boolean][];
  /** LoRA's dropout for this step's forward passes, as GpuLlama's; null: none. */
  dropout: HeldModel['dropout'] = null;

  /** As GpuLlama's: `trainable` false for scoring only; with `adapters`, only their A and B are trained. */
  constructor(
    readonly config: LlamaConfig,
    weights: Map<string, Float32Array>,
    ort: OrtRuntime,
    o: { trainable?: boolean; adapters?: Map<string, LoraWeights> } = {},
  ) {
    const held = heldWeights(config, weights, 'onnxruntime', o);
    for (const w of held.weights) {
      this.weights.set(w.name, Float32Array.from(w.data));
      if (w.trained) this.grads.set(w.name, new Float32Array(w.data.length));
    }
    this.trained = held.weights.filter((w) => w.trained).map((w) => [w.name, w.decays]);
    this.adapters = held.adapters;
    this.native = ort.native;
    this.mm = new Matmul(ort);
    this.attention = new Attention(ort);
    this.norm = new RmsNorm(ort);
    this.rope = new ew.Rope(ort);
    this.swiglu = new ew.SwiGlu(ort);
    this.head = new HeadLogprobs(ort);
    this.mlp = new MlpBackward(ort);
  }

  /**
   * An activation of `length` f32s: the head of a buffer kept from step to step and grown only, since batches
   * of windows differ in length and a new array each step is zeroed and collected.
   */
  private act(name: string, length: number): Float32Array {
    let a = this.activations.get(name);
    if (!a || a.length < length) this.activations.set(name, (a = new Float32Array(length)));
    return a.length === length ? a : a.subarray(0, length);
  }

  private w(name: string): Float32Array {
    return this.weights.get(name)!;
  }

  private cosSin(length: number): { cos: Float32Array; sin: Float32Array } {
    if (this.table.positions < length) {
      const positions = Math.max(length, 2 * this.table.positions, 64);
      this.table = { ...ropeTable(positions, this.config.headDim, this.config.ropeTheta), positions };
    }
    return this.table;
  }

  private sizesOf({ batch: B, length: T }: { batch: number; length: number }, slot: number) {
    const c = this.config;
    return {
      c,
      N: B * T,
      D: c.hiddenSize,
      H: c.heads,
      K: c.kvHeads,
      hd: c.headDim,
      F: c.intermediateSize,
      head: c.tiedEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight',
      l: (i: number, n: string) => `model.layers.${i}.${n}`,
      heads: { batch: B, length: T, heads: c.heads, kvHeads: c.kvHeads, headDim: c.headDim },
      rope: (heads: number) => ({ batch: B, length: T, heads, headDim: c.headDim }),
      ...this.cosSin(T),
      a: (n: string, length: number) => this.act(`${slot}/${n}`, length),
    };
  }

  /**
   * The forward pass of a block into slot `slot`: every position's log p(target) (B·T), and with `entropy`
   * each position's entropy of the next token written there. The slot keeps what its backward reads until its
   * next forward, so DPO's chosen and rejected sides each keep theirs.
   */
  async forward(b: TokenBlock, slot = 0, entropy?: Float32Array): Promise<Float32Array> {
    const { c, N, D, H, K, hd, F, head, l, heads, rope, cos, sin, a } = this.sizesOf(b, slot);
    const s: Slot = {
      batch: b.batch,
      length: b.length,
      ids: b.ids,
      targets: b.targets,
      dropped: this.dropout !== null,
    };
    this.slots.set(slot, s);
    const project = async (x: Float32Array, w: string, y: Float32Array, n: number, k: number) => {
      await this.mm.run(x, this.w(w), y, { m: N, n, k, transposeB: true });
      const module = w.slice(0, -'.weight'.length);
      if (this.adapters.has(module)) await this.adapterForward(module, s, a, x, y, N, n, k);
    };
    ew.embeddingForward(this.w('model.embed_tokens.weight'), b.ids, a('x0', N * D), D);
    const mo = this.act('mo', N * D);
    // x_i = xm_{i−1} + mo_{i−1} (the previous layer's MLP added to its stream), normed in the same pass.
    const stream = (i: number, w: string, y: Float32Array, rstd: Float32Array) =>
      this.norm.forward(i === 0 ? a('x0', N * D) : a(`xm.${i - 1}`, N * D), this.w(w), y, rstd, {
        rows: N,
        eps: c.rmsNormEps,
        ...(i === 0 ? {} : { r: mo, s: a(`x${i}`, N * D) }),
      });
    for (let i = 0; i < c.layers; i++) {
      const h1 = a(`h1.${i}`, N * D);
      await stream(i, l(i, 'input_layernorm.weight'), h1, a(`r1.${i}`, N));
      const [q, k, v] = [a(`q.${i}`, N * H * hd), a(`k.${i}`, N * K * hd), a(`v.${i}`, N * K * hd)];
      await project(h1, l(i, 'self_attn.q_proj.weight'), q, H * hd, D);
      await project(h1, l(i, 'self_attn.k_proj.weight'), k, K * hd, D);
      await project(h1, l(i, 'self_attn.v_proj.weight'), v, K * hd, D);
      if (c.attentionBias)
        for (const [which, y] of [
          ['q', q],
          ['k', k],
          ['v', v],
        ] as const)
          ew.biasForward(this.w(l(i, `self_attn.${which}_proj.bias`)), y, N);
      const [qr, kr] = [a(`qr.${i}`, N * H * hd), a(`kr.${i}`, N * K * hd)];
      await this.rope.forward(q, cos, sin, qr, rope(H));
      await this.rope.forward(k, cos, sin, kr, rope(K));
      const att = a(`att.${i}`, N * H * hd);
      await this.attention.forward(qr, kr, v, a(`p.${i}`, N * H * b.length), att, heads);
      const ao = this.act('ao', N * D);
      await project(att, l(i, 'self_attn.o_proj.weight'), ao, D, H * hd);
      const h2 = a(`h2.${i}`, N * D);
      await this.norm.forward(a(`x${i}`, N * D), this.w(l(i, 'post_attention_layernorm.weight')), h2, a(`r2.${i}`, N), {
        rows: N,
        eps: c.rmsNormEps,
        r: ao,
        s: a(`xm.${i}`, N * D),
      });
      const [g, u, m] = [a(`g.${i}`, N * F), a(`u.${i}`, N * F), a(`m.${i}`, N * F)];
      await project(h2, l(i, 'mlp.gate_proj.weight'), g, F, D);
      await project(h2, l(i, 'mlp.up_proj.weight'), u, F, D);
      await this.swiglu.forward(g, u, m, N * F);
      await project(m, l(i, 'mlp.down_proj.weight'), mo, D, F);
    }
    const hf = a('hf', N * D);
    await stream(c.layers, 'model.norm.weight', hf, a('rf', N));
    const logp = new Float32Array(N);
    await this.head.forward(hf, this.w(head), b.targets, logp, a('lse', N), entropy);
    return logp;
  }

  /** LoRA's term of a projection: y += (α/r)·(drop(x)·Aᵀ)·Bᵀ, keeping drop(x) and low = (α/r)·drop(x)·Aᵀ. */
  private async adapterForward(
    module: string,
    s: Slot,
    a: (n: string, length: number) => Float32Array,
    x: Float32Array,
    y: Float32Array,
    rows: number,
    out: number,
    inner: number,
  ): Promise<void> {
    const ad = this.adapters.get(module)!;
    let input = x;
    if (s.dropped && ad.dropout > 0) {
      const mask = a(`mask.${module}`, rows * inner);
      mask.set(this.dropout!.mask(rows, inner, ad.dropout, this.dropout!.seed + ad.index));
      input = a(`xd.${module}`, rows * inner);
      for (let i = 0; i < rows * inner; i++) input[i] = x[i]! * mask[i]!;
    }
    const low = a(`low.${module}`, rows * ad.r);
    await this.mm.run(input, this.w(ad.a), low, { m: rows, n: ad.r, k: inner, transposeB: true });
    for (let i = 0; i < rows * ad.r; i++) low[i]! *= ad.scale;
    await this.mm.run(low, this.w(ad.b), y, { m: rows, n: out, k: ad.r, transposeB: true, accumulate: true });
  }

  /** LoRA's backward from dy: dB += dyᵀ·low, dlow = (α/r)·dy·B, dA += dlowᵀ·drop(x), dx += drop'(dlow·A). */
  private async adapterBackward(
    module: string,
    s: Slot,
    a: (n: string, length: number) => Float32Array,
    dy: Float32Array,
    x: Float32Array,
    dx: Float32Array,
    rows: number,
    out: number,
    inner: number,
  ): Promise<void> {
    const ad = this.adapters.get(module)!;
    const masked = s.dropped && ad.dropout > 0;
    const input = masked ? a(`xd.${module}`, rows * inner) : x;
    const grad = (n: string) => this.grads.get(n) ?? this.act('frozen', this.w(n).length);
    const dlow = this.act('dlow', rows * ad.r);
    const low = a(`low.${module}`, rows * ad.r);
    await this.mm.run(dy, low, grad(ad.b), { m: out, n: ad.r, k: rows, transposeA: true, accumulate: true });
    await this.mm.run(dy, this.w(ad.b), dlow, { m: rows, n: ad.r, k: out });
    for (let i = 0; i < rows * ad.r; i++) dlow[i]! *= ad.scale;
    await this.mm.run(dlow, input, grad(ad.a), { m: ad.r, n: inner, k: rows, transposeA: true, accumulate: true });
    if (!masked) await this.mm.run(dlow, this.w(ad.a), dx, { m: rows, n: inner, k: ad.r, accumulate: true });
    else {
      const through = this.act(`dlowA`, rows * inner);
      await this.mm.run(dlow, this.w(ad.a), through, { m: rows, n: inner, k: ad.r });
      const mask = a(`mask.${module}`, rows * inner);
      for (let i = 0; i < rows * inner; i++) dx[i]! += through[i]! * mask[i]!;
    }
  }

  /** Clears every weight's gradient: a step's backward passes then add to them. */
  zeroGradients(): void {
    for (const g of this.grads.values()) g.fill(0);
  }

  /**
   * The backward pass of slot `slot`'s last forward, from the loss's gradient with respect to each of its
   * positions' log-probabilities (B·T): every weight's gradient is added to `grads` (a tied table gets the
   * head's and the embedding's); dx carries the residual stream's gradient down the layers.
   */
  async backward(slot: number, dlogp: Float32Array): Promise<void> {
    const s = this.slots.get(slot);
    if (!s) throw new Error(`onnxruntime: no forward pass in slot ${slot} to take the backward of`);
    const { c, N, D, H, K, hd, F, head, l, heads, rope, cos, sin, a } = this.sizesOf(s, slot);
    const t = (n: string, length: number) => this.act(n, length); // scratch shared by every slot's backward
    // y = x·Wᵀ taken back from dy: dx = dy·W (written, or added to), W's gradient += dyᵀ·x where W is trained.
    const through = async (
      dy: Float32Array,
      w: string,
      x: Float32Array,
      dx: Float32Array,
      out: number,
      inner: number,
      accumulate = false,
    ) => {
      await this.mm.run(dy, this.w(w), dx, { m: N, n: inner, k: out, accumulate });
      const grad = this.grads.get(w);
      if (grad) await this.mm.run(dy, x, grad, { m: out, n: inner, k: N, transposeA: true, accumulate: true });
      const module = w.slice(0, -'.weight'.length);
      if (this.adapters.has(module)) await this.adapterBackward(module, s, a, dy, x, dx, N, out, inner);
    };
    // The residual stream's gradient: each norm's backward adds its dx to it, written into the other buffer.
    let [dx, spare] = [t('dx', N * D), t('dx.spare', N * D)];
    const norm = async (x: Float32Array, w: string, rstd: Float32Array, dy: Float32Array, first = false) => {
      const o = { rows: N, ...(first ? {} : { dxIn: dx }) };
      await this.norm.backward(x, this.w(w), rstd, dy, first ? dx : spare, this.grads.get(w) ?? null, o);
      if (!first) [dx, spare] = [spare, dx];
    };
    const dh = t('dh', N * D);
    const headGrad = this.grads.get(head) ?? null;
    await this.head.backward(a('hf', N * D), this.w(head), s.targets, a('lse', N), dlogp, dh, headGrad);
    await norm(a(`x${c.layers}`, N * D), 'model.norm.weight', a('rf', N), dh, true);
    for (let i = c.layers - 1; i >= 0; i--) {
      // The MLP: dx is the gradient of x_{i+1} = xm + down(swiglu(gate(h2), up(h2))). In one graph, unless
      // one of its projections has an adapter.
      const mlp = (n: string) => l(i, `mlp.${n}_proj.weight`);
      const [g, u, m, h2] = [a(`g.${i}`, N * F), a(`u.${i}`, N * F), a(`m.${i}`, N * F), a(`h2.${i}`, N * D)];
      if (['gate', 'up', 'down'].some((n) => this.adapters.has(mlp(n).slice(0, -'.weight'.length)))) {
        const [dm, dg, du] = [t('dm', N * F), t('dg', N * F), t('du', N * F)];
        await through(dx, mlp('down'), m, dm, D, F);
        await this.swiglu.backward(g, u, dm, dg, du, N * F);
        await through(dg, mlp('gate'), h2, dh, F, D);
        await through(du, mlp('up'), h2, dh, F, D, true);
      } else {
        const weight = (n: string) => ({ value: this.w(mlp(n)), grad: this.grads.get(mlp(n)) ?? null });
        await this.mlp.run(dx, h2, g, u, m, { gate: weight('gate'), up: weight('up'), down: weight('down') }, dh, N);
      }
      await norm(a(`xm.${i}`, N * D), l(i, 'post_attention_layernorm.weight'), a(`r2.${i}`, N), dh);
      // Attention: dx is now the gradient of xm = x_i + o_proj(attention(q, k, v)).
      const datt = t('datt', N * H * hd);
      await through(dx, l(i, 'self_attn.o_proj.weight'), a(`att.${i}`, N * H * hd), datt, D, H * hd);
      const [dqr, dkr, dv] = [t('dqr', N * H * hd), t('dkr', N * K * hd), t('dv', N * K * hd)];
      await this.attention.backward(
        a(`qr.${i}`, N * H * hd),
        a(`kr.${i}`, N * K * hd),
        a(`v.${i}`, N * K * hd),
        a(`p.${i}`, N * H * s.length),
        datt,
        dqr,
        dkr,
        dv,
        heads,
      );
      const [dq, dk] = [t('dq', N * H * hd), t('dk', N * K * hd)];
      await this.rope.backward(dqr, cos, sin, dq, rope(H));
      await this.rope.backward(dkr, cos, sin, dk, rope(K));
      const h1 = a(`h1.${i}`, N * D);
      await through(dq, l(i, 'self_attn.q_proj.weight'), h1, dh, H * hd, D);
      await through(dk, l(i, 'self_attn.k_proj.weight'), h1, dh, K * hd, D, true);
      await through(dv, l(i, 'self_attn.v_proj.weight'), h1, dh, K * hd, D, true);
      for (const [which, dy] of [
        ['q', dq],
        ['k', dk],
        ['v', dv],
      ] as const) {
        const bias = this.grads.get(l(i, `self_attn.${which}_proj.bias`));
        if (c.attentionBias && bias) ew.biasBackward(dy, bias, N);
      }
      await norm(a(`x${i}`, N * D), l(i, 'input_layernorm.weight'), a(`r1.${i}`, N), dh);
    }
    const table = this.grads.get('model.embed_tokens.weight');
    if (table) ew.embeddingBackward(dx, s.ids, table, D);
  }

  private optimizerState: CpuParameter[] | null = null;

  /** Every weight trained (the adapters' with LoRA) with its gradient and AdamW's moments (zero at first use). */
  parameters(): CpuParameter[] {
    this.optimizerState ??= this.trained.map(([name, decays]) => {
      const value = this.w(name);
      return {
        name,
        value,
        grad: this.grads.get(name)!,
        m: new Float32Array(value.length),
        v: new Float32Array(value.length),
        decays,
      };
    });
    return this.optimizerState;
  }

  /** Scales every gradient so that their global L2 norm is at most `maxNorm` (clipByGlobalNorm); returns the norm before. */
  clipGradients(maxNorm: number): number {
    const native = this.native;
    let sum = 0;
    for (const g of this.grads.values())
      if (native) sum += native.sumSquares(g, g.length);
      else for (let i = 0; i < g.length; i++) sum += g[i]! * g[i]!;
    const norm = Math.sqrt(sum);
    if (maxNorm > 0 && norm > maxNorm) {
      const factor = maxNorm / (norm + 1e-6);
      for (const g of this.grads.values())
        if (native) native.scale(g, g.length, factor);
        else for (let i = 0; i < g.length; i++) g[i]! *= factor;
    }
    return norm;
  }

  /** A weight as it is now, in its layout (as GpuLlama's, whose weights must be read back). */
  async weight(name: string): Promise<Float32Array> {
    return this.w(name);
  }

  /** A weight's gradient from the last step, in the weight's layout. */
  async gradient(name: string): Promise<Float32Array> {
    return this.grads.get(name)!;
  }

  /** Frees the activations (the arrays go to the garbage collector). */
  dispose(): void {
    this.activations.clear();
    this.slots.clear();
  }
}

/** A scorer of token blocks (trainers/data.ts) by `model`'s weights as they are now, on the CPU path. */
export const ortScorer = (model: Llama, ort: OrtRuntime) =>
  heldScorer(model, 'onnxruntime', (weights) => new OrtLlama(model.config, weights, ort, { trainable: false }));
