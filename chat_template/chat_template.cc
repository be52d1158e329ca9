#include "chat_template/chat_template.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/builtins.h"
#include "chat_template/interpreter.h"
#include "chat_template/parser.h"
#include "chat_template/py_str.h"

namespace strata::chat_template {

using base::StrCat;
namespace {

absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Whether `j` nests deeper than `limit` (bounded recursion: it stops at the limit).
bool DeeperThan(const nlohmann::ordered_json& j, int limit) {
  if (!j.is_structured()) return false;
  if (limit <= 0) return true;
  for (const auto& item : j) {
    if (DeeperThan(item, limit - 1)) return true;
  }
  return false;
}

}  // namespace

const std::string& Template::name() const { return program_->name; }
const std::string& Template::source() const { return program_->source; }

absl::StatusOr<Template> ParseTemplate(std::string_view source, std::string_view name) {
  // Templates are Python str: valid UTF-8 only.
  const std::u32string cps = Decode(source);
  if (Encode(cps) != source) {
    return absl::InvalidArgumentError(StrCat(AV(name), ": not valid UTF-8"));
  }
  absl::StatusOr<std::unique_ptr<Program>> program = Parse(source, name);
  if (!program.ok()) return program.status();
  Template t;
  t.program_ = std::move(*program);
  return t;
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context, const RenderLimits& limits) const {
  if (!context.is_object()) return absl::InvalidArgumentError("render context: expected a JSON object");
  if (DeeperThan(context, limits.max_value_depth)) {
    return absl::InvalidArgumentError(StrCat("render context: nests deeper than ", limits.max_value_depth, " levels"));
  }
  auto globals = std::make_shared<Frame>();
  AddGlobals(*globals);
  auto vars = std::make_shared<Frame>();
  vars->parent = globals;
  for (const auto& [key, value] : context.items()) vars->vars[key] = FromJson(value);
  Interpreter interpreter(*program_, limits);
  try {
    return interpreter.Render(vars);
  } catch (const RenderError& e) {
    return absl::InvalidArgumentError(e.message);
  }
}

namespace {

using json = nlohmann::ordered_json;

// The fields apply_chat_template aliases to one another, in the order it looks for them.
constexpr std::string_view kReasoning[] = {"reasoning_content", "thinking", "reasoning"};
// What apply_chat_template appends to the continued text, to find where the final message ends.
constexpr std::string_view kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

// apply_chat_template drops the keys whose value is None, then aliases the reasoning fields: the first
// present becomes `thinking` (first) and `reasoning_content` (last) too.
absl::StatusOr<json> NormalizeMessages(const json& messages) {
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) {
      return absl::InvalidArgumentError(StrCat("messages[", i, "]: Chat messages should be dicts"));
    }
    json message = json::object();
    for (const auto& [key, value] : m.items()) {
      if (!value.is_null()) message[key] = value;
    }
    const json* reasoning = nullptr;
    for (std::string_view key : kReasoning) {
      auto it = message.find(std::string(key));
      if (it != message.end()) {
        reasoning = &*it;
        break;
      }
    }
    if (reasoning != nullptr) {
      const json r = *reasoning;
      json aliased = json::object();
      aliased["thinking"] = r;
      for (const auto& [key, value] : message.items()) aliased[key] = value;
      aliased["reasoning_content"] = r;
      message = std::move(aliased);
    }
    out.push_back(std::move(message));
  }
  return out;
}

// continue_final_message: appends the tag to the final message's `field` (its last text block, for a
// list of blocks; every aliased reasoning field holding the same text) and returns the text it continues.
absl::StatusOr<std::string> TagFinalMessage(const Template& tmpl, const std::string& field, json& messages) {
  json& last = messages.back();
  auto it = last.find(field);
  if (it == last.end() || it->is_null()) {
    return absl::InvalidArgumentError(
        StrCat("continue_final_message is set but the final message has no \"", field, "\" to continue!"));
  }
  const json final_message = *it;
  std::vector<std::string> fields = {field};
  if (std::find(std::begin(kReasoning), std::end(kReasoning), field) != std::end(kReasoning)) {
    fields.clear();
    for (std::string_view key : kReasoning) {
      auto f = last.find(std::string(key));
      if (f != last.end() && *f == final_message) fields.emplace_back(key);
    }
  }
  bool mentioned = false;
  for (const auto& f : fields) mentioned = mentioned || tmpl.source().find(f) != std::string::npos;
  if (!mentioned) {
    return absl::InvalidArgumentError(StrCat("continue_final_message is set to \"", field,
                                             "\" but this is not an accepted field in the chat_template"));
  }
  if (!final_message.is_array()) {
    if (!final_message.is_string()) {
      return absl::InvalidArgumentError("continue_final_message: the final message's content is not a string");
    }
    for (const auto& f : fields) last[f] = StrCat(last[f].get<std::string>(), kContinueTag);
    return final_message.get<std::string>();
  }
  for (auto block = it->rbegin(); block != it->rend(); ++block) {
    if (!block->is_object() || !block->contains("text")) continue;
    json& text = (*block)["text"];
    if (!text.is_string()) return absl::InvalidArgumentError("continue_final_message: the text is not a string");
    std::string final_text = text.get<std::string>();
    text = StrCat(final_text, kContinueTag);
    return final_text;
  }
  return absl::InvalidArgumentError(
      "continue_final_message is set but we could not find any text to continue in the final message!");
}

// render()'s keyword arguments: messages, tools, documents, add_generation_prompt, the special tokens,
// then the request's other variables (which may override special tokens, not the first four).
absl::StatusOr<json> RenderContext(const ChatRequest& request, json messages, const json& special_tokens) {
  json context = json::object();
  context["messages"] = std::move(messages);
  context["tools"] = request.tools;
  context["documents"] = request.documents;
  context["add_generation_prompt"] = request.add_generation_prompt;
  if (special_tokens.is_object()) {
    for (const auto& [key, value] : special_tokens.items()) context[key] = value;
  }
  for (const auto& [key, value] : request.extra.items()) {
    if (key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt") {
      return absl::InvalidArgumentError(StrCat("render() got multiple values for keyword argument '", key, "'"));
    }
    context[key] = value;
  }
  return context;
}

// continue_final_message: the rendering up to the tag (less trailing whitespace where the template
// stripped the tag's own), which must follow the final text.
absl::StatusOr<std::string> CutAtTag(const std::string& rendered, const std::string& final_text) {
  const std::string tag = PyStrip(kContinueTag);
  if (rendered.find(PyStrip(final_text)) == std::string::npos || rendered.find(tag) == std::string::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message is set but the final message does not appear in the chat after applying the chat "
        "template");
  }
  const size_t loc = rendered.rfind(tag);
  if (rendered.compare(loc, kContinueTag.size(), kContinueTag) == 0) return rendered.substr(0, loc);
  return PyStrip(std::string_view(rendered).substr(0, loc), std::nullopt, StripSide::kRight);
}

}  // namespace

absl::StatusOr<std::string> ApplyChatTemplate(const Template& tmpl, const ChatRequest& request,
                                              const nlohmann::ordered_json& special_tokens,
                                              const RenderLimits& limits) {
  if (!request.messages.is_array()) return absl::InvalidArgumentError("messages: expected a list");
  if (request.messages.empty()) {
    return absl::InvalidArgumentError(
        "messages: Cannot apply chat template to an empty conversation. Provide at least one message.");
  }
  const std::string& field = request.continue_final_message;
  if (!field.empty() && request.add_generation_prompt) {
    return absl::InvalidArgumentError("continue_final_message and add_generation_prompt are not compatible");
  }
  absl::StatusOr<json> messages = NormalizeMessages(request.messages);
  if (!messages.ok()) return messages.status();
  std::string final_text;
  if (!field.empty()) {
    absl::StatusOr<std::string> tagged = TagFinalMessage(tmpl, field, *messages);
    if (!tagged.ok()) return tagged.status();
    final_text = *std::move(tagged);
  }
  absl::StatusOr<json> context = RenderContext(request, *std::move(messages), special_tokens);
  if (!context.ok()) return context.status();
  absl::StatusOr<std::string> rendered = tmpl.Render(*context, limits);
  if (!rendered.ok() || field.empty()) return rendered;
  return CutAtTag(*rendered, final_text);
}

}  // namespace strata::chat_template
