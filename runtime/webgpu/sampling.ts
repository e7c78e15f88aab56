// The next token of each decoding sequence drawn on the GPU, from the logits where the head wrote them, as
// runtime/sampling.ts sampleToken draws it on the CPU: argmax at temperature 0, else the top-p nucleus of
// softmax(z / T) in order of probability (ties by id) and a draw u ∈ [0, 1) from the decoding's own random
// stream, r = u · (the nucleus's mass), the first token whose running mass reaches r. A step then reads back a
// token a sequence rather than its V logits.
//
// No sort: with p_j = exp((z_j − max z) / T) ≤ 1, the mass at or above a level, G(t) = Σ_{p_j ≥ t} p_j, falls
// as t rises, and the level where the running mass in order of probability reaches m is the largest t with
// G(t) ≥ m. Positive f32s order as their bits do, so that level is found by narrowing the bits of t eightfold a
// pass, at most 10 passes (all of a row's threads summing G at seven levels over V each time); ties at the level
// are taken in id order. Sums in f32 where the CPU's are in f64: a draw can differ only where r lies within
// rounding of a token's boundary.
// Tested against sampleToken: test/runtime/webgpu/sampling.test.ts.
/// <reference types="@webgpu/types" />
import { GpuKernels, fields, kernel, span, type Binding } from './kernel.ts';
import type { Draw } from '../sampling.ts';

/** f32s a row takes in the draws buffer: a Draw's temperature, topP and u (the fourth unused). */
const DRAW_FLOATS = 4;

const SAMPLE = kernel({
  threads: 'row',
  buffers: ['z: f32', 'draws: f32', 'mut tokens: u32'],
  dims: 'rows: u32, vocab: u32, skip: u32, first: u32',
  head: /* wgsl */ `
var<workgroup> best_value: array<f32, 256>;
var<workgroup> best_index: array<u32, 256>;
var<workgroup> uniform_f: f32;
var<workgroup> uniform_u: u32;
var<workgroup> owner: u32;
var<workgroup> owned: u32;
var<workgroup> many: array<f32, 1792>;

// Every row's probabilities by the same expression, so that a level found from them equals some of them.
fn prob(base: u32, j: u32, top: f32, t: f32) -> f32 { return exp((z[base + j] - top) / t); }

// Sums many[k * 256 + t] over the 256 threads for each k < n into many[k * 256], for every thread to read
// (then a barrier before many is written again): several reductions for the barriers of one.
fn sum_many(t: u32, n: u32) {
  workgroupBarrier();
  for (var stride = 128u; stride > 0u; stride >>= 1u) {
    if (t < stride) {
      for (var k = 0u; k < n; k++) { many[k * 256u + t] += many[k * 256u + t + stride]; }
    }
    workgroupBarrier();
  }
}

// The largest level whose G reaches m, between 0 (G is all the mass) and 2 (past every probability, the
// likeliest being 1): each pass sums G at seven levels evenly between lo (G reaches m) and hi (it does not) and
// keeps the eighth they bracket, so the 2^30 bit patterns below 2 narrow to one in at most 10 passes. (Where m
// is 0 the level found matches no probability, and the likeliest is drawn, as sampleToken draws at u = 0.)
fn level_of(t: u32, base: u32, top: f32, temp: f32, m: f32) -> u32 {
  var lo = 0u;
  var hi = bitcast<u32>(2.0);
  for (var i = 0u; i < 11u; i++) {
    if (t == 0u) { uniform_u = hi - lo; }
    if (workgroupUniformLoad(&uniform_u) <= 1u) { break; } // the same on every thread: a uniform exit
    let step = max(1u, (hi - lo + 7u) / 8u);
    var s = array<f32, 7>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var j = t; j < d.vocab; j += 256u) {
      let p = prob(base, j, top, temp);
      for (var k = 0u; k < 7u; k++) {
        if (p >= bitcast<f32>(lo + (k + 1u) * step)) { s[k] += p; }
      }
    }
    for (var k = 0u; k < 7u; k++) { many[k * 256u + t] = s[k]; }
    sum_many(t, 7u);
    var below = lo;
    var above = hi;
    for (var k = 0u; k < 7u; k++) {
      let level = lo + (k + 1u) * step;
      if (level < hi) {
        if (many[k * 256u] >= m) { below = level; } else { above = min(above, level); }
      }
    }
    workgroupBarrier();
    lo = below;
    hi = above;
  }
  return lo;
}

// The mass of the row's probabilities above level, and how many equal it (as an f32: exact below 2^24).
fn above_and_ties(t: u32, base: u32, top: f32, temp: f32, level: f32) -> vec2f {
  var above = 0.0;
  var ties = 0.0;
  for (var j = t; j < d.vocab; j += 256u) {
    let p = prob(base, j, top, temp);
    if (p > level) { above += p; } else if (p == level) { ties += 1.0; }
  }
  many[t] = above;
  many[256u + t] = ties;
  sum_many(t, 2u);
  let both = vec2f(many[0], many[256u]);
  workgroupBarrier();
  return both;
}`,
  body: /* wgsl */ `
  let t = lid.x;
  let base = d.skip + row * d.vocab;
  // The likeliest token, the lowest id among equals (a thread's ids rise, so its first maximum is its lowest).
  var value = -3.4e38;
  var index = 0u;
  for (var j = t; j < d.vocab; j += 256u) {
    if (z[base + j] > value) { value = z[base + j]; index = j; }
  }
  best_value[t] = value;
  best_index[t] = index;
  workgroupBarrier();
  for (var stride = 128u; stride > 0u; stride >>= 1u) {
    if (t < stride) {
      let v = best_value[t + stride];
      let i = best_index[t + stride];
      if (v > best_value[t] || (v == best_value[t] && i < best_index[t])) { best_value[t] = v; best_index[t] = i; }
    }
    workgroupBarrier();
  }
  let top = best_value[0];
  let likeliest = best_index[0]; // kept: best_index holds counts later
  // Draws and tokens are bound whole: the group's rows start at d.first there.
  let at = d.first + row;
  if (t == 0u) { uniform_f = draws[at * ${DRAW_FLOATS}u]; }
  let temp = workgroupUniformLoad(&uniform_f);
  if (temp <= 0.0) {
    if (t == 0u) { tokens[at] = likeliest; }
    return;
  }
  let top_p = draws[at * ${DRAW_FLOATS}u + 1u];
  let u = draws[at * ${DRAW_FLOATS}u + 2u];
  var mass = 0.0;
  for (var j = t; j < d.vocab; j += 256u) { mass += prob(base, j, top, temp); }
  let total = reduce(t, mass, false);

  // The nucleus: every probability above its last level tau, and of those equal to tau as many (in id order)
  // as bring the mass to top_p; all of them where top_p is 1.
  var nucleus = total;
  var tau = 0.0;
  var kept = 0.0;
  if (t == 0u) { uniform_f = top_p; }
  if (workgroupUniformLoad(&uniform_f) < 1.0) {
    let wanted = top_p * total;
    let bits = level_of(t, base, top, temp, wanted);
    tau = bitcast<f32>(bits);
    let at_tau = above_and_ties(t, base, top, temp, tau);
    kept = clamp(ceil((wanted - at_tau.x) / tau), 1.0, max(at_tau.y, 1.0));
    nucleus = at_tau.x + kept * tau;
  }

  // The drawn token: the level where the running mass reaches r, and the how-many-th of its equals.
  let r = u * nucleus;
  let bits = level_of(t, base, top, temp, r);
  var level = bitcast<f32>(bits);
  let at_level = above_and_ties(t, base, top, temp, level);
  var nth = clamp(ceil((r - at_level.x) / level) - 1.0, 0.0, max(at_level.y, 1.0) - 1.0);
  if (level < tau) {
    // Past the nucleus's last level (r within rounding of its mass): its last token.
    level = tau;
    nth = kept - 1.0;
  } else if (level == tau && kept > 0.0) {
    nth = min(nth, kept - 1.0);
  }
  // Which thread holds that tie: each counts its equals in a run of ids of its own, thread 0 adds them up.
  let chunk = (d.vocab + 255u) / 256u;
  let first = min(d.vocab, t * chunk);
  let last = min(d.vocab, first + chunk);
  var n = 0u;
  for (var j = first; j < last; j++) { if (prob(base, j, top, temp) == level) { n++; } }
  best_index[t] = n;
  workgroupBarrier();
  if (t == 0u) {
    var before = 0u;
    owner = 256u; // none: the level equals no probability, which rounding alone could make
    owned = 0u;
    for (var k = 0u; k < 256u; k++) {
      if (f32(before + best_index[k]) > nth) { owner = k; owned = u32(nth) - before; break; }
      before += best_index[k];
    }
  }
  workgroupBarrier();
  if (t == 0u && owner == 256u) { tokens[at] = likeliest; }
  if (t == owner) {
    var seen = 0u;
    for (var j = first; j < last; j++) {
      if (prob(base, j, top, temp) == level) {
        if (seen == owned) { tokens[at] = j; break; }
        seen++;
      }
    }
  }`,
});

/** Draws as the kernel reads them: DRAW_FLOATS f32s a row. */
export function drawParams(draws: readonly Draw[]): Float32Array {
  const params = new Float32Array(draws.length * DRAW_FLOATS);
  draws.forEach((d, r) => params.set([d.temperature, d.topP, d.u], r * DRAW_FLOATS));
  return params;
}

export class Sampler {
  constructor(private readonly k: GpuKernels) {}

  /**
   * The token each of `rows` rows of logits z (rows × vocab) draws with its Draw in `draws` (rows ×
   * DRAW_FLOATS), written to tokens (u32, one a row): in groups of rows whose logits fit one binding.
   */
  encode(pass: GPUComputePassEncoder, z: Binding, draws: Binding, tokens: Binding, rows: number, vocab: number): void {
    const group = Math.floor((this.k.bindingBytes - 256) / (vocab * 4));
    if (group < 1)
      throw new Error(
        `webgpu: a row of ${vocab} logits does not fit one binding of ${this.k.bindingBytes} bytes: sampling needs a larger binding`,
      );
    for (let from = 0; from < rows; from += group) {
      const n = Math.min(group, rows - from);
      const { binding, skip } = span(z, from * vocab, (from + n) * vocab);
      this.k.dispatch(
        pass,
        this.k.pipeline(SAMPLE),
        [binding, draws, tokens, this.k.uniform(fields({ u32: n }, { u32: vocab }, { u32: skip }, { u32: from }))],
        n,
      );
    }
  }
}
