// libFuzzer harness: chat templates (chat_template/). The input is
//   TEMPLATE \0 CONTEXT_JSON
// (the first NUL splits the two; without one the whole input is the template and the context is {}).
// A template that parses is rendered with the context (an object: messages, tools, ... as render()
// receives them) under small limits, and, when the context has a "messages" list, through
// ApplyChatTemplate as well (with continue_final_message when the context asks for it). Checked
// promises: every failure is an InvalidArgument with a message, and no rendering exceeds the output cap
// (chat_template.h).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/json.h"
#include "chat_template/chat_template.h"
#include "nlohmann/json.hpp"

namespace {

using strata::chat_template::RenderLimits;

// Small enough that libFuzzer runs thousands of inputs a second under ASan; large enough for every
// real template's conversations.
RenderLimits Limits() {
  RenderLimits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = 1 << 20;
  limits.max_range = 10'000;
  limits.max_built_bytes = 256u << 20;
  return limits;
}

void Check(const absl::StatusOr<std::string>& out, const RenderLimits& limits) {
  if (out.ok()) {
    if (out->size() > limits.max_output_bytes) std::abort();
  } else if (!absl::IsInvalidArgument(out.status()) || out.status().message().empty()) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string_view source = input.substr(0, split);
  const std::string_view context_text =
      split == std::string_view::npos ? std::string_view("{}") : input.substr(split + 1);

  absl::StatusOr<strata::chat_template::Template> tmpl = strata::chat_template::ParseTemplate(source, "fuzz.jinja");
  if (!tmpl.ok()) {
    if (!absl::IsInvalidArgument(tmpl.status())) std::abort();
    return 0;
  }
  if (!strata::base::CheckJsonDepth(context_text, strata::base::kMaxJsonDepth, "context").ok()) return 0;
  nlohmann::ordered_json context = nlohmann::ordered_json::parse(context_text, nullptr, /*allow_exceptions=*/false);
  if (context.is_discarded() || !context.is_object()) context = nlohmann::ordered_json::object();

  const RenderLimits limits = Limits();
  Check(tmpl->Render(context, limits), limits);

  auto messages = context.find("messages");
  if (messages == context.end() || !messages->is_array()) return 0;
  strata::chat_template::ChatRequest request;
  request.messages = *messages;
  for (const auto& [key, value] : context.items()) {
    if (key == "messages") continue;
    if (key == "tools") {
      request.tools = value;
    } else if (key == "documents") {
      request.documents = value;
    } else if (key == "add_generation_prompt") {
      request.add_generation_prompt = value.is_boolean() && value.get<bool>();
    } else if (key == "continue_final_message") {
      request.continue_final_message = value.is_string() ? value.get<std::string>() : value == true ? "content" : "";
    } else {
      request.extra[key] = value;
    }
  }
  const nlohmann::ordered_json special = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  Check(strata::chat_template::ApplyChatTemplate(*tmpl, request, special, limits), limits);
  return 0;
}
