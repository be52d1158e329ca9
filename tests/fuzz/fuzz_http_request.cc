// libFuzzer harness: an HTTP API request body (server/openai_protocol.h's ParseApiRequest) as a client
// sends it to /v1/completions or /v1/chat/completions (the input's first byte picks the route), checked
// against the small tokenizer and ChatML template of fuzz_fixtures.h. Links openai_protocol.cc,
// chat_prompt.cc and generate_validation.cc with the proto, tokenizer and chat template libraries: no torch,
// no HTTP server. Whatever the body, the parse ends (no hang, bounded memory) and an accepted request keeps
// what the rest of the server assumes (CheckAccepted, and the choices within the limit).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/openai_protocol.h"
#include "tests/fuzz/fuzz_fixtures.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const strata::server::openai::ApiContext context = [] {
    strata::server::openai::ApiContext c;
    c.model_name = "fuzz";
    c.limits = strata::fuzz::SmallLimits();
    c.tokenizer = &strata::fuzz::SmallTokenizer();
    c.chat_template = &strata::fuzz::SmallChatTemplate();
    c.parse_tool_calls = true;
    return c;
  }();
  const auto route = (data[0] & 1) != 0 ? strata::server::openai::Route::kChatCompletions
                                        : strata::server::openai::Route::kCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::StatusOr<strata::server::openai::ApiRequest> request =
      strata::server::openai::ParseApiRequest(route, body, context);
  if (!request.ok()) {
    // Every refusal is an error a client can be shown: never OK-with-nothing, never an internal error.
    const absl::StatusCode code = request.status().code();
    if (code != absl::StatusCode::kInvalidArgument && code != absl::StatusCode::kNotFound) std::abort();
    return 0;
  }
  if (request->prompts.empty() || request->n < 1 || request->choices() > context.api.max_choices) std::abort();
  if (request->prompt_texts.size() != request->prompts.size()) std::abort();
  for (const strata::runtime::GenerationRequest& prompt : request->prompts) {
    strata::fuzz::CheckAccepted(prompt, context.limits);
  }
  return 0;
}
