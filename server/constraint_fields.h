#pragma once
// The structured-output fields of an HTTP API request body (server/README.md, "Structured outputs"), read into the
// one structured::Constraint that the request check compiles (server/generate_validation.h): OpenAI's
// response_format, vLLM's structured_outputs (and its older guided_* fields), llama.cpp's json_schema and grammar,
// and the tool calls that tool_choice "required" or a named function forces, constrained as vLLM constrains them.
// One constraint per request; every error names the API's own field.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "structured/structured.h"

namespace strata::server::openai {

// tool_choice (chat): "none", "auto" (the model may call a tool: --tool-call-parser reads its calls), "required"
// or a named function (the output is constrained to the call).
struct ToolChoice {
  enum class Kind { kNone, kAuto, kRequired, kNamed };
  Kind kind = Kind::kNone;
  std::string name;  // kNamed: the function's name
};

// tool_choice as given, or its default: "auto" with tools, "none" without. Errors name tool_choice's part.
absl::StatusOr<ToolChoice> ReadToolChoice(const nlohmann::ordered_json& request);

// The calls a constrained output holds (chat_template::ParseForcedToolCalls reads them): "required" (`name`
// empty) or a named function's.
struct ForcedToolCalls {
  std::string name;
};

struct ConstraintFields {
  std::optional<structured::Constraint> constraint;
  std::optional<ForcedToolCalls> forced_tool_calls;
  // strata_structured_requests_total's kind: structured::ConstraintKindName, or "tool_calls". Null: no constraint.
  const char* kind = nullptr;
};

// The request's constraint, from whichever field gives it; `tool_choice` (chat only, else null) adds the forced
// tool calls. Two constraints at once are refused naming both.
absl::StatusOr<ConstraintFields> ReadConstraintFields(const nlohmann::ordered_json& request,
                                                      const ToolChoice* tool_choice);

// Whether the body has a field that may carry a constraint (tool_choice included): such a request is checked on a
// thread that may wait for a grammar to compile, never on the HTTP server's own.
bool MayHaveConstraint(const nlohmann::ordered_json& request);

}  // namespace strata::server::openai
