// DecoderConfig for Phi3ForCausalLM, as transformers 5.23's Phi3Config and modeling_phi3 read config.json.
// Plain C++.
//
// Semantics reproduced:
// - RoPE: a truthy legacy rope_scaling replaces rope_parameters; rope_theta (default 1e4) and
//   partial_rotary_factor (default 1) may sit in the dict or at the top level; types "default" and
//   "longrope" ("su" and "yarn" are Phi3Config's old names for it). The rotary embedding rotates the first
//   int(head_dim * partial_rotary_factor) dims of each head, also for the default type.
// - longrope (_compute_longrope_parameters): inv_freq = 1 / (ext * theta^(2i/d)) with ext = short_factor,
//   or long_factor while the batch's longest sequence (max position + 1) exceeds
//   original_max_position_embeddings (dynamic_rope_update); cos and sin are scaled by attention_factor,
//   default sqrt(1 + ln(factor) / ln(original)) for factor = max_position_embeddings / original (1 when
//   factor <= 1). original_max_position_embeddings is the top-level field (Phi3Config default 4096); for
//   "su" the dict must also hold one (Phi3Config's validation), whose value is then overridden.
// - sliding_window, when set, applies to every layer.

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

absl::StatusOr<double> Number(const json& object, const std::string& field, const char* key, double fallback) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number() || !std::isfinite(it->get<double>())) {
    return FieldError(field + key, absl::StrCat("must be a finite number, got ", it->dump()));
  }
  return it->get<double>();
}

absl::StatusOr<int64_t> PositiveInt(const json& config, const char* field, std::optional<int64_t> fallback) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) {
    if (fallback) return *fallback;
    return FieldError(field, "is required");
  }
  if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > (int64_t{1} << 24)) {
    return FieldError(field, absl::StrCat("must be a positive integer, got ", it->dump()));
  }
  return it->get<int64_t>();
}

absl::StatusOr<std::vector<double>> Factors(const json& params, const std::string& field, const char* key,
                                            int64_t expected) {
  auto it = params.find(key);
  if (it == params.end() || !it->is_array()) return FieldError(field + key, "must be an array of numbers for longrope");
  std::vector<double> out;
  for (const json& x : *it) {
    if (!x.is_number() || !(x.get<double>() > 0) || !std::isfinite(x.get<double>())) {
      return FieldError(field + key, absl::StrCat("must hold positive finite numbers, got ", x.dump()));
    }
    out.push_back(x.get<double>());
  }
  if (static_cast<int64_t>(out.size()) != expected) {
    return FieldError(field + key,
                      absl::StrCat("has ", out.size(), " entries, expected ", expected, " (one per rotary frequency)"));
  }
  return out;
}

}  // namespace

absl::StatusOr<DecoderConfig> Phi3DecoderConfigFromJson(const json& config) {
  DecoderConfig out;
  out.architecture = "Phi3ForCausalLM";
  absl::StatusOr<int64_t> layers = PositiveInt(config, "num_hidden_layers", std::nullopt);
  if (!layers.ok()) return layers.status();
  if (*layers > 4096) return FieldError("num_hidden_layers", "must be at most 4096");
  out.num_layers = *layers;
  absl::StatusOr<int64_t> hidden = PositiveInt(config, "hidden_size", std::nullopt);
  if (!hidden.ok()) return hidden.status();
  absl::StatusOr<int64_t> heads = PositiveInt(config, "num_attention_heads", std::nullopt);
  if (!heads.ok()) return heads.status();
  const int64_t head_dim = *hidden / *heads;

  absl::StatusOr<double> eps = Number(config, "", "rms_norm_eps", 1e-5);
  if (!eps.ok()) return eps.status();
  if (!(*eps > 0)) return FieldError("rms_norm_eps", "must be a positive finite number");
  out.rms_norm_eps = *eps;
  if (auto act = config.find("hidden_act"); act != config.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "silu") {
      return FieldError("hidden_act", absl::StrCat(act->dump(), " is not supported (silu)"));
    }
  }

  out.sliding_window.assign(static_cast<size_t>(out.num_layers), 0);
  if (auto it = config.find("sliding_window"); it != config.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      return FieldError("sliding_window", absl::StrCat("must be a positive integer or null, got ", it->dump()));
    }
    for (int64_t& w : out.sliding_window) w = it->get<int64_t>();
  }

  const json empty = json::object();
  const json* params = &empty;
  std::string field;
  for (const char* name : {"rope_scaling", "rope_parameters"}) {
    auto it = config.find(name);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_object()) return FieldError(name, absl::StrCat("must be an object, got ", it->dump()));
    if (it->empty()) continue;
    params = &*it;
    field = std::string(name) + ".";
    break;
  }
  absl::StatusOr<double> top_theta = Number(config, "", "rope_theta", 10000.0);
  if (!top_theta.ok()) return top_theta.status();
  absl::StatusOr<double> theta = Number(*params, field, "rope_theta", *top_theta);
  if (!theta.ok()) return theta.status();
  if (!(*theta > 0)) return FieldError(field + "rope_theta", "must be a positive finite number");
  absl::StatusOr<double> top_partial = Number(config, "", "partial_rotary_factor", 1.0);
  if (!top_partial.ok()) return top_partial.status();
  absl::StatusOr<double> partial = Number(*params, field, "partial_rotary_factor", *top_partial);
  if (!partial.ok()) return partial.status();
  if (!(*partial > 0) || *partial > 1) return FieldError("partial_rotary_factor", "must be in (0, 1]");
  const int64_t rotary_dim = static_cast<int64_t>(static_cast<double>(head_dim) * *partial);
  if (rotary_dim < 2 || rotary_dim % 2 != 0) {
    return FieldError("partial_rotary_factor",
                      absl::StrCat("gives ", rotary_dim, " rotary dims; an even number >= 2 is needed"));
  }
  out.rotary_dim = rotary_dim == head_dim ? 0 : rotary_dim;
  out.rope.theta = *theta;

  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (auto it = params->find(key); it != params->end()) {
      if (!it->is_string()) return FieldError(field + key, absl::StrCat("must be a string, got ", it->dump()));
      type = it->get<std::string>();
      break;
    }
  }
  if (type == "default") return out;
  if (type != "longrope" && type != "su" && type != "yarn") {
    return FieldError(field + "rope_type",
                      absl::StrCat("\"", type, "\" is not supported for Phi-3 (default, longrope, su)"));
  }
  RopeConfig& rope = out.rope;
  rope.type = RopeConfig::Type::kLongRope;
  absl::StatusOr<std::vector<double>> short_factor = Factors(*params, field, "short_factor", rotary_dim / 2);
  if (!short_factor.ok()) return short_factor.status();
  absl::StatusOr<std::vector<double>> long_factor = Factors(*params, field, "long_factor", rotary_dim / 2);
  if (!long_factor.ok()) return long_factor.status();
  rope.short_factor = *short_factor;
  rope.long_factor = *long_factor;
  // Phi3Config validates "su" before renaming it, so the dict must name original_max_position_embeddings;
  // the rope init function then standardizes again as "longrope", and the top-level field (default 4096)
  // overrides the dict's value for every spelling.
  if (type == "su" && !params->contains("original_max_position_embeddings")) {
    return FieldError(field + "original_max_position_embeddings", "is required for rope type \"su\"");
  }
  absl::StatusOr<int64_t> original = PositiveInt(config, "original_max_position_embeddings", 4096);
  if (!original.ok()) return original.status();
  absl::StatusOr<int64_t> max_positions = PositiveInt(config, "max_position_embeddings", 4096);
  if (!max_positions.ok()) return max_positions.status();
  rope.original_max_positions = static_cast<double>(*original);
  absl::StatusOr<double> factor =
      Number(*params, field, "factor", static_cast<double>(*max_positions) / static_cast<double>(*original));
  if (!factor.ok()) return factor.status();
  if (!(*factor > 0)) return FieldError(field + "factor", "must be positive");
  const double default_attention =
      *factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(*factor) / std::log(static_cast<double>(*original)));
  absl::StatusOr<double> attention = Number(*params, field, "attention_factor", default_attention);
  if (!attention.ok()) return attention.status();
  if (!(*attention > 0)) return FieldError(field + "attention_factor", "must be positive");
  rope.attention_factor = *attention;
  return out;
}

}  // namespace strata::runtime
