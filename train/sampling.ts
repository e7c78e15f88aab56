// The next token from a model's logits, as every decoder in the trainer draws it.
import type { Random } from '../core/random.ts';

let probs = new Float64Array(0);
let sorted = new Float64Array(0);

/**
 * One token from logits: argmax at temperature 0, else a draw from the top-p nucleus of softmax(logits /
 * temperature): the tokens in order of probability (ties by id) until their mass reaches topP, one drawn in
 * proportion. Typed arrays reused from call to call: a decoding step draws one token a sequence.
 * The order is found by sorting the probabilities alone (a typed array's own numeric sort, several times
 * faster than sorting ids with a comparator); the drawn rank is then mapped back to its id, the k-th among
 * equal probabilities being the k-th such id. The same draws, to the bit, as sorting the ids.
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
  const ascending = sorted.subarray(0, V);
  ascending.set(probs.subarray(0, V));
  ascending.sort();
  const ranked = (k: number) => ascending[V - 1 - k]!; // the k-th largest probability
  let size = 0;
  let mass = 0;
  let nucleus = 0;
  while (size < V) {
    const p = ranked(size++);
    nucleus += p;
    mass += p / total;
    if (mass >= topP) break;
  }
  let r = rand() * nucleus;
  let k = 0;
  while (k < size - 1 && (r -= ranked(k)) > 0) k++;
  // The rank back to an id: the how-many-th of its equals it is, among the ids with that probability in order.
  const p = ranked(k);
  let before = 0;
  while (before < k && ranked(k - before - 1) === p) before++;
  for (let id = 0; id < V; id++) if (probs[id] === p && before-- === 0) return id;
  throw new Error('sampleToken: the drawn probability belongs to no token');
}
