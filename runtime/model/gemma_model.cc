#include "runtime/model/gemma_model.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tanh.h>

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "runtime/model/linear.h"
#include "runtime/model/llama_model.h"

namespace strata::runtime {
namespace {

// tanh(x / cap) * cap, in x's dtype, as upstream's soft-capping.
at::Tensor SoftCap(const at::Tensor& x, double cap) { return at::tanh(x / cap) * cap; }

// [B, kv_heads, K, D] -> [B, kv_heads * groups, K, D], as repeat_kv.
at::Tensor RepeatKv(const at::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const int64_t b = x.size(0), h = x.size(1), k = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, h, groups, k, d}).reshape({b, h * groups, k, d});
}

at::Tensor GemmaAttention(const at::Tensor& hidden, const std::vector<WeightTensor>& w, const DecoderConfig& dims,
                          const Unit& unit, AttentionBatch& batch, KvLayer& cache) {
  const int64_t n = hidden.size(1);  // packed tokens: hidden is [1, n, hidden]
  const bool gemma3 = dims.family == ModelFamily::kGemma3;
  const size_t bias0 = gemma3 ? kGemmaKNorm + 1 : kGemmaQNorm;
  auto project = [&](int index, int bias_offset, int64_t heads) {
    at::Tensor out = dims.qkv_bias ? Linear(hidden, w[index], w[bias0 + bias_offset]) : Linear(hidden, w[index]);
    return out.view({n, heads, dims.head_dim});  // [n, heads, D]
  };
  at::Tensor q_all = project(kGemmaQ, 0, dims.num_heads);
  at::Tensor k_all = project(kGemmaK, 1, dims.num_kv_heads);
  const at::Tensor v_all = project(kGemmaV, 2, dims.num_kv_heads);
  if (gemma3) {
    q_all = GemmaRmsNorm(q_all, w[kGemmaQNorm], dims.rms_norm_eps);
    k_all = GemmaRmsNorm(k_all, w[kGemmaKNorm], dims.rms_norm_eps);
  }
  // Gemma scales scores by query_pre_attn_scalar^-1/2 rather than head_dim^-1/2.
  const double scale =
      1.0 / std::sqrt(dims.query_pre_attn_scalar > 0 ? dims.query_pre_attn_scalar : static_cast<double>(dims.head_dim));
  std::vector<at::Tensor> outs;
  for (AttentionGroup& group : batch.groups) {
    const RopeTables& rope = unit.window > 0 && group.rope_sliding.cos.defined() ? group.rope_sliding : group.rope;
    at::Tensor q = ApplyRope(GroupHeads(q_all, group), rope);
    at::Tensor k = ApplyRope(GroupHeads(k_all, group), rope);
    auto [keys, values] = KvAppend(cache, group.kv, group.positions, k, GroupHeads(v_all, group), group.key_length);
    const at::Tensor& mask = group.masks.at(unit.window);
    if (dims.attn_logit_softcapping > 0) {
      // Gemma 2's eager attention: scores, soft-cap, mask, float32 softmax cast back, weighted values.
      const int64_t groups = dims.num_heads / dims.num_kv_heads;
      at::Tensor scores = at::matmul(q, RepeatKv(keys, groups).transpose(2, 3)) * scale;
      scores = SoftCap(scores, dims.attn_logit_softcapping);
      scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
      at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
      outs.push_back(at::matmul(probs, RepeatKv(values, groups)));
    } else {
      outs.push_back(at::scaled_dot_product_attention(q, keys, values, mask, /*dropout_p=*/0.0, /*is_causal=*/false,
                                                      scale, /*enable_gqa=*/dims.num_kv_heads != dims.num_heads));
    }
  }
  at::Tensor out = PackHeads(outs);
  return dims.qkv_bias ? Linear(out, w[kGemmaO], w[bias0 + 3]) : Linear(out, w[kGemmaO]);
}

}  // namespace

at::Tensor GemmaRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor x32 = x.to(at::kFloat);
  x32 = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (x32 * (1.0 + weight.to(at::kFloat))).to(x.scalar_type());
}

std::vector<std::string> GemmaUnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& dims) {
  if (kind != UnitKind::kDecoderLayer) return LlamaUnitWeights(kind, layer, dims);
  std::vector<std::string> names = {"input_layernorm.weight",
                                    "self_attn.q_proj.weight",
                                    "self_attn.k_proj.weight",
                                    "self_attn.v_proj.weight",
                                    "self_attn.o_proj.weight",
                                    "post_attention_layernorm.weight",
                                    "mlp.gate_proj.weight",
                                    "mlp.up_proj.weight",
                                    "mlp.down_proj.weight",
                                    "pre_feedforward_layernorm.weight",
                                    "post_feedforward_layernorm.weight"};
  if (dims.family == ModelFamily::kGemma3) {
    names.push_back("self_attn.q_norm.weight");
    names.push_back("self_attn.k_norm.weight");
  }
  if (dims.qkv_bias) {
    for (const char* bias : {"q_proj", "k_proj", "v_proj", "o_proj"})
      names.push_back(absl::StrCat("self_attn.", bias, ".bias"));
  }
  return names;
}

at::Tensor RunGemmaUnit(const Unit& unit, const std::vector<WeightTensor>& w, const DecoderConfig& dims,
                        const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last) {
  switch (unit.kind) {
    case UnitKind::kEmbedding: {
      // Gemma*TextScaledWordEmbedding: embed_scale is torch.tensor(hidden ** 0.5) in the serving dtype.
      const at::Tensor& table = w[0];
      at::Tensor scale =
          at::scalar_tensor(std::sqrt(static_cast<double>(dims.hidden)), table.options().dtype(at::kDouble))
              .to(table.scalar_type());
      return at::embedding(table, hidden) * scale;
    }
    case UnitKind::kFinalNorm: {
      const at::Tensor rows = LastTokens(hidden, last);
      return GemmaRmsNorm(rows, w[0], dims.rms_norm_eps);
    }
    case UnitKind::kLmHead: {
      at::Tensor logits = Linear(hidden, w[0]).select(1, 0);
      if (dims.final_logit_softcapping > 0) logits = SoftCap(logits, dims.final_logit_softcapping);
      return logits.to(at::kFloat);
    }
    case UnitKind::kDecoderLayer:
      break;
  }
  at::Tensor x = GemmaRmsNorm(hidden, w[kGemmaInputNorm], dims.rms_norm_eps);
  x = GemmaAttention(x, w, dims, unit, batch, *cache);
  at::Tensor h = hidden + GemmaRmsNorm(x, w[kGemmaPostAttentionNorm], dims.rms_norm_eps);
  x = GemmaRmsNorm(h, w[kGemmaPreFeedforwardNorm], dims.rms_norm_eps);
  x = Linear(at::gelu(Linear(x, w[kGemmaGate]), "tanh") * Linear(x, w[kGemmaUp]), w[kGemmaDown]);
  return h + GemmaRmsNorm(x, w[kGemmaPostFeedforwardNorm], dims.rms_norm_eps);
}

}  // namespace strata::runtime
