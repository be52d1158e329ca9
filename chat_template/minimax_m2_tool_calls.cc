// vLLM's MinimaxM2ToolParser (`--tool-call-parser minimax_m2`): MiniMax-M2 writes its calls as
//   <minimax:tool_call>
//   <invoke name="NAME">
//   <parameter name="KEY">VALUE</parameter>
//   ...
//   </invoke>
//   </minimax:tool_call>
// and each value is converted by the types its schema allows (anyOf/oneOf/allOf, type lists and enums
// included): null words, then integer, number, boolean, object/array in that order of preference, else
// json.loads, else the text.

#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "chat_template/py_json.h"
#include "chat_template/py_literal.h"
#include "chat_template/py_str.h"
#include "chat_template/stream_text.h"
#include "chat_template/tool_call_formats.h"

namespace strata::chat_template {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kBlockStart = "<minimax:tool_call>";
constexpr std::string_view kBlockEnd = "</minimax:tool_call>";
constexpr std::string_view kInvokeStart = "<invoke name=";
constexpr std::string_view kInvokeEnd = "</invoke>";
constexpr std::string_view kParameterStart = "<parameter name=";
constexpr std::string_view kParameterEnd = "</parameter>";

// findall of `START(.*?)END` (DOTALL) in `s`: the texts between.
std::vector<std::string_view> Between(std::string_view s, std::string_view start, std::string_view end) {
  std::vector<std::string_view> found;
  for (size_t pos = s.find(start); pos != std::string_view::npos; pos = s.find(start, pos)) {
    const size_t body = pos + start.size();
    const size_t stop = s.find(end, body);
    if (stop == std::string_view::npos) break;
    found.push_back(s.substr(body, stop - body));
    pos = stop + end.size();
  }
  return found;
}

// MinimaxM2ToolParser._extract_name: stripped, less one pair of matching quotes around it.
std::string ExtractName(std::string_view text) {
  std::string name(StripPySpace(text));
  if (!name.empty() && ((name.front() == '"' && name.back() == '"') || (name.front() == '\'' && name.back() == '\''))) {
    return name.size() >= 2 ? name.substr(1, name.size() - 2) : std::string();
  }
  return name;
}

// _extract_types_from_schema: "type" (a string or a list of them), the kinds of a non-empty "enum"'s values,
// and the types of anyOf/oneOf/allOf's choices (a choice that is no dict counts as "string"); none: "string".
void ExtractTypes(const Json& schema, std::set<std::string>& types) {
  if (!schema.is_object()) {
    types.insert("string");
    return;
  }
  std::set<std::string> found;
  if (const auto type = schema.find("type"); type != schema.end()) {
    if (type->is_string()) {
      found.insert(type->get<std::string>());
    } else if (type->is_array()) {
      for (const Json& t : *type) {
        if (t.is_string()) found.insert(t.get<std::string>());
      }
    }
  }
  if (const auto values = schema.find("enum"); values != schema.end() && values->is_array() && !values->empty()) {
    for (const Json& v : *values) {
      if (v.is_null()) {
        found.insert("null");
      } else if (v.is_boolean()) {
        found.insert("boolean");
      } else if (v.is_number_integer()) {
        found.insert("integer");
      } else if (v.is_number_float()) {
        found.insert("number");
      } else if (v.is_string()) {
        found.insert("string");
      } else if (v.is_array()) {
        found.insert("array");
      } else if (v.is_object()) {
        found.insert("object");
      }
    }
  }
  for (const char* choice : {"anyOf", "oneOf", "allOf"}) {
    if (const auto list = schema.find(choice); list != schema.end() && list->is_array()) {
      for (const Json& c : *list) ExtractTypes(c, found);
    }
  }
  if (found.empty()) found.insert("string");
  types.insert(found.begin(), found.end());
}

// _get_param_types_from_config: `name not in config` (Python's `in` on whatever "properties" was), then
// config[name] (a dict's value; a list or string index raises TypeError). false: it raised.
bool ParamTypes(std::string_view name, const Json& config, std::set<std::string>& types) {
  bool type_error = false;
  if (!PyContains(config, name, type_error)) {
    if (type_error) return false;
    types.insert("string");
    return true;
  }
  if (!config.is_object()) return false;  // "list indices must be integers or slices, not str"
  ExtractTypes(config.at(std::string(name)), types);
  return true;
}

// _convert_param_value_with_types, dumped: nullopt where it raises past its excepts (OverflowError of
// int(float('inf')), json's ValueError for a too-long integer).
std::optional<std::string> ConvertValue(std::string_view value, const std::set<std::string>& types) {
  const std::string lower = PyLower(value);
  if (lower == "null" || lower == "none" || lower == "nil") return std::string("null");
  std::set<std::string> normalized;
  for (const std::string& t : types) normalized.insert(PyLower(t));
  std::string out;
  auto loads = [&](bool& decode_error) -> bool {
    PyJson json;
    decode_error = false;
    switch (PyJsonLoads(value, json)) {
      case JsonLoad::kOk:
        DumpPyJson(json, out);
        return true;
      case JsonLoad::kDecodeError:
        decode_error = true;
        return false;
      case JsonLoad::kValueError:
        return false;
    }
    return false;
  };
  static constexpr const char* kPriority[] = {"integer", "int",   "number", "float", "boolean", "bool",
                                              "object",  "array", "string", "str",   "text"};
  for (const char* type : kPriority) {
    if (!normalized.contains(type)) continue;
    const std::string_view t = type;
    if (t == "string" || t == "str" || t == "text") {
      DumpPyString(value, out);
      return out;
    }
    if (t == "integer" || t == "int") {
      if (std::optional<std::string> n = PyIntText(value)) return *n;
      continue;
    }
    if (t == "number" || t == "float") {
      const std::optional<double> x = PyFloatText(value);
      if (!x || std::isnan(*x)) continue;       // int(nan): ValueError, caught
      if (std::isinf(*x)) return std::nullopt;  // int(inf): OverflowError, not caught
      return *x == std::trunc(*x) ? IntegralDoubleText(*x) : PythonFloatRepr(*x);
    }
    if (t == "boolean" || t == "bool") {
      const std::string_view word = StripPySpace(lower);
      if (word == "true" || word == "1" || word == "yes" || word == "on") return std::string("true");
      if (word == "false" || word == "0" || word == "no" || word == "off") return std::string("false");
      continue;
    }
    // object, array
    bool decode_error = false;
    if (loads(decode_error)) return out;
    if (!decode_error) return std::nullopt;
  }
  bool decode_error = false;
  if (loads(decode_error)) return out;
  if (!decode_error) return std::nullopt;
  DumpPyString(value, out);
  return out;
}

// _parse_single_invoke: the name up to the first `>` (none when the invoke starts with one); the parameter
// schemas of the first tool of that name (its parameters' "properties" when it has them); each
// `<parameter name=KEY>VALUE</parameter>` converted. 0: no call; -1: it raised.
int ParseInvoke(std::string_view invoke, const Json& tools, ToolCall& call) {
  if (invoke.empty() || invoke.front() == '>') return 0;
  const std::string name = ExtractName(invoke.substr(0, invoke.find('>')));
  bool found = false;
  const Json* parameters = ToolParameters(tools, name, found);
  static const Json kEmpty = Json::object();
  const Json* config = &kEmpty;
  if (parameters != nullptr && parameters->is_object()) {
    if (const auto properties = parameters->find("properties"); properties != parameters->end()) {
      config = &*properties;
    }
  }
  std::vector<std::pair<std::string, std::string>> arguments;  // key, dumped value
  absl::flat_hash_map<std::string, size_t> index;
  for (std::string_view parameter : Between(invoke, kParameterStart, kParameterEnd)) {
    const size_t gt = parameter.find('>');
    if (parameter.empty() || gt == 0 || gt == std::string_view::npos) continue;  // ^([^>]+)>(.*) fails
    std::string key = ExtractName(parameter.substr(0, gt));
    std::string value(StripPySpace(parameter.substr(gt + 1)));
    std::set<std::string> types;
    if (!ParamTypes(key, *config, types)) return -1;
    std::optional<std::string> dumped = ConvertValue(value, types);
    if (!dumped) return -1;
    if (auto [it, inserted] = index.emplace(key, arguments.size()); !inserted) {
      arguments[it->second].second = *std::move(dumped);
    } else {
      arguments.emplace_back(std::move(key), *std::move(dumped));
    }
  }
  call.name = ValidUtf8(name);
  call.arguments.assign(1, '{');
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (i > 0) call.arguments += ", ";
    DumpPyString(arguments[i].first, call.arguments);
    call.arguments += ": ";
    call.arguments += arguments[i].second;
  }
  call.arguments += "}";
  return 1;
}

}  // namespace

// MinimaxM2ToolParser.extract_tool_calls: without `<minimax:tool_call>`, all content; else each
// `<invoke name=...</invoke>` inside each `<minimax:tool_call>...</minimax:tool_call>` block (findall, DOTALL)
// is a call. No call, or anything raising: all content. Content with calls: the text before the first
// `<minimax:tool_call>` (None when empty).
bool ParseMinimaxM2(std::string_view text, const nlohmann::ordered_json& tools, std::vector<ToolCall>& calls,
                    size_t& content_end) {
  content_end = text.find(kBlockStart);
  if (content_end == std::string_view::npos) return false;
  for (std::string_view block : Between(text, kBlockStart, kBlockEnd)) {
    for (std::string_view invoke : Between(block, kInvokeStart, kInvokeEnd)) {
      ToolCall call;
      const int parsed = ParseInvoke(invoke, tools, call);
      if (parsed < 0) return false;
      if (parsed > 0) calls.push_back(std::move(call));
    }
  }
  return !calls.empty();
}

}  // namespace strata::chat_template
