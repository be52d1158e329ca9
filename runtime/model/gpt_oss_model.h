#pragma once
// Internal (ATen): gpt-oss's decoder layer (GptOssForCausalLM): GQA attention with q/k/v/o biases and a sink logit
// per query head (attention.h's AttentionAdditions::sinks; decode rows on the CPU through decode_attention.h's
// kernel with its sinks), sliding or full per layer, RoPE over halves of each head (YaRN by default); the sparse block
// of every layer through moe.h: the router's biased top-k logits softmaxed among themselves, experts with biases and
// a clamped SwiGLU. Its RMSNorms multiply by the weight in float32 before rounding (GptOssRMSNorm); embedding and head
// are Llama's (llama_model.h), the final norm gpt-oss's.
//
// A layer's weights, in this order: input_layernorm, q, k, v, o, post_attention_layernorm, mlp.router.weight,
// mlp.router.bias, self_attn.sinks, then the q, k, v and o biases when the config has attention_bias.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/model/llama_model.h"

namespace strata::runtime {

// UnitRunner::weights and ::run (unit.h).
std::vector<std::string> GptOssUnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& dims);
at::Tensor RunGptOssUnit(const Unit& unit, const std::vector<WeightTensor>& weights, const DecoderConfig& dims,
                         const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last);

}  // namespace strata::runtime
