// Applying a quantization_config to a ModelSpec (quantized_spec.h). The rules are transformers 5.23's
// quantizers (quantizers/quantizer_*.py, integrations/*.py): which modules each replaces, the skip lists and
// how they match, and what each replacement module registers; `packed` sizing counts what the checkpoint
// stores instead.

#include "planner/quantized_spec.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace strata::planner {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A skip or target pattern with its regex compiled once (null: a plain name). RE2 matches in time linear in the
// name whatever the pattern (config.json is input: a backtracking engine could be made to run for hours).
struct Pattern {
  std::string text;
  std::shared_ptr<const RE2> re;
};

// `strip` is the prefix a pattern must carry to be a regex ("re:" for compressed-tensors; "" for transformers,
// whose patterns all are). A regex RE2 cannot compile (Python's look-around and back-references) is an error
// naming `field`: matching it by other rules would silently convert other layers than the checkpoint did.
absl::StatusOr<std::vector<Pattern>> CompilePatterns(const std::vector<std::string>& patterns, absl::string_view strip,
                                                     absl::string_view field) {
  std::vector<Pattern> out;
  for (const std::string& p : patterns) {
    Pattern compiled{p, nullptr};
    if (absl::StartsWith(p, strip)) {
      RE2::Options options;
      options.set_log_errors(false);
      auto re = std::make_shared<const RE2>(p.substr(strip.size()), options);
      if (!re->ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config.json: quantization_config.", field, ": pattern \"", p,
                         "\" is not a regular expression strata can match (RE2 syntax: no look-around or "
                         "back-references): ",
                         re->error()));
      }
      compiled.re = std::move(re);
    }
    out.push_back(std::move(compiled));
  }
  return out;
}

// transformers' should_convert_module: a pattern skips a module when it matches the module's name from the
// start up to a module boundary (as a regex: "layers.1" skips "layers.1.mlp", not "layers.11.mlp"), or when
// the name ends with it as a plain string ("lm_head", "fc1").
bool SkippedByPatterns(const std::string& name, const std::vector<Pattern>& patterns) {
  for (const Pattern& pattern : patterns) {
    if (absl::EndsWith(name, pattern.text)) return true;
    if (!pattern.re) continue;
    // re.match(f"(?:{key})(?:(?<=\.)|(?=\.|$))", name): some prefix matches the whole pattern and ends at a
    // boundary (after a '.', before a '.' or at the end).
    for (size_t end = 0; end <= name.size(); ++end) {
      const bool boundary = end == name.size() || name[end] == '.' || (end > 0 && name[end - 1] == '.');
      if (boundary && RE2::FullMatch(re2::StringPiece(name.data(), end), *pattern.re)) {
        return true;
      }
    }
  }
  return false;
}

// compressed-tensors' is_match: a target names the module exactly, is "re:" and a regex matching the name from
// its start (Python's re.match), or names the module's class.
bool CompressedTensorsMatch(const std::string& name, const std::string& class_name,
                            const std::vector<Pattern>& targets) {
  for (const Pattern& target : targets) {
    if (target.text == name || target.text == class_name) return true;
    if (target.re && target.re->Match(name, 0, name.size(), RE2::ANCHOR_START, nullptr, 0)) return true;
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
  for (const std::string& name : q.not_converted) {
    out.push_back(q.method == QuantMethod::kFp8 ? ModelNameOf(spec, name) : name);
  }
  return out;
}

QuantizedLinear MakeLinear(const QuantizationConfig& q, const std::string& module, int64_t n, int64_t k,
                           DType dense_dtype) {
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
    case QuantMethod::kAwq:
    case QuantMethod::kGptq:
      l.layout = q.method == QuantMethod::kAwq ? QuantLayout::kAwqGemm : QuantLayout::kGptqV1;
      l.bits = q.bits;
      l.group_size = q.group_size > 0 ? q.group_size : k;
      l.symmetric = q.symmetric;
      l.weight = module + ".qweight";
      l.zero_point = module + ".qzeros";
      l.scale = module + ".scales";
      if (q.method == QuantMethod::kGptq) l.g_idx = module + ".g_idx";
      l.scale_dtype = DType::kFloat16;  // what AutoAWQ and GPTQ write; the header's when there is one
      break;
    case QuantMethod::kCompressedTensors:
      l.scale = module + ".weight_scale";
      l.scale_dtype = dense_dtype;  // compressed-tensors keeps scales in the model's dtype
      if (q.float_weights) {
        l.layout = QuantLayout::kFp8Block;
        l.bits = 8;
        l.weight = module + ".weight";
        l.block_n = q.strategy == "block" ? q.block_n : (q.strategy == "channel" ? 1 : n);
        l.block_k = q.strategy == "block" ? q.block_k : k;
        l.per_tensor_scale = q.strategy == "tensor";
      } else {
        l.layout = QuantLayout::kCompressedPacked;
        l.bits = q.bits;
        l.group_size = q.strategy == "group" ? q.group_size : k;
        l.symmetric = q.symmetric;
        l.weight = module + ".weight_packed";
        l.shape = module + ".weight_shape";
        if (!q.symmetric) l.zero_point = module + ".weight_zero_point";
      }
      break;
    case QuantMethod::kMxfp4:  // experts only (SpecQuantization::mxfp4_experts), never a linear layer
      break;
  }
  return l;
}

// A stored tensor of a quantized linear: its name local to the module, shape, dtype (the one the tree counts)
// and the safetensors dtypes the header may give it.
struct StoredPiece {
  std::string local;
  std::vector<int64_t> shape;
  DType dtype;
  std::vector<std::string> header_dtypes;
};

std::string LocalName(const QuantizedLinear& l, const std::string& full) { return full.substr(l.module.size() + 1); }

std::vector<StoredPiece> StoredPieces(const QuantizedLinear& l, QuantMethod method) {
  std::vector<StoredPiece> out;
  const int64_t n = l.out_features, k = l.in_features;
  switch (l.layout) {
    case QuantLayout::kFp8Block: {
      out.push_back({LocalName(l, l.weight), {n, k}, DType::kFloat8E4M3, {"F8_E4M3"}});
      std::vector<std::string> scale_dtypes = {"F32", "BF16"};
      if (method == QuantMethod::kCompressedTensors) scale_dtypes = {"F32", "BF16", "F16"};
      if (l.scale_ue8m0) scale_dtypes = {"U8", "F8_E8M0", "F32", "BF16"};
      std::vector<int64_t> grid = {CeilDiv(n, l.block_n), CeilDiv(k, l.block_k)};
      if (l.per_tensor_scale) grid = {1};
      out.push_back({LocalName(l, l.scale), grid, l.scale_dtype, scale_dtypes});
      break;
    }
    case QuantLayout::kCompressedPacked: {
      const int64_t groups = CeilDiv(k, l.group_size);
      out.push_back({LocalName(l, l.weight), {n, CeilDiv(k * l.bits, 32)}, DType::kInt32, {"I32"}});
      out.push_back({LocalName(l, l.scale), {n, groups}, l.scale_dtype, {"F32", "BF16", "F16"}});
      if (!l.zero_point.empty()) {
        // Packed along the output dimension (compressed-tensors' pack_to_int32(packed_dim=0)).
        out.push_back({LocalName(l, l.zero_point), {CeilDiv(n * l.bits, 32), groups}, DType::kInt32, {"I32"}});
      }
      out.push_back({LocalName(l, l.shape), {2}, DType::kInt64, {"I64", "I32"}});
      break;
    }
    case QuantLayout::kAwqGemm: {
      // qweight [K, N/8] and qzeros [K/group, N/8] packed along N, scales [K/group, N].
      const int64_t groups = CeilDiv(k, l.group_size);
      out.push_back({LocalName(l, l.weight), {k, CeilDiv(n * l.bits, 32)}, DType::kInt32, {"I32"}});
      out.push_back({LocalName(l, l.zero_point), {groups, CeilDiv(n * l.bits, 32)}, DType::kInt32, {"I32"}});
      out.push_back({LocalName(l, l.scale), {groups, n}, l.scale_dtype, {"F16", "BF16", "F32"}});
      break;
    }
    case QuantLayout::kGptqV1: {
      // qweight [K*bits/32, N] packed along K, qzeros [K/group, N*bits/32], scales [K/group, N], g_idx [K].
      const int64_t groups = CeilDiv(k, l.group_size);
      out.push_back({LocalName(l, l.weight), {CeilDiv(k * l.bits, 32), n}, DType::kInt32, {"I32"}});
      out.push_back({LocalName(l, l.zero_point), {groups, CeilDiv(n * l.bits, 32)}, DType::kInt32, {"I32"}});
      out.push_back({LocalName(l, l.scale), {groups, n}, l.scale_dtype, {"F16", "BF16", "F32"}});
      out.push_back({LocalName(l, l.g_idx), {k}, DType::kInt32, {"I32"}});
      break;
    }
  }
  return out;
}

// The stored tensors of one quantized linear: full name -> expected (shape, dtype, accepted header dtypes).
std::vector<std::pair<std::string, ExpectedTensor>> StoredTensors(const QuantizedLinear& l, QuantMethod method) {
  std::vector<std::pair<std::string, ExpectedTensor>> out;
  for (StoredPiece& piece : StoredPieces(l, method)) {
    out.push_back({l.module + "." + piece.local, {piece.shape, piece.dtype, std::move(piece.header_dtypes)}});
  }
  return out;
}

// The parameters a quantized nn.Linear's module registers under `sizing` (bias kept where it was).
std::vector<TensorSpec> LinearParameters(const QuantizedLinear& l, QuantMethod method, QuantizedSizing sizing,
                                         bool dense, DType dense_dtype, std::vector<TensorSpec>& buffers) {
  std::vector<TensorSpec> out;
  buffers.clear();
  std::optional<TensorSpec> bias;
  if (l.has_bias) bias = TensorSpec{"bias", {l.out_features}, dense_dtype, true};
  const int64_t n = l.out_features;
  const int64_t k = l.in_features;
  if (dense) {  // transformers dequantizes: the nn.Linear it built
    out.push_back(TensorSpec{"weight", {n, k}, dense_dtype, true});
    if (bias) out.push_back(*bias);
    return out;
  }
  if (sizing == QuantizedSizing::kPacked) {
    if (bias) out.push_back(*bias);
    for (const StoredPiece& piece : StoredPieces(l, method)) {
      out.push_back(TensorSpec{piece.local, piece.shape, piece.dtype, true});
    }
    return out;
  }
  switch (method) {
    case QuantMethod::kFp8: {
      // FP8Linear: weight, bias (nn.Linear's slots), weight_scale_inv float32 (float8_e8m0fnu for ue8m0).
      out.push_back(TensorSpec{"weight", {n, k}, DType::kFloat8E4M3, true});
      if (bias) out.push_back(*bias);
      const DType scale = l.scale_ue8m0 ? DType::kUInt8 : DType::kFloat32;
      out.push_back(TensorSpec{"weight_scale_inv", {CeilDiv(n, l.block_n), CeilDiv(k, l.block_k)}, scale, true});
      break;
    }
    case QuantMethod::kCompressedTensors:
      // apply_quantization_config + compress_model on the meta model: the bias stays first, then the scale
      // (and zero point) in the model's dtype, then the compressed weight.
      if (bias) out.push_back(*bias);
      if (l.layout == QuantLayout::kFp8Block) {
        std::vector<int64_t> grid = {CeilDiv(n, l.block_n), CeilDiv(k, l.block_k)};
        if (l.per_tensor_scale) grid = {1};
        out.push_back(TensorSpec{"weight_scale", grid, dense_dtype, true});
        out.push_back(TensorSpec{"weight", {n, k}, DType::kFloat8E4M3, true});
      } else {
        const int64_t groups = CeilDiv(k, l.group_size);
        out.push_back(TensorSpec{"weight_scale", {n, groups}, dense_dtype, true});
        if (!l.zero_point.empty()) out.push_back(TensorSpec{"weight_zero_point", {n, groups}, DType::kInt8, true});
        out.push_back(TensorSpec{"weight_packed", {n, CeilDiv(k * l.bits, 32)}, DType::kInt32, true});
        out.push_back(TensorSpec{"weight_shape", {2}, DType::kInt64, true});
      }
      break;
    case QuantMethod::kAwq:
    case QuantMethod::kGptq: {
      // gptqmodel's QuantLinear (AWQuantLinear / GPTQQuantLinear with register_buffers): buffers only, scales and
      // bias float16 whatever the model's dtype. AWQ counts K // group groups, GPTQ ceil(K / group).
      const int64_t packed_n = CeilDiv(n * l.bits, 32);
      const int64_t groups = method == QuantMethod::kAwq ? k / l.group_size : CeilDiv(k, l.group_size);
      if (method == QuantMethod::kAwq) {
        buffers.push_back(TensorSpec{"qweight", {k, packed_n}, DType::kInt32, true});
      } else {
        buffers.push_back(TensorSpec{"qweight", {CeilDiv(k * l.bits, 32), n}, DType::kInt32, true});
      }
      buffers.push_back(TensorSpec{"qzeros", {groups, packed_n}, DType::kInt32, true});
      buffers.push_back(TensorSpec{"scales", {groups, n}, DType::kFloat16, true});
      if (method == QuantMethod::kGptq) buffers.push_back(TensorSpec{"g_idx", {k}, DType::kInt32, true});
      if (bias) buffers.push_back(TensorSpec{"bias", {n}, DType::kFloat16, true});
      break;
    }
    case QuantMethod::kMxfp4:
      break;
  }
  return out;
}

// gpt-oss's experts module as an MXFP4 checkpoint stores it (and strata keeps it): per projection X the blocks and
// scales, then its bias in the model's dtype.
std::vector<TensorSpec> Mxfp4ExpertsParameters(const ExpertsStorage& e, DType dtype) {
  const int64_t experts = e.num_experts, h = e.hidden, i = e.intermediate;
  return {TensorSpec{"gate_up_proj_blocks", {experts, 2 * i, h / 32, 16}, DType::kUInt8, true},
          TensorSpec{"gate_up_proj_scales", {experts, 2 * i, h / 32}, DType::kUInt8, true},
          TensorSpec{"gate_up_proj_bias", {experts, 2 * i}, dtype, true},
          TensorSpec{"down_proj_blocks", {experts, h, i / 32, 16}, DType::kUInt8, true},
          TensorSpec{"down_proj_scales", {experts, h, i / 32}, DType::kUInt8, true},
          TensorSpec{"down_proj_bias", {experts, h}, dtype, true}};
}

// The same module dequantized (transformers' Mxfp4 quantizer without a GPU and its kernels: GptOssExperts in bfloat16).
std::vector<TensorSpec> Mxfp4DequantizedParameters(const ExpertsStorage& e, DType dtype) {
  const int64_t experts = e.num_experts, h = e.hidden, i = e.intermediate;
  return {TensorSpec{"gate_up_proj", {experts, h, 2 * i}, DType::kBFloat16, true},
          TensorSpec{"gate_up_proj_bias", {experts, 2 * i}, dtype, true},
          TensorSpec{"down_proj", {experts, i, h}, DType::kBFloat16, true},
          TensorSpec{"down_proj_bias", {experts, h}, dtype, true}};
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

// The parameters of a converted experts module (dense: fused gate_up_proj [E, 2I, H], down_proj [E, H, I]).
std::vector<TensorSpec> ExpertsParameters(const ExpertsStorage& e, const QuantizedLinear& gate,
                                          const QuantizedLinear& down, QuantMethod method, QuantizedSizing sizing,
                                          bool dense) {
  const int64_t ne = e.num_experts, h = e.hidden, in = e.intermediate;
  std::vector<TensorSpec> out;
  // transformers replaces fused experts only for FP8 (FP8Experts); the other formats' quantizers leave them
  // dense (and dequantize them at load).
  if (dense || (sizing == QuantizedSizing::kTransformers && method != QuantMethod::kFp8)) {
    out.push_back(TensorSpec{"gate_up_proj", {ne, 2 * in, h}, e.dtype, true});
    out.push_back(TensorSpec{"down_proj", {ne, h, in}, e.dtype, true});
    return out;
  }
  if (sizing == QuantizedSizing::kPacked) {
    // What the files hold, expert by expert: each of gate's and up's tensors twice ([E, 2, ...]), down's once.
    for (const StoredPiece& piece : StoredPieces(gate, method)) {
      std::vector<int64_t> shape = {ne, 2};
      shape.insert(shape.end(), piece.shape.begin(), piece.shape.end());
      out.push_back(TensorSpec{"gate_up_proj_" + piece.local, shape, piece.dtype, true});
    }
    for (const StoredPiece& piece : StoredPieces(down, method)) {
      std::vector<int64_t> shape = {ne};
      shape.insert(shape.end(), piece.shape.begin(), piece.shape.end());
      out.push_back(TensorSpec{"down_proj_" + piece.local, shape, piece.dtype, true});
    }
    return out;
  }
  // FP8Experts (_alloc_expert_proj): the fused gate_up scale grid has at least two rows.
  const int64_t bn = gate.block_n, bk = gate.block_k;
  const DType scale = gate.scale_ue8m0 ? DType::kUInt8 : DType::kFloat32;
  out.push_back(TensorSpec{"gate_up_proj", {ne, 2 * in, h}, DType::kFloat8E4M3, true});
  out.push_back(TensorSpec{
      "gate_up_proj_scale_inv", {ne, std::max<int64_t>(CeilDiv(2 * in, bn), 2), CeilDiv(h, bk)}, scale, true});
  out.push_back(TensorSpec{"down_proj", {ne, h, in}, DType::kFloat8E4M3, true});
  out.push_back(TensorSpec{"down_proj_scale_inv", {ne, CeilDiv(h, bn), CeilDiv(in, bk)}, scale, true});
  return out;
}

// Whether transformers plans this spec dense under `sizing`.
bool PlannedDense(const SpecQuantization& q, QuantizedSizing sizing, bool keeps_fp8) {
  if (sizing == QuantizedSizing::kPacked) return false;
  if (q.config.dequantize || q.config.method == QuantMethod::kMxfp4) return true;
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
  const bool compressed_tensors = q.method == QuantMethod::kCompressedTensors;
  const char* skip_field = compressed_tensors ? "ignore" : "modules_to_not_convert";
  absl::StatusOr<std::vector<Pattern>> compiled_skips =
      CompilePatterns(NotConverted(spec, q), compressed_tensors ? "re:" : "", skip_field);
  if (!compiled_skips.ok()) return compiled_skips.status();
  absl::StatusOr<std::vector<Pattern>> compiled_targets = CompilePatterns(q.targets, "re:", "config_groups.targets");
  if (!compiled_targets.ok()) return compiled_targets.status();
  const std::vector<Pattern>& skips = *compiled_skips;
  const std::vector<Pattern>& targets = *compiled_targets;
  // Whether the format converts the linear `name` (an nn.Linear of the tree, or one expert's projection as the
  // checkpoint stores it, which was an nn.Linear in the model that wrote it).
  auto converts = [&](const std::string& name) {
    switch (q.method) {
      case QuantMethod::kCompressedTensors:
        return CompressedTensorsMatch(name, "Linear", targets) && !CompressedTensorsMatch(name, "Linear", skips);
      case QuantMethod::kGptq: {
        // optimum's convert_model: the nn.Linear layers inside the blocks, narrowed by
        // modules_in_block_to_quantize (a name ending with one of them).
        if (!absl::StartsWith(name, q.block_name + ".")) return false;
        if (q.modules_in_block.empty()) return true;
        for (const std::string& m : q.modules_in_block) {
          if (absl::EndsWith(name, m)) return true;
        }
        return false;
      }
      default:
        return !SkippedByPatterns(name, skips);
    }
  };

  std::map<std::string, ModuleSpec*> modules;
  IndexModules(spec.root, modules);
  if (q.method == QuantMethod::kMxfp4) {
    // transformers' replace_with_mxfp4_linear: every gpt-oss experts module not in modules_to_not_convert, no other.
    for (const ExpertsStorage& e : spec.per_expert_storage) {
      if (!e.fused_interleaved) continue;
      if (e.hidden % 32 != 0 || e.intermediate % 32 != 0) {
        return absl::InvalidArgumentError(absl::StrCat("config.json: quantization_config: mxfp4 needs hidden_size (",
                                                       e.hidden, ") and intermediate_size (", e.intermediate,
                                                       ") to be multiples of 32 (its blocks)"));
      }
      if (converts(e.module)) quantization.mxfp4_experts.push_back(e.module);
    }
    if (quantization.mxfp4_experts.empty()) {
      return absl::InvalidArgumentError(
          "config.json: quantization_config: mxfp4 converts no experts module of this model (gpt-oss's alone)");
    }
    spec.quantization = std::move(quantization);
    SizeQuantizedSpec(spec, QuantizedSizing::kPacked, /*keeps_fp8=*/true);
    return absl::OkStatus();
  }
  for (const auto& [name, module] : modules) {
    if (module->class_name != "Linear" || absl::EndsWith(name, ".experts")) continue;
    if (!converts(name)) continue;
    // A tied head shares the embedding's storage (save_pretrained writes the embedding alone). FP8 keeps the
    // layer's `weight` (float8), so the tie still names a parameter and the model plans as transformers plans it;
    // the packed integer layouts replace `weight` (weight_packed, qweight), so the tie would name nothing:
    // refused, never half-read.
    const std::string weight_name = module->ChildName("weight");
    const bool keeps_weight = MakeLinear(q, name, 1, 1, spec.dtype).layout == QuantLayout::kFp8Block;
    for (const auto& [tied, target] : spec.tied_weights) {
      if (!keeps_weight && (tied == weight_name || target == weight_name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config.json: quantization_config: the format would quantize ", name, ", whose weight is tied to ",
            tied == weight_name ? target : tied, " (tie_word_embeddings): list it among the modules left dense"));
      }
    }
    const TensorSpec& weight = module->parameters.front();  // nn.Linear: weight [out, in] first
    QuantizedLinear& l = quantization.linears[module->ChildName("weight")] =
        MakeLinear(q, name, weight.shape[0], weight.shape[1], spec.dtype);
    for (const TensorSpec& t : module->parameters) l.has_bias = l.has_bias || t.name == "bias";
  }
  for (const ExpertsStorage& e : spec.per_expert_storage) {
    if (e.fused_interleaved) continue;  // gpt-oss's own formats (MXFP4: quantization.h)
    // FP8 replaces the fused experts module as a whole; compressed-tensors' checkpoints quantized each expert's
    // projections, all of them or none (a fused module cannot hold both).
    size_t converted = 0;
    const size_t total = static_cast<size_t>(e.num_experts) * 3;
    for (int64_t i = 0; i < e.num_experts; ++i) {
      const ExpertLinearNames names = ExpertNames(e, i);
      for (const std::string* n : {&names.gate, &names.up, &names.down}) {
        const bool yes = q.method == QuantMethod::kFp8 ? converts(e.module) : converts(StripWeight(*n));
        converted += yes ? 1 : 0;
      }
    }
    if (converted == 0) continue;
    if (converted != total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: quantization_config: quantizes ", converted, " of the ", total, " expert projections of ",
          e.module, ": strata needs all of a layer's experts quantized alike, or none"));
    }
    for (int64_t i = 0; i < e.num_experts; ++i) {
      const ExpertLinearNames names = ExpertNames(e, i);
      quantization.linears[names.gate] = MakeLinear(q, StripWeight(names.gate), e.intermediate, e.hidden, e.dtype);
      quantization.linears[names.up] = MakeLinear(q, StripWeight(names.up), e.intermediate, e.hidden, e.dtype);
      quantization.linears[names.down] = MakeLinear(q, StripWeight(names.down), e.hidden, e.intermediate, e.dtype);
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
    if (d == "F16") l.scale_dtype = DType::kFloat16;
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
    if (e.fused_interleaved) {
      auto m = modules.find(e.module);
      if (m != modules.end() &&
          std::find(q.mxfp4_experts.begin(), q.mxfp4_experts.end(), e.module) != q.mxfp4_experts.end()) {
        m->second->parameters =
            dense ? Mxfp4DequantizedParameters(e, spec.dtype) : Mxfp4ExpertsParameters(e, spec.dtype);
      }
      continue;
    }
    const ExpertLinearNames first = ExpertNames(e, 0);
    auto gate = q.linears.find(first.gate);
    auto down = q.linears.find(first.down);
    if (gate == q.linears.end() || down == q.linears.end()) continue;
    for (int64_t i = 0; i < e.num_experts; ++i) {
      const ExpertLinearNames names = ExpertNames(e, i);
      expert_linears.insert({names.gate, names.up, names.down});
    }
    auto m = modules.find(e.module);
    if (m != modules.end()) {
      m->second->parameters = ExpertsParameters(e, gate->second, down->second, q.config.method, sizing, dense);
    }
  }
  for (const auto& [name, l] : q.linears) {
    if (expert_linears.contains(name)) continue;
    auto m = modules.find(l.module);
    if (m == modules.end()) continue;
    m->second->parameters = LinearParameters(l, q.config.method, sizing, dense, spec.dtype, m->second->buffers);
  }
  q.sizing = sizing;
  q.planned_dense = dense;
}

void AddQuantizedCheckpointTensors(const ModelSpec& spec, std::map<std::string, ExpectedTensor>& tensors) {
  if (!spec.quantization) return;
  for (const ExpertsStorage& e : spec.per_expert_storage) {
    const std::vector<std::string>& mxfp4 = spec.quantization->mxfp4_experts;
    if (std::find(mxfp4.begin(), mxfp4.end(), e.module) == mxfp4.end()) continue;
    // What the files hold, whichever sizing the tree has.
    for (const char* local : {"gate_up_proj", "down_proj", "gate_up_proj_blocks", "gate_up_proj_scales",
                              "down_proj_blocks", "down_proj_scales"}) {
      tensors.erase(absl::StrCat(e.module, ".", local));
    }
    for (const TensorSpec& t : Mxfp4ExpertsParameters(e, spec.dtype)) {
      if (t.dtype == DType::kUInt8) tensors[absl::StrCat(e.module, ".", t.name)] = {t.shape, t.dtype, {"U8"}};
    }
  }
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
    for (auto& [stored, expected] : StoredTensors(l, spec.quantization->config.method)) {
      tensors[stored] = std::move(expected);
    }
  }
}

std::string QuantizationSummary(const ModelSpec& spec) {
  if (!spec.quantization) return "none";
  const SpecQuantization& q = *spec.quantization;
  std::string out = q.config.method == QuantMethod::kMxfp4
                        ? absl::StrCat(QuantizationConfigSummary(q.config), ", ", q.mxfp4_experts.size(),
                                       " experts modules, sized ", QuantizedSizingName(q.sizing))
                        : absl::StrCat(QuantizationConfigSummary(q.config), ", ", q.linears.size(),
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
