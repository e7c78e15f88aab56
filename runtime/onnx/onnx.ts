// Small ONNX graphs, written here as a few lines each and run by ONNX Runtime (the optional `onnxruntime-node`
// package: its CPU kernels are native code with AVX-512 where the CPU has it, on a pool of threads). The
// trainer's CPU path (runtime/cpu/) hands it what dominates a step, the GEMMs and attention's batched products,
// several times faster than WebAssembly's 128-bit SIMD on one thread (docs/experiments.md, "Training on the CPU").
//
// A graph is encoded as an ONNX ModelProto by the few protobuf fields it needs: float32 (and int32) inputs and
// outputs whose sizes are named, not fixed (one session serves every shape), nodes of the default domain at
// opset 17 and of ONNX Runtime's com.microsoft (its fused operators).
import { availableParallelism } from 'node:os';
import { nativeKernels, type NativeKernels } from '../cpu/kernels.ts';

type Ort = typeof import('onnxruntime-node');

/** An attribute: an integer, a list of integers, a float (`{ float: x }`, so that 1.0 is not read as 1) or a string. */
export type Attribute = number | number[] | { float: number } | string;

/** A node: its operator, inputs, outputs and attributes; `domain` com.microsoft for ONNX Runtime's fused operators. */
export interface OnnxNode {
  op: string;
  inputs: string[];
  outputs: string[];
  attributes?: Record<string, Attribute>;
  domain?: 'com.microsoft';
}

/** A graph over float32 tensors (int32 where `int32` names them), each input and output of `rank` named dimensions. */
export interface OnnxGraph {
  inputs: Record<string, number>;
  outputs: Record<string, number>;
  nodes: OnnxNode[];
  /** Inputs of type int32 (token ids), the rest are float32. */
  int32?: string[];
}

/**
 * Writes a graph's nodes: each call adds a node and returns its output's name (its own name where given, as a
 * graph's outputs need). Constants are nodes too: `ints` (a 1-D int64 tensor: shapes, axes), `float` (a scalar).
 */
export class GraphBuilder {
  readonly nodes: OnnxNode[] = [];
  private count = 0;

  op(op: string, inputs: string[], attributes?: Record<string, Attribute>, output?: string): string {
    const out = output ?? `t${this.count++}`;
    this.nodes.push({ op, inputs, outputs: [out], attributes });
    return out;
  }

  ints(values: number[]): string {
    return this.op('Constant', [], { value_ints: values });
  }

  float(value: number): string {
    return this.op('Constant', [], { value_float: { float: value } });
  }
}

/** A graph of `inputs` and `outputs` (name → rank) whose nodes `body` writes, naming the outputs itself. */
export function graph(
  inputs: Record<string, number>,
  outputs: Record<string, number>,
  body: (g: GraphBuilder) => void,
  int32?: string[],
): OnnxGraph {
  const g = new GraphBuilder();
  body(g);
  return { inputs, outputs, nodes: g.nodes, int32 };
}

// Protobuf's wire format: a field is its number and wire type as a varint, then a varint or length-prefixed bytes.
const varint = (n: number): number[] => {
  const out: number[] = [];
  let v = BigInt.asUintN(64, BigInt(n));
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v) b |= 0x80;
    out.push(b);
  } while (v);
  return out;
};
const int = (field: number, n: number) => [...varint(field << 3), ...varint(n)];
const bytes = (field: number, b: number[]) => [...varint((field << 3) | 2), ...varint(b.length), ...b];
const text = (field: number, s: string) => bytes(field, [...Buffer.from(s, 'utf8')]);
const message = (field: number, parts: number[][]) => bytes(field, parts.flat());
const f32 = (field: number, x: number) => {
  const b = Buffer.alloc(4);
  b.writeFloatLE(x);
  return [...varint((field << 3) | 5), ...b];
};

const FLOAT = 1;
const INT32 = 6;

/** ValueInfoProto: a tensor of `type` whose `rank` dimensions are named `${name}_0`, … (any size). */
const valueInfo = (field: number, name: string, rank: number, type: number) =>
  message(field, [
    text(1, name),
    message(2, [
      message(1, [
        int(1, type),
        message(
          2,
          Array.from({ length: rank }, (_, i) => message(1, [text(2, `${name}_${i}`)])),
        ),
      ]),
    ]),
  ]);

/** AttributeProto: INTS (type 7), INT (2), STRING (3) or FLOAT (1). */
const attribute = (name: string, value: Attribute) =>
  Array.isArray(value)
    ? message(5, [text(1, name), ...value.map((v) => int(8, v)), int(20, 7)])
    : typeof value === 'number'
      ? message(5, [text(1, name), int(3, value), int(20, 2)])
      : typeof value === 'string'
        ? message(5, [text(1, name), text(4, value), int(20, 3)])
        : message(5, [text(1, name), f32(2, value.float), int(20, 1)]);

/** The ModelProto of `graph` (IR version 8, opset 17), as ONNX Runtime loads it. */
export function encodeGraph(graph: OnnxGraph): Uint8Array {
  const int32 = new Set(graph.int32 ?? []);
  const nodes = graph.nodes.map((n, i) =>
    message(1, [
      ...n.inputs.map((x) => text(1, x)),
      ...n.outputs.map((x) => text(2, x)),
      text(3, `n${i}`),
      text(4, n.op),
      ...Object.entries(n.attributes ?? {}).map(([k, v]) => attribute(k, v)),
      ...(n.domain ? [text(7, n.domain)] : []),
    ]),
  );
  const body = [
    ...nodes,
    text(2, 'prefab'),
    ...Object.entries(graph.inputs).map(([name, rank]) => valueInfo(11, name, rank, int32.has(name) ? INT32 : FLOAT)),
    ...Object.entries(graph.outputs).map(([name, rank]) => valueInfo(12, name, rank, FLOAT)),
  ];
  const opsets = [message(8, [text(1, ''), int(2, 17)]), message(8, [text(1, 'com.microsoft'), int(2, 1)])];
  return Uint8Array.from([...int(1, 8), ...opsets.flat(), ...message(7, body)]);
}

/** A tensor handed to or filled by a graph: values and dimensions. */
export interface Array32 {
  data: Float32Array | Int32Array;
  dims: number[];
}

/**
 * ONNX Runtime with this machine's cores, and a session per graph made at its first use. Its threads sleep
 * between runs rather than spin, since the trainer's own loops run on the main thread meanwhile.
 */
export class OrtRuntime {
  readonly threads: number;
  private readonly sessions = new Map<string, Promise<import('onnxruntime-node').InferenceSession>>();

  private constructor(
    private readonly ort: Ort,
    threads: number | undefined,
    /** The C kernels, which the CPU path's kernels take in place of their graphs where they are here. */
    readonly native: NativeKernels | null,
  ) {
    this.threads = threads ?? availableParallelism();
    native?.setThreads(this.threads); // one count for the process: the last runtime opened sets it
  }

  /**
   * ONNX Runtime, or why it is not here (the optional package did not install, or its library does not load);
   * with the C kernels where they are built, unless `native` is false.
   */
  static async open(threads?: number, o: { native?: boolean } = {}): Promise<OrtRuntime> {
    let ort: Ort;
    try {
      ort = await import('onnxruntime-node');
    } catch (error) {
      throw new Error(
        `onnxruntime-node does not load here (${(error as Error).message.split('\n')[0]}): it is an optional dependency of prefab; npm ci installs it where its binaries run`,
      );
    }
    return new OrtRuntime(ort, threads, o.native === false ? null : nativeKernels());
  }

  /**
   * Runs `graph` (made once for `key`: one session a key) on `inputs`, writing each output into the array
   * given for it in `outputs` (its whole size).
   */
  async run(
    key: string,
    graph: () => OnnxGraph,
    inputs: Record<string, Array32>,
    outputs: Record<string, Array32>,
  ): Promise<void> {
    let session = this.sessions.get(key);
    if (!session) {
      session = this.ort.InferenceSession.create(encodeGraph(graph()), {
        intraOpNumThreads: this.threads,
        interOpNumThreads: 1,
        executionMode: 'sequential',
        graphOptimizationLevel: 'all',
        extra: { session: { intra_op: { allow_spinning: '0' } } },
      });
      this.sessions.set(key, session);
    }
    const s = await session;
    // An array may be longer than its dims (buffers are kept across shapes): its head is the tensor.
    const tensor = (a: Array32) => {
      const data = a.data.subarray(
        0,
        a.dims.reduce((x, y) => x * y, 1),
      );
      return new this.ort.Tensor(data instanceof Int32Array ? 'int32' : 'float32', data, a.dims);
    };
    const feeds = Object.fromEntries(Object.entries(inputs).map(([k, a]) => [k, tensor(a)]));
    const fetches = Object.fromEntries(Object.entries(outputs).map(([k, a]) => [k, tensor(a)]));
    await s.run(feeds, fetches);
  }

  async dispose(): Promise<void> {
    for (const s of this.sessions.values()) await (await s).release();
    this.sessions.clear();
  }
}
