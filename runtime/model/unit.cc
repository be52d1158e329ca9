#include "runtime/model/unit.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "runtime/model/deepseek_model.h"
#include "runtime/model/gemma_model.h"
#include "runtime/model/glm4_moe_model.h"
#include "runtime/model/gpt_oss_model.h"
#include "runtime/model/llama_model.h"
#include "runtime/model/phi3_model.h"
#include "runtime/model/qwen3_model.h"

namespace strata::runtime {
namespace {

const planner::ModuleSpec* Child(const planner::ModuleSpec& parent, std::string_view local) {
  const std::string name = parent.ChildName(local);
  for (const planner::ModuleSpec& child : parent.children) {
    if (child.name == name) return &child;
  }
  return nullptr;
}

void CollectParameters(const planner::ModuleSpec& module, std::vector<std::string>& out) {
  for (const planner::TensorSpec& p : module.parameters) out.push_back(module.ChildName(p.name));
  for (const planner::ModuleSpec& child : module.children) CollectParameters(child, out);
}

// Persistent buffers a runner may read too (DeepSeekMoE's e_score_correction_bias).
void CollectPersistentBuffers(const planner::ModuleSpec& module, std::vector<std::string>& out) {
  for (const planner::TensorSpec& b : module.buffers) {
    if (b.persistent) out.push_back(module.ChildName(b.name));
  }
  for (const planner::ModuleSpec& child : module.children) CollectPersistentBuffers(child, out);
}

}  // namespace

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

// The table: one line per family. A family missing here is a -Wswitch warning.
const UnitRunner& RunnerFor(ModelFamily family) {
  static constexpr UnitRunner kLlama{LlamaUnitWeights, RunLlamaUnit};
  static constexpr UnitRunner kQwen3{Qwen3UnitWeights, RunQwen3Unit};
  static constexpr UnitRunner kGemma{GemmaUnitWeights, RunGemmaUnit};
  static constexpr UnitRunner kPhi3{Phi3UnitWeights, RunPhi3Unit};
  static constexpr UnitRunner kDeepseekV3{DeepseekV3UnitWeights, RunDeepseekV3Unit};
  static constexpr UnitRunner kGlm4Moe{Glm4MoeUnitWeights, RunGlm4MoeUnit};
  static constexpr UnitRunner kGptOss{GptOssUnitWeights, RunGptOssUnit};
  switch (family) {
    case ModelFamily::kLlama:
      return kLlama;
    case ModelFamily::kQwen3:
    case ModelFamily::kMixtral:
    case ModelFamily::kMiniMaxM2:
      return kQwen3;
    case ModelFamily::kGemma2:
    case ModelFamily::kGemma3:
      return kGemma;
    case ModelFamily::kPhi3:
      return kPhi3;
    case ModelFamily::kDeepseekV3:
      return kDeepseekV3;
    case ModelFamily::kGlm4Moe:
      return kGlm4Moe;
    case ModelFamily::kGptOss:
      return kGptOss;
  }
  return kLlama;
}

absl::StatusOr<std::vector<UnitModule>> UnitModules(const planner::ModelSpec& spec) {
  auto missing = [&](const std::string& name) {
    return absl::InvalidArgumentError(absl::StrCat(spec.architecture, ": the module tree has no module ", name));
  };
  const planner::ModuleSpec* model = Child(spec.root, "model");
  if (model == nullptr) return missing("model");
  const planner::ModuleSpec* embed = Child(*model, "embed_tokens");
  if (embed == nullptr) return missing("model.embed_tokens");
  const planner::ModuleSpec* layers = Child(*model, "layers");
  if (layers == nullptr) return missing("model.layers");
  const planner::ModuleSpec* norm = Child(*model, "norm");
  if (norm == nullptr) return missing("model.norm");
  const planner::ModuleSpec* head = Child(spec.root, "lm_head");
  if (head == nullptr) return missing("lm_head");
  std::vector<UnitModule> units = {{UnitKind::kEmbedding, -1, embed}};
  for (const planner::ModuleSpec& layer : layers->children) {
    // A kept multi-token-prediction layer (the last child) is not one of the forward pass's (MtpUnitModule).
    if (spec.mtp_kept && &layer == &layers->children.back()) break;
    units.push_back({UnitKind::kDecoderLayer, static_cast<int64_t>(units.size() - 1), &layer});
  }
  units.push_back({UnitKind::kFinalNorm, -1, norm});
  units.push_back({UnitKind::kLmHead, -1, head});
  return units;
}

absl::StatusOr<MtpUnitModule> FindMtpUnitModule(const planner::ModelSpec& spec) {
  const planner::ModuleSpec* model = Child(spec.root, "model");
  const planner::ModuleSpec* layers = model != nullptr ? Child(*model, "layers") : nullptr;
  if (!spec.mtp_kept || layers == nullptr || layers->children.empty() || !spec.decoder.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.architecture, ": the spec keeps no multi-token-prediction layer"));
  }
  MtpUnitModule out;
  const planner::ModuleSpec& layer = layers->children.back();
  out.layer = layer;
  out.layer.children.clear();
  for (const planner::ModuleSpec& child : layer.children) {
    const std::string local = child.name.substr(layer.name.size() + 1);
    if (local == "enorm" || local == "hnorm" || local == "eh_proj" || local == "shared_head" ||
        local == "embed_tokens") {
      continue;
    }
    out.layer.children.push_back(child);
  }
  for (const char* local :
       {"embed_tokens.weight", "enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"}) {
    out.extras.push_back(absl::StrCat(layer.name, ".", local));
  }
  out.index = spec.decoder->mtp_layer;
  return out;
}

bool ReadByLinear(UnitKind kind, const std::string& local) {
  if (kind == UnitKind::kLmHead) return local == "weight";
  // MLA's kv_b_proj is also read per head (absorbed into the decode query and output: deepseek_model.h).
  if (local.ends_with("kv_b_proj.weight")) return false;
  return kind == UnitKind::kDecoderLayer &&
         (local.ends_with("_proj.weight") || local.ends_with("_proj_with_mqa.weight"));
}

absl::StatusOr<std::vector<std::string>> UnitTensorNames(const UnitModule& unit, const DecoderConfig& dims,
                                                         const planner::SpecQuantization* quantized) {
  const planner::ModuleSpec& module = *unit.module;
  std::vector<std::string> in_tree;
  CollectParameters(module, in_tree);
  std::set<std::string> present(in_tree.begin(), in_tree.end());
  std::vector<std::string> buffers;
  CollectPersistentBuffers(module, buffers);
  present.insert(buffers.begin(), buffers.end());
  std::vector<std::string> names;
  std::vector<std::string> packed_modules;  // "...q_proj.": every tensor of a packed layer but its bias is read
  for (const std::string& local : RunnerFor(dims.family).weights(unit.kind, unit.layer, dims)) {
    std::string name = module.ChildName(local);
    if (quantized != nullptr) {
      if (auto it = quantized->linears.find(name); it != quantized->linears.end()) {
        packed_modules.push_back(it->second.module + ".");
        names.push_back(std::move(name));
        continue;
      }
    }
    if (!present.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("module ", module.name, " (", module.class_name,
                                                     ") has no parameter ", name, ", which its unit runner reads"));
    }
    names.push_back(std::move(name));
  }
  // A parameter the runner would not read is a model it would compute wrongly: refused, never dropped.
  const std::set<std::string> read(names.begin(), names.end());
  const std::string experts = module.ChildName("mlp.experts.");
  for (const std::string& name : in_tree) {
    if (read.contains(name) || name.starts_with(experts)) continue;
    const bool in_packed = std::any_of(packed_modules.begin(), packed_modules.end(), [&](const std::string& prefix) {
      return name.starts_with(prefix) && name.substr(prefix.size()) != "bias";
    });
    if (in_packed) continue;
    return absl::InvalidArgumentError(absl::StrCat("module ", module.name, " (", module.class_name,
                                                   ") holds parameter ", name,
                                                   ", which its unit runner does not read"));
  }
  return names;
}

at::Tensor RunUnit(const Unit& unit, const std::vector<WeightTensor>& weights, const DecoderConfig& dims,
                   const at::Tensor& hidden, AttentionBatch& batch, KvLayer* cache, const at::Tensor& last) {
  return RunnerFor(dims.family).run(unit, weights, dims, hidden, batch, cache, last);
}

}  // namespace strata::runtime
