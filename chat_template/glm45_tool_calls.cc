// vLLM's Glm4MoeModelToolParser (`--tool-call-parser glm45`): GLM-4.5/4.6 write each call as
//   <tool_call>NAME
//   <arg_key>KEY</arg_key>
//   <arg_value>VALUE</arg_value>
//   ...</tool_call>
// and the arguments are typed by the request's tool schemas: a parameter whose schema says "string" keeps
// its text as written, any other is json.loads'd, else ast.literal_eval'd, else kept as text (stripped).

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "chat_template/py_json.h"
#include "chat_template/py_literal.h"
#include "chat_template/stream_text.h"
#include "chat_template/tool_call_formats.h"

namespace strata::chat_template {
namespace {

constexpr std::string_view kCallStart = "<tool_call>";
constexpr std::string_view kCallEnd = "</tool_call>";
constexpr std::string_view kKeyStart = "<arg_key>";
constexpr std::string_view kKeyEnd = "</arg_key>";
constexpr std::string_view kValueStart = "<arg_value>";
constexpr std::string_view kValueEnd = "</arg_value>";

// The `regex` module's `\s*` from `pos`: the position after it.
size_t SkipSpaces(std::string_view s, size_t pos) {
  while (pos < s.size()) {
    const int n = ValidSequenceAt(s, pos);
    if (n == 0 || !IsRegexSpace(CodePointAt(s, pos, n))) break;
    pos += n;
  }
  return pos;
}

struct ArgPair {
  std::string_view key;
  std::string_view value;
};

// findall of `<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>` (DOTALL): from each `<arg_key>`, the key
// runs to the first `</arg_key>` that is followed by spaces, `<arg_value>` and, later, an `</arg_value>`
// (the lazy group grows past any other), the value to that first `</arg_value>`. Linear: the `</arg_key>`s
// are looked at in order, once each.
std::vector<ArgPair> ArgPairs(std::string_view s) {
  std::vector<ArgPair> pairs;
  constexpr size_t npos = std::string_view::npos;
  size_t close_from = 0;  // every `</arg_key>` before here was looked at (the good one, if any, is good_close)
  size_t good_close = npos, good_value = npos, good_value_end = npos;
  size_t value_end_from = npos, value_end_at = npos;  // the first `</arg_value>` at or after value_end_from
  // The first `</arg_key>` at or after `from` that completes a match.
  auto next_good = [&](size_t from) -> bool {
    if (good_close != npos && good_close >= from) return true;
    for (size_t p = std::max(from, close_from);;) {
      const size_t close = s.find(kKeyEnd, p);
      if (close == npos) {
        close_from = s.size();
        good_close = npos;
        return false;
      }
      const size_t value = SkipSpaces(s, close + kKeyEnd.size());
      if (s.substr(value, kValueStart.size()) == kValueStart) {
        const size_t body = value + kValueStart.size();
        if (value_end_from == npos || body < value_end_from || (value_end_at != npos && value_end_at < body)) {
          value_end_from = body;
          value_end_at = s.find(kValueEnd, body);
        }
        if (value_end_at == npos) {
          close_from = s.size();  // no `</arg_value>` after here: no later close can complete a match
          good_close = npos;
          return false;
        }
        good_close = close;
        good_value = body;
        good_value_end = value_end_at;
        close_from = close + 1;
        return true;
      }
      p = close + 1;
      close_from = p;
    }
  };
  for (size_t start = s.find(kKeyStart); start != npos; start = s.find(kKeyStart, start)) {
    const size_t key = start + kKeyStart.size();
    if (!next_good(key)) break;
    pairs.push_back({s.substr(key, good_close - key), s.substr(good_value, good_value_end - good_value)});
    start = good_value_end + kValueEnd.size();
    good_close = npos;
  }
  return pairs;
}

enum class Typed { kString, kOther, kError };

// Glm4MoeModelToolParser._is_string_type: the first tool of that name; its parameters' "properties" (a dict,
// else .get raises AttributeError), the argument's schema there (a dict, likewise), whose "type" is "string".
Typed ArgumentType(std::string_view tool_name, std::string_view arg, const nlohmann::ordered_json& tools) {
  bool found = false;
  const nlohmann::ordered_json* parameters = ToolParameters(tools, tool_name, found);
  if (parameters == nullptr || !parameters->is_object()) return Typed::kOther;
  const auto properties = parameters->find("properties");
  if (properties == parameters->end()) return Typed::kOther;
  if (!properties->is_object()) return Typed::kError;
  const auto schema = properties->find(std::string(arg));
  if (schema == properties->end()) return Typed::kOther;
  if (!schema->is_object()) return Typed::kError;
  const auto type = schema->find("type");
  return type != schema->end() && type->is_string() && type->get_ref<const std::string&>() == "string" ? Typed::kString
                                                                                                       : Typed::kOther;
}

// An argument's value as json.dumps will write it; nullopt: a value it refuses (the call's json.dumps fails,
// unless a later argument of the same name replaces this one).
using Dumped = std::optional<std::string>;

// Glm4MoeModelToolParser._deserialize, dumped: json.loads, else ast.literal_eval, else the text. false where
// it raises past its excepts (json's ValueError for a too-long integer, literal_eval's TypeError): the whole
// parse fails then.
bool Deserialize(std::string_view value, Dumped& out) {
  out.emplace();
  PyJson json;
  switch (PyJsonLoads(value, json)) {
    case JsonLoad::kOk:
      DumpPyJson(json, *out);
      return true;
    case JsonLoad::kValueError:
      return false;
    case JsonLoad::kDecodeError:
      break;
  }
  LiteralDump literal = LiteralEvalDumps(value);
  switch (literal.outcome) {
    case LiteralOutcome::kValue:
      out = std::move(literal.json);
      return true;
    case LiteralOutcome::kUnwritable:
      out.reset();
      return true;
    case LiteralOutcome::kError:
      return false;
    case LiteralOutcome::kNotLiteral:
      break;
  }
  DumpPyString(value, *out);
  return true;
}

}  // namespace

// Glm4MoeModelToolParser.extract_tool_calls: every `<tool_call>.*?</tool_call>` block (findall, DOTALL) with
// a line end is a call (one without is skipped): its name the first line stripped, its arguments every
// key/value pair after it (a repeated key keeps its first place and its last value), json.dumps'd with
// ensure_ascii=False. Anything raising inside makes the whole output content. Content with calls: the text
// before the first `<tool_call>`, None when empty or all whitespace.
bool ParseGlm45(std::string_view text, const nlohmann::ordered_json& tools, std::vector<ToolCall>& calls,
                size_t& content_end) {
  constexpr size_t npos = std::string_view::npos;
  for (size_t pos = text.find(kCallStart); pos != npos; pos = text.find(kCallStart, pos)) {
    const size_t end = text.find(kCallEnd, pos + kCallStart.size());
    if (end == npos) break;
    const std::string_view inner = text.substr(pos + kCallStart.size(), end - pos - kCallStart.size());
    pos = end + kCallEnd.size();
    const size_t line_end = inner.find('\n');
    if (line_end == npos) continue;  // func_detail_regex finds no match: vLLM skips the block
    const std::string name(StripPySpace(inner.substr(0, line_end)));
    std::vector<std::pair<std::string, Dumped>> arguments;  // in the dict's order
    absl::flat_hash_map<std::string, size_t> index;
    for (const ArgPair& pair : ArgPairs(inner.substr(line_end + 1))) {
      std::string key(StripPySpace(pair.key));
      Dumped dumped;
      switch (ArgumentType(name, key, tools)) {
        case Typed::kError:
          return false;
        case Typed::kString:
          dumped.emplace();
          DumpPyString(pair.value, *dumped);
          break;
        case Typed::kOther:
          if (!Deserialize(StripPySpace(pair.value), dumped)) return false;
          break;
      }
      if (auto [it, inserted] = index.emplace(key, arguments.size()); !inserted) {
        arguments[it->second].second = std::move(dumped);
      } else {
        arguments.emplace_back(std::move(key), std::move(dumped));
      }
    }
    ToolCall call;
    call.name = ValidUtf8(name);
    call.arguments.assign(1, '{');
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (!arguments[i].second) return false;  // json.dumps raises
      if (i > 0) call.arguments += ", ";
      DumpPyString(arguments[i].first, call.arguments);
      call.arguments += ": ";
      call.arguments += *arguments[i].second;
    }
    call.arguments += "}";
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return false;
  content_end = text.find(kCallStart);
  if (StripPySpace(text.substr(0, content_end)).empty()) content_end = 0;
  return true;
}

}  // namespace strata::chat_template
