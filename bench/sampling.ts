// Drawing a decoding step's tokens on the GPU (runtime/webgpu/sampling.ts) against drawing them on the CPU from
// logits read back (runtime/sampling.ts sampleToken, what a step did before): milliseconds for a step's rows at
// a vocabulary, the best of a few runs, with random logits (flat ones, whose nucleus is most of the vocabulary:
// the CPU's slowest case). The GPU's figure includes its dispatch and the tokens' readback; the CPU's does not
// include reading the logits back. Beside them, how many rows drew the same token on both (f32 sums against
// f64: a draw within rounding of a boundary may differ), and the C kernels' drawRows (what a CPU decoding
// step draws with, sampleToken's draws in C, the rows shared between the cores) where they are built.
// Usage: npm run bench:sampling [-- --rows 32 --vocab 1024,49152,151936 --top-p 0.9]
import { Command } from 'commander';
import { seeded } from '../core/random.ts';
import { loadCpuKernels } from '../runtime/cpu/kernels.ts';
import { drawArray, sampleToken } from '../runtime/sampling.ts';
import { download, submit, upload } from '../runtime/webgpu/buffers.ts';
import { openGpu } from '../runtime/webgpu/device.ts';
import { GpuKernels } from '../runtime/webgpu/kernel.ts';
import { Sampler, drawParams } from '../runtime/webgpu/sampling.ts';

const opts = new Command()
  .option('--rows <n>', "a step's sequences", '32')
  .option('--vocab <list>', 'vocabularies', '1024,49152,151936')
  .option('--top-p <p>', 'the nucleus', '0.9')
  .option('--runs <n>', 'runs of each, the best kept', '4')
  .parse()
  .opts<{ rows: string; vocab: string; topP: string; runs: string }>();

const gpu = await openGpu();
const k = new GpuKernels(gpu);
const sampler = new Sampler(k);
const rows = Number(opts.rows);
const random = seeded('bench-sampling');
const { kernels: native, why } = loadCpuKernels();
console.log(`the GPU: ${gpu.adapter.description}; ${rows} rows, top-p ${opts.topP}, temperature 1`);
if (!native) console.log(`no C kernels (${why})`);
console.log(
  '| vocabulary | GPU draw, ms | CPU draw (sampleToken), ms | CPU / GPU | the same token | C kernels (drawRows), ms | the same token as sampleToken |',
);
console.log('|---|---|---|---|---|---|---|');
for (const V of opts.vocab.split(',').map(Number)) {
  const logits = Float32Array.from({ length: rows * V }, () => (random() - 0.5) * 6);
  const draws = Array.from({ length: rows }, () => ({
    temperature: 1,
    topP: Number(opts.topP),
    u: Math.fround(random()),
  }));
  const [z, params, tokens] = [upload(gpu, logits), upload(gpu, drawParams(draws)), upload(gpu, new Uint32Array(rows))];
  let [onGpu, onCpu, inC, same, sameInC] = [Infinity, Infinity, Infinity, 0, 0];
  const rowsOf = Array.from({ length: rows }, (_, r) => logits.subarray(r * V, (r + 1) * V));
  const packed = drawArray(draws);
  const fromC = new Int32Array(rows);
  for (let run = 0; run < Number(opts.runs); run++) {
    let began = performance.now();
    submit(gpu, (pass) => sampler.encode(pass, z, params, tokens, rows, V));
    const drawn = new Uint32Array((await download(gpu, tokens, rows)).buffer);
    onGpu = Math.min(onGpu, performance.now() - began);
    began = performance.now();
    const want = draws.map((d, r) => sampleToken(logits.subarray(r * V, (r + 1) * V), 1, d.topP, () => d.u));
    onCpu = Math.min(onCpu, performance.now() - began);
    same = want.filter((id, r) => drawn[r] === id).length;
    if (native) {
      began = performance.now();
      native.drawRows(rowsOf, packed, fromC);
      inC = Math.min(inC, performance.now() - began);
      sameInC = want.filter((id, r) => fromC[r] === id).length;
    }
  }
  for (const buffer of [z, params, tokens]) buffer.destroy();
  console.log(
    `| ${V} | ${onGpu.toFixed(1)} | ${onCpu.toFixed(1)} | ${(onCpu / onGpu).toFixed(2)} | ${same} of ${rows} | ` +
      (native ? `${inC.toFixed(1)} | ${sameInC} of ${rows} |` : '— | — |'),
  );
}
process.exit(0);
