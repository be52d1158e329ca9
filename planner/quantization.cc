// config.json's quantization_config, read into QuantizationConfig (quantization.h). The fields and their
// defaults are transformers 5.23's config classes (utils/quantization_config.py) and, for compressed-tensors,
// the compressed-tensors library's QuantizationConfig / QuantizationScheme / QuantizationArgs.

#include "planner/quantization.h"

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
[[maybe_unused]] absl::StatusOr<int64_t> IntOr(const json& object, absl::string_view prefix, absl::string_view key,
                                               int64_t fallback, int64_t min, int64_t max) {
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
  const std::vector<std::string> supported = {"fp8", "compressed-tensors", "awq", "gptq"};
  if (absl::Status s = CheckOneOf("quant_method", out.quant_method, supported); !s.ok()) return s;
  absl::Status parsed;
  if (out.quant_method == "fp8") {
    parsed = ParseFp8(q, out);
  } else {
    parsed = QuantError("quant_method", absl::StrCat("\"", out.quant_method, "\" is not implemented yet"));
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
    case QuantMethod::kAwq:
    case QuantMethod::kGptq:
      return absl::StrCat(config.quant_method, " (int", config.bits, ", group ", config.group_size,
                          config.symmetric ? ", symmetric" : ", asymmetric", ")");
  }
  return config.quant_method;
}

}  // namespace strata::planner
