#include "chat_template/tool_calls.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "chat_template/py_json.h"
#include "chat_template/stream_text.h"
#include "chat_template/tool_call_formats.h"
#include "chat_template/value.h"

namespace strata::chat_template {
namespace {

constexpr std::string_view kHermesStart = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

// A call from a parsed object, as vLLM builds it: "name" must be a string (pydantic refuses any other
// value), the arguments (`arguments_key`, else `fallback_key` when given) must be present.
bool CallFromObject(const PyJson& object, std::string_view arguments_key, std::string_view fallback_key,
                    ToolCall& call) {
  if (object.kind != PyJson::Kind::kObject) return false;
  const PyJson* name = object.Find("name");
  if (name == nullptr || name->kind != PyJson::Kind::kString) return false;
  const PyJson* arguments = object.Find(arguments_key);
  if (arguments == nullptr && !fallback_key.empty()) arguments = object.Find(fallback_key);
  if (arguments == nullptr) return false;
  call.name = ValidUtf8(name->text);
  call.arguments.clear();
  DumpPyJson(*arguments, call.arguments);
  return true;
}

// vLLM's Hermes2ProToolParser.extract_tool_calls: the regex <tool_call>(.*?)</tool_call>|<tool_call>(.*)
// (an unclosed last block runs to the end); every block must be a JSON object with "name" and
// "arguments", or the whole output is content. Content: the text before the first <tool_call>.
bool ParseHermes(std::string_view text, std::vector<ToolCall>& calls, size_t& content_end) {
  size_t pos = text.find(kHermesStart);
  if (pos == std::string_view::npos) return false;
  content_end = pos;
  while (pos != std::string_view::npos) {
    const size_t body = pos + kHermesStart.size();
    const size_t end = text.find(kHermesEnd, body);
    const std::string_view json_text =
        end == std::string_view::npos ? text.substr(body) : text.substr(body, end - body);
    PyJson object;
    ToolCall call;
    if (PyJsonLoads(json_text, object) != JsonLoad::kOk || !CallFromObject(object, "arguments", "", call)) return false;
    calls.push_back(std::move(call));
    if (end == std::string_view::npos) break;
    pos = text.find(kHermesStart, end + kHermesEnd.size());
  }
  return true;
}

// vLLM's Llama3JsonToolParser.extract_tool_calls: raw_decode at every `{` that is past the end of the
// last object decoded (a `{` right at that end is skipped too, as vLLM's `start <= end_index` does);
// each must be an object with "name" and "arguments" (else "parameters"), or the whole output is
// content. Text around the objects (`; `, prose) is ignored. Content: the text before the first `{`,
// less a `<|python_tag|>` right before it (vLLM: none).
bool ParseLlama3Json(std::string_view text, std::vector<ToolCall>& calls, size_t& content_end) {
  size_t pos = text.find('{');
  if (pos == std::string_view::npos) return false;
  content_end = pos;
  if (text.substr(0, pos).ends_with(kPythonTag)) content_end -= kPythonTag.size();
  while (pos != std::string_view::npos) {
    PyJson object;
    size_t end;
    ToolCall call;
    if (!PyJsonRawDecode(text, pos, object, end) || !CallFromObject(object, "arguments", "parameters", call)) {
      return false;
    }
    calls.push_back(std::move(call));
    pos = end < text.size() ? text.find('{', end + 1) : std::string_view::npos;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------------
// deepseek_v3 and kimi_k2: a section marker, then calls matched by vLLM's regex, anywhere in the output.

constexpr std::string_view kDeepSeekCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDeepSeekCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDeepSeekSep = "<｜tool▁sep｜>";
constexpr std::string_view kDeepSeekJsonOpen = "\n```json\n";
constexpr std::string_view kDeepSeekJsonClose = "\n```<｜tool▁call▁end｜>";
constexpr std::string_view kKimiSectionBegin = "<|tool_calls_section_begin|>";
constexpr std::string_view kKimiCallBegin = "<|tool_call_begin|>";
constexpr std::string_view kKimiArgumentBegin = "<|tool_call_argument_begin|>";
constexpr std::string_view kKimiCallEnd = "<|tool_call_end|>";

constexpr std::string_view kMinimaxStart = "<minimax:tool_call>";

// The marker from which hermes, glm45 and minimax_m2 hold the output (llama3_json: `{`, apart).
std::string_view CallMarker(ToolCallFormat format) {
  return format == ToolCallFormat::kMinimaxM2 ? kMinimaxStart : kHermesStart;
}

// The offset of the first character that is not Python whitespace (str.isspace), or npos: none yet (an
// unfinished UTF-8 sequence at the end is not known yet either).
size_t FirstNonSpace(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = ValidSequenceAt(s, i);
    if (n == 0) return IncompleteUtf8Tail(s.substr(i)) == s.size() - i ? std::string_view::npos : i;
    if (!IsPySpace(CodePointAt(s, i, n))) return i;
    i += n;
  }
  return std::string_view::npos;
}

bool Sectioned(ToolCallFormat format) {
  return format == ToolCallFormat::kDeepSeekV3 || format == ToolCallFormat::kKimiK2;
}
std::string_view SectionBegin(ToolCallFormat format) {
  return format == ToolCallFormat::kDeepSeekV3 ? kDeepSeekCallsBegin : kKimiSectionBegin;
}
std::string_view CallBegin(ToolCallFormat format) {
  return format == ToolCallFormat::kDeepSeekV3 ? kDeepSeekCallBegin : kKimiCallBegin;
}

// vLLM's DeepSeekV3ToolParser.extract_tool_calls: no `<｜tool▁calls▁begin｜>`, no calls; else the calls are
// every match of (findall, left to right, over the whole output)
//   <｜tool▁call▁begin｜>(?P<type>.*)<｜tool▁sep｜>(?P<function_name>.*)\n```json\n(?P<function_arguments>.*)\n```<｜tool▁call▁end｜>
// where `.` is any character but `\n`: the type runs to the line's last separator, the name to the line's
// end, the arguments are the next line whole (so JSON written over several lines is no call). The
// arguments are taken as written. A type other than "function" fails pydantic's ToolCall (Literal
// "function"): vLLM's except makes the whole output content. Content: the text before the section
// marker, even when no call matched.
bool ParseDeepSeekV3(std::string_view text, std::vector<ToolCall>& calls, size_t& content_end) {
  content_end = text.find(kDeepSeekCallsBegin);
  if (content_end == std::string_view::npos) return false;
  constexpr size_t npos = std::string_view::npos;
  // Per line, computed once: its end, its last separator (from the first call marker on it) and where
  // the arguments line after its ```json line ends, so that many markers on one line stay linear.
  size_t line_end = npos, line_sep = npos, line_args_end = npos, line_from = npos;
  for (size_t pos = 0;;) {
    const size_t begin = text.find(kDeepSeekCallBegin, pos);
    if (begin == npos) break;
    pos = begin + 1;
    const size_t head = begin + kDeepSeekCallBegin.size();
    if (line_from == npos || head > line_end) {
      line_from = head;
      line_end = text.find('\n', head);
      if (line_end == npos) break;  // no line end: neither this marker nor a later one can match
      line_sep = text.substr(head, line_end - head).rfind(kDeepSeekSep);
      if (line_sep != npos) line_sep += head;
      line_args_end = npos;
      if (text.substr(line_end, kDeepSeekJsonOpen.size()) == kDeepSeekJsonOpen) {
        line_args_end = text.find('\n', line_end + kDeepSeekJsonOpen.size());
      }
    }
    if (line_sep == npos || line_sep < head || line_args_end == npos) continue;
    if (text.substr(line_args_end, kDeepSeekJsonClose.size()) != kDeepSeekJsonClose) continue;
    const std::string_view type = text.substr(head, line_sep - head);
    if (type != "function") return false;
    const size_t name = line_sep + kDeepSeekSep.size();
    const size_t arguments = line_end + kDeepSeekJsonOpen.size();
    ToolCall call;
    call.name = ValidUtf8(text.substr(name, line_end - name));
    call.arguments = ValidUtf8(text.substr(arguments, line_args_end - arguments));
    calls.push_back(std::move(call));
    pos = line_args_end + kDeepSeekJsonClose.size();
  }
  return true;
}

// The code point that ends right before text[end] and its first byte, or false (none, or not valid UTF-8).
bool CodePointBefore(std::string_view text, size_t end, size_t& start, char32_t& c) {
  for (size_t back = 1; back <= 4 && back <= end; ++back) {
    const auto byte = static_cast<unsigned char>(text[end - back]);
    if ((byte & 0xC0) == 0x80) continue;
    if (ValidSequenceAt(text, end - back) != static_cast<int>(back)) return false;
    start = end - back;
    c = CodePointAt(text, start, static_cast<int>(back));
    return true;
  }
  return false;
}

// The code point at text[i] (its length in `n`), or false for a byte that is not valid UTF-8 (n = 1).
bool CodePointFrom(std::string_view text, size_t i, char32_t& c, int& n) {
  n = ValidSequenceAt(text, i);
  if (n == 0) {
    n = 1;
    return false;
  }
  c = CodePointAt(text, i, n);
  return true;
}

// `text[from, to)` less its leading (`front`) or trailing regex `\s` characters: the new bound.
size_t SkipRegexSpace(std::string_view text, size_t from, size_t to, bool front) {
  char32_t c;
  if (front) {
    int n;
    while (from < to && CodePointFrom(text, from, c, n) && IsRegexSpace(c)) from += n;
    return from;
  }
  size_t start;
  while (to > from && CodePointBefore(text, to, start, c) && start >= from && IsRegexSpace(c)) to = start;
  return to;
}

// The call id `\s*(?P<tool_call_id>[^<]+:\d+)\s*` of vLLM's Kimi K2 regex in `w` (the text from after
// `<|tool_call_begin|>` to the next `<`), or false. The suffix must be `:`, digits, spaces; the greedy
// `\s*` in front gives back one space when the id would otherwise be empty before its `:`.
bool KimiCallId(std::string_view w, std::string_view& id) {
  const size_t end = SkipRegexSpace(w, 0, w.size(), false);
  size_t digits = end, start;
  char32_t c;
  while (CodePointBefore(w, digits, start, c) && IsDecimalDigit(c)) digits = start;
  if (digits == end || digits == 0 || w[digits - 1] != ':') return false;
  const size_t colon = digits - 1;
  size_t from = SkipRegexSpace(w, 0, colon, true);
  if (from == colon) {
    if (colon == 0 || !CodePointBefore(w, colon, start, c)) return false;
    from = start;  // the last leading space is the id's one `[^<]` character
  }
  id = w.substr(from, end - from);
  return true;
}

// vLLM's KimiK2ToolParser.extract_tool_calls: no `<|tool_calls_section_begin|>`, no calls; else every
// match (findall over the whole output) of
//   <\|tool_call_begin\|>\s*(?P<tool_call_id>[^<]+:\d+)\s*<\|tool_call_argument_begin\|>\s*
//   (?P<function_arguments>(?:(?!<\|tool_call_begin\|>).)*?)\s*<\|tool_call_end\|>     (DOTALL)
// is a call: its id as the model wrote it, its name the id's text before the first `:`, after the last
// `.` (`functions.get_weather:0` is get_weather), its arguments as written up to the first
// `<|tool_call_end|>` (less spaces around), unless a `<|tool_call_begin|>` comes first. Content: the
// text before the section marker, even when no call matched. Nothing in it can fail vLLM's try.
bool ParseKimiK2(std::string_view text, std::vector<ToolCall>& calls, size_t& content_end) {
  content_end = text.find(kKimiSectionBegin);
  if (content_end == std::string_view::npos) return false;
  constexpr size_t npos = std::string_view::npos;
  size_t end_from = npos, end_at = npos;  // the first `<|tool_call_end|>` at or after end_from
  for (size_t pos = 0;;) {
    const size_t begin = text.find(kKimiCallBegin, pos);
    if (begin == npos) break;
    pos = begin + 1;
    const size_t head = begin + kKimiCallBegin.size();
    const size_t angle = text.find('<', head);
    if (angle == npos) break;
    if (text.substr(angle, kKimiArgumentBegin.size()) != kKimiArgumentBegin) continue;
    std::string_view id;
    if (!KimiCallId(text.substr(head, angle - head), id)) continue;
    const size_t arguments = SkipRegexSpace(text, angle + kKimiArgumentBegin.size(), text.size(), true);
    if (end_from == npos || arguments < end_from || (end_at != npos && end_at < arguments)) {
      end_from = arguments;
      end_at = text.find(kKimiCallEnd, arguments);
    }
    if (end_at == npos) break;  // no end after this call: none after a later one either
    const size_t next_begin = text.find(kKimiCallBegin, arguments);
    if (next_begin < end_at) continue;
    const size_t arguments_end = SkipRegexSpace(text, arguments, end_at, false);
    ToolCall call;
    call.id = ValidUtf8(id);
    const std::string_view before_colon = id.substr(0, id.find(':'));
    const size_t dot = before_colon.rfind('.');
    call.name = ValidUtf8(dot == npos ? before_colon : before_colon.substr(dot + 1));
    call.arguments = ValidUtf8(text.substr(arguments, arguments_end - arguments));
    calls.push_back(std::move(call));
    pos = end_at + kKimiCallEnd.size();
  }
  return true;
}

}  // namespace

absl::StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view flag) {
  if (flag == "hermes") return ToolCallFormat::kHermes;
  if (flag == "llama3_json") return ToolCallFormat::kLlama3Json;
  if (flag == "deepseek_v3") return ToolCallFormat::kDeepSeekV3;
  if (flag == "kimi_k2") return ToolCallFormat::kKimiK2;
  if (flag == "glm45") return ToolCallFormat::kGlm45;
  if (flag == "minimax_m2") return ToolCallFormat::kMinimaxM2;
  if (flag == "openai") return ToolCallFormat::kOpenAi;
  return absl::InvalidArgumentError("tool call parser: unknown \"" + std::string(flag) +
                                    "\" (valid: hermes, llama3_json, deepseek_v3, kimi_k2, glm45, minimax_m2, openai)");
}

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kDeepSeekV3:
      return "deepseek_v3";
    case ToolCallFormat::kKimiK2:
      return "kimi_k2";
    case ToolCallFormat::kGlm45:
      return "glm45";
    case ToolCallFormat::kMinimaxM2:
      return "minimax_m2";
    case ToolCallFormat::kOpenAi:
      return "openai";
  }
  return "";
}

bool ReadsWholeOutput(ToolCallFormat format) { return format == ToolCallFormat::kOpenAi; }

const nlohmann::ordered_json* ToolParameters(const nlohmann::ordered_json& tools, std::string_view name, bool& found) {
  found = false;
  if (!tools.is_array()) return nullptr;
  for (const nlohmann::ordered_json& tool : tools) {
    if (!tool.is_object()) continue;
    const auto function = tool.find("function");
    if (function == tool.end() || !function->is_object()) continue;
    const auto tool_name = function->find("name");
    if (tool_name == function->end() || !tool_name->is_string() || tool_name->get_ref<const std::string&>() != name) {
      continue;
    }
    found = true;
    const auto parameters = function->find("parameters");
    return parameters == function->end() || parameters->is_null() ? nullptr : &*parameters;
  }
  return nullptr;
}

bool PyContains(const nlohmann::ordered_json& container, std::string_view key, bool& type_error) {
  type_error = false;
  if (container.is_object()) return container.contains(std::string(key));
  if (container.is_array()) {
    for (const nlohmann::ordered_json& item : container) {
      if (item.is_string() && item.get_ref<const std::string&>() == key) return true;
    }
    return false;
  }
  if (container.is_string()) return container.get_ref<const std::string&>().find(key) != std::string::npos;
  type_error = true;  // "argument of type 'int' is not iterable", and so for None and bool
  return false;
}

namespace {

// OpenAIToolParser's arguments: with no content type or one naming json, json.dumps(json.loads(text)) (ASCII
// escapes, Python's separators), the text as written where json.loads raises JSONDecodeError; vLLM's request
// fails on its other errors (an integer of more than 4,300 digits), where strata keeps the text too.
std::string HarmonyArguments(const HarmonyMessage& m) {
  if (!m.content_type || m.content_type->empty() || m.content_type->find("json") != std::string::npos) {
    PyJson value;
    if (PyJsonLoads(m.text, value) == JsonLoad::kOk) {
      std::string out;
      DumpPyJson(value, out, /*ensure_ascii=*/true);
      return out;
    }
  }
  return ValidUtf8(m.text);
}

bool IsHarmonyCall(const HarmonyMessage& m) { return m.recipient && m.recipient->starts_with("functions."); }

// recipient.split("functions.")[1]: what follows the first "functions.", up to the next.
std::string HarmonyCallName(const HarmonyMessage& m) {
  std::string_view rest = std::string_view(*m.recipient).substr(std::string_view("functions.").size());
  return ValidUtf8(rest.substr(0, rest.find("functions.")));
}

bool HasRecipient(const HarmonyMessage& m) { return m.recipient && !m.recipient->empty(); }

// OpenAIToolParser.extract_tool_calls on the messages harmony.h reads: each message addressed to
// functions.NAME is a call; the content is the final channel's text, else the last commentary message with no
// recipient (a preamble), else None; with no final message, the text of a final (or channel-less) message the
// output ended in counts as final when it is not the first message. None of it when no message ended. One
// difference, so that the final text can stream: with several final messages, vLLM's content is the last's and
// strata's the first's (gpt-oss ends its turn after its final message).
void ParseOpenAi(std::string_view text, std::string& content, std::vector<ToolCall>& calls) {
  const HarmonyOutput harmony = ReadHarmony(text);
  content.clear();
  if (harmony.messages.empty()) return;
  std::optional<std::string> final_text, preamble;
  for (const HarmonyMessage& m : harmony.messages) {
    if (IsHarmonyCall(m)) {
      ToolCall call;
      call.name = HarmonyCallName(m);
      call.arguments = HarmonyArguments(m);
      calls.push_back(std::move(call));
    } else if (m.channel == "final") {
      if (!final_text) final_text = m.text;
    } else if (m.channel == "commentary" && !HasRecipient(m)) {
      preamble = m.text;
    }
  }
  const std::optional<HarmonyMessage>& current = harmony.current;
  if (current && !current->text.empty() && !final_text && !current->recipient &&
      (!current->channel || current->channel == "final")) {
    final_text = current->text;
  }
  if (final_text && !final_text->empty()) {
    content = *final_text;
  } else if (preamble) {
    content = *preamble;
  }
}

}  // namespace

ToolCallIds::ToolCallIds() : state_((uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()) {}

std::string ToolCallIds::Next() {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) {
    // splitmix64; 2^64 mod 62 makes the first letters 1e-17 likelier: not worth a rejection loop.
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    id.push_back(kAlphabet[z % kAlphabet.size()]);
  }
  return id;
}

ParsedToolCalls ParseToolCalls(ToolCallFormat format, std::string_view text, ToolCallIds& ids,
                               const nlohmann::ordered_json* tools) {
  ParsedToolCalls parsed;
  static const nlohmann::ordered_json kNoTools;
  const nlohmann::ordered_json& schemas = tools != nullptr ? *tools : kNoTools;
  if (format == ToolCallFormat::kOpenAi) {
    ParseOpenAi(text, parsed.content, parsed.calls);
    for (ToolCall& call : parsed.calls) call.id = ids.Next();
    return parsed;
  }
  size_t content_end = 0;
  bool ok = false;
  switch (format) {
    case ToolCallFormat::kHermes:
      ok = ParseHermes(text, parsed.calls, content_end);
      break;
    case ToolCallFormat::kLlama3Json:
      ok = ParseLlama3Json(text, parsed.calls, content_end);
      break;
    case ToolCallFormat::kDeepSeekV3:
      ok = ParseDeepSeekV3(text, parsed.calls, content_end);
      break;
    case ToolCallFormat::kKimiK2:
      ok = ParseKimiK2(text, parsed.calls, content_end);
      break;
    case ToolCallFormat::kGlm45:
      ok = ParseGlm45(text, schemas, parsed.calls, content_end);
      break;
    case ToolCallFormat::kMinimaxM2:
      ok = ParseMinimaxM2(text, schemas, parsed.calls, content_end);
      break;
    case ToolCallFormat::kOpenAi:
      break;
  }
  if (!ok) {
    parsed.calls.clear();
    parsed.content = std::string(text);
    return parsed;
  }
  parsed.content = std::string(text.substr(0, content_end));
  if (format != ToolCallFormat::kKimiK2) {
    for (ToolCall& call : parsed.calls) call.id = ids.Next();
  }
  return parsed;
}

// ---------------------------------------------------------------------------------------------------------
// Streaming

ToolCallStreamParser::ToolCallStreamParser(ToolCallFormat format, ToolCallIds ids, nlohmann::ordered_json tools)
    : format_(format), ids_(ids), tools_(std::move(tools)) {
  if (format == ToolCallFormat::kOpenAi) harmony_.emplace();
}

void ToolCallStreamParser::EmitContent(std::string_view text, std::vector<ToolCallDelta>& out) {
  if (text.empty()) return;
  if (!out.empty() && out.back().tool_index < 0) {
    out.back().content.append(text);
    return;
  }
  ToolCallDelta delta;
  delta.content = std::string(text);
  out.push_back(std::move(delta));
}

void ToolCallStreamParser::FeedContent(std::string_view text, std::vector<ToolCallDelta>& out) {
  std::string s = std::move(pending_);
  s.append(text);
  pending_.clear();
  if (mode_ == Mode::kContent && Sectioned(format_)) {
    // Content up to the section marker; from it on, kept_ holds what Finish() parses.
    const std::string_view section = SectionBegin(format_);
    if (const size_t marker = s.find(section); marker != std::string::npos) {
      EmitContent(std::string_view(s).substr(0, marker), out);
      mode_ = Mode::kHeld;
      return;
    }
    const size_t hold = std::max(IncompleteUtf8Tail(s), MarkerOverlap(s, section, section.size() - 1));
    EmitContent(std::string_view(s).substr(0, s.size() - hold), out);
    pending_ = s.substr(s.size() - hold);
    return;
  }
  if (mode_ == Mode::kContent) {
    const bool llama = format_ == ToolCallFormat::kLlama3Json;
    const size_t marker = llama ? s.find('{') : s.find(CallMarker(format_));
    // glm45: content that is all whitespace is None when there are calls: it waits for another character.
    if (format_ == ToolCallFormat::kGlm45 && !content_started_) {
      const size_t text_at = FirstNonSpace(s);
      const size_t maybe_marker = s.size() - MarkerOverlap(s, kHermesStart, kHermesStart.size() - 1);
      if (text_at == std::string::npos || (marker != std::string::npos && marker <= text_at) ||
          (marker == std::string::npos && text_at >= maybe_marker)) {
        if (marker == std::string::npos) {
          pending_ = std::move(s);
          return;
        }
        held_tag_ = s.substr(0, marker);  // sent after all when the output has no calls
        held_ = s.substr(marker);
        mode_ = Mode::kHeld;
        return;
      }
      content_started_ = true;
    }
    if (marker != std::string::npos) {
      size_t content_end = marker;
      if (llama && std::string_view(s).substr(0, marker).ends_with(kPythonTag)) {
        content_end -= kPythonTag.size();
        held_tag_ = std::string(kPythonTag);
      }
      EmitContent(std::string_view(s).substr(0, content_end), out);
      held_ = s.substr(marker);
      mode_ = Mode::kHeld;
      return;
    }
  }
  size_t hold = IncompleteUtf8Tail(s);
  if (mode_ == Mode::kContent) {
    // A partial call marker; Llama: a partial or whole <|python_tag|> (dropped before a `{`).
    const std::string_view marker = CallMarker(format_);
    const size_t overlap = format_ == ToolCallFormat::kLlama3Json ? MarkerOverlap(s, kPythonTag, kPythonTag.size())
                                                                  : MarkerOverlap(s, marker, marker.size() - 1);
    hold = std::max(hold, overlap);
  }
  EmitContent(std::string_view(s).substr(0, s.size() - hold), out);
  pending_ = s.substr(s.size() - hold);
}

void ToolCallStreamParser::Keep(std::string_view new_text) {
  kept_.append(new_text);
  if (kept_anchored_) return;
  const std::string_view section = SectionBegin(format_), call = CallBegin(format_);
  const size_t first = std::min(kept_.find(section), kept_.find(call));
  if (first != std::string::npos) {
    kept_.erase(0, first);
    kept_anchored_ = true;
    return;
  }
  // Not yet a marker: only a tail that may begin one (the section marker is the longer).
  const size_t tail = section.size() - 1;
  if (kept_.size() > tail) kept_.erase(0, kept_.size() - tail);
}

std::vector<ToolCallDelta> ToolCallStreamParser::Feed(std::string_view new_text) {
  std::vector<ToolCallDelta> out;
  if (harmony_) {
    if (mode_ == Mode::kFinished) return out;
    std::vector<HarmonyReader::Event> events;
    harmony_->Feed(new_text, events);
    HarmonyEvents(events, out);
    return out;
  }
  if (Sectioned(format_)) {
    // Nothing is decided before the end: a call may fail vLLM's try (deepseek_v3) or be cut.
    if (mode_ == Mode::kFinished) return out;
    Keep(new_text);
    if (mode_ == Mode::kContent) FeedContent(new_text, out);
    return out;
  }
  switch (mode_) {
    case Mode::kFinished:
      return out;
    case Mode::kContent:
    case Mode::kDecidedContent:
      FeedContent(new_text, out);
      if (mode_ != Mode::kHeld) return out;
      break;
    case Mode::kHeld:
      held_.append(new_text);
      break;
  }
  // Held: the first character after the marker decides early when no call can follow. Hermes: the first
  // block must be a JSON object; Llama: the first `{` must open an object with a key (`{}` has no name).
  // glm45 and minimax_m2 wait for the end (a call's first line may be anything).
  const bool decides_early = format_ == ToolCallFormat::kHermes || format_ == ToolCallFormat::kLlama3Json;
  if (decides_early && !decided_checked_) {
    const size_t after = format_ == ToolCallFormat::kHermes ? kHermesStart.size() : 1;
    const size_t first = SkipJsonSpace(held_, std::max(after, decide_from_));
    decide_from_ = first;
    if (first < held_.size()) {
      decided_checked_ = true;
      const char expected = format_ == ToolCallFormat::kHermes ? '{' : '"';
      if (held_[first] != expected) {
        mode_ = Mode::kDecidedContent;
        std::string text = std::move(held_tag_);
        text.append(held_);
        held_.clear();
        held_tag_.clear();
        FeedContent(text, out);
      }
    }
  }
  return out;
}

std::vector<ToolCallDelta> ToolCallStreamParser::Finish() {
  std::vector<ToolCallDelta> out;
  if (mode_ == Mode::kFinished) return out;
  if (harmony_) {
    std::vector<HarmonyReader::Event> events;
    harmony_->Finish(events);
    HarmonyEvents(events, out);
    // No final message's text went out: the one the output ended in, where vLLM counts it, else the last
    // preamble.
    if (!content_sent_) {
      if (harmony_part_ == HarmonyPart::kPartialOnly && !final_ended_ && !harmony_text_.empty()) {
        EmitContent(harmony_text_, out);
      } else if (preamble_) {
        EmitContent(*preamble_, out);
      }
    }
    mode_ = Mode::kFinished;
    return out;
  }
  if (mode_ != Mode::kHeld) {
    EmitContent(pending_, out);
  } else if (Sectioned(format_)) {
    // kept_ starts at the first call or section marker: its calls are the whole output's. A failure
    // makes the whole output content, of which everything before the section marker was sent.
    std::vector<ToolCall> calls;
    size_t section = 0;
    const bool ok = format_ == ToolCallFormat::kDeepSeekV3 ? ParseDeepSeekV3(kept_, calls, section)
                                                           : ParseKimiK2(kept_, calls, section);
    if (!ok) EmitContent(std::string_view(kept_).substr(kept_.find(SectionBegin(format_))), out);
    for (size_t i = 0; ok && i < calls.size(); ++i) {
      ToolCallDelta first;
      first.tool_index = static_cast<int>(i);
      first.id = format_ == ToolCallFormat::kKimiK2 ? std::move(calls[i].id) : ids_.Next();
      first.name = std::move(calls[i].name);
      out.push_back(std::move(first));
      ToolCallDelta arguments;
      arguments.tool_index = static_cast<int>(i);
      arguments.arguments = std::move(calls[i].arguments);
      out.push_back(std::move(arguments));
    }
  } else {
    // held_ starts at the first marker: its calls are the whole output's, and its content is empty
    // with calls, or all of it (with the held <|python_tag|>) without.
    ParsedToolCalls parsed = ParseToolCalls(format_, held_, ids_, &tools_);
    if (parsed.calls.empty()) {
      EmitContent(held_tag_, out);
      EmitContent(held_, out);
    }
    for (size_t i = 0; i < parsed.calls.size(); ++i) {
      ToolCallDelta first;
      first.tool_index = static_cast<int>(i);
      first.id = std::move(parsed.calls[i].id);
      first.name = std::move(parsed.calls[i].name);
      out.push_back(std::move(first));
      ToolCallDelta arguments;
      arguments.tool_index = static_cast<int>(i);
      arguments.arguments = std::move(parsed.calls[i].arguments);
      out.push_back(std::move(arguments));
    }
  }
  pending_.clear();
  held_.clear();
  held_tag_.clear();
  kept_.clear();
  mode_ = Mode::kFinished;
  return out;
}

void ToolCallStreamParser::EmitCall(ToolCall call, std::vector<ToolCallDelta>& out) {
  ToolCallDelta first;
  first.tool_index = calls_sent_;
  first.id = std::move(call.id);
  first.name = std::move(call.name);
  out.push_back(std::move(first));
  ToolCallDelta arguments;
  arguments.tool_index = calls_sent_;
  arguments.arguments = std::move(call.arguments);
  out.push_back(std::move(arguments));
  ++calls_sent_;
}

void ToolCallStreamParser::HarmonyEvents(const std::vector<HarmonyReader::Event>& events,
                                         std::vector<ToolCallDelta>& out) {
  for (const HarmonyReader::Event& event : events) {
    switch (event.kind) {
      case HarmonyReader::Event::Kind::kHeader: {
        const HarmonyMessage& h = event.header;
        harmony_header_ = h;
        harmony_text_.clear();
        const bool content_open = !final_ended_ && !content_sent_;
        if (IsHarmonyCall(h)) {
          harmony_part_ = HarmonyPart::kCall;
        } else if (h.channel == "final") {
          // Its text is the content whether it ends or not when a message ended before it and it has no
          // recipient (vLLM's partial rule); else only once it ends.
          harmony_part_ = !content_open                        ? HarmonyPart::kNone
                          : harmony_ended_ > 0 && !h.recipient ? HarmonyPart::kFinal
                                                               : HarmonyPart::kFinalHeld;
        } else if (h.channel == "commentary" && !HasRecipient(h)) {
          harmony_part_ = HarmonyPart::kPreamble;
        } else if (!h.channel && !h.recipient && harmony_ended_ > 0 && content_open) {
          harmony_part_ = HarmonyPart::kPartialOnly;
        } else {
          harmony_part_ = HarmonyPart::kNone;
        }
        break;
      }
      case HarmonyReader::Event::Kind::kText:
        if (harmony_part_ == HarmonyPart::kFinal) {
          EmitContent(event.text, out);
          content_sent_ = true;
        } else if (harmony_part_ != HarmonyPart::kNone) {
          harmony_text_ += event.text;
        }
        break;
      case HarmonyReader::Event::Kind::kEnd:
        ++harmony_ended_;
        switch (harmony_part_) {
          case HarmonyPart::kCall: {
            HarmonyMessage m = harmony_header_;
            m.text = std::move(harmony_text_);
            EmitCall({ids_.Next(), HarmonyCallName(m), HarmonyArguments(m)}, out);
            break;
          }
          case HarmonyPart::kFinal:
            final_ended_ = true;
            break;
          case HarmonyPart::kFinalHeld:
            final_ended_ = true;
            if (!harmony_text_.empty()) {
              EmitContent(harmony_text_, out);
              content_sent_ = true;
            }
            break;
          case HarmonyPart::kPreamble:
            preamble_ = harmony_text_;
            break;
          case HarmonyPart::kPartialOnly:
          case HarmonyPart::kNone:
            break;
        }
        harmony_part_ = HarmonyPart::kNone;
        harmony_text_.clear();
        break;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Forced tool calls (tool_choice "required" or a named function)

namespace {

// vLLM's TypeAdapter(list[FunctionDefinition]).validate_json of the "required" output: a list of at least one
// object with a string "name" and "parameters".
bool ParseCallList(std::string_view text, std::vector<ToolCall>& calls) {
  PyJson list;
  if (PyJsonLoads(text, list) != JsonLoad::kOk || list.kind != PyJson::Kind::kArray || list.items.empty()) return false;
  for (const PyJson& item : list.items) {
    ToolCall call;
    if (!CallFromObject(item, "parameters", "", call)) return false;
    calls.push_back(std::move(call));
  }
  return true;
}

// A call's two deltas: its id and name, then its arguments (none when empty).
void AppendCall(int index, ToolCall call, std::vector<ToolCallDelta>& out) {
  ToolCallDelta first;
  first.tool_index = index;
  first.id = std::move(call.id);
  first.name = std::move(call.name);
  out.push_back(std::move(first));
  if (call.arguments.empty()) return;
  ToolCallDelta arguments;
  arguments.tool_index = index;
  arguments.arguments = std::move(call.arguments);
  out.push_back(std::move(arguments));
}

}  // namespace

ParsedToolCalls ParseForcedToolCalls(std::string_view text, std::string_view name, ToolCallIds& ids) {
  ParsedToolCalls parsed;
  if (!name.empty()) {
    parsed.calls.push_back({ids.Next(), std::string(name), std::string(text)});
    return parsed;
  }
  if (!ParseCallList(text, parsed.calls)) {
    parsed.calls.clear();
    parsed.content = std::string(text);
    return parsed;
  }
  for (ToolCall& call : parsed.calls) call.id = ids.Next();
  return parsed;
}

ForcedToolCallStreamParser::ForcedToolCallStreamParser(std::string name, ToolCallIds ids)
    : name_(std::move(name)), ids_(ids) {}

std::vector<ToolCallDelta> ForcedToolCallStreamParser::Feed(std::string_view new_text) {
  std::vector<ToolCallDelta> out;
  if (finished_) return out;
  if (name_.empty()) {
    held_.append(new_text);
    return out;
  }
  if (!started_) {
    started_ = true;
    AppendCall(0, {ids_.Next(), name_, std::string(new_text)}, out);
  } else if (!new_text.empty()) {
    ToolCallDelta arguments;
    arguments.tool_index = 0;
    arguments.arguments = std::string(new_text);
    out.push_back(std::move(arguments));
  }
  return out;
}

std::vector<ToolCallDelta> ForcedToolCallStreamParser::Finish() {
  std::vector<ToolCallDelta> out;
  if (finished_) return out;
  finished_ = true;
  if (!name_.empty()) {
    if (!started_) AppendCall(0, {ids_.Next(), name_, ""}, out);
    return out;
  }
  ParsedToolCalls parsed = ParseForcedToolCalls(held_, "", ids_);
  if (parsed.calls.empty() && !parsed.content.empty()) {
    ToolCallDelta content;
    content.content = std::move(parsed.content);
    out.push_back(std::move(content));
  }
  for (size_t i = 0; i < parsed.calls.size(); ++i) AppendCall(static_cast<int>(i), std::move(parsed.calls[i]), out);
  held_.clear();
  return out;
}

}  // namespace strata::chat_template
