#pragma once
// Internal (ATen): Gemma 2 and Gemma 3 text units (unit.h's runner), as transformers 5.23
// computes them: the embedding times sqrt(hidden) rounded to the serving dtype; Gemma RMSNorm
// (x * rsqrt(mean(x^2) + eps) * (1 + weight), in float32, cast back at the end); input / post-attention /
// pre-feedforward / post-feedforward norms; attention scaled by query_pre_attn_scalar^-1/2 with Gemma 3's
// q/k norms and two RoPE tables (sliding layers use AttentionBatch::rope_sliding), Gemma 2's score
// soft-cap (explicit scores, since SDPA cannot cap); GeGLU (tanh GELU); the logit soft-cap.

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "runtime/model/unit.h"

namespace strata::runtime {

// Weight order of a Gemma decoder layer's unit (after these: q/k/v/o biases when dims.qkv_bias).
enum GemmaLayerWeight : int {
  kGemmaInputNorm,
  kGemmaQ,
  kGemmaK,
  kGemmaV,
  kGemmaO,
  kGemmaPostAttentionNorm,
  kGemmaGate,
  kGemmaUp,
  kGemmaDown,
  kGemmaPreFeedforwardNorm,
  kGemmaPostFeedforwardNorm,
  kGemmaQNorm,
  kGemmaKNorm,  // the last two: Gemma 3
};

// UnitRunner::weights and ::run (unit.h).
std::vector<std::string> GemmaUnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& dims);

at::Tensor RunGemmaUnit(const Unit& unit, const std::vector<WeightTensor>& weights, const DecoderConfig& dims,
                        const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last);

// Gemma2RMSNorm / Gemma3RMSNorm.
at::Tensor GemmaRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace strata::runtime
