// The next token from a model's logits, as every decoder in the trainer draws it.
import type { Random } from '../core/random.ts';

/** What a token is drawn with where the logits are (runtime/webgpu/sampling.ts): sampleToken's arguments, its one random number drawn ahead. */
export interface Draw {
  temperature: number;
  topP: number;
  /** The decoding's random number for this token, in [0, 1) (rand()'s next); unused at temperature 0. */
  u: number;
}

/** Draws as the C kernels' drawRows takes them: temperature, topP and u, a row after another, in doubles. */
export function drawArray(draws: readonly Draw[]): Float64Array {
  return Float64Array.from(draws.flatMap((d) => [d.temperature, d.topP, d.u]));
}

let probs = new Float64Array(0);
let sorted = new Float64Array(0);
/** drawByMass's buckets: 16 a halving of the probability, 64 halvings, the smaller ones in the last. */
const BUCKETS = 1024;
const bucketMass = new Float64Array(BUCKETS);
/** Probabilities (relative to the largest, 1) from which the nucleus is looked for first. */
const CUTOFF = 1e-4;

/**
 * One token from logits: argmax at temperature 0, else a draw from the top-p nucleus of softmax(logits /
 * temperature): the tokens in order of probability (ties by id) until their mass reaches topP, one drawn in
 * proportion. Typed arrays reused from call to call: a decoding step draws one token a sequence.
 * The order is found by sorting the probabilities alone (a typed array's own numeric sort, several times
 * faster than sorting ids with a comparator); the drawn rank is then mapped back to its id, the k-th among
 * equal probabilities being the k-th such id. The same draws, to the bit, as sorting the ids; at top-p 1
 * (no nucleus to cut) the drawn token is found without a sort (drawByMass), the same but where the draw lies
 * within rounding of a token's boundary. Throws where the logits give no distribution to draw from (NaN,
 * infinite, or every one -Infinity) at a temperature above 0.
 */
export function sampleToken(logits: Float32Array, temperature: number, topP: number, rand: Random): number {
  const V = logits.length;
  let best = 0;
  for (let i = 1; i < V; i++) if (logits[i]! > logits[best]!) best = i;
  if (temperature <= 0) return best;
  if (probs.length < V) {
    probs = new Float64Array(V);
    sorted = new Float64Array(V);
  }
  const top = logits[best]!;
  let total = 0;
  for (let i = 0; i < V; i++) total += probs[i] = Math.exp((logits[i]! - top) / temperature);
  if (!(total > 0) || !Number.isFinite(total))
    throw new Error('sampleToken: no token to draw: the logits give no distribution (NaN, infinite, or all -Infinity)');
  // At top-p 1 the nucleus is every token: nothing to sort for, only the token where the mass reaches r.
  if (topP >= 1) return drawByMass(V, rand() * total, best);
  // The nucleus is a prefix of the probabilities in order: it is looked for first among those within a factor
  // of CUTOFF of the largest (a few dozen values to sort rather than V, where the sort was most of a draw),
  // and among all V only where their mass falls short of topP. The same prefix either way.
  let n = 0;
  for (let i = 0; i < V; i++) if (probs[i]! >= CUTOFF) sorted[n++] = probs[i]!;
  let ascending = sorted.subarray(0, n);
  ascending.sort();
  const ranked = (k: number) => ascending[ascending.length - 1 - k]!; // the k-th largest probability
  let size = 0;
  let mass = 0;
  let nucleus = 0;
  for (let pass = 0; pass < 2; pass++) {
    [size, mass, nucleus] = [0, 0, 0];
    while (size < ascending.length) {
      const p = ranked(size++);
      nucleus += p;
      mass += p / total;
      if (mass >= topP) break;
    }
    if (mass >= topP || ascending.length === V) break;
    ascending = sorted.subarray(0, V);
    ascending.set(probs.subarray(0, V));
    ascending.sort();
  }
  let r = rand() * nucleus;
  let k = 0;
  while (k < size - 1 && (r -= ranked(k)) > 0) k++;
  // The rank back to an id: the how-many-th of its equals it is, among the ids with that probability in order.
  const p = ranked(k);
  let before = 0;
  while (before < k && ranked(k - before - 1) === p) before++;
  return nthOf(p, before, V);
}

/** The id of the k-th token (from 0, in id order) whose probability is p. */
function nthOf(p: number, k: number, V: number): number {
  for (let id = 0; id < V; id++) if (probs[id] === p && k-- === 0) return id;
  throw new Error('sampleToken: the drawn probability belongs to no token');
}

const median = (x: number, y: number, z: number) => Math.max(Math.min(x, y), Math.min(Math.max(x, y), z));

/**
 * The bucket of a probability in [0, 1]: its double's exponent and first four fraction bits (the top 16 bits
 * of its high word) counted down from 1's, so larger probabilities are in smaller buckets and the buckets in
 * order are the probabilities in order; 0 and the smallest share the last.
 */
function bucketOf(high: number): number {
  return Math.min(BUCKETS - 1, 0x3ff0 - (high >>> 16));
}

/**
 * The token at which the running mass of probs[0..V), in order of probability (ties by id), first reaches r:
 * what walking them sorted finds, found without a sort. One pass sums the mass by bucket (each a sixteenth of
 * a halving: no branch to mispredict), which says in which bucket r falls; that bucket's values alone then
 * go through three-way partitions around a pivot (the mass above it says on which side r falls). Its sums run
 * in another order than the walk's: a draw can differ from the walk's only where r lies within rounding of a
 * boundary.
 */
function drawByMass(V: number, r: number, best: number): number {
  if (r <= 0) return best;
  const high = new Uint32Array(probs.buffer, probs.byteOffset, 2 * V); // little-endian: the high word second
  bucketMass.fill(0);
  for (let i = 0; i < V; i++) bucketMass[bucketOf(high[2 * i + 1]!)]! += probs[i]!;
  let b = 0;
  while (b < BUCKETS - 1 && r > bucketMass[b]!) r -= bucketMass[b++]!;
  if (bucketMass[b] === 0) {
    // r past the whole mass (by rounding): the last token of all, the last of the last bucket with any.
    while (b > 0 && bucketMass[b] === 0) b--;
    r = bucketMass[b]!;
  }
  const a = sorted;
  let n = 0;
  for (let i = 0; i < V; i++) if (bucketOf(high[2 * i + 1]!) === b) a[n++] = probs[i]!;
  let [lo, hi] = [0, n];
  while (hi - lo > 16) {
    const pivot = median(a[lo]!, a[(lo + hi) >>> 1]!, a[hi - 1]!);
    // [lo, above) > pivot, [above, i) = pivot, [below, hi) < pivot; `mass` sums the first.
    let [above, i, below, mass] = [lo, lo, hi, 0];
    while (i < below) {
      const v = a[i]!;
      if (v > pivot) {
        a[i++] = a[above]!;
        a[above++] = v;
        mass += v;
      } else if (v < pivot) {
        a[i] = a[--below]!;
        a[below] = v;
      } else i++;
    }
    if (r <= mass) {
      hi = above;
      continue;
    }
    r -= mass;
    // The pivot's equals in id order; past the last token of all (r beyond the mass by rounding), the last.
    const equal = below - above;
    for (let k = 0; k < equal; k++)
      if ((r -= pivot) <= 0 || (below === hi && k === equal - 1)) return nthOf(pivot, k, V);
    lo = below;
  }
  const rest = a.subarray(lo, hi).sort(); // ascending: walked from its end
  for (let k = rest.length - 1; k >= 0; k--) {
    if ((r -= rest[k]!) > 0 && k > 0) continue;
    let before = 0; // its equals ranked before it, at the larger indices
    while (k + before + 1 < rest.length && rest[k + before + 1] === rest[k]) before++;
    return nthOf(rest[k]!, before, V);
  }
  throw new Error('sampleToken: no token to draw');
}
