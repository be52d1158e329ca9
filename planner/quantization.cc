// config.json's quantization_config, read into QuantizationConfig (quantization.h). The fields and their
// defaults are transformers 5.23's config classes (utils/quantization_config.py) and, for compressed-tensors,
// the compressed-tensors library's QuantizationConfig / QuantizationScheme / QuantizationArgs.

#include "planner/quantization.h"

#include <cctype>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace strata::planner {
namespace {

using json = nlohmann::json;

absl::Status QuantError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: quantization_config.", field, ": ", what));
}

// `value` is one of `supported`, else an error naming the value and listing them.
absl::Status CheckOneOf(absl::string_view field, const std::string& value, const std::vector<std::string>& supported) {
  for (const std::string& s : supported) {
    if (s == value) return absl::OkStatus();
  }
  return QuantError(field,
                    absl::StrCat("\"", value, "\" is not supported (supported: ", absl::StrJoin(supported, ", "), ")"));
}

absl::StatusOr<std::optional<std::string>> OptionalString(const json& object, absl::string_view prefix,
                                                          absl::string_view key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string())
    return QuantError(absl::StrCat(prefix, key), absl::StrCat("must be a string, got ", it->dump()));
  return std::optional<std::string>(it->get<std::string>());
}

absl::StatusOr<bool> BoolOr(const json& object, absl::string_view prefix, absl::string_view key, bool fallback) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return QuantError(absl::StrCat(prefix, key), absl::StrCat("must be true or false, got ", it->dump()));
  }
  return it->get<bool>();
}

// An integer in [min, max] (booleans and floats refused), `fallback` when absent or null.
absl::StatusOr<int64_t> IntOr(const json& object, absl::string_view prefix, absl::string_view key, int64_t fallback,
                              int64_t min, int64_t max) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  const bool in_range = it->is_number_integer() &&
                        !(it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(max)) &&
                        it->get<int64_t>() >= min && it->get<int64_t>() <= max;
  if (!in_range) {
    return QuantError(absl::StrCat(prefix, key),
                      absl::StrCat("must be an integer between ", min, " and ", max, ", got ", it->dump()));
  }
  return it->get<int64_t>();
}

// A list of strings; nullopt when absent or null.
absl::StatusOr<std::optional<std::vector<std::string>>> StringList(const json& object, absl::string_view prefix,
                                                                   absl::string_view key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::optional<std::vector<std::string>>();
  if (!it->is_array()) {
    return QuantError(absl::StrCat(prefix, key), absl::StrCat("must be a list of module names, got ", it->dump()));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < it->size(); ++i) {
    if (!(*it)[i].is_string()) {
      return QuantError(absl::StrCat(prefix, key, "[", i, "]"),
                        absl::StrCat("must be a string, got ", (*it)[i].dump()));
    }
    out.push_back((*it)[i].get<std::string>());
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

// The largest block or group strata accepts (far above any released checkpoint's 128).
constexpr int64_t kMaxBlock = int64_t{1} << 20;

// quant_method "fp8": transformers' FineGrainedFP8Config.
absl::Status ParseFp8(const json& q, QuantizationConfig& out) {
  out.method = QuantMethod::kFp8;
  absl::StatusOr<std::optional<std::string>> scheme = OptionalString(q, "", "activation_scheme");
  if (!scheme.ok()) return scheme.status();
  const std::string activation = scheme->value_or("dynamic");
  if (activation == "static") {
    return QuantError("activation_scheme",
                      "\"static\" (per-tensor activation scales) is not supported: strata quantizes activations "
                      "dynamically (supported: dynamic)");
  }
  if (absl::Status s = CheckOneOf("activation_scheme", activation, {"dynamic"}); !s.ok()) return s;
  out.dynamic_activations = true;

  auto block = q.find("weight_block_size");
  if (block == q.end()) {
    out.block_n = out.block_k = 128;  // FineGrainedFP8Config's default
  } else {
    if (block->is_null()) {
      return QuantError("weight_block_size",
                        "null (per-tensor FP8) is not supported for quant_method \"fp8\": give [block_n, block_k]");
    }
    if (!block->is_array() || block->size() != 2) {
      return QuantError("weight_block_size",
                        absl::StrCat("must be a list of two positive integers, got ", block->dump()));
    }
    for (size_t i = 0; i < 2; ++i) {
      const json& v = (*block)[i];
      if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > kMaxBlock) {
        return QuantError(absl::StrCat("weight_block_size[", i, "]"),
                          absl::StrCat("must be an integer between 1 and ", kMaxBlock, ", got ", v.dump()));
      }
    }
    out.block_n = (*block)[0].get<int64_t>();
    out.block_k = (*block)[1].get<int64_t>();
  }

  absl::StatusOr<std::optional<std::string>> scale_fmt = OptionalString(q, "", "scale_fmt");
  if (!scale_fmt.ok()) return scale_fmt.status();
  if (absl::Status s = CheckOneOf("scale_fmt", scale_fmt->value_or("float"), {"float", "ue8m0"}); !s.ok()) return s;
  out.scale_ue8m0 = scale_fmt->value_or("float") == "ue8m0";
  // Qwen's FP8 checkpoints say "fmt": "e4m3"; e5m2 weights would be read wrong.
  absl::StatusOr<std::optional<std::string>> fmt = OptionalString(q, "", "fmt");
  if (!fmt.ok()) return fmt.status();
  if (*fmt) {
    if (absl::Status s = CheckOneOf("fmt", **fmt, {"e4m3"}); !s.ok()) return s;
  }
  absl::StatusOr<std::optional<std::string>> expert_dtype = OptionalString(q, "", "expert_dtype");
  if (!expert_dtype.ok()) return expert_dtype.status();
  if (absl::Status s = CheckOneOf("expert_dtype", expert_dtype->value_or("fp8"), {"fp8"}); !s.ok()) return s;
  absl::StatusOr<std::optional<std::vector<std::string>>> convert = StringList(q, "", "modules_to_convert");
  if (!convert.ok()) return convert.status();
  if (*convert && !(*convert)->empty()) {
    return QuantError("modules_to_convert", "FP8 embeddings are not supported (the list must be empty or absent)");
  }

  // MiniMax writes the skip list as ignored_layers; FineGrainedFP8Config reads it when modules_to_not_convert
  // is absent or null.
  absl::StatusOr<std::optional<std::vector<std::string>>> skip = StringList(q, "", "modules_to_not_convert");
  if (!skip.ok()) return skip.status();
  if (!*skip) {
    skip = StringList(q, "", "ignored_layers");
    if (!skip.ok()) return skip.status();
  }
  out.default_skips = !skip->has_value();
  out.not_converted = skip->value_or(std::vector<std::string>());
  absl::StatusOr<bool> dequantize = BoolOr(q, "", "dequantize", false);
  if (!dequantize.ok()) return dequantize.status();
  out.dequantize = *dequantize;
  out.bits = 8;
  return absl::OkStatus();
}

// A field that must be absent or null: strata does not implement what it describes.
// The field is absent, null or an empty object.
absl::Status MustBeNull(const json& object, absl::string_view prefix, absl::string_view key, absl::string_view why) {
  auto it = object.find(key);
  // compressed-tensors' update_config writes an empty object for a part it does not use ("sparsity_config": {}).
  if (it == object.end() || it->is_null() || (it->is_object() && it->empty())) return absl::OkStatus();
  return QuantError(absl::StrCat(prefix, key), absl::StrCat(why, " (got ", it->dump(), ")"));
}

// compressed-tensors' input_activations: none (weight-only), or FP8 activations quantized dynamically per token
// (the FP8-dynamic scheme) beside float weights. Static activation scales and integer activations are refused.
absl::Status CheckInputActivations(const json& scheme, absl::string_view prefix, bool float_weights) {
  auto it = scheme.find("input_activations");
  if (it == scheme.end() || it->is_null()) return absl::OkStatus();
  const std::string field = absl::StrCat(prefix, "input_activations");
  if (!it->is_object()) return QuantError(field, absl::StrCat("must be an object or null, got ", it->dump()));
  absl::StatusOr<bool> dynamic = BoolOr(*it, absl::StrCat(field, "."), "dynamic", false);
  if (!dynamic.ok()) {
    // "local" (dynamic, computed per group) is a string: also a scheme strata does not run.
    return QuantError(
        absl::StrCat(field, ".dynamic"),
        absl::StrCat("only true is supported (activations quantized as they come), got ", (*it)["dynamic"].dump()));
  }
  if (!*dynamic) {
    return QuantError(absl::StrCat(field, ".dynamic"),
                      "false (static activation scales) is not supported: strata quantizes activations dynamically");
  }
  absl::StatusOr<std::optional<std::string>> type = OptionalString(*it, absl::StrCat(field, "."), "type");
  if (!type.ok()) return type.status();
  if (!float_weights || type->value_or("int") != "float") {
    return QuantError(field,
                      "quantized activations are supported only as dynamic FP8 beside FP8 weights (the FP8-dynamic "
                      "scheme); integer weights must be weight-only (input_activations null)");
  }
  absl::StatusOr<int64_t> bits = IntOr(*it, absl::StrCat(field, "."), "num_bits", 8, 1, 64);
  if (!bits.ok()) return bits.status();
  if (*bits != 8)
    return QuantError(absl::StrCat(field, ".num_bits"), absl::StrCat(*bits, " is not supported (supported: 8)"));
  return absl::OkStatus();
}

// The weights' strategy (int: group or channel; float: channel, tensor or block) and the group size or block
// structure it needs.
absl::Status ParseCompressedStrategy(const json& weights, const std::string& w, QuantizationConfig& out) {
  absl::StatusOr<std::optional<std::string>> strategy = OptionalString(weights, w, "strategy");
  if (!strategy.ok()) return strategy.status();
  if (!*strategy) return QuantError(absl::StrCat(w, "strategy"), "is missing");
  out.strategy = **strategy;
  const std::vector<std::string> strategies = out.float_weights ? std::vector<std::string>{"channel", "tensor", "block"}
                                                                : std::vector<std::string>{"group", "channel"};
  if (absl::Status s = CheckOneOf(absl::StrCat(w, "strategy"), out.strategy, strategies); !s.ok()) return s;
  if (out.strategy == "group") {
    absl::StatusOr<int64_t> group = IntOr(weights, w, "group_size", 0, 1, kMaxBlock);
    if (!group.ok()) return group.status();
    if (*group == 0) return QuantError(absl::StrCat(w, "group_size"), "is missing (strategy \"group\" needs one)");
    out.group_size = *group;
  }
  if (out.strategy == "block") {
    auto block = weights.find("block_structure");
    if (block == weights.end() || !block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
        !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() <= 0 || (*block)[1].get<int64_t>() <= 0 ||
        (*block)[0].get<int64_t>() > kMaxBlock || (*block)[1].get<int64_t>() > kMaxBlock) {
      return QuantError(absl::StrCat(w, "block_structure"),
                        absl::StrCat("must be [block_n, block_k] (positive integers) for strategy \"block\", got ",
                                     block == weights.end() ? "nothing" : block->dump()));
    }
    out.block_n = (*block)[0].get<int64_t>();
    out.block_k = (*block)[1].get<int64_t>();
  }
  return absl::OkStatus();
}

// compressed-tensors' weights args (QuantizationArgs) of the one scheme: type, bits, symmetry, strategy and its
// group or block; weights stored quantized, in an activation order strata reads, scales in the model's dtype.
absl::Status ParseCompressedWeights(const json& weights, const std::string& w, QuantizationConfig& out) {
  absl::StatusOr<std::optional<std::string>> type = OptionalString(weights, w, "type");
  if (!type.ok()) return type.status();
  const std::string weight_type = type->value_or("int");
  if (absl::Status s = CheckOneOf(absl::StrCat(w, "type"), weight_type, {"int", "float"}); !s.ok()) return s;
  out.float_weights = weight_type == "float";
  absl::StatusOr<int64_t> bits = IntOr(weights, w, "num_bits", 8, 1, 64);
  if (!bits.ok()) return bits.status();
  const std::vector<std::string> supported_bits =
      out.float_weights ? std::vector<std::string>{"8"} : std::vector<std::string>{"4", "8"};
  if (absl::Status s = CheckOneOf(absl::StrCat(w, "num_bits"), std::to_string(*bits), supported_bits); !s.ok())
    return s;
  out.bits = static_cast<int>(*bits);
  absl::StatusOr<bool> symmetric = BoolOr(weights, w, "symmetric", true);
  if (!symmetric.ok()) return symmetric.status();
  out.symmetric = *symmetric;
  if (out.float_weights && !out.symmetric) {
    return QuantError(absl::StrCat(w, "symmetric"), "false is not supported for float (FP8) weights");
  }
  if (absl::Status s = ParseCompressedStrategy(weights, w, out); !s.ok()) return s;
  auto dynamic = weights.find("dynamic");
  if (dynamic != weights.end() && !dynamic->is_null() && *dynamic != false) {
    return QuantError(absl::StrCat(w, "dynamic"),
                      absl::StrCat("weights must be stored quantized (false), got ", dynamic->dump()));
  }
  auto actorder = weights.find("actorder");
  if (actorder != weights.end() && !actorder->is_null() && *actorder != false && *actorder != "static" &&
      *actorder != "weight") {
    return QuantError(absl::StrCat(w, "actorder"),
                      absl::StrCat(actorder->dump(),
                                   " is not supported (supported: null, \"static\", \"weight\": group activation "
                                   "order stores a weight_g_idx strata does not read)"));
  }
  for (const char* key : {"scale_dtype", "zp_dtype"}) {
    if (absl::Status s = MustBeNull(weights, w, key, "is not supported: scales in the model's dtype only"); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// The storage format (the scheme's own, else the config's) and the config's top-level fields strata refuses
// when set: a quantization status other than compressed, a quantized KV cache, sparsity, transforms, transformers'
// FP8-kernel module layout.
absl::Status ParseCompressedFormat(const json& q, const json& scheme, const std::string& prefix,
                                   QuantizationConfig& out) {
  const std::string weight_type = out.float_weights ? "float" : "int";
  // The scheme's own format overrides the config's.
  absl::StatusOr<std::optional<std::string>> format = OptionalString(scheme, prefix, "format");
  if (!format.ok()) return format.status();
  std::string format_field = absl::StrCat(prefix, "format");
  if (!*format) {
    format = OptionalString(q, "", "format");
    if (!format.ok()) return format.status();
    format_field = "format";
  }
  out.format = format->value_or("dense");
  const std::string wanted = out.float_weights ? "float-quantized" : "pack-quantized";
  if (absl::Status s = CheckOneOf(format_field, out.format, {"pack-quantized", "float-quantized"}); !s.ok()) return s;
  if (out.format != wanted) {
    return QuantError(format_field, absl::StrCat("\"", out.format, "\" does not store ", weight_type,
                                                 " weights (expected \"", wanted, "\")"));
  }
  absl::StatusOr<std::optional<std::string>> status = OptionalString(q, "", "quantization_status");
  if (!status.ok()) return status.status();
  if (*status) {
    if (absl::Status s = CheckOneOf("quantization_status", **status, {"compressed"}); !s.ok()) return s;
  }
  if (absl::Status s = MustBeNull(q, "", "kv_cache_scheme", "a quantized KV cache is not supported"); !s.ok()) return s;
  if (absl::Status s = MustBeNull(q, "", "sparsity_config", "sparse checkpoints are not supported"); !s.ok()) return s;
  if (absl::Status s = MustBeNull(q, "", "transform_config", "transforms are not supported"); !s.ok()) return s;
  absl::StatusOr<bool> optimized = BoolOr(q, "", "use_optimized_inference", false);
  if (!optimized.ok()) return optimized.status();
  if (*optimized) {
    return QuantError("use_optimized_inference", "true is not supported (transformers' FP8-kernel module layout)");
  }
  return absl::OkStatus();
}

// quant_method "compressed-tensors": one config group (compressed-tensors' QuantizationScheme) of weights
// args (QuantizationArgs), the format, the ignore list.
absl::Status ParseCompressedTensors(const json& q, QuantizationConfig& out) {
  out.method = QuantMethod::kCompressedTensors;
  auto groups = q.find("config_groups");
  if (groups == q.end() || groups->is_null()) return QuantError("config_groups", "is missing (no quantized layers)");
  if (!groups->is_object() || groups->empty()) {
    return QuantError("config_groups", absl::StrCat("must be an object of config groups, got ", groups->dump()));
  }
  if (groups->size() != 1) {
    return QuantError("config_groups", absl::StrCat("has ", groups->size(),
                                                    " groups: only one config group (one scheme for every "
                                                    "quantized layer) is supported"));
  }
  const std::string group_name = groups->begin().key();
  const json& scheme = groups->begin().value();
  const std::string prefix = absl::StrCat("config_groups.", group_name, ".");
  if (!scheme.is_object()) {
    return QuantError(absl::StrCat("config_groups.", group_name),
                      absl::StrCat("must be an object, got ", scheme.dump()));
  }
  absl::StatusOr<std::optional<std::vector<std::string>>> targets = StringList(scheme, prefix, "targets");
  if (!targets.ok()) return targets.status();
  if (!*targets || (*targets)->empty()) return QuantError(absl::StrCat(prefix, "targets"), "is missing or empty");
  out.targets = **targets;

  auto weights = scheme.find("weights");
  if (weights == scheme.end() || weights->is_null()) {
    return QuantError(absl::StrCat(prefix, "weights"), "is missing: activation-only schemes are not supported");
  }
  if (!weights->is_object()) {
    return QuantError(absl::StrCat(prefix, "weights"), absl::StrCat("must be an object, got ", weights->dump()));
  }
  if (absl::Status s = ParseCompressedWeights(*weights, absl::StrCat(prefix, "weights."), out); !s.ok()) return s;
  if (absl::Status s = CheckInputActivations(scheme, prefix, out.float_weights); !s.ok()) return s;
  if (absl::Status s = MustBeNull(scheme, prefix, "output_activations", "quantized outputs are not supported");
      !s.ok()) {
    return s;
  }

  if (absl::Status s = ParseCompressedFormat(q, scheme, prefix, out); !s.ok()) return s;

  absl::StatusOr<std::optional<std::vector<std::string>>> ignore = StringList(q, "", "ignore");
  if (!ignore.ok()) return ignore.status();
  out.not_converted = ignore->value_or(std::vector<std::string>());
  absl::StatusOr<bool> dequantize = BoolOr(q, "", "dequantize", false);
  if (!dequantize.ok()) return dequantize.status();
  // run_compressed (deprecated) only sets dequantize: run_compressed false means dequantize.
  absl::StatusOr<bool> run_compressed = BoolOr(q, "", "run_compressed", true);
  if (!run_compressed.ok()) return run_compressed.status();
  out.dequantize = *dequantize || !*run_compressed;
  return absl::OkStatus();
}

// quant_method "awq": transformers' AwqConfig, GEMM layout (version / format "gemm"), 4 bits, with zero points.
absl::Status ParseAwq(const json& q, QuantizationConfig& out) {
  out.method = QuantMethod::kAwq;
  absl::StatusOr<std::optional<std::string>> format = OptionalString(q, "", "format");
  if (!format.ok()) return format.status();
  std::string format_field = "format";
  absl::StatusOr<std::optional<std::string>> version = OptionalString(q, "", "version");
  if (!version.ok()) return version.status();
  if (*version) {  // the legacy field wins, as AwqConfig reads it
    format = version;
    format_field = "version";
  }
  std::string layout = format->value_or("gemm");
  for (char& c : layout) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (absl::Status s = CheckOneOf(format_field, layout, {"gemm"}); !s.ok()) return s;
  absl::StatusOr<int64_t> bits = IntOr(q, "", "bits", 4, 1, 64);
  if (!bits.ok()) return bits.status();
  if (absl::Status s = CheckOneOf("bits", std::to_string(*bits), {"4"}); !s.ok()) return s;
  out.bits = 4;
  absl::StatusOr<int64_t> group = IntOr(q, "", "group_size", 128, -1, kMaxBlock);
  if (!group.ok()) return group.status();
  if (*group <= 0) {
    return QuantError("group_size", absl::StrCat("must be a positive integer for AWQ, got ", *group));
  }
  out.group_size = *group;
  absl::StatusOr<bool> zero_point = BoolOr(q, "", "zero_point", true);
  if (!zero_point.ok()) return zero_point.status();
  if (!*zero_point) return QuantError("zero_point", "false (symmetric AWQ) is not supported (supported: true)");
  out.symmetric = false;
  absl::StatusOr<std::optional<std::vector<std::string>>> skip = StringList(q, "", "modules_to_not_convert");
  if (!skip.ok()) return skip.status();
  out.not_converted = skip->value_or(std::vector<std::string>());
  out.default_skips = true;  // the AWQ quantizer always adds transformers' default skips (lm_head)
  return absl::OkStatus();
}

// quant_method "mxfp4": transformers' Mxfp4Config (gpt-oss): the experts modules not listed in
// modules_to_not_convert are stored as MXFP4; `dequantize` plans them dense.
absl::Status ParseMxfp4(const json& q, QuantizationConfig& out) {
  out.method = QuantMethod::kMxfp4;
  out.bits = 4;
  out.group_size = 32;
  absl::StatusOr<std::optional<std::vector<std::string>>> skip = StringList(q, "", "modules_to_not_convert");
  if (!skip.ok()) return skip.status();
  if (*skip) out.not_converted = **skip;
  absl::StatusOr<bool> dequantize = BoolOr(q, "", "dequantize", false);
  if (!dequantize.ok()) return dequantize.status();
  out.dequantize = *dequantize;
  return absl::OkStatus();
}

// quant_method "gptq": transformers' GPTQConfig, v1 checkpoints (checkpoint_format / format "gptq").
absl::Status ParseGptq(const json& q, QuantizationConfig& out) {
  out.method = QuantMethod::kGptq;
  absl::StatusOr<std::optional<std::string>> format = OptionalString(q, "", "format");
  if (!format.ok()) return format.status();
  std::string format_field = "format";
  absl::StatusOr<std::optional<std::string>> checkpoint_format = OptionalString(q, "", "checkpoint_format");
  if (!checkpoint_format.ok()) return checkpoint_format.status();
  if (*checkpoint_format) {
    format = checkpoint_format;
    format_field = "checkpoint_format";
  }
  std::string layout = format->value_or("gptq");
  for (char& c : layout) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (absl::Status s = CheckOneOf(format_field, layout, {"gptq"}); !s.ok()) return s;
  absl::StatusOr<int64_t> bits = IntOr(q, "", "bits", 4, 1, 64);
  if (!bits.ok()) return bits.status();
  if (absl::Status s = CheckOneOf("bits", std::to_string(*bits), {"4", "8"}); !s.ok()) return s;
  out.bits = static_cast<int>(*bits);
  absl::StatusOr<int64_t> group = IntOr(q, "", "group_size", 128, -1, kMaxBlock);
  if (!group.ok()) return group.status();
  if (*group == 0) return QuantError("group_size", "must be a positive integer or -1 (one group per row), got 0");
  out.group_size = *group;  // -1: K per layer
  absl::StatusOr<bool> desc_act = BoolOr(q, "", "desc_act", false);
  if (!desc_act.ok()) return desc_act.status();
  out.desc_act = *desc_act;
  absl::StatusOr<bool> sym = BoolOr(q, "", "sym", true);
  if (!sym.ok()) return sym.status();
  out.symmetric = *sym;
  if (absl::Status s = MustBeNull(q, "", "dynamic", "per-module overrides are not supported"); !s.ok()) return s;
  absl::StatusOr<std::optional<std::string>> block = OptionalString(q, "", "block_name_to_quantize");
  if (!block.ok()) return block.status();
  out.block_name = block->value_or("model.layers");
  auto in_block = q.find("modules_in_block_to_quantize");
  if (in_block != q.end() && !in_block->is_null()) {
    bool ok = in_block->is_array();
    for (size_t i = 0; ok && i < in_block->size(); ++i) {
      const json& names = (*in_block)[i];
      ok = names.is_array();
      for (size_t j = 0; ok && j < names.size(); ++j) {
        ok = names[j].is_string();
        if (ok) out.modules_in_block.push_back(names[j].get<std::string>());
      }
    }
    if (!ok) {
      return QuantError("modules_in_block_to_quantize",
                        absl::StrCat("must be a list of lists of module names, got ", in_block->dump()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view QuantizedSizingName(QuantizedSizing sizing) {
  return sizing == QuantizedSizing::kPacked ? "packed" : "transformers";
}

absl::StatusOr<QuantizedSizing> ParseQuantizedSizing(absl::string_view text) {
  if (text == "packed") return QuantizedSizing::kPacked;
  if (text == "transformers") return QuantizedSizing::kTransformers;
  return absl::InvalidArgumentError(
      absl::StrCat("\"", text, "\" is not a quantized sizing (expected packed or transformers)"));
}

absl::StatusOr<std::optional<QuantizationConfig>> ParseQuantizationConfig(const json& config) {
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return std::optional<QuantizationConfig>();
  const json& q = *it;
  if (!q.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: quantization_config: must be an object, got ", q.dump()));
  }
  absl::StatusOr<std::optional<std::string>> method = OptionalString(q, "", "quant_method");
  if (!method.ok()) return method.status();
  if (!*method) return QuantError("quant_method", "is missing");
  QuantizationConfig out;
  out.quant_method = **method;
  const std::vector<std::string> supported = {"fp8", "compressed-tensors", "awq", "gptq", "mxfp4"};
  if (absl::Status s = CheckOneOf("quant_method", out.quant_method, supported); !s.ok()) return s;
  absl::Status parsed;
  if (out.quant_method == "fp8") {
    parsed = ParseFp8(q, out);
  } else if (out.quant_method == "compressed-tensors") {
    parsed = ParseCompressedTensors(q, out);
  } else if (out.quant_method == "awq") {
    parsed = ParseAwq(q, out);
  } else if (out.quant_method == "mxfp4") {
    parsed = ParseMxfp4(q, out);
  } else {
    parsed = ParseGptq(q, out);
  }
  if (!parsed.ok()) return parsed;
  return std::optional<QuantizationConfig>(std::move(out));
}

std::string QuantizationConfigSummary(const QuantizationConfig& config) {
  switch (config.method) {
    case QuantMethod::kFp8:
      return absl::StrCat("fp8 (float8_e4m3fn, block ", config.block_n, "x", config.block_k,
                          config.scale_ue8m0 ? ", ue8m0 scales" : "", ")");
    case QuantMethod::kCompressedTensors:
      if (config.float_weights) {
        return absl::StrCat("compressed-tensors float-quantized (float8_e4m3fn, ", config.strategy,
                            config.strategy == "block" ? absl::StrCat(" ", config.block_n, "x", config.block_k) : "",
                            " scales)");
      }
      return absl::StrCat("compressed-tensors pack-quantized (int", config.bits, ", ",
                          config.strategy == "group" ? absl::StrCat("group ", config.group_size) : config.strategy,
                          config.symmetric ? ", symmetric" : ", asymmetric", ")");
    case QuantMethod::kAwq:
      return absl::StrCat("awq gemm (int", config.bits, ", group ", config.group_size, ", zero points)");
    case QuantMethod::kMxfp4:
      return "mxfp4 (E2M1 x E8M0 blocks of 32, experts)";
    case QuantMethod::kGptq:
      return absl::StrCat(
          "gptq v1 (int", config.bits, ", ",
          config.group_size < 0 ? std::string("one group per row") : absl::StrCat("group ", config.group_size),
          config.symmetric ? ", symmetric" : ", asymmetric", config.desc_act ? ", desc_act" : "", ")");
  }
  return config.quant_method;
}

}  // namespace strata::planner
