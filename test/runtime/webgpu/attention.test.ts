// Causal attention on the GPU (runtime/webgpu/attention.ts) against the model's (test/fixtures/attention.ts, on
// the WASM backend): the output and tfjs's gradients with respect to q, k and v, within 1e-5 relative; plain
// multi-head and grouped-query attention, sequences shorter and longer than a workgroup's 64 rows, and head
// sizes on both sides of 64 (where the flash kernels' tiles halve).
import { describe, expect, it } from 'vitest';
import { seeded } from '../../../core/random.ts';
import { Attention } from '../../../runtime/webgpu/attention.ts';
import { download, submit, upload } from '../../../runtime/webgpu/buffers.ts';
import { ATTENTION_CASES, attentionInputs, modelAttention } from '../../fixtures/attention.ts';
import { absent, gpu as here, kernels, relativeError } from '../../fixtures/webgpu.ts';

describe('causal attention on the GPU', () => {
  it.skipIf(absent)(
    'gives the model’s attention and its gradients, with one key/value head a query head or shared',
    async () => {
      const gpu = here!;
      const random = seeded('webgpu-attention');
      const attention = new Attention(kernels!);
      const cases = [...ATTENTION_CASES, { batch: 1, length: 70, heads: 2, kvHeads: 1, headDim: 128 }];
      for (const shape of cases) {
        const { batch, length, heads, kvHeads, headDim } = shape;
        const { q, k, v, dout } = attentionInputs(shape, random);
        const want = await modelAttention(q, k, v, dout, shape);

        const rows = batch * heads * length;
        const [bq, bk, bv, bdout] = [upload(gpu, q), upload(gpu, k), upload(gpu, v), upload(gpu, dout)];
        const [lse, delta, out, dq, dk, dv] = [rows, rows, q.length, q.length, k.length, v.length].map((len) =>
          upload(gpu, new Float32Array(len)),
        );
        submit(gpu, (pass) => {
          attention.forward(pass, bq, bk, bv, out!, lse!, shape);
          attention.backward(
            pass,
            { q: bq, k: bk, v: bv, out: out!, lse: lse! },
            bdout,
            delta!,
            {
              dq: dq!,
              dk: dk!,
              dv: dv!,
            },
            shape,
          );
        });
        const what = `${batch}×${length}, ${heads} heads, ${kvHeads} kv heads of ${headDim}`;
        expect(relativeError(await download(gpu, out!, q.length), want.out), `out ${what}`).toBeLessThan(1e-5);
        for (const [name, buffer, grad] of [
          ['dq', dq!, want.dq],
          ['dk', dk!, want.dk],
          ['dv', dv!, want.dv],
        ] as const) {
          expect(relativeError(await download(gpu, buffer, grad.length), grad), `${name} ${what}`).toBeLessThan(1e-5);
        }
      }
    },
  );
});
