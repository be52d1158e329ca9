#include "chat_template/tool_calls.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <random>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "chat_template/escapes.h"
#include "chat_template/stream_text.h"
#include "chat_template/value.h"

namespace strata::chat_template {
namespace {

constexpr std::string_view kHermesStart = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

// Deeper JSON is malformed here; vLLM's json.loads fails at Python's recursion limit (about 1,000).
constexpr int kMaxJsonDepth = 512;
// Python (3.10.7+) refuses to convert an integer of more digits (ValueError, which vLLM's parsers catch).
constexpr size_t kMaxIntDigits = 4300;

// ---------------------------------------------------------------------------------------------------------
// UTF-8

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// A lone surrogate kept from a \udXXX escape (WTF-8: ED A0..BF 80..BF), as its code point, or 0.
uint32_t SurrogateAt(std::string_view text, size_t i) {
  if (i + 3 > text.size() || static_cast<unsigned char>(text[i]) != 0xED) return 0;
  const auto c1 = static_cast<unsigned char>(text[i + 1]), c2 = static_cast<unsigned char>(text[i + 2]);
  if (c1 < 0xA0 || c1 > 0xBF || (c2 & 0xC0) != 0x80) return 0;
  return 0xD000 | ((c1 & 0x3F) << 6) | (c2 & 0x3F);
}

// `text` with each invalid byte and each lone surrogate replaced by U+FFFD (a name must be valid UTF-8).
std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const int n = ValidSequenceAt(text, i);
    if (n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out.append(kReplacement);
      i += SurrogateAt(text, i) ? 3 : 1;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// JSON with Python's json module's rules: json.loads / JSONDecoder.raw_decode (strict: no control
// characters in strings; NaN, Infinity, -Infinity; duplicate keys keep the first position and the last
// value) and json.dumps(ensure_ascii=False) (", " and ": " separators, floats as repr(), ints exact).

struct PyJson {
  enum class Kind : uint8_t { kNull, kTrue, kFalse, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  std::string text;  // kNumber: its Python repr; kString: the decoded string (WTF-8)
  std::vector<std::string> keys;
  std::vector<PyJson> items;  // array elements, or object values (parallel to keys)

  const PyJson* Find(std::string_view key) const {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == key) return &items[i];
    }
    return nullptr;
  }
};

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t SkipJsonSpace(std::string_view s, size_t pos) {
  while (pos < s.size() && IsJsonSpace(s[pos])) ++pos;
  return pos;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// repr(float(text)) for a number with a fraction or an exponent.
std::string PythonFloatRepr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value < 0 ? "-Infinity" : "Infinity";
  std::string out = std::signbit(value) ? "-" : "";
  char buf[64];
  // Shortest round-trip digits, as repr() chooses them, then repr's layout.
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), std::fabs(value), std::chars_format::scientific);
  if (ec != std::errc()) return "NaN";  // cannot happen: 64 bytes hold any double
  const std::string_view sci(buf, end - buf);
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = 0;
  std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+'), sci.data() + sci.size(), exponent);
  const int point = exponent + 1;  // the value is 0.DIGITS × 10^point
  const int n = static_cast<int>(digits.size());
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out += "0." + std::string(-point, '0') + digits;
    } else if (point >= n) {
      out += digits + std::string(point - n, '0') + ".0";
    } else {
      out += digits.substr(0, point) + "." + digits.substr(point);
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    out += exponent < 0 ? "e-" : "e+";
    const std::string exp = std::to_string(std::abs(exponent));
    if (exp.size() < 2) out.push_back('0');
    out += exp;
  }
  return out;
}

class PyJsonParser {
 public:
  explicit PyJsonParser(std::string_view s) : s_(s) {}

  // JSONDecoder.raw_decode at `pos` (no leading whitespace): the value and the offset after it.
  bool RawDecode(size_t pos, PyJson& out, size_t& end) {
    pos_ = pos;
    if (!Value(out, 0)) return false;
    end = pos_;
    return true;
  }

  // json.loads: one value, with JSON whitespace around it and nothing else.
  bool Loads(PyJson& out) {
    pos_ = SkipJsonSpace(s_, 0);
    if (!Value(out, 0)) return false;
    return SkipJsonSpace(s_, pos_) == s_.size();
  }

 private:
  bool Literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool Value(PyJson& out, int depth) {
    if (pos_ >= s_.size()) return false;
    switch (s_[pos_]) {
      case '"':
        out.kind = PyJson::Kind::kString;
        ++pos_;
        return String(out.text);
      case '{':
        return Object(out, depth + 1);
      case '[':
        return Array(out, depth + 1);
      case 'n':
        out.kind = PyJson::Kind::kNull;
        return Literal("null");
      case 't':
        out.kind = PyJson::Kind::kTrue;
        return Literal("true");
      case 'f':
        out.kind = PyJson::Kind::kFalse;
        return Literal("false");
      case 'N':
        out.kind = PyJson::Kind::kNumber;
        out.text = "NaN";
        return Literal("NaN");
      case 'I':
        out.kind = PyJson::Kind::kNumber;
        out.text = "Infinity";
        return Literal("Infinity");
      default:
        if (s_.substr(pos_, 9) == "-Infinity") {
          pos_ += 9;
          out.kind = PyJson::Kind::kNumber;
          out.text = "-Infinity";
          return true;
        }
        return Number(out);
    }
  }

  // Python's number pattern: -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?, where a fraction or an exponent
  // without digits is not part of the number.
  bool Number(PyJson& out) {
    const size_t start = pos_;
    size_t p = pos_;
    if (p < s_.size() && s_[p] == '-') ++p;
    if (p >= s_.size() || !IsDigit(s_[p])) return false;
    if (s_[p] == '0') {
      ++p;
    } else {
      while (p < s_.size() && IsDigit(s_[p])) ++p;
    }
    bool is_float = false;
    if (p + 1 < s_.size() && s_[p] == '.' && IsDigit(s_[p + 1])) {
      p += 2;
      while (p < s_.size() && IsDigit(s_[p])) ++p;
      is_float = true;
    }
    if (p < s_.size() && (s_[p] == 'e' || s_[p] == 'E')) {
      size_t q = p + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && IsDigit(s_[q])) {
        while (q < s_.size() && IsDigit(s_[q])) ++q;
        p = q;
        is_float = true;
      }
    }
    pos_ = p;
    out.kind = PyJson::Kind::kNumber;
    const std::string_view text = s_.substr(start, p - start);
    if (!is_float) {
      const bool negative = text[0] == '-';
      if (text.size() - negative > kMaxIntDigits) return false;
      out.text = text == "-0" ? "0" : std::string(text);
      return true;
    }
    const std::string copy(text);
    out.text = PythonFloatRepr(std::strtod(copy.c_str(), nullptr));
    return true;
  }

  bool Hex4(uint32_t& value) {
    if (pos_ + 4 > s_.size()) return false;
    value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_ + i];
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        value |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        value |= c - 'A' + 10;
      } else {
        return false;
      }
    }
    pos_ += 4;
    return true;
  }

  // After the opening quote; strict: a control character (< 0x20) in a string is an error.
  bool String(std::string& out) {
    out.clear();
    while (true) {
      const size_t start = pos_;
      while (pos_ < s_.size() && s_[pos_] != '"' && s_[pos_] != '\\' && static_cast<unsigned char>(s_[pos_]) >= 0x20) {
        ++pos_;
      }
      out.append(s_.substr(start, pos_ - start));
      if (pos_ >= s_.size()) return false;
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (c != '\\') return false;  // a control character
      if (pos_ >= s_.size()) return false;
      const char e = s_[pos_++];
      if (const char short_escape = ShortEscape(e); short_escape != 0) {
        out.push_back(short_escape);
        continue;
      }
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(cp)) return false;
          // A high surrogate followed by an escaped low one is one code point; any other stays alone.
          if (cp >= 0xD800 && cp <= 0xDBFF && s_.substr(pos_, 2) == "\\u") {
            const size_t save = pos_;
            pos_ += 2;
            uint32_t low;
            if (Hex4(low) && low >= 0xDC00 && low <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else {
              pos_ = save;
            }
          }
          AppendCodePoint(out, cp);
          break;
        }
        default:
          return false;
      }
    }
  }

  bool Object(PyJson& out, int depth) {
    if (depth > kMaxJsonDepth) return false;
    out.kind = PyJson::Kind::kObject;
    ++pos_;  // '{'
    pos_ = SkipJsonSpace(s_, pos_);
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return true;
    }
    absl::flat_hash_map<std::string, size_t> index;  // only for large objects: small ones scan
    while (true) {
      if (pos_ >= s_.size() || s_[pos_] != '"') return false;
      ++pos_;
      std::string key;
      if (!String(key)) return false;
      pos_ = SkipJsonSpace(s_, pos_);
      if (pos_ >= s_.size() || s_[pos_] != ':') return false;
      pos_ = SkipJsonSpace(s_, pos_ + 1);
      PyJson value;
      if (!Value(value, depth)) return false;
      size_t at = out.keys.size();
      if (out.keys.size() < 16) {
        for (size_t i = 0; i < out.keys.size(); ++i) {
          if (out.keys[i] == key) at = i;
        }
        if (out.keys.size() == 15 && at == out.keys.size()) {
          for (size_t i = 0; i < out.keys.size(); ++i) index.emplace(out.keys[i], i);
          index.emplace(key, at);
        }
      } else {
        at = index.emplace(key, out.keys.size()).first->second;
      }
      if (at == out.keys.size()) {
        out.keys.push_back(std::move(key));
        out.items.push_back(std::move(value));
      } else {
        out.items[at] = std::move(value);  // a duplicate key: Python's dict keeps the last value
      }
      pos_ = SkipJsonSpace(s_, pos_);
      if (pos_ >= s_.size()) return false;
      if (s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      if (s_[pos_] != ',') return false;
      pos_ = SkipJsonSpace(s_, pos_ + 1);
    }
  }

  bool Array(PyJson& out, int depth) {
    if (depth > kMaxJsonDepth) return false;
    out.kind = PyJson::Kind::kArray;
    pos_ = SkipJsonSpace(s_, pos_ + 1);
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      out.items.emplace_back();
      if (!Value(out.items.back(), depth)) return false;
      pos_ = SkipJsonSpace(s_, pos_);
      if (pos_ >= s_.size()) return false;
      if (s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      if (s_[pos_] != ',') return false;
      pos_ = SkipJsonSpace(s_, pos_ + 1);
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// json.dumps's string: `"` `\` and controls escaped (\n \r \t \b \f, else \u00XX), the rest as is;
// a lone surrogate as its \udXXX escape and invalid UTF-8 as U+FFFD, so the result is valid UTF-8.
void DumpString(std::string_view s, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      if (const int n = ValidSequenceAt(s, i); n > 0) {
        out.append(s.substr(i, n));
        i += n;
      } else if (const uint32_t surrogate = SurrogateAt(s, i)) {
        out += "\\u";
        for (int shift = 12; shift >= 0; shift -= 4) out.push_back(kHex[(surrogate >> shift) & 0xF]);
        i += 3;
      } else {
        out.append(kReplacement);
        ++i;
      }
      continue;
    }
    ++i;
    if (!AppendJsonEscape(out, c)) out.push_back(static_cast<char>(c));
  }
  out.push_back('"');
}

void Dump(const PyJson& v, std::string& out) {
  switch (v.kind) {
    case PyJson::Kind::kNull:
      out += "null";
      return;
    case PyJson::Kind::kTrue:
      out += "true";
      return;
    case PyJson::Kind::kFalse:
      out += "false";
      return;
    case PyJson::Kind::kNumber:
      out += v.text;
      return;
    case PyJson::Kind::kString:
      DumpString(v.text, out);
      return;
    case PyJson::Kind::kArray:
      out.push_back('[');
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i > 0) out += ", ";
        Dump(v.items[i], out);
      }
      out.push_back(']');
      return;
    case PyJson::Kind::kObject:
      out.push_back('{');
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i > 0) out += ", ";
        DumpString(v.keys[i], out);
        out += ": ";
        Dump(v.items[i], out);
      }
      out.push_back('}');
      return;
  }
}

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
  Dump(*arguments, call.arguments);
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
    if (!PyJsonParser(json_text).Loads(object) || !CallFromObject(object, "arguments", "", call)) return false;
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
  PyJsonParser parser(text);
  while (pos != std::string_view::npos) {
    PyJson object;
    size_t end;
    ToolCall call;
    if (!parser.RawDecode(pos, object, end) || !CallFromObject(object, "arguments", "parameters", call)) {
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
  return absl::InvalidArgumentError("tool call parser: unknown \"" + std::string(flag) +
                                    "\" (valid: hermes, llama3_json, deepseek_v3, kimi_k2)");
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
  }
  return "";
}

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

ParsedToolCalls ParseToolCalls(ToolCallFormat format, std::string_view text, ToolCallIds& ids) {
  ParsedToolCalls parsed;
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

ToolCallStreamParser::ToolCallStreamParser(ToolCallFormat format, ToolCallIds ids) : format_(format), ids_(ids) {}

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
    const bool hermes = format_ == ToolCallFormat::kHermes;
    const size_t marker = hermes ? s.find(kHermesStart) : s.find('{');
    if (marker != std::string::npos) {
      size_t content_end = marker;
      if (!hermes && std::string_view(s).substr(0, marker).ends_with(kPythonTag)) {
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
    // Hermes: a partial <tool_call>; Llama: a partial or whole <|python_tag|> (dropped before a `{`).
    const size_t overlap = format_ == ToolCallFormat::kHermes ? MarkerOverlap(s, kHermesStart, kHermesStart.size() - 1)
                                                              : MarkerOverlap(s, kPythonTag, kPythonTag.size());
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
  if (!decided_checked_) {
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
    ParsedToolCalls parsed = ParseToolCalls(format_, held_, ids_);
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

// ---------------------------------------------------------------------------------------------------------
// Forced tool calls (tool_choice "required" or a named function)

namespace {

// vLLM's TypeAdapter(list[FunctionDefinition]).validate_json of the "required" output: a list of at least one
// object with a string "name" and "parameters".
bool ParseCallList(std::string_view text, std::vector<ToolCall>& calls) {
  PyJson list;
  if (!PyJsonParser(text).Loads(list) || list.kind != PyJson::Kind::kArray || list.items.empty()) return false;
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
