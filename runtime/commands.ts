// `prefab model score|generate|inspect|export`: a Hugging Face folder of the Llama family checked by hand, and
// written where other tools run models. Each prints one JSON object on stdout, so its numbers can be compared
// with another implementation's.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { InvalidArgumentError, Option, type Command } from 'commander';
import type { GgufType } from '../model/gguf.ts';
import { PipelineError } from '../pipeline/errors.ts';
import type { CommandContext } from '../pipeline/commands.ts';
import type { Logger } from '../pipeline/log.ts';
import { seeded } from '../core/random.ts';
import { commandOptions, deviceFor, type Device } from './device.ts';
import type { Llama } from '../model/llama.ts';

/** A JSON list of token ids (`depth` 1) or of lists of them (`depth` 2). */
function tokenIds(depth: 1 | 2) {
  return (value: string): number[] | number[][] => {
    let parsed: unknown;
    try {
      parsed = JSON.parse(value);
    } catch {
      throw new InvalidArgumentError(`not JSON: ${value}`);
    }
    const isIds = (x: unknown) => Array.isArray(x) && x.length > 0 && x.every((v) => Number.isInteger(v) && v >= 0);
    if (depth === 1 ? !isIds(parsed) : !(Array.isArray(parsed) && parsed.length > 0 && parsed.every(isIds))) {
      throw new InvalidArgumentError(
        depth === 1
          ? 'expected a list of token ids, e.g. [1,5,9]'
          : 'expected a list of lists of token ids, e.g. [[1,5,9],[1,7]]',
      );
    }
    return parsed as number[] | number[][];
  };
}

const number = (value: string) => {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0) throw new InvalidArgumentError(`not a non-negative number: ${value}`);
  return n;
};

/**
 * The model in `dir` (its adapter/, where it has one, merged), on the device `--backend` asked for; names the
 * folder and the id when an id is out of the vocabulary.
 */
async function open(
  program: Command,
  ctx: CommandContext,
  dir: string,
  ids: number[][],
): Promise<{ model: Llama; device: Device; log: Logger }> {
  const log = ctx.logger();
  const device = await deviceFor(commandOptions(program), log);
  const [{ readHfModel }, { Llama }] = await Promise.all([import('../model/hf.ts'), import('../model/llama.ts')]); // the trainer, only when a model is opened
  let hf;
  try {
    hf = readHfModel(dir);
  } catch (error) {
    throw new PipelineError((error as Error).message);
  }
  const bad = ids.flat().find((id) => id >= hf.config.vocabSize);
  if (bad !== undefined)
    throw new PipelineError(`token id ${bad} is outside ${dir}'s vocabulary of ${hf.config.vocabSize}`);
  const model = new Llama(hf.config, hf.weights);
  if (existsSync(join(dir, 'adapter'))) {
    const { loadAdapter, mergeLora } = await import('../model/lora.ts');
    try {
      loadAdapter(join(dir, 'adapter'), model);
    } catch (error) {
      model.dispose();
      throw new PipelineError((error as Error).message);
    }
    mergeLora(model);
  }
  return { model, device, log };
}

/** Each sequence's per-token log-probs (the first token has none) and their sums. */
async function score(
  { model, device, log }: { model: Llama; device: Device; log: Logger },
  sequences: number[][],
): Promise<{ token_logprobs: number[][]; sums: number[] }> {
  const { withScorer } = await import('./engines.ts');
  const token_logprobs = await withScorer(device, model, log, async (logprobs) => {
    const rows: number[][] = [];
    for (const ids of sequences) {
      const T = ids.length;
      const row =
        T < 2
          ? []
          : await logprobs({
              ids: Int32Array.from(ids),
              targets: Int32Array.from([...ids.slice(1), 0]),
              batch: 1,
              length: T,
            });
      rows.push(Array.from(row).slice(0, T - 1));
    }
    return rows;
  });
  return { token_logprobs, sums: token_logprobs.map((row) => row.reduce((s, v) => s + v, 0)) };
}

export function addModelCommands(program: Command, ctx: CommandContext): void {
  const model = program
    .command('model')
    .description('check a Hugging Face model folder (Llama, Qwen2) by hand: score, generate, inspect; export it');

  model
    .command('score')
    .description(
      'print {"token_logprobs": [[...]], "sums": [...]}: each token\'s log-prob given the tokens before it (the first has none)',
    )
    .argument('<folder>', 'a model folder: config.json and model.safetensors (or a sharded index)')
    .requiredOption('--ids <json>', 'token ids, a list of sequences, e.g. [[1,5,9],[1,7]]', tokenIds(2))
    .action(async (dir: string, opts: { ids: number[][] }) => {
      const m = await open(program, ctx, dir, opts.ids);
      process.stdout.write(JSON.stringify(await score(m, opts.ids)) + '\n');
      m.model.dispose();
      ctx.setExit(0);
    });

  model
    .command('generate')
    .description('print {"continuation": [...]}: the tokens after the prompt, greedy unless --temperature is given')
    .argument('<folder>', 'a model folder')
    .requiredOption('--ids <json>', "the prompt's token ids, e.g. [1,5,9]", tokenIds(1))
    .option('--max-new-tokens <n>', 'most tokens to generate', (v) => Math.max(1, Math.floor(number(v))), 16)
    .option('--temperature <t>', 'sampling temperature (0: greedy)', number, 0)
    .option('--top-p <p>', 'sample from the smallest set of tokens holding this much probability', number, 1)
    .option('--seed <s>', "the sampler's seed", 'prefab')
    .option('--stop <ids>', 'stop after any of these token ids, e.g. [2]', tokenIds(1))
    .action(
      async (
        dir: string,
        opts: { ids: number[]; maxNewTokens: number; temperature: number; topP: number; seed: string; stop?: number[] },
      ) => {
        const { model: m, device, log } = await open(program, ctx, dir, [opts.ids]);
        // Under auto on the GPU where one sequence decodes faster there.
        const engine = await (await import('./placement.ts')).decodingEngine(device, m, 1, log);
        const { SharedDecoder } = await import('./shared-decoder.ts');
        const decoder = new SharedDecoder(m, (await import('./engines.ts')).cachePool(engine, m));
        const continuation = await decoder.generate(decoder.cache(), opts.ids, {
          maxTokens: opts.maxNewTokens,
          temperature: opts.temperature,
          topP: opts.topP,
          random: seeded(opts.seed, 'generate'),
          stop: opts.stop,
        });
        decoder.dispose();
        process.stdout.write(JSON.stringify({ continuation }) + '\n');
        m.dispose();
        ctx.setExit(0);
      },
    );

  model
    .command('inspect')
    .description('print the architecture, parameter count, dtype and shape of a model folder')
    .argument('<folder>', 'a model folder')
    .action(async (dir: string) => {
      const { llamaConfigJson, readHfModel } = await import('../model/hf.ts');
      let hf;
      try {
        hf = readHfModel(dir);
      } catch (error) {
        throw new PipelineError((error as Error).message);
      }
      const c = hf.config;
      const parameters = [...hf.weights.values()].reduce((n, w) => n + w.length, 0);
      process.stdout.write(
        JSON.stringify({
          architecture: (llamaConfigJson(c).architectures as string[])[0],
          parameters,
          dtype: hf.dtype,
          vocab_size: c.vocabSize,
          hidden_size: c.hiddenSize,
          intermediate_size: c.intermediateSize,
          layers: c.layers,
          heads: c.heads,
          kv_heads: c.kvHeads,
          head_dim: c.headDim,
          rope_theta: c.ropeTheta,
          tied_embeddings: c.tiedEmbeddings,
          attention_bias: c.attentionBias,
        }) + '\n',
      );
      ctx.setExit(0);
    });

  model
    .command('export')
    .description(
      'write a model folder as GGUF (llama.cpp, Ollama, LM Studio: weights, tokenizer and chat template in one file) or as one Hugging Face folder with LoRA adapters merged (vLLM, transformers), or its LoRA adapters alone as an adapter GGUF (llama.cpp --lora over the base\'s GGUF: export the base with --no-adapter, or the adapter\'s base folder); prints {"path", "bytes", "format"}',
    )
    .argument('<folder>', 'a model folder (its adapter/, if any, merged) or a PEFT adapter folder')
    .requiredOption('--out <path>', 'the GGUF file, or the folder, to write')
    .addOption(
      new Option('--format <format>', 'what to write: gguf, hf, or gguf-lora (the adapters alone)')
        .choices(['gguf', 'hf', 'gguf-lora'])
        .default('gguf'),
    )
    .addOption(
      new Option('--type <type>', "GGUF's weights: f32, f16 or q8_0").choices(['f32', 'f16', 'q8_0']).default('f16'),
    )
    .option(
      '--base <folder>',
      "an adapter's base model, where adapter_config.json's base_model_name_or_path is not a folder here",
    )
    .option('--no-adapter', "a model folder's own weights, its adapter/ left out: the base its adapter GGUF runs on")
    .action(
      async (
        dir: string,
        opts: { out: string; format: 'gguf' | 'hf' | 'gguf-lora'; type: GgufType; base?: string; adapter: boolean },
      ) => {
        await deviceFor(commandOptions(program), ctx.logger()); // the merge runs on the reference model
        const { exportModel } = await import('../model/export.ts');
        try {
          process.stdout.write(JSON.stringify(exportModel({ from: dir, ...opts })) + '\n');
        } catch (error) {
          throw new PipelineError((error as Error).message);
        }
        ctx.setExit(0);
      },
    );
}
