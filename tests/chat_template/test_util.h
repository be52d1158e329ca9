#pragma once
// Helpers of the chat_template suites: render a template source with a JSON context.

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "chat_template/chat_template.h"
#include "nlohmann/json.hpp"

namespace strata::chat_template::testing {

inline absl::StatusOr<std::string> RenderSource(std::string_view source, std::string_view context_json = "{}",
                                                const RenderLimits& limits = {}) {
  absl::StatusOr<Template> t = ParseTemplate(source, "t.jinja");
  if (!t.ok()) return t.status();
  return t->Render(nlohmann::ordered_json::parse(context_json), limits);
}

// The rendering, or "ERROR: message" (for EXPECT_EQ on both outcomes).
inline std::string R(std::string_view source, std::string_view context_json = "{}") {
  absl::StatusOr<std::string> out = RenderSource(source, context_json);
  return out.ok() ? *out : "ERROR: " + std::string(out.status().message());
}

}  // namespace strata::chat_template::testing
