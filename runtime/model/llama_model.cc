#include "runtime/model/llama_model.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/rsqrt.h>

#include "absl/strings/str_cat.h"
#include "runtime/model/gemma_model.h"
#include "runtime/model/linear.h"
#include "runtime/model/phi3_model.h"
#include "runtime/model/pointwise.h"
#include "runtime/model/qwen3_model.h"

namespace strata::runtime {

bool Unit::offloaded() const {
  for (const Weight& w : weights) {
    if (w.needs_fetch()) return true;
  }
  return false;
}

std::vector<const Weight*> Unit::weight_ptrs() const {
  std::vector<const Weight*> out;
  for (const Weight& w : weights) out.push_back(&w);
  return out;
}

std::vector<std::string> UnitTensorNames(UnitKind kind, int64_t layer, const ModelDims& dims, bool tied_head) {
  if (dims.family == ModelFamily::kGemma2 || dims.family == ModelFamily::kGemma3) {
    return GemmaUnitTensorNames(kind, layer, dims, tied_head);
  }
  if (dims.family == ModelFamily::kPhi3) return Phi3UnitTensorNames(kind, layer, dims, tied_head);
  switch (kind) {
    case UnitKind::kEmbedding:
      return {"model.embed_tokens.weight"};
    case UnitKind::kFinalNorm:
      return {"model.norm.weight"};
    case UnitKind::kLmHead:
      return {tied_head ? "model.embed_tokens.weight" : "lm_head.weight"};
    case UnitKind::kDecoderLayer:
      break;
  }
  if (dims.qk_norm || dims.moe.num_experts > 0) return ExtendedLayerTensorNames(layer, dims);
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  std::vector<std::string> names = {
      p + "input_layernorm.weight",  p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
      p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight", p + "post_attention_layernorm.weight",
      p + "mlp.gate_proj.weight",    p + "mlp.up_proj.weight",      p + "mlp.down_proj.weight"};
  if (dims.qkv_bias) {
    for (const char* b : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}) {
      names.push_back(p + b);
    }
  }
  return names;
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (FusedPointwiseApplies(x, weight)) return FusedRmsNorm(x, weight, eps);
  at::Tensor x32 = x.to(at::kFloat);
  at::Tensor variance = x32.pow(2).mean(-1, /*keepdim=*/true);
  x32 = x32 * at::rsqrt(variance + eps);
  return weight * x32.to(x.scalar_type());
}

at::Tensor LastTokens(const at::Tensor& hidden, const at::Tensor& last) {
  const at::Tensor tokens = hidden.select(0, 0);  // [tokens, hidden]
  // Every token is a row's last (decode rows only): the packed tokens are the rows, in order.
  if (tokens.size(0) == last.size(0)) return tokens.unsqueeze(1);
  return tokens.index_select(0, last).unsqueeze(1);
}

at::Tensor RunUnit(const Unit& unit, const std::vector<at::Tensor>& w, const ModelDims& dims, const at::Tensor& hidden,
                   AttentionBatch& batch, KvLayer* cache, const at::Tensor& last) {
  if (dims.family == ModelFamily::kGemma2 || dims.family == ModelFamily::kGemma3) {
    return RunGemmaUnit(unit, w, dims, hidden, batch, cache, last);
  }
  if (dims.family == ModelFamily::kPhi3) return RunPhi3Unit(unit, w, dims, hidden, batch, cache, last);
  switch (unit.kind) {
    case UnitKind::kEmbedding:
      return at::embedding(w[0], hidden);
    case UnitKind::kFinalNorm: {
      const at::Tensor rows = LastTokens(hidden, last);
      return RmsNorm(rows, w[0], dims.rms_norm_eps);
    }
    case UnitKind::kLmHead:
      return Linear(hidden, w[0]).select(1, 0).to(at::kFloat);
    case UnitKind::kDecoderLayer:
      break;
  }
  if (dims.qk_norm || dims.moe.num_experts > 0) return RunExtendedLayer(unit, w, dims, hidden, batch, *cache);
  AttentionWeights attention{w[kQ], w[kK], w[kV], w[kO], {}, {}, {}};
  if (dims.qkv_bias) {
    attention.q_bias = w[kQBias];
    attention.k_bias = w[kKBias];
    attention.v_bias = w[kVBias];
  }
  at::Tensor normed = RmsNorm(hidden, w[kInputNorm], dims.rms_norm_eps);
  at::Tensor h = hidden + SelfAttention(normed, attention, dims.num_heads, dims.num_kv_heads, dims.head_dim,
                                        unit.window, batch, *cache);
  normed = RmsNorm(h, w[kPostNorm], dims.rms_norm_eps);
  at::Tensor mlp = Linear(SiluMul(Linear(normed, w[kGate]), Linear(normed, w[kUp])), w[kDown]);
  return h + mlp;
}

}  // namespace strata::runtime
