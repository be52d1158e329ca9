// The readers of the forward pass's settings (decoder_config.h) that more than one family builder uses
// (spec_builder.h): numbers, and the RoPE dict of the Llama family and Gemma.

#include "planner/decoder_config.h"

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "planner/spec_builder.h"

namespace strata::planner::spec_builder {

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

}  // namespace strata::planner::spec_builder
