#pragma once
// Internal (ATen): the decoder layers of Qwen3 (q/k RMSNorm per head before RoPE), Qwen3-MoE (the same,
// with sparse MoE blocks in the layers the config makes sparse), Mixtral (a Mistral layer whose MLP
// is the sparse MoE block) and MiniMax-M2 (q/k RMSNorms across all heads, partial RoPE, a sparse block in every layer
// whose sigmoid router adds a correction bias). Embedding, final norm and head are the Llama family's (llama_model.h).
//
// A layer's weights, in this order: input_layernorm, q, k, v, o, post_attention_layernorm, then the
// dense MLP's gate, up, down or the MoE router (mlp.gate; MiniMax-M2: and the block's e_score_correction_bias),
// then q_norm, k_norm when the family has them (MiniMax-M2: each over all heads at once),
// then the q, k, v and o biases when the config has attention_bias.
// The experts of a sparse layer are the unit's `experts` (moe.h).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/model/llama_model.h"

namespace strata::runtime {

// UnitRunner::weights and ::run (unit.h); the embedding, final norm and LM head are Llama's. Some names are
// stored under another in the checkpoint (planner::ModelSpec::stored_names).
std::vector<std::string> Qwen3UnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& dims);
at::Tensor RunQwen3Unit(const Unit& unit, const std::vector<WeightTensor>& weights, const DecoderConfig& dims,
                        const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last);

}  // namespace strata::runtime
