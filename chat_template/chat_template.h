#pragma once
// Hugging Face chat templates rendered as transformers' apply_chat_template renders them: jinja2's
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with loop controls, transformers'
// {% generation %} tag, its tojson filter (json.dumps with ensure_ascii=False) and its globals
// raise_exception and strftime_now. Text in, text out: no torch, no tokenizer.
//
//   absl::StatusOr<Template> t = ParseTemplate(source, "chat_template.jinja");   // syntax errors name
//                                                                                // NAME:LINE:COLUMN
//   ChatRequest request;  request.messages = ...;  request.add_generation_prompt = true;
//   absl::StatusOr<std::string> prompt = ApplyChatTemplate(*t, request, special_tokens);
//
// Rendering is bounded (RenderLimits): a template or a conversation that would run too long, recurse
// too deep or produce too much text is an error, never a hang or an exhausted server.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata::chat_template {

struct Program;

struct RenderLimits {
  // Units of work: one per expression, statement and loop iteration, plus one per 16 bytes or items
  // a step creates. A long real conversation needs well under a tenth of this.
  int64_t max_steps = 2'000'000;
  // Nested evaluation: expressions within expressions, blocks within blocks, macro calls within macro
  // calls. The parser refuses nesting deeper than 200 in the source.
  int max_nesting = 400;
  // The rendering, and any one string or list built on the way.
  size_t max_output_bytes = 16u << 20;
  // range(): the sandbox's MAX_RANGE.
  int64_t max_range = 100'000;
  // Lists and dicts nested in each other, the input's included.
  int max_value_depth = 128;
  // Bytes of strings and lists built during one rendering, freed or not: bounds the memory a template
  // can hold. 3,000 messages through the most quadratic real template (Mistral Small 3.1: a list grown by
  // `x = x + [m]`) build ~450 MiB.
  size_t max_built_bytes = 1u << 30;
};

class Template {
 public:
  const std::string& name() const;
  const std::string& source() const;

  // Renders with `context` (an object: the variables render() receives; messages, tools, ...).
  // Errors: InvalidArgument "NAME:LINE: Kind: message" (raise_exception's message, an undefined value
  // used, a type error, a limit reached).
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context, const RenderLimits& limits = {}) const;

 private:
  friend absl::StatusOr<Template> ParseTemplate(std::string_view source, std::string_view name);
  std::shared_ptr<const Program> program_;
};

// Parses `source`; `name` (the file) prefixes every error: "chat_template.jinja:3:12: unexpected '}'".
absl::StatusOr<Template> ParseTemplate(std::string_view source, std::string_view name);

// What apply_chat_template takes besides the template.
struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role", "content", ...}]
  nlohmann::ordered_json tools;                                       // null, or a list of JSON schemas
  nlohmann::ordered_json documents;                                   // null, or a list of objects
  bool add_generation_prompt = false;
  // "" off; else the message field to continue ("content" for continue_final_message=True).
  std::string continue_final_message;
  // Further template variables (enable_thinking, date_string, ...); they override special tokens.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

// transformers' apply_chat_template(tokenize=False) of one conversation: keys whose value is null are
// dropped from each message, reasoning_content/thinking/reasoning are aliased, the final message is
// continued (its text must survive the template), and the template sees messages, tools, documents,
// add_generation_prompt, the special tokens (an object such as {"bos_token": "<s>"}) and `extra`.
absl::StatusOr<std::string> ApplyChatTemplate(const Template& tmpl, const ChatRequest& request,
                                              const nlohmann::ordered_json& special_tokens,
                                              const RenderLimits& limits = {});

}  // namespace strata::chat_template
