#include "runtime/model/gpt_oss_model.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/rsqrt.h>

#include "runtime/model/linear.h"
#include "runtime/model/moe.h"

namespace strata::runtime {
namespace {

enum : size_t { kNormIn, kQProj, kKProj, kVProj, kOProj, kNormPost, kRouter, kRouterBias, kSinks, kBiases };

// GptOssRMSNorm: (weight x normalised x in float32), rounded once to x's dtype (Llama's rounds x first). The same as
// RmsNorm in float32, which takes the fused kernel there.
at::Tensor GptOssRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.scalar_type() == at::kFloat) return RmsNorm(x, weight, eps);
  at::Tensor x32 = x.to(at::kFloat);
  x32 = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (weight.to(at::kFloat) * x32).to(x.scalar_type());
}

}  // namespace

std::vector<std::string> GptOssUnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& dims) {
  if (kind != UnitKind::kDecoderLayer) return LlamaUnitWeights(kind, layer, dims);
  std::vector<std::string> names = {
      "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
      "mlp.router.weight",       "mlp.router.bias",         "self_attn.sinks"};
  if (dims.qkv_bias) {
    for (const char* b :
         {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.o_proj.bias"}) {
      names.push_back(b);
    }
  }
  return names;
}

at::Tensor RunGptOssUnit(const Unit& unit, const std::vector<WeightTensor>& w, const DecoderConfig& dims,
                         const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last) {
  if (unit.kind == UnitKind::kFinalNorm) return GptOssRmsNorm(LastTokens(hidden, last), w[0], dims.rms_norm_eps);
  if (unit.kind != UnitKind::kDecoderLayer) return RunLlamaUnit(unit, w, dims, hidden, batch, cache, last);
  AttentionWeights attention{w[kQProj], w[kKProj], w[kVProj], w[kOProj], {}, {}, {}};
  AttentionAdditions additions;
  additions.sinks = w[kSinks];
  if (dims.qkv_bias) {
    attention.q_bias = w[kBiases];
    attention.k_bias = w[kBiases + 1];
    attention.v_bias = w[kBiases + 2];
    additions.o_bias = w[kBiases + 3];
  }
  const at::Tensor h =
      hidden + SelfAttention(GptOssRmsNorm(hidden, w[kNormIn], dims.rms_norm_eps), attention, dims.num_heads,
                             dims.num_kv_heads, dims.head_dim, unit.window, batch, *cache, additions);
  const at::Tensor normed = GptOssRmsNorm(h, w[kNormPost], dims.rms_norm_eps);
  return h + SparseMoe(normed, w[kRouter], unit.experts, dims.moe, /*correction_bias=*/at::Tensor(), w[kRouterBias]);
}

}  // namespace strata::runtime
