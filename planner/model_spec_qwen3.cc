// Qwen3ForCausalLM and Qwen3MoeForCausalLM (transformers 5.23 models/qwen3, models/qwen3_moe): the Llama
// layout of model_spec_llama.cc plus an RMSNorm over each query and key head (q_norm, k_norm, after
// o_proj in registration order) and, for Qwen3-MoE, Qwen3MoeSparseMoeBlock (experts, then gate) in the
// layers that are sparse; the others keep Qwen3MoeMLP with intermediate_size. Checkpoints store the
// experts one tensor per expert (mlp.experts.E.{gate,up,down}_proj.weight).

#include <string>

#include "absl/strings/str_cat.h"
#include "planner/model_spec_moe.h"

namespace strata::planner::internal {

absl::Status ExtendQwen3Spec(const nlohmann::json& /*config*/, ModelSpec& spec) {
  AddQkNorms(spec, "Qwen3");
  return absl::OkStatus();
}

absl::Status ExtendQwen3MoeSpec(const nlohmann::json& config, ModelSpec& spec) {
  absl::StatusOr<MoeFields> moe = ReadQwen3MoeFields(config);
  if (!moe.ok()) return moe.status();
  int64_t sparse_layers = 0;
  for (int64_t i = 0; i < spec.num_hidden_layers; ++i) sparse_layers += Qwen3MoeLayerIsSparse(*moe, i) ? 1 : 0;
  const char* experts_field = ExpertsField(config);
  if (absl::Status s = CheckExpertModules(moe->num_experts, sparse_layers, experts_field); !s.ok()) return s;
  AddQkNorms(spec, "Qwen3Moe");
  const int64_t hidden = Child(Child(spec.root, "model"), "embed_tokens").parameters.front().shape[1];
  for (int64_t i = 0; i < spec.num_hidden_layers; ++i) {
    if (!Qwen3MoeLayerIsSparse(*moe, i)) continue;
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
