#include "runtime/model/model_config.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace strata::runtime {
namespace {

using json = nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", field, ": ", what));
}

absl::StatusOr<double> NumberOr(const json& object, const std::string& prefix, const char* key, double fallback) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number())
    return FieldError(absl::StrCat(prefix, key), absl::StrCat("expected a number, got ", it->dump()));
  return it->get<double>();
}

// PreTrainedConfig.convert_rope_params_to_dict / standardize_rope_params: a truthy legacy `rope_scaling`
// wins over `rope_parameters`; `rope_theta` may sit in the dict (transformers 5 writes it there) or at
// the top level (older exports).
absl::StatusOr<RopeConfig> ParseRope(const json& config) {
  RopeConfig rope;
  const json* params = nullptr;
  std::string field;
  for (const char* name : {"rope_scaling", "rope_parameters"}) {
    auto it = config.find(name);
    if (it != config.end() && it->is_object() && !it->empty()) {
      params = &*it;
      field = name;
      break;
    }
  }
  absl::StatusOr<double> top_theta = NumberOr(config, "", "rope_theta", 10000.0);
  if (!top_theta.ok()) return top_theta.status();
  rope.theta = *top_theta;
  absl::StatusOr<double> top_partial = NumberOr(config, "", "partial_rotary_factor", 1.0);
  if (!top_partial.ok()) return top_partial.status();
  double partial = *top_partial;
  if (params != nullptr) {
    const std::string prefix = field + ".";
    std::string type = "default";
    for (const char* key : {"rope_type", "type"}) {
      if (auto it = params->find(key); it != params->end() && it->is_string()) {
        type = it->get<std::string>();
        break;
      }
    }
    absl::StatusOr<double> theta = NumberOr(*params, prefix, "rope_theta", rope.theta);
    if (!theta.ok()) return theta.status();
    rope.theta = *theta;
    absl::StatusOr<double> p = NumberOr(*params, prefix, "partial_rotary_factor", partial);
    if (!p.ok()) return p.status();
    partial = *p;
    if (type == "default") {
      rope.type = RopeConfig::Type::kDefault;
    } else if (type == "linear" || type == "llama3") {
      rope.type = type == "linear" ? RopeConfig::Type::kLinear : RopeConfig::Type::kLlama3;
      if (!params->contains("factor")) return FieldError(prefix + "factor", "required for rope_type " + type);
      absl::StatusOr<double> factor = NumberOr(*params, prefix, "factor", 1.0);
      if (!factor.ok()) return factor.status();
      rope.factor = *factor;
      if (rope.factor <= 0) return FieldError(prefix + "factor", "must be positive");
      if (rope.type == RopeConfig::Type::kLlama3) {
        absl::StatusOr<double> low = NumberOr(*params, prefix, "low_freq_factor", 1.0);
        absl::StatusOr<double> high = NumberOr(*params, prefix, "high_freq_factor", 4.0);
        absl::StatusOr<double> max_positions = NumberOr(config, "", "max_position_embeddings", 8192);
        if (!low.ok()) return low.status();
        if (!high.ok()) return high.status();
        if (!max_positions.ok()) return max_positions.status();
        absl::StatusOr<double> original = NumberOr(*params, prefix, "original_max_position_embeddings", *max_positions);
        if (!original.ok()) return original.status();
        if (*high <= *low) return FieldError(prefix + "high_freq_factor", "must exceed low_freq_factor");
        rope.low_freq_factor = *low;
        rope.high_freq_factor = *high;
        rope.original_max_positions = *original;
      }
    } else {
      return FieldError(
          prefix + "rope_type",
          absl::StrCat("RoPE type \"", type, "\" is not supported by the runtime (default, linear, llama3)"));
    }
  }
  // inv_freq = theta ^ (-2i / d): theta <= 0 gives NaN or infinite frequencies.
  if (!(rope.theta > 0) || !std::isfinite(rope.theta)) {
    return FieldError(params != nullptr ? field + ".rope_theta" : "rope_theta",
                      absl::StrCat("must be a positive finite number, got ", rope.theta));
  }
  // Llama-family attention rotates the whole head; a partial factor would make transformers' own
  // forward fail for scaled types and is ignored by the default type, so only 1 is meaningful here.
  if (partial != 1.0 && rope.type != RopeConfig::Type::kDefault) {
    return FieldError("partial_rotary_factor", "only 1.0 is supported");
  }
  return rope;
}

}  // namespace

absl::StatusOr<RopeConfig> RopeFromJson(const json& config) { return ParseRope(config); }

absl::StatusOr<DecoderConfig> DecoderConfigFromJson(const json& config) {
  DecoderConfig out;
  if (!config.is_object()) return FieldError("(root)", "expected a JSON object");
  auto arch = config.find("architectures");
  if (arch != config.end() && arch->is_array() && !arch->empty() && (*arch)[0].is_string()) {
    out.architecture = (*arch)[0].get<std::string>();
  }
  if (out.architecture == "Gemma2ForCausalLM" || out.architecture == "Gemma3ForCausalLM") {
    return GemmaDecoderConfigFromJson(config);
  }
  if (out.architecture == "Phi3ForCausalLM") return Phi3DecoderConfigFromJson(config);
  // Mixtral windows as Mistral; Qwen3 as Qwen2; Qwen3-MoE as Qwen2 but on every layer (no layer_types).
  const bool qwen3_moe = out.architecture == "Qwen3MoeForCausalLM";
  const bool mistral = out.architecture == "MistralForCausalLM" || out.architecture == "MixtralForCausalLM";
  const bool qwen2 = out.architecture == "Qwen2ForCausalLM" || out.architecture == "Qwen3ForCausalLM" || qwen3_moe;
  if (!mistral && !qwen2 && out.architecture != "LlamaForCausalLM") {
    return FieldError("architectures", absl::StrCat("\"", out.architecture,
                                                    "\" is not one the runtime runs (LlamaForCausalLM, "
                                                    "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                                                    "Qwen3MoeForCausalLM, MixtralForCausalLM, Gemma2ForCausalLM, "
                                                    "Gemma3ForCausalLM, Phi3ForCausalLM)"));
  }
  auto layers = config.find("num_hidden_layers");
  if (layers == config.end() || !layers->is_number_integer()) return FieldError("num_hidden_layers", "required");
  out.num_layers = layers->get<int64_t>();

  absl::StatusOr<double> eps = NumberOr(config, "", "rms_norm_eps", 1e-6);
  if (!eps.ok()) return eps.status();
  out.rms_norm_eps = *eps;
  // A zero or negative epsilon divides by zero (or takes the root of a negative) on a zero row: the model
  // would stream garbage under status OK.
  if (!(out.rms_norm_eps > 0) || !std::isfinite(out.rms_norm_eps)) {
    return FieldError("rms_norm_eps", absl::StrCat("must be a positive finite number, got ", out.rms_norm_eps));
  }

  if (auto act = config.find("hidden_act"); act != config.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "silu") {
      return FieldError("hidden_act", absl::StrCat(act->dump(), " is not supported (silu)"));
    }
  }

  absl::StatusOr<RopeConfig> rope = ParseRope(config);
  if (!rope.ok()) return rope.status();
  out.rope = *rope;

  // Sliding windows: Mistral applies `sliding_window` to every layer when set; Qwen2 only with
  // use_sliding_window, to the layers that layer_types (or, absent, max_window_layers) marks sliding.
  // Llama has none.
  int64_t window = 0;
  if (mistral || qwen2) {
    if (auto it = config.find("sliding_window"); it != config.end() && !it->is_null()) {
      if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
        return FieldError("sliding_window", absl::StrCat("expected a positive integer, got ", it->dump()));
      }
      window = it->get<int64_t>();
    } else if (qwen2 && !config.contains("sliding_window")) {
      window = 4096;  // Qwen2Config's default
    }
  }
  bool use_window = mistral;
  if (qwen2) {
    // Every field is type-checked before use: json::value() would throw type_error on a null or a string.
    if (auto it = config.find("use_sliding_window"); it != config.end() && !it->is_null()) {
      if (!it->is_boolean())
        return FieldError("use_sliding_window", absl::StrCat("expected true or false, got ", it->dump()));
      use_window = it->get<bool>();
    } else {
      use_window = false;
    }
  }
  out.sliding_window.assign(static_cast<size_t>(out.num_layers), 0);
  if (use_window && window > 0) {
    auto types = config.find("layer_types");
    if (qwen2 && !qwen3_moe && types != config.end() && types->is_array()) {
      if (static_cast<int64_t>(types->size()) != out.num_layers) {
        return FieldError("layer_types", "must have one entry per hidden layer");
      }
      for (int64_t i = 0; i < out.num_layers; ++i) {
        const json& type = (*types)[static_cast<size_t>(i)];
        if (!type.is_string()) {
          return FieldError(absl::StrCat("layer_types[", i, "]"), absl::StrCat("expected a string, got ", type.dump()));
        }
        if (type == "sliding_attention") out.sliding_window[static_cast<size_t>(i)] = window;
      }
    } else if (qwen2 && !qwen3_moe) {
      int64_t first = 28;  // Qwen2Config's default
      if (auto it = config.find("max_window_layers"); it != config.end() && !it->is_null()) {
        if (!it->is_number_integer() || it->get<int64_t>() < 0) {
          return FieldError("max_window_layers", absl::StrCat("expected a non-negative integer, got ", it->dump()));
        }
        first = it->get<int64_t>();
      }
      for (int64_t i = first; i < out.num_layers; ++i) out.sliding_window[static_cast<size_t>(i)] = window;
    } else {
      for (int64_t& w : out.sliding_window) w = window;
    }
  }
  if (absl::Status s = ReadQwen3AndMoeConfig(config, out); !s.ok()) return s;
  return out;
}

}  // namespace strata::runtime
