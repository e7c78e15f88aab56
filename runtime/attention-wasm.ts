// The decoder's attention over its KV cache, as two small WebAssembly SIMD functions.
//
// A decoding step attends each new token to every cached one: for a model of width 128 and a few hundred
// cached tokens that is most of a step's work, and it cannot be batched across sequences (each has its own
// cache). These functions do it four lanes at a time, several times as fast as plain TypeScript.
// The module is assembled here from its instructions (the few opcodes it needs), so no toolchain or binary
// file is involved; each function is written out below in the WebAssembly text format it encodes.
//
// Memory: the functions read and write one WebAssembly.Memory, given at instantiation, where the caller keeps
// the cache (runtime/decode.ts: one memory per cache). Addresses are byte offsets; head sizes are multiples of 4.

const leb = (n: number): number[] => {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n) b |= 0x80;
    out.push(b);
  } while (n);
  return out;
};
const vec = (items: number[][]) => [...leb(items.length), ...items.flat()];
const name = (s: string) => [...leb(s.length), ...[...s].map((c) => c.charCodeAt(0))];
const section = (id: number, body: number[]) => [id, ...leb(body.length), ...body];
const [i32, f32, v128] = [0x7f, 0x7d, 0x7b];

/** The instructions used, by their names in the text format. */
const $ = {
  get: (i: number) => [0x20, ...leb(i)],
  set: (i: number) => [0x21, ...leb(i)],
  tee: (i: number) => [0x22, ...leb(i)],
  const: (n: number) => [0x41, ...leb(n)], // i32.const, n in 0…63 (signed LEB128 agrees there)
  add: [0x6a], // i32.add
  mul: [0x6c], // i32.mul
  shl: [0x74], // i32.shl
  lt_u: [0x49], // i32.lt_u
  gt_u: [0x4b], // i32.gt_u
  eqz: [0x45], // i32.eqz
  'f32.load': [0x2a, 2, 0],
  'f32.store': [0x38, 2, 0],
  'f32.add': [0x92],
  'f32.mul': [0x94],
  'v128.load': [0xfd, 0, 4, 0],
  'v128.store': [0xfd, 11, 4, 0],
  'v128.zero': [0xfd, 12, ...new Array<number>(16).fill(0)], // v128.const 0
  'f32x4.splat': [0xfd, 19],
  'f32x4.extract_lane': (lane: number) => [0xfd, 31, lane],
  'f32x4.add': [0xfd, ...leb(228)],
  'f32x4.mul': [0xfd, ...leb(230)],
  block: [0x02, 0x40],
  loop: [0x03, 0x40],
  br: (depth: number) => [0x0c, ...leb(depth)],
  br_if: (depth: number) => [0x0d, ...leb(depth)],
  end: [0x0b],
};

/**
 * (func $scores (param $q i32) (param $k i32) (param $n i32) (param $stride i32) (param $hd i32)
 *               (param $out i32) (param $scale f32)
 *   ;; out[t] = scale · Σ_d q[d]·k[t·stride + d] for t < n: one query head against n cached keys of its
 *   ;; key/value head, four d at a time (lanes), the lanes added at the end. Four positions go side by side,
 *   ;; sharing each load of q; the last n mod 4 one by one, each summed in the same order.
 *   (local $t i32) (local $d i32) (local $row i32) (local $qd v128) (local $a0 v128) … (local $a3 v128) …)
 */
const sumLanes = (acc: number) => [
  ...$.get(acc),
  ...$['f32x4.extract_lane'](0),
  ...$.get(acc),
  ...$['f32x4.extract_lane'](1),
  ...$['f32.add'],
  ...$.get(acc),
  ...$['f32x4.extract_lane'](2),
  ...$.get(acc),
  ...$['f32x4.extract_lane'](3),
  ...$['f32.add'],
  ...$['f32.add'],
];
/** out[t + i] = scale · (lanes of $a_i added), for the i-th of the positions side by side. */
const storeScore = (i: number, acc: number) => [
  ...$.get(5),
  ...$.get(7),
  ...$.const(i),
  ...$.add,
  ...$.const(2),
  ...$.shl,
  ...$.add,
  ...sumLanes(acc),
  ...$.get(6),
  ...$['f32.mul'],
  ...$['f32.store'],
];
/** $a_i += $qd · k[row + i·stride + d…] */
const accumulate = (i: number, acc: number) => [
  ...$.get(acc),
  ...$.get(11),
  ...$.get(9),
  ...$.get(3),
  ...$.const(i),
  ...$.mul,
  ...$.add,
  ...$.get(8),
  ...$.add,
  ...$['v128.load'],
  ...$['f32x4.mul'],
  ...$['f32x4.add'],
  ...$.set(acc),
];
const scores = [
  ...vec([
    [3, i32],
    [6, v128],
  ]), // locals 7 $t, 8 $d, 9 $row, 10 $a0 (one at a time), 11 $qd, 12…15 $a0…$a3
  ...$.const(0),
  ...$.set(7),
  // Four positions at a time while t + 4 ≤ n.
  ...$.block,
  ...$.loop,
  ...$.get(7),
  ...$.const(4),
  ...$.add,
  ...$.get(2),
  ...$.gt_u,
  ...$.br_if(1),
  ...$['v128.zero'],
  ...$.set(12),
  ...$['v128.zero'],
  ...$.set(13),
  ...$['v128.zero'],
  ...$.set(14),
  ...$['v128.zero'],
  ...$.set(15),
  ...$.const(0),
  ...$.set(8),
  ...$.get(1),
  ...$.get(7),
  ...$.get(3),
  ...$.mul,
  ...$.add,
  ...$.set(9), // row = k + t·stride
  ...$.loop,
  ...$.get(0),
  ...$.get(8),
  ...$.add,
  ...$['v128.load'],
  ...$.set(11), // qd = q[d…d+3]
  ...accumulate(0, 12),
  ...accumulate(1, 13),
  ...accumulate(2, 14),
  ...accumulate(3, 15),
  ...$.get(8),
  ...$.const(16),
  ...$.add,
  ...$.tee(8),
  ...$.get(4),
  ...$.const(2),
  ...$.shl,
  ...$.lt_u,
  ...$.br_if(0),
  ...$.end,
  ...storeScore(0, 12),
  ...storeScore(1, 13),
  ...storeScore(2, 14),
  ...storeScore(3, 15),
  ...$.get(7),
  ...$.const(4),
  ...$.add,
  ...$.set(7),
  ...$.br(0),
  ...$.end,
  ...$.end,
  // The rest one by one.
  ...$.block,
  ...$.loop,
  ...$.get(7),
  ...$.get(2),
  ...$.lt_u,
  ...$.eqz,
  ...$.br_if(1), // t < n, else done
  ...$['v128.zero'],
  ...$.set(10),
  ...$.const(0),
  ...$.set(8),
  ...$.get(1),
  ...$.get(7),
  ...$.get(3),
  ...$.mul,
  ...$.add,
  ...$.set(9), // row = k + t·stride
  ...$.loop,
  ...$.get(10),
  ...$.get(0),
  ...$.get(8),
  ...$.add,
  ...$['v128.load'],
  ...$.get(9),
  ...$.get(8),
  ...$.add,
  ...$['v128.load'],
  ...$['f32x4.mul'],
  ...$['f32x4.add'],
  ...$.set(10), // acc += q[d…d+3] · row[d…d+3]
  ...$.get(8),
  ...$.const(16),
  ...$.add,
  ...$.tee(8),
  ...$.get(4),
  ...$.const(2),
  ...$.shl,
  ...$.lt_u,
  ...$.br_if(0),
  ...$.end,
  ...storeScore(0, 10),
  ...$.get(7),
  ...$.const(1),
  ...$.add,
  ...$.set(7),
  ...$.br(0),
  ...$.end,
  ...$.end,
  ...$.end,
];

/**
 * (func $mix (param $p i32) (param $v i32) (param $n i32) (param $stride i32) (param $hd i32) (param $out i32)
 *   ;; out[d] = Σ_t p[t]·v[t·stride + d] for d < hd: one head's output, the cached values weighted by its
 *   ;; attention probabilities, summed over t in order, four d at a time.
 *   (local $t i32) (local $d i32) (local $row i32) (local $pt v128) …)
 */
const mix = [
  ...vec([
    [3, i32],
    [1, v128],
  ]), // locals 6 $t, 7 $d, 8 $row, 9 $pt
  ...$.const(0),
  ...$.set(7),
  ...$.loop, // out[0…hd) = 0
  ...$.get(5),
  ...$.get(7),
  ...$.add,
  ...$['v128.zero'],
  ...$['v128.store'],
  ...$.get(7),
  ...$.const(16),
  ...$.add,
  ...$.tee(7),
  ...$.get(4),
  ...$.const(2),
  ...$.shl,
  ...$.lt_u,
  ...$.br_if(0),
  ...$.end,
  ...$.const(0),
  ...$.set(6),
  ...$.block,
  ...$.loop,
  ...$.get(6),
  ...$.get(2),
  ...$.lt_u,
  ...$.eqz,
  ...$.br_if(1), // t < n, else done
  ...$.get(0),
  ...$.get(6),
  ...$.const(2),
  ...$.shl,
  ...$.add,
  ...$['f32.load'],
  ...$['f32x4.splat'],
  ...$.set(9), // pt = p[t] in all four lanes
  ...$.get(1),
  ...$.get(6),
  ...$.get(3),
  ...$.mul,
  ...$.add,
  ...$.set(8), // row = v + t·stride
  ...$.const(0),
  ...$.set(7),
  ...$.loop,
  ...$.get(5),
  ...$.get(7),
  ...$.add, // &out[d]
  ...$.get(5),
  ...$.get(7),
  ...$.add,
  ...$['v128.load'],
  ...$.get(9),
  ...$.get(8),
  ...$.get(7),
  ...$.add,
  ...$['v128.load'],
  ...$['f32x4.mul'],
  ...$['f32x4.add'],
  ...$['v128.store'], // out[d…d+3] += pt · row[d…d+3]
  ...$.get(7),
  ...$.const(16),
  ...$.add,
  ...$.tee(7),
  ...$.get(4),
  ...$.const(2),
  ...$.shl,
  ...$.lt_u,
  ...$.br_if(0),
  ...$.end,
  ...$.get(6),
  ...$.const(1),
  ...$.add,
  ...$.set(6),
  ...$.br(0),
  ...$.end,
  ...$.end,
  ...$.end,
];

const MODULE = new WebAssembly.Module(
  new Uint8Array([
    ...[0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0], // \0asm, version 1
    ...section(
      1,
      vec([
        [0x60, ...vec([[i32], [i32], [i32], [i32], [i32], [i32], [f32]]), 0],
        [0x60, ...vec([[i32], [i32], [i32], [i32], [i32], [i32]]), 0],
      ]),
    ), // types
    ...section(2, vec([[...name('env'), ...name('memory'), 0x02, 0x00, 0]])), // import (memory env.memory 0)
    ...section(3, vec([[0], [1]])), // functions: $scores of type 0, $mix of type 1
    ...section(
      7,
      vec([
        [...name('scores'), 0x00, 0],
        [...name('mix'), 0x00, 1],
      ]),
    ), // exports
    ...section(
      10,
      vec([
        [...leb(scores.length), ...scores],
        [...leb(mix.length), ...mix],
      ]),
    ), // code
  ]),
);

export interface AttentionKernels {
  /** out[t] = scale · q·k[t] for t < n; q, k, out byte addresses, stride the bytes from one position's key to the next, hd a multiple of 4. */
  scores(q: number, k: number, n: number, stride: number, hd: number, out: number, scale: number): void;
  /** out[d] = Σ_t p[t]·v[t][d] for d < hd (a multiple of 4); byte addresses, stride as for scores. */
  mix(p: number, v: number, n: number, stride: number, hd: number, out: number): void;
}

/** The kernels over a memory (compiled once, instantiated per memory: a few microseconds). */
export function attentionKernels(memory: WebAssembly.Memory): AttentionKernels {
  return new WebAssembly.Instance(MODULE, { env: { memory } }).exports as unknown as AttentionKernels;
}
