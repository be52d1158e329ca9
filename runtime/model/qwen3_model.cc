#include "runtime/model/qwen3_model.h"

#include <ATen/TensorOperators.h>

#include "runtime/model/linear.h"
#include "runtime/model/moe.h"
#include "runtime/model/pointwise.h"

namespace strata::runtime {
namespace {

bool Sparse(const DecoderConfig& dims, int64_t layer) {
  return dims.moe.num_experts > 0 && layer >= 0 && static_cast<size_t>(layer) < dims.moe.sparse.size() &&
         dims.moe.sparse[static_cast<size_t>(layer)];
}

enum : size_t { kNormIn, kQProj, kKProj, kVProj, kOProj, kNormPost, kMlp };

}  // namespace

std::vector<std::string> Qwen3UnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& dims) {
  if (kind != UnitKind::kDecoderLayer) return LlamaUnitWeights(kind, layer, dims);
  std::vector<std::string> names = {"input_layernorm.weight",  "self_attn.q_proj.weight",
                                    "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                    "self_attn.o_proj.weight", "post_attention_layernorm.weight"};
  if (Sparse(dims, layer)) {
    names.push_back("mlp.gate.weight");
    if (dims.moe.router == planner::MoeConfig::Router::kSigmoid) names.push_back("mlp.e_score_correction_bias");
  } else {
    for (const char* n : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) names.push_back(n);
  }
  if (dims.qk_norm) {
    names.push_back("self_attn.q_norm.weight");
    names.push_back("self_attn.k_norm.weight");
  }
  if (dims.qkv_bias) {
    for (const char* b : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"})
      names.push_back(b);
  }
  if (dims.o_bias) names.push_back("self_attn.o_proj.bias");
  return names;
}

at::Tensor RunQwen3Unit(const Unit& unit, const std::vector<WeightTensor>& w, const DecoderConfig& dims,
                        const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache_or_null,
                        const at::Tensor& last) {
  if (unit.kind != UnitKind::kDecoderLayer) return RunLlamaUnit(unit, w, dims, hidden, batch, cache_or_null, last);
  KvLayer& cache = *cache_or_null;
  const bool sparse = Sparse(dims, unit.layer);
  AttentionWeights attention{w[kQProj], w[kKProj], w[kVProj], w[kOProj], {}, {}, {}};
  AttentionAdditions additions;
  const bool biased_router = sparse && dims.moe.router == planner::MoeConfig::Router::kSigmoid;
  size_t next = kMlp + (sparse ? (biased_router ? 2 : 1) : 3);
  if (dims.qk_norm) {
    additions.q_norm = w[next++];
    additions.k_norm = w[next++];
    additions.norm_eps = dims.rms_norm_eps;
    additions.norm_across_heads = dims.qk_norm_across_heads;
  }
  if (dims.qkv_bias) {
    attention.q_bias = w[next++];
    attention.k_bias = w[next++];
    attention.v_bias = w[next++];
  }
  if (dims.o_bias) additions.o_bias = w[next++];
  at::Tensor normed = RmsNorm(hidden, w[kNormIn], dims.rms_norm_eps);
  at::Tensor h = hidden + SelfAttention(normed, attention, dims.num_heads, dims.num_kv_heads, dims.head_dim,
                                        unit.window, batch, cache, additions);
  normed = RmsNorm(h, w[kNormPost], dims.rms_norm_eps);
  at::Tensor mlp;
  if (sparse) {
    mlp = SparseMoe(normed, w[kMlp], unit.experts, dims.moe, biased_router ? w[kMlp + 1] : at::Tensor());
  } else {
    mlp = Linear(SiluMul(Linear(normed, w[kMlp]), Linear(normed, w[kMlp + 1])), w[kMlp + 2]);
  }
  return h + mlp;
}

}  // namespace strata::runtime
