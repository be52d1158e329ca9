#include "chat_template/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/container/flat_hash_map.h"
#include "chat_template/escapes.h"
#include "chat_template/stream_text.h"
#include "chat_template/value.h"

namespace strata::chat_template {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// A lone surrogate kept from a \udXXX escape (WTF-8: ED A0..BF 80..BF), as its code point, or 0.
uint32_t SurrogateAt(std::string_view text, size_t i) {
  if (i + 3 > text.size() || static_cast<unsigned char>(text[i]) != 0xED) return 0;
  const auto c1 = static_cast<unsigned char>(text[i + 1]), c2 = static_cast<unsigned char>(text[i + 2]);
  if (c1 < 0xA0 || c1 > 0xBF || (c2 & 0xC0) != 0x80) return 0;
  return 0xD000 | ((c1 & 0x3F) << 6) | (c2 & 0x3F);
}

// `text` with each invalid byte and each lone surrogate replaced by U+FFFD (a name must be valid UTF-8).
}  // namespace

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

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t SkipJsonSpace(std::string_view s, size_t pos) {
  while (pos < s.size() && IsJsonSpace(s[pos])) ++pos;
  return pos;
}

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

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class PyJsonParser {
 public:
  explicit PyJsonParser(std::string_view s) : s_(s) {}

  // The last failure was an integer too long to convert (Python's ValueError).
  bool value_error() const { return value_error_; }

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
      if (text.size() - negative > kMaxIntDigits) {
        value_error_ = true;  // Python's int() refuses it: a ValueError, raised where the scanner meets it
        return false;
      }
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
  bool value_error_ = false;
};

void AppendUnicodeEscape(uint32_t unit, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out.push_back(kHex[(unit >> shift) & 0xF]);
}

// json.dumps's string: `"` `\` and controls escaped (\n \r \t \b \f, else \u00XX), the rest as is, or with
// ensure_ascii every other code point as \uXXXX (a UTF-16 pair above U+FFFF); a lone surrogate as its \udXXX
// escape and invalid UTF-8 as U+FFFD, so the result is valid UTF-8.
void DumpString(std::string_view s, std::string& out, bool ensure_ascii) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      if (const int n = ValidSequenceAt(s, i); n > 0) {
        if (ensure_ascii) {
          const char32_t cp = CodePointAt(s, i, n);
          if (cp >= 0x10000) {
            AppendUnicodeEscape(0xD800 + ((cp - 0x10000) >> 10), out);
            AppendUnicodeEscape(0xDC00 + ((cp - 0x10000) & 0x3FF), out);
          } else {
            AppendUnicodeEscape(cp, out);
          }
        } else {
          out.append(s.substr(i, n));
        }
        i += n;
      } else if (const uint32_t surrogate = SurrogateAt(s, i)) {
        AppendUnicodeEscape(surrogate, out);
        i += 3;
      } else {
        if (ensure_ascii) {
          AppendUnicodeEscape(0xFFFD, out);
        } else {
          out.append(kReplacement);
        }
        ++i;
      }
      continue;
    }
    ++i;
    if (!AppendJsonEscape(out, c)) out.push_back(static_cast<char>(c));
  }
  out.push_back('"');
}

void Dump(const PyJson& v, std::string& out, bool ensure_ascii) {
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
      DumpString(v.text, out, ensure_ascii);
      return;
    case PyJson::Kind::kArray:
      out.push_back('[');
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i > 0) out += ", ";
        Dump(v.items[i], out, ensure_ascii);
      }
      out.push_back(']');
      return;
    case PyJson::Kind::kObject:
      out.push_back('{');
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i > 0) out += ", ";
        DumpString(v.keys[i], out, ensure_ascii);
        out += ": ";
        Dump(v.items[i], out, ensure_ascii);
      }
      out.push_back('}');
      return;
  }
}

}  // namespace

JsonLoad PyJsonLoads(std::string_view text, PyJson& out) {
  PyJsonParser parser(text);
  if (parser.Loads(out)) return JsonLoad::kOk;
  return parser.value_error() ? JsonLoad::kValueError : JsonLoad::kDecodeError;
}

bool PyJsonRawDecode(std::string_view text, size_t pos, PyJson& out, size_t& end) {
  return PyJsonParser(text).RawDecode(pos, out, end);
}

void DumpPyJson(const PyJson& value, std::string& out, bool ensure_ascii) { Dump(value, out, ensure_ascii); }

void DumpPyString(std::string_view s, std::string& out, bool ensure_ascii) { DumpString(s, out, ensure_ascii); }

}  // namespace strata::chat_template
