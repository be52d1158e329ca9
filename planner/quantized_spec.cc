// Applying a quantization_config to a ModelSpec (quantized_spec.h). The rules are transformers 5.23's
// quantizers (quantizers/quantizer_*.py, integrations/*.py): which modules each replaces, the skip lists and
// how they match, and what each replacement module registers; `packed` sizing counts what the checkpoint
// stores instead.

#include "planner/quantized_spec.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"

namespace strata::planner {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// transformers' should_convert_module: a pattern skips a module when it matches the module's name from the
// start up to a module boundary (as a regex: "layers.1" skips "layers.1.mlp", not "layers.11.mlp"), or when
// the name ends with it as a plain string ("lm_head", "fc1").
bool SkippedByPatterns(const std::string& name, const std::vector<std::string>& patterns) {
  for (const std::string& pattern : patterns) {
    if (absl::EndsWith(name, pattern)) return true;
    std::regex re;
    try {
      re = std::regex(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error&) {
      continue;  // not a regex Python and ECMAScript share: only the suffix rule applies
    }
    // re.match(f"(?:{key})(?:(?<=\.)|(?=\.|$))", name): some prefix matches the whole pattern and ends at a
    // boundary (after a '.', before a '.' or at the end).
    for (size_t end = 0; end <= name.size(); ++end) {
      const bool boundary = end == name.size() || name[end] == '.' || (end > 0 && name[end - 1] == '.');
      if (boundary && std::regex_match(name.begin(), name.begin() + static_cast<std::ptrdiff_t>(end), re)) return true;
    }
  }
  return false;
}

void IndexModules(ModuleSpec& module, std::map<std::string, ModuleSpec*>& out) {
  out[module.name] = &module;
  for (ModuleSpec& child : module.children) IndexModules(child, out);
}

// transformers' get_keys_to_not_convert: both sides of every tied pair, the module of the model's last
// parameter and the output embeddings (lm_head), without ".weight".
std::vector<std::string> DefaultSkips(const ModelSpec& spec) {
  std::set<std::string> keys;
  for (const auto& [tied, target] : spec.tied_weights) {
    keys.insert(tied);
    keys.insert(target);
  }
  std::string last;
  auto walk = [&](const auto& self, const ModuleSpec& m) -> void {
    for (const TensorSpec& p : m.parameters) last = m.ChildName(p.name);
    for (const ModuleSpec& c : m.children) self(self, c);
  };
  walk(walk, spec.root);
  if (!last.empty()) keys.insert(last);
  keys.insert("lm_head.weight");  // every supported family's get_output_embeddings()
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    std::string name = k;
    if (absl::EndsWith(name, ".weight")) name.resize(name.size() - 7);
    out.push_back(name);
  }
  return out;
}

// FineGrainedFP8HfQuantizer._normalize_modules_to_not_convert: skip entries written with the checkpoint's
// names are renamed to the model's (Mixtral: ".block_sparse_moe." is ".mlp.").
std::string ModelNameOf(const ModelSpec& spec, const std::string& name) {
  if (spec.architecture != "MixtralForCausalLM") return name;
  std::string renamed = absl::StrReplaceAll(name + ".", {{".block_sparse_moe.", ".mlp."}});
  renamed.pop_back();
  return renamed;
}

// The modules transformers leaves dense, as patterns for SkippedByPatterns.
std::vector<std::string> NotConverted(const ModelSpec& spec, const QuantizationConfig& q) {
  std::vector<std::string> out;
  if (q.default_skips) out = DefaultSkips(spec);
  for (const std::string& name : q.not_converted) out.push_back(ModelNameOf(spec, name));
  return out;
}

QuantizedLinear MakeLinear(const QuantizationConfig& q, const std::string& module, int64_t n, int64_t k) {
  QuantizedLinear l;
  l.module = module;
  l.out_features = n;
  l.in_features = k;
  switch (q.method) {
    case QuantMethod::kFp8:
      l.layout = QuantLayout::kFp8Block;
      l.bits = 8;
      l.block_n = q.block_n;
      l.block_k = q.block_k;
      l.weight = module + ".weight";
      l.scale = module + ".weight_scale_inv";
      l.scale_ue8m0 = q.scale_ue8m0;
      l.scale_dtype = q.scale_ue8m0 ? DType::kUInt8 : DType::kFloat32;
      break;
    default:
      break;
  }
  return l;
}

// The stored tensors of one quantized linear: name -> expected (shape, dtype, accepted header dtypes).
std::vector<std::pair<std::string, ExpectedTensor>> StoredTensors(const QuantizedLinear& l) {
  std::vector<std::pair<std::string, ExpectedTensor>> out;
  switch (l.layout) {
    case QuantLayout::kFp8Block: {
      out.push_back({l.weight, {{l.out_features, l.in_features}, DType::kFloat8E4M3, {"F8_E4M3"}}});
      std::vector<std::string> scale_dtypes = {"F32", "BF16"};
      if (l.scale_ue8m0) scale_dtypes = {"U8", "F8_E8M0", "F32", "BF16"};
      out.push_back(
          {l.scale,
           {{CeilDiv(l.out_features, l.block_n), CeilDiv(l.in_features, l.block_k)}, l.scale_dtype, scale_dtypes}});
      break;
    }
    default:
      break;
  }
  return out;
}

// The parameters a quantized nn.Linear's module registers under `sizing` (bias kept where it was).
std::vector<TensorSpec> LinearParameters(const QuantizedLinear& l, const std::optional<TensorSpec>& bias,
                                         QuantizedSizing sizing, bool dense, DType dense_dtype) {
  std::vector<TensorSpec> out;
  const int64_t n = l.out_features;
  const int64_t k = l.in_features;
  if (dense) {  // transformers dequantizes: the nn.Linear it built
    out.push_back(TensorSpec{"weight", {n, k}, dense_dtype, true});
    if (bias) out.push_back(*bias);
    return out;
  }
  switch (l.layout) {
    case QuantLayout::kFp8Block: {
      // FP8Linear: weight, bias (nn.Linear's slots), weight_scale_inv float32 (float8_e8m0fnu for ue8m0).
      out.push_back(TensorSpec{"weight", {n, k}, DType::kFloat8E4M3, true});
      if (bias) out.push_back(*bias);
      DType scale = l.scale_dtype;
      if (sizing == QuantizedSizing::kTransformers) scale = l.scale_ue8m0 ? DType::kUInt8 : DType::kFloat32;
      out.push_back(TensorSpec{"weight_scale_inv", {CeilDiv(n, l.block_n), CeilDiv(k, l.block_k)}, scale, true});
      break;
    }
    default:
      break;
  }
  return out;
}

// The linears of expert `i` of `e`, keyed by their stored dense names.
struct ExpertLinearNames {
  std::string gate, up, down;
};
ExpertLinearNames ExpertNames(const ExpertsStorage& e, int64_t i) {
  const std::string p = absl::StrCat(e.stored_prefix, ".", i, ".");
  return {p + e.gate, p + e.up, p + e.down};
}

std::string StripWeight(const std::string& name) {
  return absl::EndsWith(name, ".weight") ? name.substr(0, name.size() - 7) : name;
}

// The parameters of a converted experts module (fused gate_up_proj [E, 2I, H], down_proj [E, H, I]).
std::vector<TensorSpec> ExpertsParameters(const ExpertsStorage& e, const QuantizedLinear& first, QuantizedSizing sizing,
                                          bool dense) {
  const int64_t ne = e.num_experts, h = e.hidden, in = e.intermediate;
  std::vector<TensorSpec> out;
  if (dense) {
    out.push_back(TensorSpec{"gate_up_proj", {ne, 2 * in, h}, e.dtype, true});
    out.push_back(TensorSpec{"down_proj", {ne, h, in}, e.dtype, true});
    return out;
  }
  switch (first.layout) {
    case QuantLayout::kFp8Block: {
      const int64_t bn = first.block_n, bk = first.block_k;
      if (sizing == QuantizedSizing::kTransformers) {
        // FP8Experts (_alloc_expert_proj): the fused gate_up scale grid has at least two rows.
        const DType scale = first.scale_ue8m0 ? DType::kUInt8 : DType::kFloat32;
        out.push_back(TensorSpec{"gate_up_proj", {ne, 2 * in, h}, DType::kFloat8E4M3, true});
        out.push_back(TensorSpec{
            "gate_up_proj_scale_inv", {ne, std::max<int64_t>(CeilDiv(2 * in, bn), 2), CeilDiv(h, bk)}, scale, true});
        out.push_back(TensorSpec{"down_proj", {ne, h, in}, DType::kFloat8E4M3, true});
        out.push_back(TensorSpec{"down_proj_scale_inv", {ne, CeilDiv(h, bn), CeilDiv(in, bk)}, scale, true});
      } else {
        // What the files hold: gate's and up's grids apiece.
        out.push_back(TensorSpec{"gate_up_proj", {ne, 2 * in, h}, DType::kFloat8E4M3, true});
        out.push_back(
            TensorSpec{"gate_up_proj_scale_inv", {ne, 2 * CeilDiv(in, bn), CeilDiv(h, bk)}, first.scale_dtype, true});
        out.push_back(TensorSpec{"down_proj", {ne, h, in}, DType::kFloat8E4M3, true});
        out.push_back(
            TensorSpec{"down_proj_scale_inv", {ne, CeilDiv(h, bn), CeilDiv(in, bk)}, first.scale_dtype, true});
      }
      break;
    }
    default:
      break;
  }
  return out;
}

// Whether transformers plans this spec dense under `sizing`.
bool PlannedDense(const SpecQuantization& q, QuantizedSizing sizing, bool keeps_fp8) {
  if (sizing == QuantizedSizing::kPacked) return false;
  if (q.config.dequantize) return true;
  return q.config.method == QuantMethod::kFp8 && !keeps_fp8;
}

}  // namespace

absl::Status QuantizeSpec(const nlohmann::json& config, ModelSpec& spec) {
  absl::StatusOr<std::optional<QuantizationConfig>> parsed = ParseQuantizationConfig(config);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->has_value()) return absl::OkStatus();
  SpecQuantization quantization;
  quantization.config = **parsed;
  const QuantizationConfig& q = quantization.config;
  const std::vector<std::string> skips = NotConverted(spec, q);

  std::set<std::string> experts_modules;
  for (const ExpertsStorage& e : spec.per_expert_storage) experts_modules.insert(e.module);
  std::map<std::string, ModuleSpec*> modules;
  IndexModules(spec.root, modules);
  for (const auto& [name, module] : modules) {
    if (module->class_name != "Linear" || absl::EndsWith(name, ".experts")) continue;
    if (SkippedByPatterns(name, skips)) continue;
    const TensorSpec& weight = module->parameters.front();  // nn.Linear: weight [out, in] first
    quantization.linears[module->ChildName("weight")] = MakeLinear(q, name, weight.shape[0], weight.shape[1]);
  }
  for (const ExpertsStorage& e : spec.per_expert_storage) {
    if (SkippedByPatterns(e.module, skips)) continue;
    for (int64_t i = 0; i < e.num_experts; ++i) {
      const ExpertLinearNames names = ExpertNames(e, i);
      quantization.linears[names.gate] = MakeLinear(q, StripWeight(names.gate), e.intermediate, e.hidden);
      quantization.linears[names.up] = MakeLinear(q, StripWeight(names.up), e.intermediate, e.hidden);
      quantization.linears[names.down] = MakeLinear(q, StripWeight(names.down), e.hidden, e.intermediate);
    }
  }
  spec.quantization = std::move(quantization);
  SizeQuantizedSpec(spec, QuantizedSizing::kPacked, /*keeps_fp8=*/true);
  return absl::OkStatus();
}

void AdoptStoredScaleDTypes(ModelSpec& spec, const std::map<std::string, std::string>& header_dtypes) {
  if (!spec.quantization) return;
  for (auto& [name, l] : spec.quantization->linears) {
    auto it = header_dtypes.find(l.scale);
    if (it == header_dtypes.end()) continue;
    const std::string& d = it->second;
    if (d == "F32") l.scale_dtype = DType::kFloat32;
    if (d == "BF16") l.scale_dtype = DType::kBFloat16;
    if (l.scale_ue8m0 && (d == "U8" || d == "F8_E8M0")) l.scale_dtype = DType::kUInt8;
  }
  SizeQuantizedSpec(spec, spec.quantization->sizing, /*keeps_fp8=*/!spec.quantization->planned_dense);
}

bool TransformersKeepsFp8(const MachineInventory& inventory) {
  if (inventory.gpus.empty()) return false;
  const GpuMemory& gpu = inventory.gpus.front();
  return gpu.compute_capability_major > 8 || (gpu.compute_capability_major == 8 && gpu.compute_capability_minor >= 9);
}

void SizeQuantizedSpec(ModelSpec& spec, QuantizedSizing sizing, bool keeps_fp8) {
  if (!spec.quantization) return;
  SpecQuantization& q = *spec.quantization;
  const bool dense = PlannedDense(q, sizing, keeps_fp8);
  std::map<std::string, ModuleSpec*> modules;
  IndexModules(spec.root, modules);
  std::set<std::string> expert_linears;
  for (const ExpertsStorage& e : spec.per_expert_storage) {
    const ExpertLinearNames first = ExpertNames(e, 0);
    auto l = q.linears.find(first.gate);
    if (l == q.linears.end()) continue;
    for (int64_t i = 0; i < e.num_experts; ++i) {
      const ExpertLinearNames names = ExpertNames(e, i);
      expert_linears.insert({names.gate, names.up, names.down});
    }
    auto m = modules.find(e.module);
    if (m != modules.end()) m->second->parameters = ExpertsParameters(e, l->second, sizing, dense);
  }
  for (const auto& [name, l] : q.linears) {
    if (expert_linears.contains(name)) continue;
    auto m = modules.find(l.module);
    if (m == modules.end()) continue;
    std::optional<TensorSpec> bias;
    for (const TensorSpec& t : m->second->parameters) {
      if (t.name == "bias") bias = t;
    }
    m->second->parameters = LinearParameters(l, bias, sizing, dense, spec.dtype);
  }
  q.sizing = sizing;
  q.planned_dense = dense;
}

void AddQuantizedCheckpointTensors(const ModelSpec& spec, std::map<std::string, ExpectedTensor>& tensors) {
  if (!spec.quantization) return;
  for (const auto& [name, l] : spec.quantization->linears) {
    // The module's own entries (the tree's sizing of it), bias aside, give way to what the files store.
    for (auto it = tensors.lower_bound(l.module + ".");
         it != tensors.end() && absl::StartsWith(it->first, l.module + ".");) {
      const std::string local = it->first.substr(l.module.size() + 1);
      if (local.find('.') == std::string::npos && local != "bias") {
        it = tensors.erase(it);
      } else {
        ++it;
      }
    }
    tensors.erase(name);
    for (auto& [stored, expected] : StoredTensors(l)) tensors[stored] = std::move(expected);
  }
}

std::string QuantizationSummary(const ModelSpec& spec) {
  if (!spec.quantization) return "none";
  const SpecQuantization& q = *spec.quantization;
  std::string out = absl::StrCat(QuantizationConfigSummary(q.config), ", ", q.linears.size(),
                                 " quantized linear layers, sized ", QuantizedSizingName(q.sizing));
  if (q.sizing == QuantizedSizing::kTransformers) {
    if (q.planned_dense) {
      absl::StrAppend(
          &out, q.config.dequantize ? " (dequantize: planned dense in " : " (dequantized: planned dense in ",
          std::string(DTypeName(spec.dtype)),
          q.config.dequantize ? ")" : "; transformers keeps FP8 only on a GPU of compute capability >= 8.9)");
    }
  } else {
    absl::StrAppend(&out, " (the bytes the checkpoint holds)");
  }
  return out;
}

nlohmann::ordered_json QuantizationToJson(const ModelSpec& spec) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (!spec.quantization) return out;
  const SpecQuantization& q = *spec.quantization;
  out["quant_method"] = q.config.quant_method;
  out["format"] = QuantizationConfigSummary(q.config);
  out["sizing"] = std::string(QuantizedSizingName(q.sizing));
  out["planned_dense"] = q.planned_dense;
  out["quantized_linears"] = q.linears.size();
  return out;
}

}  // namespace strata::planner
