// MixtralForCausalLM (transformers 5.23 models/mixtral): the Mistral layout of model_spec_llama.cc with
// every layer's MLP replaced by MixtralSparseMoeBlock (gate, then experts; the experts' intermediate size
// is intermediate_size). Checkpoints keep the pre-5.0 names: block_sparse_moe.gate.weight for the router
// and block_sparse_moe.experts.E.{w1,w3,w2}.weight for each expert's gate, up and down projections.
// The forward pass routes each token to num_experts_per_tok experts, always renormalising their
// probabilities, and keeps the routing weights float32.

#include <string>

#include "absl/strings/str_cat.h"
#include "planner/model_spec_moe.h"

namespace strata::planner::internal {

absl::Status ExtendMixtralSpec(const nlohmann::json& config, ModelSpec& spec, DecoderConfig& decoder) {
  absl::StatusOr<MoeFields> moe = ReadMixtralFields(config);
  if (!moe.ok()) return moe.status();
  const char* experts_field = ExpertsField(config);
  if (absl::Status s = CheckExpertModules(moe->num_experts, spec.num_hidden_layers, experts_field); !s.ok()) return s;
  decoder.moe.num_experts = moe->num_experts;
  decoder.moe.top_k = moe->top_k;
  decoder.moe.norm_topk_prob = moe->norm_topk_prob;
  decoder.moe.weights_in_float32 = true;
  decoder.moe.sparse.assign(static_cast<size_t>(spec.num_hidden_layers), true);
  const int64_t hidden = Child(Child(spec.root, "model"), "embed_tokens").parameters.front().shape[1];
  for (int64_t i = 0; i < spec.num_hidden_layers; ++i) {
    ModuleSpec& layer = LayerModule(spec, i);
    ModuleSpec& mlp = Child(layer, "mlp");
    // The dense MLP the Llama layout built has the expert shape: its gate_proj is [intermediate, hidden].
    moe->intermediate = Child(mlp, "gate_proj").parameters.front().shape[0];
    const std::string act_class = Child(mlp, "act_fn").class_name;
    mlp = SparseMoeBlock(layer, "Mixtral", *moe, hidden, act_class, spec.dtype, /*router_first=*/true);
    const std::string stored = absl::StrCat("model.layers.", i, ".block_sparse_moe");
    spec.stored_names[layer.ChildName("mlp.gate.weight")] = stored + ".gate.weight";
    spec.per_expert_storage.push_back(ExpertsStorage{layer.ChildName("mlp.experts"), stored + ".experts", "w1.weight",
                                                     "w3.weight", "w2.weight", moe->num_experts, hidden,
                                                     moe->intermediate, spec.dtype});
  }
  return absl::OkStatus();
}

}  // namespace strata::planner::internal
