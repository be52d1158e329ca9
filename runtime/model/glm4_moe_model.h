#pragma once
// Internal (ATen): the decoder layer of GLM-4.5/4.6/4.7 (Glm4MoeForCausalLM): GQA attention over the leading
// head_dim x partial_rotary_factor dims (DecoderConfig::rotary_dim), per-head q/k RMSNorms before RoPE when the
// config has use_qk_norm, q/k/v biases when it has attention_bias (o_proj never has one); a dense MLP in the first
// first_k_dense_replace layers and DeepSeekMoE after them (moe.h's sigmoid group-limited router with its correction
// bias, plus the shared experts). Embedding, final norm and head are the Llama family's (llama_model.h).
//
// A layer's weights, in this order: input_layernorm, q, k, v, o, post_attention_layernorm; the dense MLP's gate,
// up, down, or the router (mlp.gate.weight), its e_score_correction_bias and the shared experts' gate, up, down;
// then q_norm, k_norm when the config has them, then the q, k and v biases when it has attention_bias.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/model/llama_model.h"

namespace strata::runtime {

// UnitRunner::weights and ::run (unit.h).
std::vector<std::string> Glm4MoeUnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& dims);
at::Tensor RunGlm4MoeUnit(const Unit& unit, const std::vector<WeightTensor>& weights, const DecoderConfig& dims,
                          const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last);

}  // namespace strata::runtime
