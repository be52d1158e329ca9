#include "server/chat_prompt.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/json.h"

namespace strata::server {
namespace json_fields {

absl::Status Invalid(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

const char* TypeName(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

// A field of `object` read as one type: absent or null is nullopt, another type an error naming it.
const Json* Field(const Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<bool>> Bool(const Json& object, const char* key, absl::string_view field) {
  const Json* value = Field(object, key);
  if (value == nullptr) return std::nullopt;
  const absl::string_view name = field.empty() ? absl::string_view(key) : field;
  if (!value->is_boolean()) return Invalid(name, absl::StrCat("must be a boolean, not ", TypeName(*value)));
  return value->get<bool>();
}

absl::StatusOr<std::optional<double>> Number(const Json& object, const char* key, absl::string_view field) {
  const Json* value = Field(object, key);
  if (value == nullptr) return std::nullopt;
  const absl::string_view name = field.empty() ? absl::string_view(key) : field;
  if (!value->is_number()) return Invalid(name, absl::StrCat("must be a number, not ", TypeName(*value)));
  return value->get<double>();
}

// An integer; a float with an integral value (1.0) is taken as pydantic's lax mode takes it.
absl::StatusOr<int64_t> IntegerValue(const Json& value, absl::string_view field) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Invalid(field, "is out of range");
    }
    return value.get<int64_t>();
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
  }
  return Invalid(field, absl::StrCat("must be an integer, not ", value.is_number() ? "a fraction" : TypeName(value)));
}

absl::StatusOr<std::optional<int64_t>> Integer(const Json& object, const char* key, absl::string_view field) {
  const Json* value = Field(object, key);
  if (value == nullptr) return std::nullopt;
  absl::StatusOr<int64_t> integer = IntegerValue(*value, field.empty() ? absl::string_view(key) : field);
  if (!integer.ok()) return integer.status();
  return *integer;
}

absl::StatusOr<std::optional<std::string>> String(const Json& object, const char* key, absl::string_view field) {
  const Json* value = Field(object, key);
  if (value == nullptr) return std::nullopt;
  const absl::string_view name = field.empty() ? absl::string_view(key) : field;
  if (!value->is_string()) return Invalid(name, absl::StrCat("must be a string, not ", TypeName(*value)));
  return value->get<std::string>();
}

}  // namespace json_fields

namespace {

using json_fields::Bool;
using json_fields::Field;
using json_fields::Invalid;
using json_fields::String;
using json_fields::TypeName;
using Json = nlohmann::ordered_json;

#define STRATA_ASSIGN_OR_RETURN(lhs, expr)      \
  auto lhs##_or = (expr);                       \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *std::move(lhs##_or)

// One chat message's "content": a string, or a list of text parts (joined by "\n", as vLLM joins them).
absl::StatusOr<Json> MessageContent(const Json& content, absl::string_view field) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) {
    return Invalid(field, absl::StrCat("must be a string or a list of text parts, not ", TypeName(content)));
  }
  std::vector<std::string> texts;
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string part_field = absl::StrCat(field, "[", j, "]");
    if (!part.is_object()) return Invalid(part_field, "must be an object {\"type\": \"text\", \"text\": ...}");
    STRATA_ASSIGN_OR_RETURN(type, String(part, "type", absl::StrCat(part_field, ".type")));
    if (type != "text") {
      return Invalid(absl::StrCat(part_field, ".type"),
                     absl::StrCat("'", type.value_or("null"), "' is not supported: strata serves text (type 'text')"));
    }
    STRATA_ASSIGN_OR_RETURN(text, String(part, "text", absl::StrCat(part_field, ".text")));
    if (!text) return Invalid(absl::StrCat(part_field, ".text"), "missing");
    texts.push_back(*std::move(text));
  }
  return Json(absl::StrJoin(texts, "\n"));
}

// The messages as the template receives them: each an object with a string role; content flattened;
// tool calls' arguments parsed from their JSON text (as vLLM does, templates iterate them as objects).
absl::StatusOr<Json> ReadMessages(const Json& request, int64_t max_messages) {
  const Json* messages = Field(request, "messages");
  if (messages == nullptr) return Invalid("messages", "missing: give a list of {\"role\", \"content\"} messages");
  if (!messages->is_array()) return Invalid("messages", absl::StrCat("must be a list, not ", TypeName(*messages)));
  if (messages->empty()) return Invalid("messages", "is an empty list");
  if (static_cast<int64_t>(messages->size()) > max_messages) {
    return Invalid("messages", absl::StrCat(messages->size(), " messages, more than the limit of ", max_messages));
  }
  Json out = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string field = absl::StrCat("messages[", i, "]");
    Json message = (*messages)[i];
    if (!message.is_object()) return Invalid(field, absl::StrCat("must be an object, not ", TypeName(message)));
    const Json* role = Field(message, "role");
    if (role == nullptr || !role->is_string()) return Invalid(absl::StrCat(field, ".role"), "missing: a string");
    if (auto content = message.find("content"); content != message.end()) {
      STRATA_ASSIGN_OR_RETURN(flat, MessageContent(*content, absl::StrCat(field, ".content")));
      *content = std::move(flat);
    }
    if (auto calls = message.find("tool_calls"); calls != message.end() && calls->is_array()) {
      for (size_t j = 0; j < calls->size(); ++j) {
        Json& call = (*calls)[j];
        if (!call.is_object()) continue;
        auto function = call.find("function");
        if (function == call.end() || !function->is_object()) continue;
        auto arguments = function->find("arguments");
        if (arguments == function->end() || !arguments->is_string()) continue;
        // Text that is not JSON stays text (the template prints it); JSON too deep to copy is refused.
        const std::string what = absl::StrCat(field, ".tool_calls[", j, "].function.arguments");
        const std::string& text = arguments->get_ref<const std::string&>();
        if (absl::Status depth = base::CheckJsonDepth(text, kMaxEmbeddedJsonDepth, what); !depth.ok()) {
          return depth;
        }
        absl::StatusOr<Json> parsed = base::ParseOrderedJson(text, kMaxEmbeddedJsonDepth, what);
        if (parsed.ok() && parsed->is_object()) *arguments = *std::move(parsed);
      }
    }
    out.push_back(std::move(message));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> RenderChat(const Json& request, const chat_template::CheckpointChatTemplate* chat_template,
                                       int64_t max_messages) {
  if (chat_template == nullptr) {
    return Invalid("messages",
                   "the model has no chat template (chat_template.jinja or tokenizer_config.json's chat_template): "
                   "start strata-server with --chat-template FILE, or send a prompt to /v1/completions");
  }
  chat_template::ChatRequest chat;
  STRATA_ASSIGN_OR_RETURN(messages, ReadMessages(request, max_messages));
  chat.messages = std::move(messages);
  if (const Json* tools = Field(request, "tools"); tools != nullptr) {
    if (!tools->is_array()) return Invalid("tools", absl::StrCat("must be a list, not ", TypeName(*tools)));
    for (size_t i = 0; i < tools->size(); ++i) {
      if (!(*tools)[i].is_object()) return Invalid(absl::StrCat("tools[", i, "]"), "must be an object");
    }
    if (!tools->empty()) chat.tools = *tools;
  }
  if (const Json* documents = Field(request, "documents"); documents != nullptr) {
    if (!documents->is_array()) return Invalid("documents", "must be a list of objects");
    chat.documents = *documents;
  }
  STRATA_ASSIGN_OR_RETURN(add_generation_prompt, Bool(request, "add_generation_prompt"));
  STRATA_ASSIGN_OR_RETURN(continue_final_message, Bool(request, "continue_final_message"));
  chat.add_generation_prompt = add_generation_prompt.value_or(!continue_final_message.value_or(false));
  if (continue_final_message.value_or(false)) {
    if (chat.add_generation_prompt) {
      return Invalid("continue_final_message", "cannot be true with add_generation_prompt true");
    }
    chat.continue_final_message = "content";
  }
  if (const Json* kwargs = Field(request, "chat_template_kwargs"); kwargs != nullptr) {
    if (!kwargs->is_object()) return Invalid("chat_template_kwargs", "must be an object");
    chat.extra = *kwargs;
  }
  STRATA_ASSIGN_OR_RETURN(chat_template_name, String(request, "chat_template_name"));
  absl::StatusOr<const chat_template::Template*> tmpl =
      chat_template->Select(chat_template_name.value_or(""), !chat.tools.is_null());
  if (!tmpl.ok()) return Invalid("chat_template_name", tmpl.status().message());
  absl::StatusOr<std::string> rendered = chat_template::ApplyChatTemplate(**tmpl, chat, chat_template->special_tokens);
  if (!rendered.ok())
    return Invalid("messages", absl::StrCat("the chat template failed: ", rendered.status().message()));
  return rendered;
}

}  // namespace strata::server
