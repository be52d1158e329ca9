#include "runtime/model/llama_model.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/rsqrt.h>

#include "runtime/model/linear.h"
#include "runtime/model/pointwise.h"

namespace strata::runtime {

std::vector<std::string> LlamaUnitWeights(UnitKind kind, int64_t /*layer*/, const DecoderConfig& dims) {
  if (kind != UnitKind::kDecoderLayer) return {"weight"};
  std::vector<std::string> names = {
      "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
  if (dims.qkv_bias) {
    for (const char* b : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"})
      names.push_back(b);
  }
  if (dims.o_bias) names.push_back("self_attn.o_proj.bias");
  if (dims.mlp_bias) {
    for (const char* b : {"mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"}) names.push_back(b);
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
  // Every token's logits are wanted (decode rows only, or prompt scoring): `last` lists them all, in order.
  if (tokens.size(0) == last.size(0)) return tokens.unsqueeze(1);
  return tokens.index_select(0, last).unsqueeze(1);
}

at::Tensor RunLlamaUnit(const Unit& unit, const std::vector<WeightTensor>& w, const DecoderConfig& dims,
                        const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last) {
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
  AttentionWeights attention{w[kQ], w[kK], w[kV], w[kO], {}, {}, {}};
  AttentionAdditions additions;
  size_t next = kDown + 1;
  if (dims.qkv_bias) {
    attention.q_bias = w[next++];
    attention.k_bias = w[next++];
    attention.v_bias = w[next++];
  }
  if (dims.o_bias) additions.o_bias = w[next++];
  at::Tensor gate_bias, up_bias, down_bias;
  if (dims.mlp_bias) {
    gate_bias = w[next++];
    up_bias = w[next++];
    down_bias = w[next++];
  }
  at::Tensor normed = RmsNorm(hidden, w[kInputNorm], dims.rms_norm_eps);
  at::Tensor h = hidden + SelfAttention(normed, attention, dims.num_heads, dims.num_kv_heads, dims.head_dim,
                                        unit.window, batch, *cache, additions);
  normed = RmsNorm(h, w[kPostNorm], dims.rms_norm_eps);
  const WeightTensor* gate_up[] = {&w[kGate], &w[kUp]};  // one split over the threads where in panels
  const at::Tensor gate_up_bias[] = {gate_bias, up_bias};
  const std::vector<at::Tensor> g = LinearEach(normed, gate_up, gate_up_bias);
  at::Tensor mlp = Linear(SiluMul(g[0], g[1]), w[kDown], down_bias);
  return h + mlp;
}

}  // namespace strata::runtime
