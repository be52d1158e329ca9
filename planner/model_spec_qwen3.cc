// Qwen3ForCausalLM and Qwen3MoeForCausalLM (transformers 5.23 models/qwen3, models/qwen3_moe): the Llama
// layout of model_spec_llama.cc plus an RMSNorm over each query and key head (q_norm, k_norm, after
// o_proj in registration order) and, for Qwen3-MoE, Qwen3MoeSparseMoeBlock (experts, then gate) in the
// layers that are sparse; the others keep Qwen3MoeMLP with intermediate_size. Checkpoints store the
// experts one tensor per expert (mlp.experts.E.{gate,up,down}_proj.weight). The forward pass normalises q
// and k; Qwen3-MoE routes each token to num_experts_per_tok experts, renormalising their probabilities
// when norm_topk_prob, and casts the routing weights back to the activations' dtype.

#include "planner/model_spec_qwen3.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "planner/model_spec_moe.h"

namespace strata::planner::internal {

absl::Status ExtendQwen3Spec(const nlohmann::json& /*config*/, ModelSpec& spec, DecoderConfig& decoder) {
  AddQkNorms(spec, "Qwen3");
  decoder.qk_norm = true;
  return absl::OkStatus();
}

absl::Status ExtendQwen3MoeSpec(const nlohmann::json& config, ModelSpec& spec, DecoderConfig& decoder) {
  absl::StatusOr<MoeFields> moe = ReadQwen3MoeFields(config);
  if (!moe.ok()) return moe.status();
  int64_t sparse_layers = 0;
  for (int64_t i = 0; i < spec.num_hidden_layers; ++i) sparse_layers += Qwen3MoeLayerIsSparse(*moe, i) ? 1 : 0;
  const char* experts_field = ExpertsField(config);
  if (absl::Status s = CheckExpertModules(moe->num_experts, sparse_layers, experts_field); !s.ok()) return s;
  AddQkNorms(spec, "Qwen3Moe");
  decoder.qk_norm = true;
  decoder.moe.num_experts = moe->num_experts;
  decoder.moe.top_k = moe->top_k;
  decoder.moe.norm_topk_prob = moe->norm_topk_prob;
  decoder.moe.sparse.assign(static_cast<size_t>(spec.num_hidden_layers), false);
  const int64_t hidden = Child(Child(spec.root, "model"), "embed_tokens").parameters.front().shape[1];
  for (int64_t i = 0; i < spec.num_hidden_layers; ++i) {
    if (!Qwen3MoeLayerIsSparse(*moe, i)) continue;
    decoder.moe.sparse[static_cast<size_t>(i)] = true;
    ModuleSpec& layer = LayerModule(spec, i);
    ModuleSpec& mlp = Child(layer, "mlp");
    const std::string act_class = Child(mlp, "act_fn").class_name;
    mlp = SparseMoeBlock(layer, "Qwen3Moe", *moe, hidden, act_class, spec.dtype, /*router_first=*/false);
    const std::string experts = layer.ChildName("mlp.experts");
    spec.per_expert_storage.push_back(ExpertsStorage{experts, experts, "gate_proj.weight", "up_proj.weight",
                                                     "down_proj.weight", moe->num_experts, hidden, moe->intermediate,
                                                     spec.dtype});
  }
  return absl::OkStatus();
}

}  // namespace strata::planner::internal
