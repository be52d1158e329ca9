#pragma once
// The OpenAI-compatible API's wire format, without the HTTP server or the engine: request bodies of
// /v1/completions and /v1/chat/completions checked into validated runtime requests (through the one
// request check both APIs share, server/generate_validation.h), and the JSON of responses, streamed
// chunks and errors as OpenAI shapes them. server/http_api.h serves them; fuzz_http_request feeds this
// file's parser whatever bytes it likes.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chat_template/checkpoint_template.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/engine.h"
#include "server/constraint_fields.h"
#include "server/served_model.h"
#include "tokenizer/tokenizer.h"

namespace strata::server::openai {

using Json = nlohmann::ordered_json;

// An error as OpenAI answers it: the HTTP status and {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};
Json ErrorJson(const ApiError& error);
std::string ErrorBody(const ApiError& error);  // ErrorJson as text
// A status from the request check or the engine: InvalidArgument "field: why" is a 400 whose param is
// the field; NotFound 404; Unauthenticated 401; ResourceExhausted 429; Unavailable and
// FailedPrecondition 503; anything else 500.
ApiError ErrorFromStatus(const absl::Status& status);

// What the API checks besides the generation limits.
struct ApiLimits {
  int64_t max_json_depth = 64;   // arrays and objects nested in each other
  int64_t max_choices = 128;     // prompts x n
  int64_t max_logit_bias = 300;  // entries, as OpenAI's limit
  // Tokens a response may list: n x (echoed prompt + max new tokens) x (1 + logprobs), summed over the
  // prompts (--max-response-tokens). A request above is refused before it runs: its response would be built
  // whole (tens of MiB) on the server's threads.
  int64_t max_response_tokens = int64_t{1} << 19;
};

// What the API parses against: the served model's name, limits, tokenizer and chat template.
struct ApiContext {
  std::string model_name;
  GenerateLimits limits;
  ApiLimits api;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  const chat_template::CheckpointChatTemplate* chat_template = nullptr;
  bool parse_tool_calls = false;  // --tool-call-parser given
};

enum class Route { kCompletions, kChatCompletions };

// One validated request: each prompt generated `n` times (choice index = prompt * n + sample).
struct ApiRequest {
  Route route = Route::kCompletions;
  std::string model;
  std::vector<runtime::GenerationRequest> prompts;
  std::vector<std::string> prompt_texts;  // the prompt as text (ids decoded), for echo
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: the prompt before the completion
  // completions: logprobs (the number of top alternatives, 0-20); chat: logprobs true (top_logprobs).
  std::optional<int64_t> logprobs;
  bool parse_tool_calls = false;  // chat with tools, tool_choice "auto", and a tool-call parser
  // With parse_tool_calls: the request's "tools", which --tool-call-parser glm45 and minimax_m2 type arguments by
  // (shared: every choice's parser reads them).
  std::shared_ptr<const Json> tools;
  // chat: tool_choice "required" or a named function: each output is constrained to the call(s) and answered as
  // tool_calls (chat_template::ParseForcedToolCalls), whatever --tool-call-parser says.
  std::optional<ForcedToolCalls> forced_tool_calls;
  // The structured-output constraint's kind (strata_structured_requests_total), null without one. A constrained
  // output is never split into reasoning: the grammar holds from its first token.
  const char* structured_kind = nullptr;
  // chat: chat_template_kwargs.enable_thinking as Python tests it (absent: true), which --reasoning-parser
  // qwen3 reads as vLLM's does (off: no reasoning, all content).
  bool thinking_enabled = true;
  int64_t choices() const { return static_cast<int64_t>(prompts.size()) * n; }
};

// Parses and checks a request body. Errors name the field (InvalidArgument "messages[2].content: ...";
// NotFound for another model's name). A request with a structured-output constraint blocks while its grammar
// compiles (MayHaveConstraint tells them apart beforehand).
absl::StatusOr<ApiRequest> ParseApiRequest(Route route, std::string_view body, const ApiContext& context);
// The same, from the body already parsed (ParseJsonObject).
absl::StatusOr<ApiRequest> ReadApiRequest(Route route, const Json& request, const ApiContext& context);

// The body as JSON, refusing (InvalidArgument naming `what`) text that is not JSON, not an object, or
// nested deeper than `max_depth`.
absl::StatusOr<Json> ParseJsonObject(std::string_view body, int64_t max_depth, absl::string_view what = "request body");

// "stop", "length", "tool_calls" or "abort" (cancelled or cut).
const char* FinishReasonText(runtime::FinishReason reason);

// The token as a logprobs entry shows it: its text alone (tokenizer.decode([id])).
std::string TokenText(const tokenizer::Tokenizer* tokenizer, int32_t id);

}  // namespace strata::server::openai
