#pragma once
// Internal (ATen): DeepSeek-V3's decoder layer (DeepseekV3ForCausalLM; Kimi K2), as transformers 5.23 computes it:
// multi-head latent attention over a latent paged KV cache, and DeepSeekMoE (sigmoid group-limited routing in
// float32, routed experts weighted, shared experts added unweighted; a dense MLP in the first
// first_k_dense_replace layers). Its embedding, final norm and LM head are Llama's.
//
// The cache keeps, per token and layer, the latent row transformers caches: kv_a_layernorm(latent) [kv_lora_rank]
// then the RoPE'd shared key [qk_rope_head_dim] (576 values for V3, against 2 x 128 heads x 192 expanded). A decode
// row (one query token) absorbs kv_b_proj into the query and the output, as DeepSeek's own inference code, vLLM and
// llama.cpp do: q_nope x W_UK per head gives a query in latent space, attention runs as one KV head of
// kv_lora_rank + qk_rope_head_dim over all query heads with the latent as the values, and W_UV maps each head's
// result back before o_proj. A prefill chunk expands the latent through kv_b_proj into per-head keys and values
// (transformers' expand_kv), which costs heads x (qk_nope_head_dim + v_head_dim) per key once rather than the
// absorbed heads x kv_lora_rank per query and key.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model/unit.h"

namespace strata::runtime {

// UnitRunner::weights and ::run.
std::vector<std::string> DeepseekV3UnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& config);
at::Tensor RunDeepseekV3Unit(const Unit& unit, const std::vector<WeightTensor>& weights, const DecoderConfig& config,
                             const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last);

}  // namespace strata::runtime
