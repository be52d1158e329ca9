#include "planner/model_registry.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "planner/quantized_spec.h"
#include "planner/spec_builder.h"

namespace strata::planner {
namespace {

// One line per architecture. Llama's builder serves six of them (model_spec_llama.cc's trait table holds
// their differences); Gemma's two.
constexpr Architecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama", ModelFamily::kLlama, LlamaFamilySpecFromConfig},
    {"MistralForCausalLM", "mistral", ModelFamily::kLlama, LlamaFamilySpecFromConfig},
    {"Qwen2ForCausalLM", "qwen2", ModelFamily::kLlama, LlamaFamilySpecFromConfig},
    {"Qwen3ForCausalLM", "qwen3", ModelFamily::kQwen3, LlamaFamilySpecFromConfig},
    {"Qwen3MoeForCausalLM", "qwen3_moe", ModelFamily::kQwen3, LlamaFamilySpecFromConfig},
    {"MixtralForCausalLM", "mixtral", ModelFamily::kMixtral, LlamaFamilySpecFromConfig},
    {"Gemma2ForCausalLM", "gemma2", ModelFamily::kGemma2, GemmaSpecFromConfig},
    {"Gemma3ForCausalLM", "gemma3_text", ModelFamily::kGemma3, GemmaSpecFromConfig},
    {"Phi3ForCausalLM", "phi3", ModelFamily::kPhi3, Phi3SpecFromConfig},
    {"DeepseekV3ForCausalLM", "deepseek_v3", ModelFamily::kDeepseekV3, DeepseekV3SpecFromConfig},
    // Kimi K2 (moonshotai): DeepSeek-V3's architecture and class under its own model_type (its config class
    // is remote code; transformers' DeepseekV3Config reads the same fields).
    {"DeepseekV3ForCausalLM", "kimi_k2", ModelFamily::kDeepseekV3, DeepseekV3SpecFromConfig},
    {"Glm4MoeForCausalLM", "glm4_moe", ModelFamily::kGlm4Moe, Glm4MoeSpecFromConfig},
    {"MiniMaxM2ForCausalLM", "minimax_m2", ModelFamily::kMiniMaxM2, MiniMaxM2SpecFromConfig},
    {"GptOssForCausalLM", "gpt_oss", ModelFamily::kGptOss, GptOssSpecFromConfig},
};

}  // namespace

absl::Span<const Architecture> Architectures() { return kArchitectures; }

absl::StatusOr<const Architecture*> ResolveArchitecture(const nlohmann::json& config) {
  using spec_builder::FieldError;
  std::vector<absl::string_view> supported;
  for (const Architecture& a : kArchitectures) {
    if (std::find(supported.begin(), supported.end(), a.name) == supported.end()) supported.push_back(a.name);
  }
  const std::string hint = absl::StrCat(" (supported: ", absl::StrJoin(supported, ", "),
                                        "); describe other models with a module tree: run "
                                        "tools/export_module_tree.py and pass --module-tree");

  const Architecture* by_model_type = nullptr;
  std::string model_type;
  if (auto it = config.find("model_type"); it != config.end() && !it->is_null()) {
    if (!it->is_string()) return FieldError("model_type", absl::StrCat("must be a string, got ", it->dump()));
    model_type = it->get<std::string>();
    for (const Architecture& a : kArchitectures) {
      if (a.model_type == model_type) by_model_type = &a;
    }
  }

  auto arch_it = config.find("architectures");
  if (arch_it == config.end() || arch_it->is_null()) {
    if (by_model_type != nullptr) return by_model_type;
    if (model_type.empty()) {
      return absl::InvalidArgumentError("config.json: neither architectures nor model_type is set" + hint);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: model_type \"", model_type, "\" is not supported", hint));
  }
  if (!arch_it->is_array() || arch_it->empty() || !(*arch_it)[0].is_string()) {
    return FieldError("architectures", absl::StrCat("must be a non-empty array of strings, got ", arch_it->dump()));
  }
  const std::string name = (*arch_it)[0].get<std::string>();
  // A class under several model types (DeepseekV3ForCausalLM: deepseek_v3, kimi_k2) is the row of the config's.
  const Architecture* arch = by_model_type != nullptr && by_model_type->name == name ? by_model_type : nullptr;
  for (const Architecture& a : kArchitectures) {
    if (a.name == name && arch == nullptr) arch = &a;
  }
  if (arch == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: architecture \"", name, "\" is not supported", hint));
  }
  // AutoModelForCausalLM picks the class from model_type, not from architectures: a config naming two
  // different classes would be built differently by transformers than it says; an unknown model_type is
  // refused by AutoConfig.
  if (!model_type.empty() && by_model_type != arch) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: architectures[0] is \"", name, "\" but model_type is \"", model_type, "\""));
  }
  return arch;
}

namespace {

// SpecOptions::mtp: the family's MTP layer into the tree, as the last child of model.layers, its head tied to lm_head
// (DeepSeek shares the output head: the planner places the layer with it, and it is not counted twice), its tensors
// no longer ignored, its per-layer settings at its index.
absl::Status KeepMtpLayer(ModelSpec& spec) {
  if (!spec.mtp) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: num_nextn_predict_layers: ", spec.architecture,
                     " declares no multi-token-prediction layer, which --speculative mtp proposes with"));
  }
  if (!spec.decoder.ok()) return spec.decoder.status();
  ModuleSpec* model = nullptr;
  for (ModuleSpec& child : spec.root.children) {
    if (child.name == "model") model = &child;
  }
  ModuleSpec* layers = nullptr;
  for (ModuleSpec& child : model != nullptr ? model->children : spec.root.children) {
    if (child.name == "model.layers") layers = &child;
  }
  if (model == nullptr || layers == nullptr) {
    return absl::InternalError(absl::StrCat(spec.architecture, ": the module tree has no model.layers"));
  }
  const std::string prefix = spec.mtp->module.name + ".";
  layers->children.push_back(spec.mtp->module);
  spec.tied_weights[prefix + "shared_head.head.weight"] = "lm_head.weight";
  spec.per_expert_storage.insert(spec.per_expert_storage.end(), spec.mtp->experts.begin(), spec.mtp->experts.end());
  std::erase(spec.ignored_prefixes, prefix);
  if (std::find(spec.no_split_classes.begin(), spec.no_split_classes.end(), spec.mtp->module.class_name) ==
      spec.no_split_classes.end()) {
    spec.no_split_classes.push_back(spec.mtp->module.class_name);
  }
  DecoderConfig& decoder = *spec.decoder;
  decoder.mtp_layer = decoder.num_layers;
  decoder.moe.sparse.resize(static_cast<size_t>(decoder.num_layers), false);
  decoder.moe.sparse.push_back(spec.mtp->sparse);
  decoder.sliding_window.resize(static_cast<size_t>(decoder.num_layers), 0);
  decoder.sliding_window.push_back(0);
  spec.mtp_kept = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpec> ModelSpecFromConfig(const nlohmann::json& config, DType dtype, const SpecOptions& options) {
  if (!config.is_object()) return absl::InvalidArgumentError("config.json: expected a JSON object");
  // Every family's config states it (its config class has a default); null or absent is "unknown". Read
  // first, for the families' RoPE defaults; an error is reported after the family's own.
  absl::StatusOr<int64_t> positions =
      spec_builder::PositiveIntOr(config, "max_position_embeddings", 0, /*may_be_null=*/true, kMaxPositions);
  const int64_t max_positions = positions.ok() ? *positions : 0;
  absl::StatusOr<const Architecture*> arch = ResolveArchitecture(config);
  if (!arch.ok()) return arch.status();
  absl::StatusOr<ModelSpec> spec = (*arch)->build(config, **arch, dtype, max_positions);
  if (!spec.ok()) return spec;
  if (!positions.ok()) return positions.status();
  if (spec->decoder.ok()) spec->decoder->family = (*arch)->family;
  spec->max_position_embeddings = *positions;
  if (auto eos = config.find("eos_token_id"); eos != config.end()) {
    spec->eos_token_ids = EosTokenIdsFromJson(*eos, "config.json");
  }
  if (options.mtp) {
    if (absl::Status s = KeepMtpLayer(*spec); !s.ok()) return s;
  }
  // One place for every family: the quantized layers and the tree sized as the files hold them.
  if (absl::Status s = QuantizeSpec(config, *spec); !s.ok()) return s;
  return spec;
}

}  // namespace strata::planner
