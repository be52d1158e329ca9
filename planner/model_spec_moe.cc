// Pieces shared by the Qwen3, Qwen3-MoE and Mixtral specs (model_spec_moe.h): the MoE config fields and
// the sparse MoE block as transformers 5.23 builds it (models/{qwen3_moe,mixtral}/modeling_*.py: the
// experts are one module holding fused 3-D parameters, with the activation as its child).

#include "planner/model_spec_moe.h"

#include <algorithm>
#include <cmath>
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

// A positive integer field at most `max` (or 0 where `may_be_zero`) into `out`, left as it is when absent.
absl::Status ReadInt(const json& config, const char* field, int64_t& out, int64_t max, bool may_be_zero = false) {
  auto it = config.find(field);
  if (it == config.end()) return absl::OkStatus();
  if (may_be_zero && it->is_number_integer() && it->get<int64_t>() == 0) {
    out = 0;
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> v = spec_builder::PositiveIntAtMost(*it, field, max);
  if (!v.ok()) return v.status();
  out = *v;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GroupRouterFields> ReadGroupRouterFields(const json& config, const GroupRouterFields& defaults,
                                                        int64_t layers) {
  GroupRouterFields f = defaults;
  if (absl::Status s = ReadInt(config, "moe_intermediate_size", f.moe_intermediate, kMaxHiddenSize); !s.ok()) return s;
  if (absl::Status s = ReadInt(config, "n_shared_experts", f.n_shared_experts, 1024, /*may_be_zero=*/true); !s.ok()) {
    return s;
  }
  // n_routed_experts, or its alias num_local_experts (the config's attribute_map).
  const char* experts_field = config.contains("n_routed_experts") ? "n_routed_experts" : "num_local_experts";
  if (absl::Status s = ReadInt(config, experts_field, f.n_routed_experts, kMaxExperts); !s.ok()) return s;
  if (absl::Status s = ReadInt(config, "n_group", f.n_group, kMaxExperts); !s.ok()) return s;
  if (absl::Status s = ReadInt(config, "topk_group", f.topk_group, kMaxExperts); !s.ok()) return s;
  if (absl::Status s = ReadInt(config, "num_experts_per_tok", f.top_k, kMaxExperts); !s.ok()) return s;
  if (absl::Status s = ReadInt(config, "first_k_dense_replace", f.first_k_dense_replace, kMaxHiddenLayers,
                               /*may_be_zero=*/true);
      !s.ok()) {
    return s;
  }
  // The router's shapes: groups of equal size, topk_group of them kept, top_k experts among the kept ones.
  if (f.n_routed_experts % f.n_group != 0) {
    return FieldError("n_routed_experts",
                      absl::StrCat("(", f.n_routed_experts, ") must be a multiple of n_group (", f.n_group, ")"));
  }
  if (f.topk_group > f.n_group) {
    return FieldError("topk_group", absl::StrCat("(", f.topk_group, ") must be at most n_group (", f.n_group, ")"));
  }
  const int64_t per_group = f.n_routed_experts / f.n_group;
  if (per_group < 2) {
    // A group's score is the sum of its two best experts' (topk(2) in the router).
    return FieldError("n_group", absl::StrCat("(", f.n_group, ") leaves fewer than 2 experts per group"));
  }
  if (f.top_k > f.topk_group * per_group) {
    return FieldError("num_experts_per_tok", absl::StrCat("(", f.top_k, ") exceeds the experts of topk_group (",
                                                          f.topk_group, ") groups of ", per_group));
  }
  if (absl::Status s =
          CheckExpertModules(f.n_routed_experts, std::max<int64_t>(0, layers - f.first_k_dense_replace), experts_field);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<double> scaling = spec_builder::NumberOr(config, "", "routed_scaling_factor", f.routed_scaling_factor);
  if (!scaling.ok()) return scaling.status();
  if (!(*scaling > 0) || !std::isfinite(*scaling)) {
    return FieldError("routed_scaling_factor", "must be a positive finite number");
  }
  f.routed_scaling_factor = *scaling;
  absl::StatusOr<bool> norm = spec_builder::BoolOr(config, "norm_topk_prob", f.norm_topk_prob);
  if (!norm.ok()) return norm.status();
  f.norm_topk_prob = *norm;
  return f;
}

void SetGroupRouterMoe(const GroupRouterFields& f, int64_t layers, MoeConfig& moe) {
  moe.router = MoeConfig::Router::kSigmoidGroups;
  moe.num_experts = f.n_routed_experts;
  moe.top_k = f.top_k;
  moe.norm_topk_prob = f.norm_topk_prob;
  moe.weights_in_float32 = true;
  moe.n_group = f.n_group;
  moe.topk_group = f.topk_group;
  moe.routed_scaling_factor = f.routed_scaling_factor;
  moe.shared_intermediate = f.moe_intermediate * f.n_shared_experts;
  moe.sparse.assign(static_cast<size_t>(layers), false);
  for (int64_t i = f.first_k_dense_replace; i < layers; ++i) moe.sparse[static_cast<size_t>(i)] = true;
}

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
