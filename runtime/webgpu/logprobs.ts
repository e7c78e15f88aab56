// log p(target) at every position from the logits, and its backward, on the GPU: a fused log-softmax and
// gather (model/parameters.ts targetLogprobs does it in tfjs ops). Every loss of the trainer starts from
// these token log-probs, so its gradient arrives here as d/d logp per position and leaves as d/d logits:
//   logp_t = z_t[y_t] − logsumexp(z_t),   dz_t = dlogp_t · (onehot(y_t) − softmax(z_t)).
// A workgroup takes a row of V logits; the forward keeps each row's logsumexp for the backward.
/// <reference types="@webgpu/types" />
import { GpuKernels, fields, kernel, type Binding } from './kernel.ts';

const DIMS = 'rows: u32, vocab: u32';

const FORWARD = kernel({
  threads: 'row',
  buffers: ['z: f32', 'targets: i32', 'mut logp: f32', 'mut lse: f32'],
  dims: DIMS,
  body: `
  let base = row * d.vocab;
  var top = -3.4e38;
  for (var j = lid.x; j < d.vocab; j += 256u) { top = max(top, z[base + j]); }
  top = reduce(lid.x, top, true);
  var sum = 0.0;
  for (var j = lid.x; j < d.vocab; j += 256u) { sum += exp(z[base + j] - top); }
  let l = top + log(reduce(lid.x, sum, false));
  if (lid.x == 0u) {
    lse[row] = l;
    logp[row] = z[base + u32(targets[row])] - l;
  }`,
});

const BACKWARD = kernel({
  threads: 'row',
  head: 'override ACCUMULATE: bool = false;',
  buffers: ['z: f32', 'targets: i32', 'lse: f32', 'dlogp: f32', 'mut dz: f32'],
  dims: DIMS,
  body: `
  let base = row * d.vocab;
  let g = dlogp[row];
  let wanted = u32(targets[row]);
  for (var j = lid.x; j < d.vocab; j += 256u) {
    let hit = select(0.0, 1.0, j == wanted);
    let v = g * (hit - exp(z[base + j] - lse[row]));
    if (ACCUMULATE) { dz[base + j] += v; } else { dz[base + j] = v; }
  }`,
});

// Each row's entropy of the next token from its logits and the forward's logsumexp:
//   H_t = −Σ_j p_j·log p_j = lse_t − Σ_j p_j·z_tj,   p_j = exp(z_tj − lse_t).
const ENTROPY = kernel({
  threads: 'row',
  buffers: ['z: f32', 'lse: f32', 'mut entropy: f32'],
  dims: DIMS,
  body: `
  let base = row * d.vocab;
  let l = lse[row];
  var sum = 0.0;
  for (var j = lid.x; j < d.vocab; j += 256u) { sum += exp(z[base + j] - l) * z[base + j]; }
  let mean = reduce(lid.x, sum, false);
  if (lid.x == 0u) { entropy[row] = l - mean; }`,
});

export interface LogprobShape {
  rows: number;
  vocab: number;
  /** Backward: add to dz instead of writing it. */
  accumulate?: boolean;
}

export class TargetLogprobs {
  constructor(private readonly k: GpuKernels) {}

  private dims(s: LogprobShape): GPUBuffer {
    return this.k.uniform(fields({ u32: s.rows }, { u32: s.vocab }));
  }

  /** logp (rows) and lse (rows) from the logits z (rows × vocab) and the targets (rows, i32). */
  forward(
    pass: GPUComputePassEncoder,
    z: Binding,
    targets: Binding,
    logp: Binding,
    lse: Binding,
    s: LogprobShape,
  ): void {
    this.k.dispatch(pass, this.k.pipeline(FORWARD), [z, targets, logp, lse, this.dims(s)], s.rows);
  }

  /** Each row's entropy (rows) from the logits z (rows × vocab) and the forward's lse. */
  entropy(pass: GPUComputePassEncoder, z: Binding, lse: Binding, entropy: Binding, s: LogprobShape): void {
    this.k.dispatch(pass, this.k.pipeline(ENTROPY), [z, lse, entropy, this.dims(s)], s.rows);
  }

  /** dz (rows × vocab) from dlogp (rows), with the forward's z, targets and lse. */
  backward(
    pass: GPUComputePassEncoder,
    z: Binding,
    targets: Binding,
    lse: Binding,
    dlogp: Binding,
    dz: Binding,
    s: LogprobShape,
  ): void {
    this.k.dispatch(
      pass,
      this.k.pipeline(BACKWARD, { ACCUMULATE: s.accumulate ? 1 : 0 }),
      [z, targets, lse, dlogp, dz, this.dims(s)],
      s.rows,
    );
  }
}
