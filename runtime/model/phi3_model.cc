#include "runtime/model/phi3_model.h"

#include <ATen/TensorOperators.h>

#include "runtime/model/linear.h"
#include "runtime/model/llama_model.h"
#include "runtime/model/pointwise.h"

namespace strata::runtime {

std::vector<std::string> Phi3UnitWeights(UnitKind kind, int64_t layer, const DecoderConfig& dims) {
  if (kind != UnitKind::kDecoderLayer) return LlamaUnitWeights(kind, layer, dims);
  return {"input_layernorm.weight",          "self_attn.qkv_proj.weight", "self_attn.o_proj.weight",
          "post_attention_layernorm.weight", "mlp.gate_up_proj.weight",   "mlp.down_proj.weight"};
}

at::Tensor RunPhi3Unit(const Unit& unit, const std::vector<WeightTensor>& w, const DecoderConfig& dims,
                       const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last) {
  if (unit.kind != UnitKind::kDecoderLayer) return RunLlamaUnit(unit, w, dims, hidden, batch, cache, last);
  const int64_t q_rows = dims.num_heads * dims.head_dim;
  const int64_t kv_rows = dims.num_kv_heads * dims.head_dim;
  const WeightTensor& qkv = w[kPhi3Qkv];
  AttentionWeights attention{WeightRows(qkv, 0, q_rows),
                             WeightRows(qkv, q_rows, kv_rows),
                             WeightRows(qkv, q_rows + kv_rows, kv_rows),
                             w[kPhi3O],
                             {},
                             {},
                             {}};
  at::Tensor normed = RmsNorm(hidden, w[kPhi3InputNorm], dims.rms_norm_eps);
  at::Tensor h = hidden + SelfAttention(normed, attention, dims.num_heads, dims.num_kv_heads, dims.head_dim,
                                        unit.window, batch, *cache);
  normed = RmsNorm(h, w[kPhi3PostNorm], dims.rms_norm_eps);
  // Phi3MLP: gate_up_proj, chunk(2) into gate | up, up * act(gate).
  at::Tensor gate_up = Linear(normed, w[kPhi3GateUp]);
  at::Tensor gate = gate_up.narrow(-1, 0, dims.intermediate);
  at::Tensor up = gate_up.narrow(-1, dims.intermediate, dims.intermediate);
  return h + Linear(SiluMul(gate, up), w[kPhi3Down]);
}

}  // namespace strata::runtime
