// The next token from a model's logits, as every decoder in the trainer draws it.
import type { Random } from '../core/random.ts';

let probs = new Float64Array(0);
let order = new Uint32Array(0);

/**
 * One token from logits: argmax at temperature 0, else a draw from the top-p nucleus of softmax(logits /
 * temperature): the tokens in order of probability (ties by id) until their mass reaches topP, one drawn in
 * proportion. Typed arrays reused from call to call: a decoding step draws one token a sequence.
 */
export function sampleToken(logits: Float32Array, temperature: number, topP: number, rand: Random): number {
  const V = logits.length;
  let best = 0;
  for (let i = 1; i < V; i++) if (logits[i]! > logits[best]!) best = i;
  if (temperature <= 0) return best;
  if (probs.length < V) {
    probs = new Float64Array(V);
    order = new Uint32Array(V);
  }
  const top = logits[best]!;
  let total = 0;
  for (let i = 0; i < V; i++) {
    total += probs[i] = Math.exp((logits[i]! - top) / temperature);
    order[i] = i;
  }
  const ids = order.subarray(0, V).sort((a, b) => probs[b]! - probs[a]! || a - b);
  let size = 0;
  let mass = 0;
  let nucleus = 0;
  while (size < V) {
    const p = probs[ids[size++]!]!;
    nucleus += p;
    mass += p / total;
    if (mass >= topP) break;
  }
  let r = rand() * nucleus;
  for (let k = 0; k < size; k++) if ((r -= probs[ids[k]!]!) <= 0) return ids[k]!;
  return ids[size - 1]!;
}
