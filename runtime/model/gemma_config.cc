// DecoderConfig for Gemma2ForCausalLM and Gemma3ForCausalLM (text), as transformers 5.23's Gemma2Config /
// Gemma3TextConfig and modeling code read config.json. Plain C++.
//
// Semantics reproduced (models/gemma2, models/gemma3):
// - layer_types, or by default every `sliding_window_pattern`-th layer full attention (Gemma 2: 2; Gemma 3:
//   sliding_window_pattern, default 6), the others sliding with `sliding_window` (the same
//   create_sliding_window_causal_mask as Mistral: key visible when query - key < window);
// - Gemma 2 RoPE is one Llama-style dict; Gemma 3 has one per layer type: the global layers' from
//   rope_parameters.full_attention or the legacy rope_scaling (+ rope_theta, default 1e6), the sliding
//   layers' from rope_parameters.sliding_attention (+ rope_local_base_freq, default 1e4);
// - scores scaled by query_pre_attn_scalar^-1/2; Gemma 2 soft-caps them with attn_logit_softcapping
//   (default 50). Gemma3Attention in 5.23 does not pass attn_logit_softcapping to its attention function,
//   so for Gemma 3 the field is validated and, as upstream, has no effect;
// - final_logit_softcapping (Gemma 2 default 30, Gemma 3 none) caps the logits.

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/model/model_config.h"

namespace strata::runtime {
namespace {

using json = nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", field, ": ", what));
}

// A positive finite number; `fallback` when absent; 0 (none) when null and `nullable`.
absl::StatusOr<double> PositiveNumber(const json& config, const char* field, double fallback, bool nullable) {
  auto it = config.find(field);
  if (it == config.end()) return fallback;
  if (it->is_null() && nullable) return 0.0;
  if (!it->is_number() || !(it->get<double>() > 0) || !std::isfinite(it->get<double>())) {
    return FieldError(
        field, absl::StrCat("must be a positive finite number", nullable ? " or null" : "", ", got ", it->dump()));
  }
  return it->get<double>();
}

absl::StatusOr<RopeConfig> RopeOfDict(const json& dict, const std::string& field) {
  absl::StatusOr<RopeConfig> rope = RopeFromJson(json{{"rope_parameters", dict}});
  if (!rope.ok()) return absl::InvalidArgumentError(absl::StrCat(rope.status().message(), " (in ", field, ")"));
  if (rope->type != RopeConfig::Type::kDefault && rope->type != RopeConfig::Type::kLinear) {
    return FieldError(field + ".rope_type", "only default and linear RoPE are supported for Gemma");
  }
  return rope;
}

}  // namespace

absl::StatusOr<DecoderConfig> GemmaDecoderConfigFromJson(const json& config) {
  DecoderConfig out;
  out.architecture = config.at("architectures")[0].get<std::string>();
  const bool gemma3 = out.architecture == "Gemma3ForCausalLM";
  auto layers = config.find("num_hidden_layers");
  if (layers == config.end() || !layers->is_number_integer() || layers->get<int64_t>() <= 0 ||
      layers->get<int64_t>() > 4096) {
    return FieldError("num_hidden_layers", "required: a positive integer of at most 4096");
  }
  out.num_layers = layers->get<int64_t>();
  absl::StatusOr<double> eps = PositiveNumber(config, "rms_norm_eps", 1e-6, false);
  if (!eps.ok()) return eps.status();
  out.rms_norm_eps = *eps;

  if (auto act = config.find("hidden_activation"); act != config.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "gelu_pytorch_tanh") {
      return FieldError("hidden_activation", absl::StrCat(act->dump(), " is not supported (gelu_pytorch_tanh)"));
    }
  }
  if (auto it = config.find("use_bidirectional_attention"); it != config.end() && !it->is_null()) {
    if (!it->is_boolean()) return FieldError("use_bidirectional_attention", "must be true, false or null");
    if (it->get<bool>()) return FieldError("use_bidirectional_attention", "bidirectional attention is not supported");
  }
  absl::StatusOr<double> scalar = PositiveNumber(config, "query_pre_attn_scalar", 256, false);
  if (!scalar.ok()) return scalar.status();
  out.query_pre_attn_scalar = *scalar;
  absl::StatusOr<double> final_cap = PositiveNumber(config, "final_logit_softcapping", gemma3 ? 0.0 : 30.0, true);
  if (!final_cap.ok()) return final_cap.status();
  out.final_logit_softcapping = *final_cap;
  absl::StatusOr<double> attn_cap = PositiveNumber(config, "attn_logit_softcapping", gemma3 ? 0.0 : 50.0, true);
  if (!attn_cap.ok()) return attn_cap.status();
  if (!gemma3) out.attn_logit_softcapping = *attn_cap;

  // Layer types (the planner checked their shape; read again here so this parser stands alone).
  std::vector<bool> sliding(static_cast<size_t>(out.num_layers));
  if (auto it = config.find("layer_types"); it != config.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != out.num_layers) {
      return FieldError("layer_types", "must have one entry per hidden layer");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      if (t != "sliding_attention" && t != "full_attention") {
        return FieldError(absl::StrCat("layer_types[", i, "]"), "must be \"sliding_attention\" or \"full_attention\"");
      }
      sliding[i] = t == "sliding_attention";
    }
  } else {
    int64_t pattern = 2;
    if (gemma3) {
      pattern = 6;
      if (auto p = config.find("sliding_window_pattern"); p != config.end() && !p->is_null()) {
        if (!p->is_number_integer() || p->get<int64_t>() <= 0) {
          return FieldError("sliding_window_pattern", absl::StrCat("must be a positive integer, got ", p->dump()));
        }
        pattern = p->get<int64_t>();
      }
    }
    for (int64_t i = 0; i < out.num_layers; ++i) sliding[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
  }
  int64_t window = 4096;
  bool any_sliding = false;
  for (bool s : sliding) any_sliding = any_sliding || s;
  if (auto it = config.find("sliding_window"); it != config.end()) {
    if (it->is_null()) {
      if (any_sliding) return FieldError("sliding_window", "is null but layer_types has sliding_attention layers");
    } else if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      return FieldError("sliding_window", absl::StrCat("must be a positive integer, got ", it->dump()));
    } else {
      window = it->get<int64_t>();
    }
  }
  out.sliding_window.assign(static_cast<size_t>(out.num_layers), 0);
  for (size_t i = 0; i < sliding.size(); ++i) {
    if (sliding[i]) out.sliding_window[i] = window;
  }

  if (!gemma3) {
    absl::StatusOr<RopeConfig> rope = RopeFromJson(config);
    if (!rope.ok()) return rope.status();
    if (rope->type != RopeConfig::Type::kDefault && rope->type != RopeConfig::Type::kLinear) {
      return FieldError("rope_scaling.rope_type", "only default and linear RoPE are supported for Gemma 2");
    }
    out.rope = *rope;
    return out;
  }

  // Gemma3TextConfig.convert_rope_params_to_dict.
  json full = json{{"rope_type", "default"}};
  json local = json{{"rope_type", "default"}};
  if (auto it = config.find("rope_parameters"); it != config.end() && !it->is_null()) {
    if (!it->is_object() || !(it->contains("full_attention") || it->contains("sliding_attention"))) {
      return FieldError("rope_parameters",
                        "must hold \"full_attention\" and \"sliding_attention\" entries for Gemma 3");
    }
    if (auto f = it->find("full_attention"); f != it->end() && !f->is_null()) full = *f;
    if (auto s = it->find("sliding_attention"); s != it->end() && !s->is_null()) local = *s;
  }
  if (!full.is_object()) return FieldError("rope_parameters.full_attention", "must be an object");
  if (!local.is_object()) return FieldError("rope_parameters.sliding_attention", "must be an object");
  if (auto it = config.find("rope_scaling"); it != config.end() && !it->is_null()) {
    if (!it->is_object()) return FieldError("rope_scaling", absl::StrCat("must be an object, got ", it->dump()));
    full.update(*it);
  }
  if (!full.contains("rope_theta")) {
    absl::StatusOr<double> theta = PositiveNumber(config, "rope_theta", 1000000.0, false);
    if (!theta.ok()) return theta.status();
    full["rope_theta"] = *theta;
  }
  if (!local.contains("rope_theta")) {
    absl::StatusOr<double> theta = PositiveNumber(config, "rope_local_base_freq", 10000.0, false);
    if (!theta.ok()) return theta.status();
    local["rope_theta"] = *theta;
  }
  absl::StatusOr<RopeConfig> global_rope = RopeOfDict(full, "rope_parameters.full_attention");
  if (!global_rope.ok()) return global_rope.status();
  absl::StatusOr<RopeConfig> local_rope = RopeOfDict(local, "rope_parameters.sliding_attention");
  if (!local_rope.ok()) return local_rope.status();
  out.rope = *global_rope;
  out.sliding_rope = *local_rope;
  return out;
}

}  // namespace strata::runtime
