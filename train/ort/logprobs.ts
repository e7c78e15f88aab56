// log p(target) at every position from the logits, and its backward, on the CPU: a log-softmax and gather
// (train/parameters.ts targetLogprobs does it in tfjs ops), one ONNX graph a pass. Every loss of the trainer
// starts from these token log-probs, so its gradient arrives here as d/d logp per position and leaves as
// d/d logits:
//   logp_t = z_t[y_t] − logsumexp(z_t),   dz_t = dlogp_t · (onehot(y_t) − softmax(z_t)).
import { graph, type OrtRuntime } from './onnx.ts';

const forward = () =>
  graph(
    { z: 2, targets: 2 },
    { logp: 2, lse: 2 },
    (g) => {
      g.op('ReduceLogSumExp', ['z'], { axes: [-1], keepdims: 1 }, 'lse');
      g.op('Sub', [g.op('GatherElements', ['z', 'targets'], { axis: 1 }), 'lse'], {}, 'logp');
    },
    ['targets'],
  );

const backward = () =>
  graph(
    { z: 2, targets: 2, lse: 2, dlogp: 2 },
    { dz: 2 },
    (g) => {
      const softmax = g.op('Exp', [g.op('Sub', ['z', 'lse'])]);
      const spread = g.op('Mul', [g.op('Neg', ['dlogp']), softmax]);
      g.op('ScatterElements', [spread, 'targets', 'dlogp'], { axis: 1, reduction: 'add' }, 'dz');
    },
    ['targets'],
  );

export class TargetLogprobs {
  constructor(private readonly ort: OrtRuntime) {}

  /** logp and lse (rows) from the logits z (rows × V) and each row's target. */
  async forward(z: Float32Array, targets: Int32Array, logp: Float32Array, lse: Float32Array, V: number) {
    const rows = targets.length;
    await this.ort.run(
      'logprobs.forward',
      forward,
      { z: { data: z, dims: [rows, V] }, targets: { data: targets, dims: [rows, 1] } },
      { logp: { data: logp, dims: [rows, 1] }, lse: { data: lse, dims: [rows, 1] } },
    );
  }

  /** dz (rows × V) from d loss / d logp. */
  async backward(
    z: Float32Array,
    targets: Int32Array,
    lse: Float32Array,
    dlogp: Float32Array,
    dz: Float32Array,
    V: number,
  ) {
    const rows = targets.length;
    await this.ort.run(
      'logprobs.backward',
      backward,
      {
        z: { data: z, dims: [rows, V] },
        targets: { data: targets, dims: [rows, 1] },
        lse: { data: lse, dims: [rows, 1] },
        dlogp: { data: dlogp, dims: [rows, 1] },
      },
      { dz: { data: dz, dims: [rows, V] } },
    );
  }
}
