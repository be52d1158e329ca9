// Pieces shared by the Qwen3, Qwen3-MoE and Mixtral specs (model_spec_moe.h): the MoE config fields and
// the sparse MoE block as transformers 5.23 builds it (models/{qwen3_moe,mixtral}/modeling_*.py: the
// experts are one module holding fused 3-D parameters, with the activation as its child).

#include "planner/model_spec_moe.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "planner/spec_builder.h"

namespace strata::planner::internal {
namespace {

using json = nlohmann::json;
using spec_builder::FieldError;

// An integer field in [min, max], `fallback` when absent. Booleans and floats are not integers (the
// config dataclasses are strict).
absl::StatusOr<int64_t> IntField(const json& config, absl::string_view field, int64_t fallback, int64_t min,
                                 int64_t max) {
  auto it = config.find(field);
  if (it == config.end()) return fallback;
  if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(max))) {
    return FieldError(field, absl::StrCat("must be an integer between ", min, " and ", max, ", got ", it->dump()));
  }
  const int64_t v = it->get<int64_t>();
  if (v < min || v > max) {
    return FieldError(field, absl::StrCat("must be an integer between ", min, " and ", max, ", got ", it->dump()));
  }
  return v;
}

absl::Status CheckExperts(const MoeFields& moe, absl::string_view experts_field) {
  if (moe.top_k > moe.num_experts) {
    return FieldError("num_experts_per_tok",
                      absl::StrCat("(", moe.top_k, ") must not exceed ", experts_field, " (", moe.num_experts, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* ExpertsField(const json& config) {
  return config.contains("num_local_experts") || !config.contains("num_experts") ? "num_local_experts" : "num_experts";
}

absl::StatusOr<MoeFields> ReadQwen3MoeFields(const json& config) {
  MoeFields moe;
  // Qwen3MoeDecoderLayer builds dense MLPs only when num_experts is 0; a MoE architecture without experts
  // is refused here rather than served as a differently-sized dense model.
  const char* experts_field = ExpertsField(config);
  absl::StatusOr<int64_t> experts = IntField(config, experts_field, 128, 1, kMaxExperts);
  if (!experts.ok()) return experts.status();
  absl::StatusOr<int64_t> top_k = IntField(config, "num_experts_per_tok", 8, 1, kMaxExperts);
  if (!top_k.ok()) return top_k.status();
  absl::StatusOr<int64_t> inter = IntField(config, "moe_intermediate_size", 768, 1, kMaxHiddenSize);
  if (!inter.ok()) return inter.status();
  // (i + 1) % decoder_sparse_step: 0 divides by zero upstream.
  absl::StatusOr<int64_t> step = IntField(config, "decoder_sparse_step", 1, 1, kMaxHiddenLayers);
  if (!step.ok()) return step.status();
  moe.num_experts = *experts;
  moe.top_k = *top_k;
  moe.intermediate = *inter;
  moe.decoder_sparse_step = *step;
  if (auto it = config.find("mlp_only_layers"); it != config.end() && !it->is_null()) {
    if (!it->is_array())
      return FieldError("mlp_only_layers", absl::StrCat("must be a list of integers, got ", it->dump()));
    for (size_t i = 0; i < it->size(); ++i) {
      const json& v = (*it)[i];
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{1} << 62)) {
        return FieldError(absl::StrCat("mlp_only_layers[", i, "]"), absl::StrCat("must be an integer, got ", v.dump()));
      }
      moe.mlp_only_layers.push_back(v.get<int64_t>());
    }
  }
  if (auto it = config.find("norm_topk_prob"); it != config.end()) {
    if (!it->is_boolean()) return FieldError("norm_topk_prob", absl::StrCat("must be true or false, got ", it->dump()));
    moe.norm_topk_prob = it->get<bool>();
  }
  if (absl::Status s = CheckExperts(moe, experts_field); !s.ok()) return s;
  return moe;
}

absl::StatusOr<MoeFields> ReadMixtralFields(const json& config) {
  MoeFields moe;
  const char* experts_field = ExpertsField(config);
  absl::StatusOr<int64_t> experts = IntField(config, experts_field, 8, 1, kMaxExperts);
  if (!experts.ok()) return experts.status();
  absl::StatusOr<int64_t> top_k = IntField(config, "num_experts_per_tok", 2, 1, kMaxExperts);
  if (!top_k.ok()) return top_k.status();
  moe.num_experts = *experts;
  moe.top_k = *top_k;
  moe.norm_topk_prob = true;  // MixtralTopKRouter always divides by the top-k sum
  if (absl::Status s = CheckExperts(moe, experts_field); !s.ok()) return s;
  return moe;
}

absl::Status CheckExpertModules(int64_t num_experts, int64_t sparse_layers, const char* experts_field) {
  // Both are capped (kMaxExperts, kMaxHiddenLayers), so the product fits.
  if (num_experts * sparse_layers > kMaxExpertModules) {
    return FieldError(experts_field,
                      absl::StrCat("(", num_experts, ") x ", sparse_layers, " sparse layers is more than ",
                                   kMaxExpertModules, " expert modules"));
  }
  return absl::OkStatus();
}

bool Qwen3MoeLayerIsSparse(const MoeFields& moe, int64_t layer) {
  for (int64_t l : moe.mlp_only_layers) {
    if (l == layer) return false;
  }
  return moe.num_experts > 0 && (layer + 1) % moe.decoder_sparse_step == 0;
}

ModuleSpec& Child(ModuleSpec& module, const std::string& local) {
  for (ModuleSpec& c : module.children) {
    if (c.name == module.ChildName(local)) return c;
  }
  // Only called on trees model_spec_llama.cc just built, which have every child asked for.
  return module.children.front();
}

ModuleSpec& LayerModule(ModelSpec& spec, int64_t layer) {
  return Child(Child(Child(spec.root, "model"), "layers"), std::to_string(layer));
}

void AddQkNorms(ModelSpec& spec, const std::string& prefix) {
  for (int64_t i = 0; i < spec.num_hidden_layers; ++i) {
    ModuleSpec& attn = Child(LayerModule(spec, i), "self_attn");
    for (const char* local : {"q_norm", "k_norm"}) {
      ModuleSpec norm;
      norm.name = attn.ChildName(local);
      norm.class_name = prefix + "RMSNorm";
      norm.parameters.push_back(TensorSpec{"weight", {spec.head_dim}, spec.dtype, true});
      attn.children.push_back(std::move(norm));
    }
  }
}

ModuleSpec SparseMoeBlock(const ModuleSpec& layer, const std::string& prefix, const MoeFields& moe, int64_t hidden,
                          const std::string& act_class, DType dtype, bool router_first) {
  ModuleSpec block;
  block.name = layer.ChildName("mlp");
  block.class_name = prefix + "SparseMoeBlock";

  ModuleSpec experts;
  experts.name = block.ChildName("experts");
  experts.class_name = prefix + "Experts";
  experts.parameters.push_back(
      TensorSpec{"gate_up_proj", {moe.num_experts, 2 * moe.intermediate, hidden}, dtype, true});
  experts.parameters.push_back(TensorSpec{"down_proj", {moe.num_experts, hidden, moe.intermediate}, dtype, true});
  ModuleSpec act;
  act.name = experts.ChildName("act_fn");
  act.class_name = act_class;
  experts.children.push_back(std::move(act));

  ModuleSpec router;
  router.name = block.ChildName("gate");
  router.class_name = prefix + "TopKRouter";
  router.parameters.push_back(TensorSpec{"weight", {moe.num_experts, hidden}, dtype, true});

  if (router_first) {
    block.children.push_back(std::move(router));
    block.children.push_back(std::move(experts));
  } else {
    block.children.push_back(std::move(experts));
    block.children.push_back(std::move(router));
  }
  return block;
}

}  // namespace strata::planner::internal
