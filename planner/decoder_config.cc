// The readers of the forward pass's settings (decoder_config.h) that more than one family builder uses
// (spec_builder.h): numbers, and the RoPE dict of the Llama family and Gemma.

#include "planner/decoder_config.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "planner/spec_builder.h"

namespace strata::planner::spec_builder {

absl::StatusOr<RopeDict> FindRopeDict(const json& config) {
  RopeDict dict;
  for (const char* name : {"rope_scaling", "rope_parameters"}) {
    auto it = config.find(name);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_object()) return FieldError(name, absl::StrCat("must be an object, got ", it->dump()));
    if (it->empty()) continue;
    dict.params = &*it;
    dict.field = name;
    break;
  }
  return dict;
}

absl::StatusOr<std::string> RopeTypeOf(const RopeDict& dict, std::string fallback) {
  if (dict.params == nullptr) return fallback;
  for (const char* key : {"rope_type", "type"}) {
    auto it = dict.params->find(key);
    if (it == dict.params->end()) continue;
    if (!it->is_string()) {
      return FieldError(absl::StrCat(dict.field, ".", key), absl::StrCat("must be a string, got ", it->dump()));
    }
    return it->get<std::string>();
  }
  return fallback;
}

absl::StatusOr<double> NumberOr(const json& object, absl::string_view prefix, absl::string_view key, double fallback) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number())
    return FieldError(absl::StrCat(prefix, key), absl::StrCat("must be a number, got ", it->dump()));
  return it->get<double>();
}

absl::StatusOr<RopeConfig> LlamaStyleRope(const json& params, absl::string_view prefix, absl::string_view type,
                                          double theta, double max_positions) {
  RopeConfig rope;
  absl::StatusOr<double> dict_theta = NumberOr(params, prefix, "rope_theta", theta);
  if (!dict_theta.ok()) return dict_theta.status();
  rope.theta = *dict_theta;
  if (type == "linear" || type == "llama3") {
    rope.type = type == "linear" ? RopeConfig::Type::kLinear : RopeConfig::Type::kLlama3;
    if (!params.contains("factor")) {
      return FieldError(absl::StrCat(prefix, "factor"), absl::StrCat("is required for rope_type ", type));
    }
    absl::StatusOr<double> factor = NumberOr(params, prefix, "factor", 1.0);
    if (!factor.ok()) return factor.status();
    rope.factor = *factor;
    if (rope.factor <= 0) return FieldError(absl::StrCat(prefix, "factor"), "must be positive");
    if (rope.type == RopeConfig::Type::kLlama3) {
      absl::StatusOr<double> low = NumberOr(params, prefix, "low_freq_factor", 1.0);
      if (!low.ok()) return low.status();
      absl::StatusOr<double> high = NumberOr(params, prefix, "high_freq_factor", 4.0);
      if (!high.ok()) return high.status();
      absl::StatusOr<double> original = NumberOr(params, prefix, "original_max_position_embeddings", max_positions);
      if (!original.ok()) return original.status();
      if (*high <= *low) return FieldError(absl::StrCat(prefix, "high_freq_factor"), "must exceed low_freq_factor");
      rope.low_freq_factor = *low;
      rope.high_freq_factor = *high;
      rope.original_max_positions = *original;
    }
  } else if (type != "default") {
    return FieldError(absl::StrCat(prefix, "rope_type"),
                      absl::StrCat("\"", type, "\" is not supported by the runtime (default, linear, llama3)"));
  }
  // inv_freq = theta ^ (-2i / d): theta <= 0 gives NaN or infinite frequencies.
  if (!(rope.theta > 0) || !std::isfinite(rope.theta)) {
    return FieldError(absl::StrCat(prefix, "rope_theta"),
                      absl::StrCat("must be a positive finite number, got ", rope.theta));
  }
  return rope;
}

absl::StatusOr<RopeConfig> YarnRope(const json& params, absl::string_view prefix, double theta, double max_positions) {
  RopeConfig rope;
  rope.type = RopeConfig::Type::kYarn;
  absl::StatusOr<double> dict_theta = NumberOr(params, prefix, "rope_theta", theta);
  if (!dict_theta.ok()) return dict_theta.status();
  rope.theta = *dict_theta;
  if (!(rope.theta > 0) || !std::isfinite(rope.theta)) {
    return FieldError(absl::StrCat(prefix, "rope_theta"),
                      absl::StrCat("must be a positive finite number, got ", rope.theta));
  }
  absl::StatusOr<double> original = NumberOr(params, prefix, "original_max_position_embeddings", max_positions);
  if (!original.ok()) return original.status();
  if (!(*original > 0)) {
    return FieldError(absl::StrCat(prefix, "original_max_position_embeddings"), "is required for rope_type yarn");
  }
  rope.original_max_positions = *original;
  // A null factor is max_position_embeddings / original_max_position_embeddings (DeepSeek-V3's note upstream).
  absl::StatusOr<double> factor =
      NumberOr(params, prefix, "factor", max_positions > 0 ? max_positions / *original : 1.0);
  if (!factor.ok()) return factor.status();
  if (!(*factor > 0) || !std::isfinite(*factor)) return FieldError(absl::StrCat(prefix, "factor"), "must be positive");
  rope.factor = *factor;
  auto mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  absl::StatusOr<double> m = NumberOr(params, prefix, "mscale", 0);
  if (!m.ok()) return m.status();
  absl::StatusOr<double> m_all = NumberOr(params, prefix, "mscale_all_dim", 0);
  if (!m_all.ok()) return m_all.status();
  // attention_factor, else from mscale / mscale_all_dim when both are set, else from the factor alone.
  const double fallback =
      *m != 0 && *m_all != 0 ? mscale(rope.factor, *m) / mscale(rope.factor, *m_all) : mscale(rope.factor, 1.0);
  absl::StatusOr<double> attention = NumberOr(params, prefix, "attention_factor", fallback);
  if (!attention.ok()) return attention.status();
  rope.attention_factor = *attention;
  // beta_fast / beta_slow: `or 32` / `or 1` upstream, so 0 and null take the default too.
  absl::StatusOr<double> fast = NumberOr(params, prefix, "beta_fast", 32);
  if (!fast.ok()) return fast.status();
  absl::StatusOr<double> slow = NumberOr(params, prefix, "beta_slow", 1);
  if (!slow.ok()) return slow.status();
  rope.beta_fast = *fast != 0 ? *fast : 32;
  rope.beta_slow = *slow != 0 ? *slow : 1;
  if (auto it = params.find("truncate"); it != params.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return FieldError(absl::StrCat(prefix, "truncate"), absl::StrCat("must be true or false, got ", it->dump()));
    }
    rope.truncate = it->get<bool>();
  }
  return rope;
}

absl::StatusOr<int64_t> ReadGqaHeads(const json& config, int64_t default_kv_heads, int64_t default_head_dim,
                                     DecoderSizes& sizes) {
  absl::StatusOr<int64_t> kv_heads =
      PositiveIntOr(config, "num_key_value_heads", default_kv_heads, /*may_be_null=*/false, kMaxAttentionHeads);
  if (!kv_heads.ok()) return kv_heads.status();
  if (sizes.heads % *kv_heads != 0) {
    return FieldError("num_attention_heads", absl::StrCat("(", sizes.heads, ") must be a multiple of ",
                                                          "num_key_value_heads (", *kv_heads, ")"));
  }
  sizes.kv_heads = *kv_heads;
  absl::StatusOr<int64_t> head_dim =
      PositiveIntOr(config, "head_dim", default_head_dim, /*may_be_null=*/false, kMaxHeadDim);
  if (!head_dim.ok()) return head_dim.status();
  sizes.head_dim = *head_dim;
  return *head_dim;
}

absl::StatusOr<std::string> HiddenAct(const json& config, bool silu_only) {
  std::string act = "silu";
  if (auto it = config.find("hidden_act"); it != config.end()) {
    if (!it->is_string()) return FieldError("hidden_act", absl::StrCat("must be a string, got ", it->dump()));
    act = it->get<std::string>();
  }
  if (silu_only && act != "silu") {
    return FieldError("hidden_act", absl::StrCat("\"", act, "\" is not supported (silu)"));
  }
  return act;
}

absl::StatusOr<double> RmsNormEps(const json& config, double fallback) {
  absl::StatusOr<double> eps = NumberOr(config, "", "rms_norm_eps", fallback);
  if (!eps.ok()) return eps.status();
  if (!(*eps > 0) || !std::isfinite(*eps)) {
    return FieldError("rms_norm_eps", absl::StrCat("must be a positive finite number, got ", *eps));
  }
  return *eps;
}

absl::StatusOr<RopeConfig> DictRope(const json& config, double default_theta, int64_t max_positions,
                                    const json* defaults) {
  absl::StatusOr<RopeDict> dict = FindRopeDict(config);
  if (!dict.ok()) return dict.status();
  const json empty = json::object();
  const json* params = dict->params != nullptr ? dict->params : defaults;
  const RopeDict resolved{params, dict->field};
  absl::StatusOr<std::string> type = RopeTypeOf(resolved);
  if (!type.ok()) return type.status();
  absl::StatusOr<double> theta = NumberOr(config, "", "rope_theta", default_theta);
  if (!theta.ok()) return theta.status();
  const std::string prefix = params != nullptr ? dict->field + "." : "";
  if (*type == "yarn") {
    return YarnRope(params != nullptr ? *params : empty, prefix, *theta,
                    max_positions > 0 ? static_cast<double>(max_positions) : 0);
  }
  return LlamaStyleRope(params != nullptr ? *params : empty, prefix, *type, *theta,
                        max_positions > 0 ? static_cast<double>(max_positions) : 8192.0);
}

absl::Status FinishDictRopeDecoder(const json& config, double default_eps, double default_theta, int64_t max_positions,
                                   const json* rope_defaults, DecoderConfig decoder, ModelSpec& spec) {
  absl::StatusOr<double> eps = RmsNormEps(config, default_eps);
  if (!eps.ok()) return eps.status();
  decoder.rms_norm_eps = *eps;
  absl::StatusOr<RopeConfig> rope = DictRope(config, default_theta, max_positions, rope_defaults);
  if (!rope.ok()) {
    spec.decoder = rope.status();
  } else {
    decoder.rope = *rope;
    spec.decoder = std::move(decoder);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> PartialRotaryFactor(const json& config, double fallback) {
  absl::StatusOr<RopeDict> dict = FindRopeDict(config);
  if (!dict.ok()) return dict.status();
  double factor = fallback;
  for (const auto& [object, prefix] :
       {std::pair{&config, std::string()}, std::pair{dict->params, dict->params != nullptr ? dict->field + "." : ""}}) {
    if (object == nullptr) continue;
    auto it = object->find("partial_rotary_factor");
    if (it == object->end() || it->is_null()) continue;
    if (!it->is_number() || !(it->get<double>() > 0) || it->get<double>() > 1) {
      return FieldError(absl::StrCat(prefix, "partial_rotary_factor"),
                        absl::StrCat("must be a number in (0, 1], got ", it->dump()));
    }
    factor = it->get<double>();
  }
  return factor;
}

}  // namespace strata::planner::spec_builder
