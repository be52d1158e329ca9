#include "server/constraint_fields.h"

#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/chat_prompt.h"
#include "server/generate_validation.h"

namespace strata::server::openai {
namespace {

using Json = nlohmann::ordered_json;
using json_fields::Bool;
using json_fields::Field;
using json_fields::Invalid;
using json_fields::String;
using json_fields::TypeName;
using structured::Constraint;
using structured::ConstraintKind;

#define STRATA_ASSIGN_OR_RETURN(lhs, expr)      \
  auto lhs##_or = (expr);                       \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  auto lhs = *std::move(lhs##_or)

// Client text (a type, a key, a tool's name) as an error quotes it: at most 64 bytes.
std::string Shown(std::string_view text) {
  return text.size() > 64 ? absl::StrCat(absl::string_view(text.data(), 64), "...") : std::string(text);
}

Constraint Make(ConstraintKind kind, std::string text, std::string field) {
  Constraint constraint;
  constraint.kind = kind;
  constraint.text = std::move(text);
  constraint.field = std::move(field);
  return constraint;
}

// A schema or a structural tag: a JSON object, or a string holding one (vLLM's fields take both).
absl::StatusOr<std::string> JsonText(const Json& value, absl::string_view field) {
  if (value.is_string()) return ConstraintJsonText(value.get_ref<const std::string&>(), field);
  return JsonObjectText(value, field);
}

absl::StatusOr<std::string> Text(const Json& value, absl::string_view field, absl::string_view what) {
  if (!value.is_string()) return Invalid(field, absl::StrCat("must be a string (", what, "), not ", TypeName(value)));
  return value.get<std::string>();
}

// One value of vLLM's structured_outputs (or its guided_* alias) as the constraint of its kind.
absl::StatusOr<Constraint> KindValue(ConstraintKind kind, const Json& value, const std::string& field) {
  switch (kind) {
    case ConstraintKind::kJsonSchema:
    case ConstraintKind::kStructuralTag: {
      STRATA_ASSIGN_OR_RETURN(text, JsonText(value, field));
      return Make(kind, std::move(text), field);
    }
    case ConstraintKind::kRegex: {
      STRATA_ASSIGN_OR_RETURN(text, Text(value, field, "a regular expression"));
      return Make(kind, std::move(text), field);
    }
    case ConstraintKind::kGrammar: {
      STRATA_ASSIGN_OR_RETURN(text, Text(value, field, "an EBNF grammar"));
      return Make(kind, std::move(text), field);
    }
    case ConstraintKind::kChoice: {
      if (!value.is_array()) return Invalid(field, absl::StrCat("must be a list of strings, not ", TypeName(value)));
      if (value.empty()) return Invalid(field, "an empty list: give at least one string");
      Constraint constraint = Make(kind, "", field);
      for (size_t i = 0; i < value.size(); ++i) {
        if (!value[i].is_string()) return Invalid(absl::StrCat(field, "[", i, "]"), "must be a string");
        constraint.choices.push_back(value[i].get<std::string>());
      }
      return constraint;
    }
    case ConstraintKind::kJsonObject:
      break;
  }
  return Make(ConstraintKind::kJsonObject, "", field);
}

// OpenAI's response_format (both routes, as vLLM takes it), with llama.cpp's {"type": "json_object", "schema"}.
absl::StatusOr<std::optional<Constraint>> ReadResponseFormat(const Json& request) {
  const Json* format = Field(request, "response_format");
  if (format == nullptr) return std::nullopt;
  if (!format->is_object()) {
    return Invalid("response_format", absl::StrCat("must be an object {\"type\": \"text\" | \"json_object\" | "
                                                   "\"json_schema\", ...}, not ",
                                                   TypeName(*format)));
  }
  STRATA_ASSIGN_OR_RETURN(type, String(*format, "type", "response_format.type"));
  if (!type) return Invalid("response_format.type", "missing: give \"text\", \"json_object\" or \"json_schema\"");
  if (*type == "text") return std::nullopt;
  if (*type == "json_object") {
    if (const Json* schema = Field(*format, "schema"); schema != nullptr) {
      STRATA_ASSIGN_OR_RETURN(text, JsonText(*schema, "response_format.schema"));
      return Make(ConstraintKind::kJsonSchema, std::move(text), "response_format.schema");
    }
    return Make(ConstraintKind::kJsonObject, "", "response_format");
  }
  if (*type != "json_schema") {
    return Invalid("response_format.type",
                   absl::StrCat("'", Shown(*type), "' is not one of \"text\", \"json_object\", \"json_schema\""));
  }
  const Json* spec = Field(*format, "json_schema");
  if (spec == nullptr) {
    return Invalid("response_format.json_schema", "missing: give {\"name\": ..., \"schema\": {...}, \"strict\": ...}");
  }
  if (!spec->is_object()) {
    return Invalid("response_format.json_schema",
                   absl::StrCat("must be an object {\"name\", \"schema\", \"strict\"}, not ", TypeName(*spec)));
  }
  STRATA_ASSIGN_OR_RETURN(name, String(*spec, "name", "response_format.json_schema.name"));
  if (!name || name->empty()) return Invalid("response_format.json_schema.name", "missing: name the schema");
  STRATA_ASSIGN_OR_RETURN(description, String(*spec, "description", "response_format.json_schema.description"));
  (void)description;  // the model is told nothing the template does not render
  STRATA_ASSIGN_OR_RETURN(strict, Bool(*spec, "strict", "response_format.json_schema.strict"));
  const Json* schema = Field(*spec, "schema");
  if (schema == nullptr) {
    return Invalid("response_format.json_schema.schema", "missing: give the JSON schema the output must follow");
  }
  STRATA_ASSIGN_OR_RETURN(text, JsonObjectText(*schema, "response_format.json_schema.schema"));
  Constraint constraint = Make(ConstraintKind::kJsonSchema, std::move(text), "response_format.json_schema.schema");
  // strata's default is strict: a keyword the engine would not enforce is refused, never dropped silently.
  constraint.strict = strict.value_or(true);
  return constraint;
}

// vLLM's structured_outputs: exactly one of its kinds, and its options.
absl::StatusOr<std::optional<Constraint>> ReadStructuredOutputs(const Json& request) {
  const Json* outputs = Field(request, "structured_outputs");
  if (outputs == nullptr) return std::nullopt;
  constexpr const char* kKinds = "json, regex, choice, grammar, structural_tag or json_object";
  if (!outputs->is_object()) {
    return Invalid("structured_outputs",
                   absl::StrCat("must be an object with one of ", kKinds, ", not ", TypeName(*outputs)));
  }
  static constexpr std::pair<std::string_view, ConstraintKind> kFields[] = {
      {"json", ConstraintKind::kJsonSchema},
      {"regex", ConstraintKind::kRegex},
      {"choice", ConstraintKind::kChoice},
      {"grammar", ConstraintKind::kGrammar},
      {"structural_tag", ConstraintKind::kStructuralTag},
      {"json_object", ConstraintKind::kJsonObject}};
  std::vector<std::pair<std::string, ConstraintKind>> given;
  bool any_whitespace = true;
  for (const auto& [key, value] : outputs->items()) {
    const std::string field = absl::StrCat("structured_outputs.", Shown(key));
    if (value.is_null()) continue;
    if (key == "json_object") {
      if (!value.is_boolean()) return Invalid(field, absl::StrCat("must be a boolean, not ", TypeName(value)));
      if (value.get<bool>()) given.emplace_back(key, ConstraintKind::kJsonObject);
      continue;
    }
    if (key == "disable_any_whitespace" || key == "disable_fallback" || key == "disable_additional_properties") {
      if (!value.is_boolean()) return Invalid(field, absl::StrCat("must be a boolean, not ", TypeName(value)));
      // strata has no other backend to fall back to: disable_fallback asks for what it does anyway.
      if (key == "disable_any_whitespace") any_whitespace = !value.get<bool>();
      if (key == "disable_additional_properties" && value.get<bool>()) {
        return Invalid(field, "is not supported: give \"additionalProperties\": false in the schema");
      }
      continue;
    }
    bool known = false;
    for (const auto& [name, kind] : kFields) {
      if (key == name) {
        given.emplace_back(key, kind);
        known = true;
      }
    }
    if (!known) {
      return Invalid(field, absl::StrCat("is not a field of structured_outputs that strata reads (", kKinds,
                                         "; disable_any_whitespace, disable_fallback)"));
    }
  }
  if (given.empty()) return Invalid("structured_outputs", absl::StrCat("empty: give one of ", kKinds));
  if (given.size() > 1) {
    return Invalid("structured_outputs",
                   absl::StrCat("give one of ", kKinds, ", not both ", given[0].first, " and ", given[1].first));
  }
  const auto& [key, kind] = given.front();
  STRATA_ASSIGN_OR_RETURN(constraint, KindValue(kind, outputs->at(key), absl::StrCat("structured_outputs.", key)));
  constraint.any_whitespace = any_whitespace;
  return constraint;
}

// A tool as tool_choice forces it: OpenAI's {"type": "function", "function": {"name", "parameters", "strict"}}.
struct ForcedTool {
  std::string name;
  Json parameters;  // a JSON schema; {"type": "object"} when the tool has none (a function without arguments)
  bool strict = true;
};

absl::StatusOr<std::vector<ForcedTool>> ReadTools(const Json& request, const char* needed_by) {
  const Json* tools = Field(request, "tools");
  if (tools == nullptr || !tools->is_array() || tools->empty()) {
    return Invalid("tool_choice", absl::StrCat(needed_by, " needs tools to call: give tools"));
  }
  std::vector<ForcedTool> out;
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& tool = (*tools)[i];
    const std::string field = absl::StrCat("tools[", i, "]");
    if (!tool.is_object()) return Invalid(field, "must be an object {\"type\": \"function\", \"function\": {...}}");
    STRATA_ASSIGN_OR_RETURN(type, String(tool, "type", absl::StrCat(field, ".type")));
    if (type && *type != "function") {
      return Invalid(absl::StrCat(field, ".type"), absl::StrCat("'", Shown(*type), "' is not \"function\""));
    }
    const Json* function = Field(tool, "function");
    if (function == nullptr || !function->is_object()) {
      return Invalid(absl::StrCat(field, ".function"), "missing: give {\"name\": ..., \"parameters\": {...}}");
    }
    STRATA_ASSIGN_OR_RETURN(name, String(*function, "name", absl::StrCat(field, ".function.name")));
    if (!name || name->empty()) return Invalid(absl::StrCat(field, ".function.name"), "missing");
    STRATA_ASSIGN_OR_RETURN(strict, Bool(*function, "strict", absl::StrCat(field, ".function.strict")));
    ForcedTool forced{*std::move(name), Json{{"type", "object"}}, strict.value_or(true)};
    if (const Json* parameters = Field(*function, "parameters"); parameters != nullptr) {
      if (!parameters->is_object()) {
        return Invalid(absl::StrCat(field, ".function.parameters"),
                       absl::StrCat("must be an object (a JSON schema), not ", TypeName(*parameters)));
      }
      forced.parameters = *parameters;
    }
    out.push_back(std::move(forced));
  }
  return out;
}

// tool_choice "required": a list of calls, each {"name": one of the tools, "parameters": that tool's parameters}
// (vLLM's schema: an array of at least one item, anyOf over the tools; at most one item with parallel_tool_calls
// false). The tools' "$defs" (and "definitions") move to the root, where their "#/$defs/..." references now point,
// as vLLM moves them.
absl::StatusOr<Constraint> RequiredCallsConstraint(const Json& request, std::vector<ForcedTool> tools) {
  STRATA_ASSIGN_OR_RETURN(parallel, Bool(request, "parallel_tool_calls"));
  Json schema = {{"type", "array"}, {"minItems", 1}};
  if (!parallel.value_or(true)) schema["maxItems"] = 1;
  Json branches = Json::array();
  Json hoisted = Json::object();
  bool strict = false;
  for (size_t i = 0; i < tools.size(); ++i) {
    ForcedTool& tool = tools[i];
    for (const char* defs : {"$defs", "definitions"}) {
      auto found = tool.parameters.find(defs);
      if (found == tool.parameters.end() || !found->is_object()) continue;
      Json& into = hoisted[defs];
      for (const auto& [name, definition] : found->items()) {
        if (into.contains(name) && into[name] != definition) {
          return Invalid(absl::StrCat("tools[", i, "].function.parameters.", defs, ".", Shown(name)),
                         "is defined differently by another tool: tool_choice \"required\" puts every tool's "
                         "definitions in one schema, so give them different names");
        }
        into[name] = definition;
      }
      tool.parameters.erase(defs);
    }
    // The combined schema is strict unless every tool said strict: false.
    strict |= tool.strict;
    branches.push_back({{"type", "object"},
                        {"properties",
                         {{"name", {{"type", "string"}, {"enum", Json::array({tool.name})}}},
                          {"parameters", std::move(tool.parameters)}}},
                        {"required", Json::array({"name", "parameters"})},
                        {"additionalProperties", false}});
  }
  schema["items"] = branches.size() == 1 ? branches[0] : Json{{"anyOf", std::move(branches)}};
  for (auto& [defs, definitions] : hoisted.items()) schema[defs] = std::move(definitions);
  Constraint constraint =
      Make(ConstraintKind::kJsonSchema, schema.dump(-1, ' ', false, Json::error_handler_t::replace), "tools");
  constraint.strict = strict;
  return constraint;
}

// tool_choice "required" or a named function: the constraint on the call(s).
absl::StatusOr<std::optional<Constraint>> ReadForcedToolCalls(const Json& request, const ToolChoice& choice) {
  if (choice.kind != ToolChoice::Kind::kRequired && choice.kind != ToolChoice::Kind::kNamed) return std::nullopt;
  const bool required = choice.kind == ToolChoice::Kind::kRequired;
  STRATA_ASSIGN_OR_RETURN(tools, ReadTools(request, required ? "\"required\"" : "a named function"));
  if (required) return RequiredCallsConstraint(request, std::move(tools));
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (tools[i].name == choice.name) {
      Constraint constraint =
          Make(ConstraintKind::kJsonSchema, tools[i].parameters.dump(-1, ' ', false, Json::error_handler_t::replace),
               absl::StrCat("tools[", i, "].function.parameters"));
      constraint.strict = tools[i].strict;
      return constraint;
    }
    if (names.size() < 8) names.push_back(absl::StrCat("'", Shown(tools[i].name), "'"));
  }
  if (tools.size() > names.size()) names.push_back("...");
  return Invalid("tool_choice.function.name",
                 absl::StrCat("'", Shown(choice.name), "' is not one of the tools (", absl::StrJoin(names, ", "), ")"));
}

// The top-level fields that each give a whole constraint, in the order a conflict names them.
constexpr std::string_view kConstraintFields[] = {
    "response_format", "structured_outputs", "guided_json", "guided_regex",
    "guided_choice",   "guided_grammar",     "json_schema", "grammar"};

}  // namespace

absl::StatusOr<ToolChoice> ReadToolChoice(const Json& request) {
  const Json* tools = Field(request, "tools");
  ToolChoice choice;
  choice.kind =
      tools != nullptr && tools->is_array() && !tools->empty() ? ToolChoice::Kind::kAuto : ToolChoice::Kind::kNone;
  const Json* given = Field(request, "tool_choice");
  if (given == nullptr) return choice;
  if (given->is_string()) {
    const std::string& name = given->get_ref<const std::string&>();
    if (name == "none") {
      choice.kind = ToolChoice::Kind::kNone;
    } else if (name == "auto") {
      choice.kind = ToolChoice::Kind::kAuto;
    } else if (name == "required") {
      choice.kind = ToolChoice::Kind::kRequired;
    } else {
      return Invalid("tool_choice", absl::StrCat("'", Shown(name),
                                                 "' is not one of \"none\", \"auto\", \"required\" or "
                                                 "{\"type\": \"function\", \"function\": {\"name\": ...}}"));
    }
    return choice;
  }
  if (!given->is_object()) {
    return Invalid("tool_choice", absl::StrCat("must be a string or {\"type\": \"function\", \"function\": {\"name\": "
                                               "...}}, not ",
                                               TypeName(*given)));
  }
  STRATA_ASSIGN_OR_RETURN(type, String(*given, "type", "tool_choice.type"));
  if (type && *type != "function") {
    return Invalid("tool_choice.type", absl::StrCat("'", Shown(*type), "' is not \"function\""));
  }
  const Json* function = Field(*given, "function");
  if (function == nullptr || !function->is_object()) {
    return Invalid("tool_choice.function", "missing: give {\"name\": the function to call}");
  }
  STRATA_ASSIGN_OR_RETURN(name, String(*function, "name", "tool_choice.function.name"));
  if (!name || name->empty()) return Invalid("tool_choice.function.name", "missing: name the function to call");
  choice.kind = ToolChoice::Kind::kNamed;
  choice.name = *std::move(name);
  return choice;
}

absl::StatusOr<ConstraintFields> ReadConstraintFields(const Json& request, const ToolChoice* tool_choice) {
  // Each field's constraint, read whole before they are counted: a field that is wrong is named first.
  struct Given {
    const char* field;
    Constraint constraint;
  };
  std::vector<Given> given;
  STRATA_ASSIGN_OR_RETURN(format, ReadResponseFormat(request));
  if (format) given.push_back({"response_format", *std::move(format)});
  STRATA_ASSIGN_OR_RETURN(outputs, ReadStructuredOutputs(request));
  if (outputs) given.push_back({"structured_outputs", *std::move(outputs)});
  // vLLM's older names of structured_outputs' kinds, and llama.cpp's json_schema.
  for (auto [field, kind] :
       {std::pair{"guided_json", ConstraintKind::kJsonSchema}, std::pair{"guided_regex", ConstraintKind::kRegex},
        std::pair{"guided_choice", ConstraintKind::kChoice}, std::pair{"guided_grammar", ConstraintKind::kGrammar},
        std::pair{"json_schema", ConstraintKind::kJsonSchema}}) {
    if (const Json* value = Field(request, field); value != nullptr) {
      STRATA_ASSIGN_OR_RETURN(constraint, KindValue(kind, *value, field));
      given.push_back({field, std::move(constraint)});
    }
  }
  // llama.cpp's GBNF grammar (xgrammar reads it as EBNF); its default, "", asks for nothing.
  if (const Json* grammar = Field(request, "grammar"); grammar != nullptr) {
    STRATA_ASSIGN_OR_RETURN(text, Text(*grammar, "grammar", "a GBNF grammar"));
    if (!text.empty()) given.push_back({"grammar", Make(ConstraintKind::kGrammar, std::move(text), "grammar")});
  }
  ConstraintFields out;
  if (tool_choice != nullptr) {
    STRATA_ASSIGN_OR_RETURN(forced, ReadForcedToolCalls(request, *tool_choice));
    if (forced) {
      given.push_back({"tool_choice", *std::move(forced)});
      out.forced_tool_calls = ForcedToolCalls{tool_choice->kind == ToolChoice::Kind::kNamed ? tool_choice->name : ""};
    }
  }
  if (given.size() > 1) {
    return Invalid(given[1].field, absl::StrCat("give one structured-output constraint: ", given[0].field, " and ",
                                                given[1].field, " both constrain the output"));
  }
  if (given.empty()) return out;
  out.kind = out.forced_tool_calls ? "tool_calls" : structured::ConstraintKindName(given[0].constraint.kind);
  out.constraint = std::move(given[0].constraint);
  return out;
}

bool MayHaveConstraint(const Json& request) {
  for (std::string_view field : kConstraintFields) {
    if (auto it = request.find(std::string(field)); it != request.end() && !it->is_null()) return true;
  }
  auto choice = request.find("tool_choice");
  if (choice == request.end() || choice->is_null()) return false;
  return !choice->is_string() || (*choice != "auto" && *choice != "none");
}

}  // namespace strata::server::openai
