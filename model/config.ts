// The model's config: what a Llama-family folder's config.json says (model/hf.ts reads and writes it), the
// weights it implies in transformers' names and shapes, the FLOPs of a token, and LoRA's settings. No
// TensorFlow.js here: a config is read and checked without loading the model.

export interface LlamaConfig {
  /** `llama` or `qwen2`: the same math, Qwen2 with biases on q, k and v. */
  modelType: 'llama' | 'qwen2';
  vocabSize: number;
  /** D */
  hiddenSize: number;
  /** F, the SwiGLU MLP's width. */
  intermediateSize: number;
  layers: number;
  /** H */
  heads: number;
  /** K: query heads share key/value heads in groups of H / K (grouped-query attention). */
  kvHeads: number;
  /** hd: often D / H, but not always. */
  headDim: number;
  ropeTheta: number;
  rmsNormEps: number;
  /** The output head is the embedding table (tie_word_embeddings). */
  tiedEmbeddings: boolean;
  /** Biases on the q, k and v projections (Qwen2; Llama's attention_bias). */
  attentionBias: boolean;
  /** Longest sequence the model is meant for (max_position_embeddings). */
  maxPositions: number;
  bosTokenId: number | null;
  /** One id, or several (Llama 3 stops at any of three). */
  eosTokenId: number | number[] | null;
}

/** Parameter name → shape, in transformers' names and (out, in) orientation, in a fixed order. */
export function llamaParameterShapes(c: LlamaConfig): [string, number[]][] {
  const { hiddenSize: D, intermediateSize: F, heads: H, kvHeads: K, headDim: hd } = c;
  const shapes: [string, number[]][] = [['model.embed_tokens.weight', [c.vocabSize, D]]];
  for (let i = 0; i < c.layers; i++) {
    const l = `model.layers.${i}.`;
    shapes.push(
      [`${l}input_layernorm.weight`, [D]],
      [`${l}self_attn.q_proj.weight`, [H * hd, D]],
      [`${l}self_attn.k_proj.weight`, [K * hd, D]],
      [`${l}self_attn.v_proj.weight`, [K * hd, D]],
      ...(c.attentionBias
        ? ([
            [`${l}self_attn.q_proj.bias`, [H * hd]],
            [`${l}self_attn.k_proj.bias`, [K * hd]],
            [`${l}self_attn.v_proj.bias`, [K * hd]],
          ] as [string, number[]][])
        : []),
      [`${l}self_attn.o_proj.weight`, [D, H * hd]],
      [`${l}post_attention_layernorm.weight`, [D]],
      [`${l}mlp.gate_proj.weight`, [F, D]],
      [`${l}mlp.up_proj.weight`, [F, D]],
      [`${l}mlp.down_proj.weight`, [D, F]],
    );
  }
  shapes.push(['model.norm.weight', [D]]);
  if (!c.tiedEmbeddings) shapes.push(['lm_head.weight', [c.vocabSize, D]]);
  return shapes;
}

/**
 * Floating-point operations to train on one token in a sequence of `length`, as nanoGPT's estimate_mfu
 * counts them: 6 per weight used in a matMul (the embedding table is a lookup unless it is also the head),
 * and attention's 6·2·layers·(H·hd)·T. `size`: the parameters (default: the config's weights).
 */
export function flopsPerToken(
  c: LlamaConfig,
  length: number,
  size = llamaParameterShapes(c).reduce((n, [, shape]) => n + shape.reduce((a, b) => a * b, 1), 0),
): number {
  const lookup = c.tiedEmbeddings ? 0 : c.vocabSize * c.hiddenSize;
  return 6 * (size - lookup) + 12 * c.layers * c.heads * c.headDim * length;
}

export interface LoraConfig {
  /** The adapters' rank r. */
  r: number;
  /** α: the update is scaled by α / r. */
  alpha: number;
  /** Dropout on an adapter's input while training. */
  dropout: number;
  /** Projections that get adapters, by their last name: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj. */
  targetModules: string[];
}

export const PROJECTIONS = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const;
