#include "runtime/model/phi3_model.h"

#include <ATen/TensorOperators.h>

#include "absl/strings/str_cat.h"
#include "runtime/model/linear.h"
#include "runtime/model/pointwise.h"

namespace strata::runtime {

std::vector<std::string> Phi3UnitTensorNames(UnitKind kind, int64_t layer, const ModelDims& dims, bool tied_head) {
  if (kind != UnitKind::kDecoderLayer) {
    ModelDims llama = dims;
    llama.family = ModelFamily::kLlama;
    return UnitTensorNames(kind, layer, llama, tied_head);
  }
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  return {p + "input_layernorm.weight",          p + "self_attn.qkv_proj.weight", p + "self_attn.o_proj.weight",
          p + "post_attention_layernorm.weight", p + "mlp.gate_up_proj.weight",   p + "mlp.down_proj.weight"};
}

at::Tensor RunPhi3Unit(const Unit& unit, const std::vector<at::Tensor>& w, const ModelDims& dims,
                       const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last) {
  if (unit.kind != UnitKind::kDecoderLayer) {
    ModelDims llama = dims;
    llama.family = ModelFamily::kLlama;
    return RunUnit(unit, w, llama, hidden, batch, cache, last);
  }
  const int64_t q_rows = dims.num_heads * dims.head_dim;
  const int64_t kv_rows = dims.num_kv_heads * dims.head_dim;
  const at::Tensor& qkv = w[kPhi3Qkv];
  AttentionWeights attention{qkv.narrow(0, 0, q_rows),
                             qkv.narrow(0, q_rows, kv_rows),
                             qkv.narrow(0, q_rows + kv_rows, kv_rows),
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
