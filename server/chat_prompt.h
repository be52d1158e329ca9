#pragma once
// A chat as both APIs give it, rendered into a prompt by the checkpoint's chat template: the HTTP API's
// `messages` (OpenAI's shape) and gRPC Generate's (converted to the same JSON). Also the typed reads of
// JSON request fields both use, each error naming its field.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chat_template/checkpoint_template.h"
#include "nlohmann/json.hpp"

namespace strata::server {

namespace json_fields {
using Json = nlohmann::ordered_json;
// InvalidArgument "field: message".
absl::Status Invalid(absl::string_view field, absl::string_view message);
const char* TypeName(const Json& value);  // "a string", "an array", ...
// The field, or null when it is absent or JSON null.
const Json* Field(const Json& object, const char* key);
// Each: absent or null is nullopt; another type is an error naming the field: `field` when given (the
// path of a nested field, "stream_options.include_usage"), else `key`.
absl::StatusOr<std::optional<bool>> Bool(const Json& object, const char* key, absl::string_view field = {});
absl::StatusOr<std::optional<double>> Number(const Json& object, const char* key, absl::string_view field = {});
// An integer; a float with an integral value (1.0) is taken, as pydantic's lax mode takes it.
absl::StatusOr<int64_t> IntegerValue(const Json& value, absl::string_view field);
absl::StatusOr<std::optional<int64_t>> Integer(const Json& object, const char* key, absl::string_view field = {});
absl::StatusOr<std::optional<std::string>> String(const Json& object, const char* key, absl::string_view field = {});
}  // namespace json_fields

// How deep JSON that arrives inside a string may nest (a tool call's function.arguments, gRPC's tools_json
// and tool_calls_json): as deep as a request body (openai::ApiLimits::max_json_depth's default).
inline constexpr int kMaxEmbeddedJsonDepth = 64;

// Renders `request`'s chat with `chat_template` (null: an error saying the model has none): its
// "messages" (each an object with a string role; content a string or a list of text parts, joined by "\n"
// as vLLM joins them; tool calls' arguments parsed from their JSON text), "tools", "documents",
// "add_generation_prompt" (default true unless continue_final_message), "continue_final_message",
// "chat_template_kwargs" and "chat_template_name". At most `max_messages` messages. Errors name the field
// ("messages[2].content: ..."); a template's own error is "messages: the chat template failed: ...".
absl::StatusOr<std::string> RenderChat(const nlohmann::ordered_json& request,
                                       const chat_template::CheckpointChatTemplate* chat_template,
                                       int64_t max_messages);

}  // namespace strata::server
