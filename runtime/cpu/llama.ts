// The Llama of model/llama.ts on the CPU path: its weights as f32 arrays, the forward pass to every position's
// log p(target) and its backward from d loss / d logp, written out layer by layer as runtime/webgpu/llama.ts
// writes them for the GPU, every weight's gradient left in `grads`. Its kernels are the C kernels
// (runtime/cpu/kernels.ts: OpenBLAS's GEMM, and RMSNorm, RoPE, SwiGLU, causal attention, the head's log-probs
// as C loops on every core); the embedding and biases are loops here. Every loss of the trainer is a function
// of those token log-probs (trainers/step.ts MicroBatch), so one backward serves SFT, DPO and friends, KTO and
// DAPO alike. Tested against the reference model: test/runtime/held-llama.test.ts, held-trainers.test.ts,
// test/runtime/cpu/kernels.test.ts.
//
// Shapes: N = B·T rows, D hidden, H query and K key/value heads of hd, F the MLP's width, V the vocabulary.
// A weight is stored (out, in) as transformers stores it, so a projection is x·Wᵀ, its input gradient dy·W
// and its weight gradient dyᵀ·x.
import type { LlamaConfig } from '../../model/config.ts';
import { ropeTable, type Llama } from '../../model/llama.ts';
import type { TokenBlock } from '../../model/windows.ts';
import { heldWeights, type HeldModel, type LoraWeights } from '../held.ts';
import { heldScorer } from '../scoring.ts';
import type { CpuParameter } from './adamw.ts';
import type { CpuKernels } from './kernels.ts';

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

/** C (M×N) = op(A) (M×K) · op(B) (K×N), row-major, written or added to C: the GEMM's contract on both engines. */
interface MatmulShape {
  m: number;
  n: number;
  k: number;
  /** A is stored K×M. */
  transposeA?: boolean;
  /** B is stored N×K. */
  transposeB?: boolean;
  /** C += op(A)·op(B) instead of C = op(A)·op(B). */
  accumulate?: boolean;
}

/** The logits a chunk of the head's rows may hold (16M f32s, 64 MiB): the N×V logits never exist whole. */
const HEAD_CHUNK = 1 << 24;

export class CpuLlama {
  readonly weights = new Map<string, Float32Array>();
  readonly grads = new Map<string, Float32Array>();
  private readonly activations = new Map<string, Float32Array>();
  private readonly slots = new Map<number, Slot>();
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

  /** The logits a chunk of the head's rows may hold. */
  private readonly headChunk: number;

  /**
   * As GpuLlama's: `trainable` false for scoring only; with `adapters`, only their A and B are trained.
   * `headChunk`: the logits the head makes at a time (default HEAD_CHUNK).
   */
  constructor(
    readonly config: LlamaConfig,
    weights: Map<string, Float32Array>,
    private readonly k: CpuKernels,
    o: { trainable?: boolean; adapters?: Map<string, LoraWeights>; headChunk?: number } = {},
  ) {
    this.headChunk = o.headChunk ?? HEAD_CHUNK;
    const held = heldWeights(config, weights, 'the CPU path', o);
    for (const w of held.weights) {
      this.weights.set(w.name, Float32Array.from(w.data));
      if (w.trained) this.grads.set(w.name, new Float32Array(w.data.length));
    }
    this.trained = held.weights.filter((w) => w.trained).map((w) => [w.name, w.decays]);
    this.adapters = held.adapters;
  }

  /** OpenBLAS's GEMM (its transposes read in place). */
  private mm(a: Float32Array, b: Float32Array, c: Float32Array, s: MatmulShape): void {
    const [tA, tB] = [s.transposeA ? 1 : 0, s.transposeB ? 1 : 0];
    this.k.sgemm(tA, tB, s.m, s.n, s.k, 1, a, tA ? s.m : s.k, b, tB ? s.k : s.n, s.accumulate ? 1 : 0, c, s.n);
  }

  /** Row ranges of at most headChunk logits. */
  private headChunks(rows: number, V: number): [number, number][] {
    const size = Math.max(1, Math.floor(this.headChunk / V));
    const out: [number, number][] = [];
    for (let r = 0; r < rows; r += size) out.push([r, Math.min(rows, r + size)]);
    return out;
  }

  /**
   * log p(target) and the logsumexp of every row of h (N × D) under the head W (V × D), a chunk of rows' logits
   * at a time (Liger's fused linear cross-entropy), and each row's entropy where asked.
   */
  private headForward(
    h: Float32Array,
    w: Float32Array,
    targets: Int32Array,
    logp: Float32Array,
    lse: Float32Array,
    entropy?: Float32Array,
  ): void {
    const [rows, D] = [targets.length, h.length / targets.length];
    const V = w.length / D;
    for (const [r0, r1] of this.headChunks(rows, V)) {
      const n = r1 - r0;
      const z = this.act('head.z', n * V);
      this.k.sgemm(0, 1, n, V, D, 1, h.subarray(r0 * D), D, w, D, 0, z, V);
      const e = entropy?.subarray(r0, r1) ?? null;
      this.k.logprobsForward(z, targets.subarray(r0, r1), logp.subarray(r0, r1), lse.subarray(r0, r1), e, n, V);
    }
  }

  /**
   * The head's backward: a chunk's logits made again and turned into dz = dlogp·(onehot(y) − softmax(z)) in
   * place; dh = dz·W, and dW += dzᵀ·h where the head is trained (`dw` null: frozen).
   */
  private headBackward(
    h: Float32Array,
    w: Float32Array,
    targets: Int32Array,
    lse: Float32Array,
    dlogp: Float32Array,
    dh: Float32Array,
    dw: Float32Array | null,
  ): void {
    const [rows, D] = [targets.length, h.length / targets.length];
    const V = w.length / D;
    for (const [r0, r1] of this.headChunks(rows, V)) {
      const n = r1 - r0;
      const [z, hc] = [this.act('head.z', n * V), h.subarray(r0 * D)];
      this.k.sgemm(0, 1, n, V, D, 1, hc, D, w, D, 0, z, V);
      this.k.logprobsBackward(z, targets.subarray(r0, r1), lse.subarray(r0, r1), dlogp.subarray(r0, r1), n, V);
      this.k.sgemm(0, 0, n, D, V, 1, z, V, w, D, 0, dh.subarray(r0 * D), D);
      if (dw) this.k.sgemm(1, 0, V, D, n, 1, z, V, hc, D, 1, dw, D);
    }
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
      B,
      T,
      N: B * T,
      D: c.hiddenSize,
      H: c.heads,
      K: c.kvHeads,
      hd: c.headDim,
      F: c.intermediateSize,
      head: c.tiedEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight',
      l: (i: number, n: string) => `model.layers.${i}.${n}`,
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
    const { c, B, T, N, D, H, K, hd, F, head, l, cos, sin, a } = this.sizesOf(b, slot);
    const s: Slot = {
      batch: b.batch,
      length: b.length,
      ids: b.ids,
      targets: b.targets,
      dropped: this.dropout !== null,
    };
    this.slots.set(slot, s);
    const project = (x: Float32Array, w: string, y: Float32Array, n: number, k: number) => {
      this.mm(x, this.w(w), y, { m: N, n, k, transposeB: true });
      const module = w.slice(0, -'.weight'.length);
      if (this.adapters.has(module)) this.adapterForward(module, s, a, x, y, N, n, k);
    };
    const x0 = a('x0', N * D);
    const table = this.w('model.embed_tokens.weight');
    for (let row = 0; row < N; row++) x0.set(table.subarray(b.ids[row]! * D, (b.ids[row]! + 1) * D), row * D);
    const mo = this.act('mo', N * D);
    // x_i = xm_{i−1} + mo_{i−1} (the previous layer's MLP added to its stream), normed in the same pass.
    const stream = (i: number, w: string, y: Float32Array, rstd: Float32Array) =>
      i === 0
        ? this.k.rmsnormForward(x0, null, null, this.w(w), y, rstd, N, D, c.rmsNormEps)
        : this.k.rmsnormForward(a(`xm.${i - 1}`, N * D), mo, a(`x${i}`, N * D), this.w(w), y, rstd, N, D, c.rmsNormEps);
    for (let i = 0; i < c.layers; i++) {
      const h1 = a(`h1.${i}`, N * D);
      stream(i, l(i, 'input_layernorm.weight'), h1, a(`r1.${i}`, N));
      const [q, k, v] = [a(`q.${i}`, N * H * hd), a(`k.${i}`, N * K * hd), a(`v.${i}`, N * K * hd)];
      project(h1, l(i, 'self_attn.q_proj.weight'), q, H * hd, D);
      project(h1, l(i, 'self_attn.k_proj.weight'), k, K * hd, D);
      project(h1, l(i, 'self_attn.v_proj.weight'), v, K * hd, D);
      if (c.attentionBias)
        for (const [which, y] of [
          ['q', q],
          ['k', k],
          ['v', v],
        ] as const)
          addBias(this.w(l(i, `self_attn.${which}_proj.bias`)), y, N);
      const [qr, kr] = [a(`qr.${i}`, N * H * hd), a(`kr.${i}`, N * K * hd)];
      this.k.rope(q, cos, sin, qr, N, T, H, hd, 1);
      this.k.rope(k, cos, sin, kr, N, T, K, hd, 1);
      const att = a(`att.${i}`, N * H * hd);
      this.k.attentionForward(qr, kr, v, a(`p.${i}`, N * H * T), att, B, T, H, K, hd);
      const ao = this.act('ao', N * D);
      project(att, l(i, 'self_attn.o_proj.weight'), ao, D, H * hd);
      const h2 = a(`h2.${i}`, N * D);
      const w2 = this.w(l(i, 'post_attention_layernorm.weight'));
      this.k.rmsnormForward(a(`x${i}`, N * D), ao, a(`xm.${i}`, N * D), w2, h2, a(`r2.${i}`, N), N, D, c.rmsNormEps);
      const [g, u, m] = [a(`g.${i}`, N * F), a(`u.${i}`, N * F), a(`m.${i}`, N * F)];
      project(h2, l(i, 'mlp.gate_proj.weight'), g, F, D);
      project(h2, l(i, 'mlp.up_proj.weight'), u, F, D);
      this.k.swigluForward(g, u, m, N * F);
      project(m, l(i, 'mlp.down_proj.weight'), mo, D, F);
    }
    const hf = a('hf', N * D);
    stream(c.layers, 'model.norm.weight', hf, a('rf', N));
    const logp = new Float32Array(N);
    this.headForward(hf, this.w(head), b.targets, logp, a('lse', N), entropy);
    return logp;
  }

  /** LoRA's term of a projection: y += (α/r)·(drop(x)·Aᵀ)·Bᵀ, keeping drop(x) and low = (α/r)·drop(x)·Aᵀ. */
  private adapterForward(
    module: string,
    s: Slot,
    a: (n: string, length: number) => Float32Array,
    x: Float32Array,
    y: Float32Array,
    rows: number,
    out: number,
    inner: number,
  ): void {
    const ad = this.adapters.get(module)!;
    let input = x;
    if (s.dropped && ad.dropout > 0) {
      const mask = a(`mask.${module}`, rows * inner);
      mask.set(this.dropout!.mask(rows, inner, ad.dropout, this.dropout!.seed + ad.index));
      input = a(`xd.${module}`, rows * inner);
      for (let i = 0; i < rows * inner; i++) input[i] = x[i]! * mask[i]!;
    }
    const low = a(`low.${module}`, rows * ad.r);
    this.mm(input, this.w(ad.a), low, { m: rows, n: ad.r, k: inner, transposeB: true });
    for (let i = 0; i < rows * ad.r; i++) low[i]! *= ad.scale;
    this.mm(low, this.w(ad.b), y, { m: rows, n: out, k: ad.r, transposeB: true, accumulate: true });
  }

  /** LoRA's backward from dy: dB += dyᵀ·low, dlow = (α/r)·dy·B, dA += dlowᵀ·drop(x), dx += drop'(dlow·A). */
  private adapterBackward(
    module: string,
    s: Slot,
    a: (n: string, length: number) => Float32Array,
    dy: Float32Array,
    x: Float32Array,
    dx: Float32Array,
    rows: number,
    out: number,
    inner: number,
  ): void {
    const ad = this.adapters.get(module)!;
    const masked = s.dropped && ad.dropout > 0;
    const input = masked ? a(`xd.${module}`, rows * inner) : x;
    const grad = (n: string) => this.grads.get(n) ?? this.act('frozen', this.w(n).length);
    const dlow = this.act('dlow', rows * ad.r);
    const low = a(`low.${module}`, rows * ad.r);
    this.mm(dy, low, grad(ad.b), { m: out, n: ad.r, k: rows, transposeA: true, accumulate: true });
    this.mm(dy, this.w(ad.b), dlow, { m: rows, n: ad.r, k: out });
    for (let i = 0; i < rows * ad.r; i++) dlow[i]! *= ad.scale;
    this.mm(dlow, input, grad(ad.a), { m: ad.r, n: inner, k: rows, transposeA: true, accumulate: true });
    if (!masked) this.mm(dlow, this.w(ad.a), dx, { m: rows, n: inner, k: ad.r, accumulate: true });
    else {
      const through = this.act(`dlowA`, rows * inner);
      this.mm(dlow, this.w(ad.a), through, { m: rows, n: inner, k: ad.r });
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
    if (!s) throw new Error(`the CPU path: no forward pass in slot ${slot} to take the backward of`);
    const { c, B, T, N, D, H, K, hd, F, head, l, cos, sin, a } = this.sizesOf(s, slot);
    const t = (n: string, length: number) => this.act(n, length); // scratch shared by every slot's backward
    // y = x·Wᵀ taken back from dy: dx = dy·W (written, or added to), W's gradient += dyᵀ·x where W is trained.
    const through = (
      dy: Float32Array,
      w: string,
      x: Float32Array,
      dx: Float32Array,
      out: number,
      inner: number,
      accumulate = false,
    ) => {
      this.mm(dy, this.w(w), dx, { m: N, n: inner, k: out, accumulate });
      const grad = this.grads.get(w);
      if (grad) this.mm(dy, x, grad, { m: out, n: inner, k: N, transposeA: true, accumulate: true });
      const module = w.slice(0, -'.weight'.length);
      if (this.adapters.has(module)) this.adapterBackward(module, s, a, dy, x, dx, N, out, inner);
    };
    // The residual stream's gradient: each norm's backward adds its dx to it, written into the other buffer.
    let [dx, spare] = [t('dx', N * D), t('dx.spare', N * D)];
    const norm = (x: Float32Array, w: string, rstd: Float32Array, dy: Float32Array, first = false) => {
      const dw = this.grads.get(w) ?? null;
      this.k.rmsnormBackward(x, this.w(w), rstd, dy, first ? null : dx, first ? dx : spare, dw, N, D);
      if (!first) [dx, spare] = [spare, dx];
    };
    const dh = t('dh', N * D);
    const headGrad = this.grads.get(head) ?? null;
    this.headBackward(a('hf', N * D), this.w(head), s.targets, a('lse', N), dlogp, dh, headGrad);
    norm(a(`x${c.layers}`, N * D), 'model.norm.weight', a('rf', N), dh, true);
    for (let i = c.layers - 1; i >= 0; i--) {
      // The MLP: dx is the gradient of x_{i+1} = xm + down(swiglu(gate(h2), up(h2))). Without adapters, each
      // weight's gradient is added in its GEMM (β = 1) and dg written over dm.
      const mlp = (n: string) => l(i, `mlp.${n}_proj.weight`);
      const [g, u, m, h2] = [a(`g.${i}`, N * F), a(`u.${i}`, N * F), a(`m.${i}`, N * F), a(`h2.${i}`, N * D)];
      if (['gate', 'up', 'down'].some((n) => this.adapters.has(mlp(n).slice(0, -'.weight'.length)))) {
        const [dm, dg, du] = [t('dm', N * F), t('dg', N * F), t('du', N * F)];
        through(dx, mlp('down'), m, dm, D, F);
        this.k.swigluBackward(g, u, dm, dg, du, N * F);
        through(dg, mlp('gate'), h2, dh, F, D);
        through(du, mlp('up'), h2, dh, F, D, true);
      } else {
        const [dg, du] = [t('dg', N * F), t('du', N * F)];
        const [wg, wu, wd] = [this.w(mlp('gate')), this.w(mlp('up')), this.w(mlp('down'))];
        this.k.sgemm(0, 0, N, F, D, 1, dx, D, wd, F, 0, dg, F);
        this.k.swigluBackward(g, u, dg, dg, du, N * F);
        this.k.sgemm(0, 0, N, D, F, 1, dg, F, wg, D, 0, dh, D);
        this.k.sgemm(0, 0, N, D, F, 1, du, F, wu, D, 1, dh, D);
        const grad = (n: string) => this.grads.get(mlp(n));
        if (grad('down')) this.k.sgemm(1, 0, D, F, N, 1, dx, D, m, F, 1, grad('down')!, F);
        if (grad('gate')) this.k.sgemm(1, 0, F, D, N, 1, dg, F, h2, D, 1, grad('gate')!, D);
        if (grad('up')) this.k.sgemm(1, 0, F, D, N, 1, du, F, h2, D, 1, grad('up')!, D);
      }
      norm(a(`xm.${i}`, N * D), l(i, 'post_attention_layernorm.weight'), a(`r2.${i}`, N), dh);
      // Attention: dx is now the gradient of xm = x_i + o_proj(attention(q, k, v)).
      const datt = t('datt', N * H * hd);
      through(dx, l(i, 'self_attn.o_proj.weight'), a(`att.${i}`, N * H * hd), datt, D, H * hd);
      const [dqr, dkr, dv] = [t('dqr', N * H * hd), t('dkr', N * K * hd), t('dv', N * K * hd)];
      const [qr, kr, v, p] = [
        a(`qr.${i}`, N * H * hd),
        a(`kr.${i}`, N * K * hd),
        a(`v.${i}`, N * K * hd),
        a(`p.${i}`, N * H * T),
      ];
      this.k.attentionBackward(qr, kr, v, p, datt, dqr, dkr, dv, B, T, H, K, hd);
      const [dq, dk] = [t('dq', N * H * hd), t('dk', N * K * hd)];
      this.k.rope(dqr, cos, sin, dq, N, T, H, hd, -1);
      this.k.rope(dkr, cos, sin, dk, N, T, K, hd, -1);
      const h1 = a(`h1.${i}`, N * D);
      through(dq, l(i, 'self_attn.q_proj.weight'), h1, dh, H * hd, D);
      through(dk, l(i, 'self_attn.k_proj.weight'), h1, dh, K * hd, D, true);
      through(dv, l(i, 'self_attn.v_proj.weight'), h1, dh, K * hd, D, true);
      for (const [which, dy] of [
        ['q', dq],
        ['k', dk],
        ['v', dv],
      ] as const) {
        const bias = this.grads.get(l(i, `self_attn.${which}_proj.bias`));
        if (c.attentionBias && bias) sumRows(dy, bias, N);
      }
      norm(a(`x${i}`, N * D), l(i, 'input_layernorm.weight'), a(`r1.${i}`, N), dh);
    }
    const table = this.grads.get('model.embed_tokens.weight');
    if (table)
      for (let row = 0; row < N; row++) {
        const [from, to] = [row * D, s.ids[row]! * D];
        for (let j = 0; j < D; j++) table[to + j]! += dx[from + j]!;
      }
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
    let sum = 0;
    for (const g of this.grads.values()) sum += this.k.sumSquares(g, g.length);
    const norm = Math.sqrt(sum);
    if (maxNorm > 0 && norm > maxNorm) {
      const factor = maxNorm / (norm + 1e-6);
      for (const g of this.grads.values()) this.k.scale(g, g.length, factor);
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

/** A scorer of token blocks (runtime/scoring.ts) by `model`'s weights as they are now, on the CPU path. */
export const cpuScorer = (model: Llama, k: CpuKernels) =>
  heldScorer(model, 'the CPU path', (weights) => new CpuLlama(model.config, weights, k, { trainable: false }));

/** y[row] += bias for each of `rows` rows. */
function addBias(bias: Float32Array, y: Float32Array, rows: number): void {
  const n = bias.length;
  for (let row = 0; row < rows; row++) for (let j = 0; j < n; j++) y[row * n + j]! += bias[j]!;
}

/** dbias += Σ over `rows` rows of dy. */
function sumRows(dy: Float32Array, dbias: Float32Array, rows: number): void {
  const n = dbias.length;
  for (let row = 0; row < rows; row++) for (let j = 0; j < n; j++) dbias[j]! += dy[row * n + j]!;
}
