#include "chat_template/chat_template.h"

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/interpreter.h"
#include "chat_template/parser.h"

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

// Python's str.strip() (for the continue_final_message check).
std::string PyStrip(std::string_view s) {
  std::u32string cps = Decode(s);
  size_t b = 0;
  size_t e = cps.size();
  while (b < e && IsPySpace(cps[b])) ++b;
  while (e > b && IsPySpace(cps[e - 1])) --e;
  return Encode(std::u32string_view(cps).substr(b, e - b));
}

std::string PyRStrip(std::string_view s) {
  std::u32string cps = Decode(s);
  size_t e = cps.size();
  while (e > 0 && IsPySpace(cps[e - 1])) --e;
  return Encode(std::u32string_view(cps).substr(0, e));
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

absl::StatusOr<std::string> ApplyChatTemplate(const Template& tmpl, const ChatRequest& request,
                                              const nlohmann::ordered_json& special_tokens,
                                              const RenderLimits& limits) {
  using json = nlohmann::ordered_json;
  if (!request.messages.is_array()) return absl::InvalidArgumentError("messages: expected a list");
  if (request.messages.empty()) {
    return absl::InvalidArgumentError(
        "messages: Cannot apply chat template to an empty conversation. Provide at least one message.");
  }
  const std::string& field = request.continue_final_message;
  if (!field.empty() && request.add_generation_prompt) {
    return absl::InvalidArgumentError("continue_final_message and add_generation_prompt are not compatible");
  }
  // apply_chat_template drops the keys whose value is None, then aliases the reasoning fields.
  static constexpr std::string_view kReasoning[] = {"reasoning_content", "thinking", "reasoning"};
  json messages = json::array();
  for (size_t i = 0; i < request.messages.size(); ++i) {
    const json& m = request.messages[i];
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
    messages.push_back(std::move(message));
  }
  const std::string kTag = "CONTINUE_FINAL_MESSAGE_TAG ";
  std::string final_text;
  if (!field.empty()) {
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
    if (final_message.is_array()) {
      bool found = false;
      for (auto block = it->rbegin(); block != it->rend(); ++block) {
        if (!block->is_object() || !block->contains("text")) continue;
        json& text = (*block)["text"];
        if (!text.is_string()) return absl::InvalidArgumentError("continue_final_message: the text is not a string");
        final_text = text.get<std::string>();
        text = final_text + kTag;
        found = true;
        break;
      }
      if (!found) {
        return absl::InvalidArgumentError(
            "continue_final_message is set but we could not find any text to continue in the final message!");
      }
    } else {
      if (!final_message.is_string()) {
        return absl::InvalidArgumentError("continue_final_message: the final message's content is not a string");
      }
      final_text = final_message.get<std::string>();
      for (const auto& f : fields) last[f] = last[f].get<std::string>() + kTag;
    }
  }
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
  absl::StatusOr<std::string> rendered = tmpl.Render(context, limits);
  if (!rendered.ok() || field.empty()) return rendered;
  const std::string tag = PyStrip(kTag);
  if (rendered->find(PyStrip(final_text)) == std::string::npos || rendered->find(tag) == std::string::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message is set but the final message does not appear in the chat after applying the chat "
        "template");
  }
  const size_t loc = rendered->rfind(tag);
  if (rendered->compare(loc, kTag.size(), kTag) == 0) return rendered->substr(0, loc);
  return PyRStrip(std::string_view(*rendered).substr(0, loc));
}

}  // namespace strata::chat_template
