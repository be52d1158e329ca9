#include "runtime/model/glm4_moe_model.h"

#include <ATen/TensorOperators.h>

#include "runtime/model/linear.h"
#include "runtime/model/moe.h"
#include "runtime/model/pointwise.h"

namespace strata::runtime {
namespace {

bool Sparse(const DecoderConfig& dims, int64_t layer) {
  return layer >= 0 && static_cast<size_t>(layer) < dims.moe.sparse.size() &&
         dims.moe.sparse[static_cast<size_t>(layer)];
}

enum : size_t { kNormIn, kQProj, kKProj, kVProj, kOProj, kNormPost, kMlp };

}  // namespace

std::vector<std::string> Glm4MoeUnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& dims) {
  if (kind != UnitKind::kDecoderLayer) return LlamaUnitWeights(kind, layer, dims);
  std::vector<std::string> names = {"input_layernorm.weight",  "self_attn.q_proj.weight",
                                    "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                    "self_attn.o_proj.weight", "post_attention_layernorm.weight"};
  if (Sparse(dims, layer)) {
    for (const char* n : {"mlp.gate.weight", "mlp.gate.e_score_correction_bias", "mlp.shared_experts.gate_proj.weight",
                          "mlp.shared_experts.up_proj.weight", "mlp.shared_experts.down_proj.weight"}) {
      names.push_back(n);
    }
  } else {
    for (const char* n : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) names.push_back(n);
  }
  if (dims.qk_norm) {
    names.push_back("self_attn.q_norm.weight");
    names.push_back("self_attn.k_norm.weight");
  }
  if (dims.qkv_bias) {
    for (const char* b : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}) {
      names.push_back(b);
    }
  }
  return names;
}

at::Tensor RunGlm4MoeUnit(const Unit& unit, const std::vector<WeightTensor>& w, const DecoderConfig& dims,
                          const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last) {
  if (unit.kind != UnitKind::kDecoderLayer) return RunLlamaUnit(unit, w, dims, hidden, batch, cache, last);
  const bool sparse = Sparse(dims, unit.layer);
  AttentionWeights attention{w[kQProj], w[kKProj], w[kVProj], w[kOProj], {}, {}, {}};
  AttentionAdditions additions;
  size_t next = kMlp + (sparse ? 5 : 3);
  if (dims.qk_norm) {
    additions.q_norm = w[next++];
    additions.k_norm = w[next++];
    additions.norm_eps = dims.rms_norm_eps;
  }
  if (dims.qkv_bias) {
    attention.q_bias = w[next++];
    attention.k_bias = w[next++];
    attention.v_bias = w[next++];
  }
  at::Tensor normed = RmsNorm(hidden, w[kNormIn], dims.rms_norm_eps);
  const at::Tensor h = hidden + SelfAttention(normed, attention, dims.num_heads, dims.num_kv_heads, dims.head_dim,
                                              unit.window, batch, *cache, additions);
  normed = RmsNorm(h, w[kNormPost], dims.rms_norm_eps);
  if (!sparse) return h + Linear(SiluMul(Linear(normed, w[kMlp]), Linear(normed, w[kMlp + 1])), w[kMlp + 2]);
  const at::Tensor routed = SparseMoe(normed, w[kMlp], unit.experts, dims.moe, w[kMlp + 1]);
  const at::Tensor shared = Linear(SiluMul(Linear(normed, w[kMlp + 2]), Linear(normed, w[kMlp + 3])), w[kMlp + 4]);
  return h + (routed + shared);
}

}  // namespace strata::runtime
