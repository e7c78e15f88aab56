// The next token from a model's logits, as every decoder in the trainer draws it.
import type { Random } from '../core/random.ts';

/** One token from logits: argmax at temperature 0, else a draw from the top-p nucleus of softmax(logits / temperature). */
export function sampleToken(logits: Float32Array, temperature: number, topP: number, rand: Random): number {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i]! > logits[best]!) best = i;
  if (temperature <= 0) return best;
  const probs = Array.from(logits, (l, i) => ({ i, p: Math.exp((l - logits[best]!) / temperature) }));
  const total = probs.reduce((s, x) => s + x.p, 0);
  probs.sort((a, b) => b.p - a.p);
  const nucleus: typeof probs = [];
  let mass = 0;
  for (const x of probs) {
    nucleus.push(x);
    mass += x.p / total;
    if (mass >= topP) break;
  }
  let r = rand() * nucleus.reduce((s, x) => s + x.p, 0);
  for (const x of nucleus) if ((r -= x.p) <= 0) return x.i;
  return nucleus.at(-1)!.i;
}
