#include "chat_template/lexer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/escapes.h"
#include "chat_template/value.h"

namespace strata::chat_template {

using base::StrCat;

std::string SyntaxErrorText(std::string_view name, int line, int column, std::string_view message) {
  return StrCat(absl::string_view(name.data(), name.size()), ":", line, ":", column, ": ",
                absl::string_view(message.data(), message.size()));
}

namespace {

// Source text as jinja2 reads it: "\r\n" and "\r" become "\n", and one trailing newline is dropped.
std::string Normalize(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Python's str.isspace() on the code point that starts at s[i]; *len gets its byte length.
bool SpaceAt(std::string_view s, size_t i, size_t* len) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    *len = 1;
    return IsPySpace(c);
  }
  const size_t n = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
  if (i + n > s.size()) return false;
  std::u32string cp = Decode(s.substr(i, n));
  *len = n;
  return cp.size() == 1 && IsPySpace(cp[0]);
}

// The end of the run of whitespace starting at `pos` (regex \s*).
size_t SkipSpace(std::string_view s, size_t pos) {
  size_t len = 0;
  while (pos < s.size() && SpaceAt(s, pos, &len)) pos += len;
  return pos;
}

// Python's str.rstrip(): text without its trailing whitespace.
std::string_view RStrip(std::string_view s) {
  // Walk forward remembering where the last non-space code point ended (multi-byte spaces exist).
  size_t end = 0;
  size_t len = 0;
  for (size_t i = 0; i < s.size(); i += len) {
    if (!SpaceAt(s, i, &len)) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
      len = std::min(len, s.size() - i);
      end = i + len;
    }
  }
  return s.substr(0, end);
}

bool AllSpace(std::string_view s) {
  if (s.empty()) return false;
  return SkipSpace(s, 0) == s.size();
}

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  Lexer(std::string_view source, std::string_view name) : src_(Normalize(source)), name_(name) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t tag = FindTag(pos);
      if (tag == std::string_view::npos) {
        Emit(TokenKind::kData, src_.substr(pos), pos);
        break;
      }
      const char type = src_[tag + 1];  // '{', '%' or '#'
      char sign = tag + 2 < src_.size() ? src_[tag + 2] : 0;
      if (sign != '-' && sign != '+') sign = 0;
      std::string_view text = std::string_view(src_).substr(pos, tag - pos);
      if (sign == '-') {
        text = RStrip(text);
      } else if (sign != '+' && type != '{') {
        text = LStripBlock(text, line_starting);
      }
      if (!text.empty()) Emit(TokenKind::kData, text, pos);
      size_t after = tag + 2 + (sign ? 1 : 0);
      if (type == '#') {
        auto end = EndOfComment(after, tag);
        if (!end.ok()) return end.status();
        pos = *end;
      } else if (type == '%' && IsRaw(after)) {
        auto end = Raw(after, tag);
        if (!end.ok()) return end.status();
        pos = *end;
      } else {
        const bool block = type == '%';
        Emit(block ? TokenKind::kBlockBegin : TokenKind::kVarBegin, "", tag);
        auto end = Tag(after, block);
        if (!end.ok()) return end.status();
        pos = *end;
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    Emit(TokenKind::kEof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  void Emit(TokenKind kind, std::string_view value, size_t offset) {
    auto [line, column] = Where(offset);
    tokens_.push_back(Token{kind, std::string(value), line, column});
  }

  std::pair<int, int> Where(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  absl::Status Error(size_t offset, std::string_view message) const {
    auto [line, column] = Where(offset);
    return absl::InvalidArgumentError(SyntaxErrorText(name_, line, column, message));
  }

  size_t FindTag(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // lstrip_blocks: whitespace between the start of the line and a block or comment tag goes.
  static std::string_view LStripBlock(std::string_view text, bool line_starting) {
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting) && AllSpace(text.substr(l_pos))) return text.substr(0, l_pos);
    return text;
  }

  // After a block or comment end: "-" strips all whitespace, "+" nothing, else trim_blocks drops one "\n".
  size_t AfterEnd(size_t pos, char sign) const {
    if (sign == '-') return SkipSpace(src_, pos);
    if (sign == '+') return pos;
    return pos < src_.size() && src_[pos] == '\n' ? pos + 1 : pos;
  }

  absl::StatusOr<size_t> EndOfComment(size_t content, size_t tag) const {
    const size_t end = src_.find("#}", content);
    if (end == std::string::npos) return Error(tag, "Missing end of comment tag");
    const char sign = end > content && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    return AfterEnd(end + 2, sign);
  }

  // `{% raw %}` (the "{%" and its sign already read from `after` on).
  bool IsRaw(size_t after) const {
    size_t p = SkipSpace(src_, after);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = SkipSpace(src_, p + 3);
    if (src_.compare(p, 2, "%}") == 0) return true;
    return src_.compare(p, 3, "-%}") == 0;
  }

  absl::StatusOr<size_t> Raw(size_t after, size_t tag) {
    size_t p = SkipSpace(src_, SkipSpace(src_, after) + 3);
    p = src_[p] == '-' ? SkipSpace(src_, p + 3) : p + 2;  // no trim_blocks after {% raw %}, as jinja2
    const bool line_starting = p > 0 && src_[p - 1] == '\n';
    for (size_t q = src_.find("{%", p); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t r = q + 2;
      char sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
      r = SkipSpace(src_, r);
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r = SkipSpace(src_, r + 6);
      char end_sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) end_sign = src_[r++];
      if (src_.compare(r, 2, "%}") != 0) continue;
      std::string_view text = std::string_view(src_).substr(p, q - p);
      if (sign == '-') {
        text = RStrip(text);
      } else if (sign != '+') {
        text = LStripBlock(text, line_starting);
      }
      if (!text.empty()) Emit(TokenKind::kData, text, p);
      return AfterEnd(r + 2, end_sign);
    }
    return Error(tag, "Missing end of raw directive");
  }

  // The tokens inside {{ ... }} or {% ... %}; returns the offset after the end tag.
  absl::StatusOr<size_t> Tag(size_t pos, bool block) {
    std::vector<char> balance;
    while (true) {
      pos = SkipSpace(src_, pos);
      if (pos >= src_.size()) {
        return Error(pos, block ? "unexpected end of template, expected '%}'"
                                : "unexpected end of template, "
                                  "expected '}}'");
      }
      if (balance.empty()) {
        const std::string_view close = block ? "%}" : "}}";
        char sign = 0;
        size_t p = pos;
        if (src_[p] == '-' || (block && src_[p] == '+')) sign = src_[p++];
        if (src_.compare(p, 2, close) == 0) {
          Emit(block ? TokenKind::kBlockEnd : TokenKind::kVarEnd, "", pos);
          return block ? AfterEnd(p + 2, sign) : (sign == '-' ? SkipSpace(src_, p + 2) : p + 2);
        }
      }
      const char c = src_[pos];
      if (IsDigit(c)) {
        pos = Number(pos);
      } else if (IsNameStart(c)) {
        size_t end = pos;
        while (end < src_.size() && IsNameChar(src_[end])) ++end;
        Emit(TokenKind::kName, std::string_view(src_).substr(pos, end - pos), pos);
        pos = end;
      } else if (c == '\'' || c == '"') {
        auto end = String(pos);
        if (!end.ok()) return end.status();
        pos = *end;
      } else {
        static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string_view op;
        for (std::string_view two : kTwo) {
          if (src_.compare(pos, 2, two) == 0) op = two;
        }
        if (op.empty()) {
          static constexpr std::string_view kOne = "+-/*%~[](){}><=.:|,;";
          if (kOne.find(c) == std::string_view::npos) {
            return Error(pos, StrCat("unexpected char ", StrRepr(std::string(1, c))));
          }
          op = std::string_view(src_).substr(pos, 1);
        }
        if (op == "(" || op == "[" || op == "{") {
          balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (balance.empty()) return Error(pos, StrCat("unexpected '", op, "'"));
          if (balance.back() != op[0]) {
            return Error(pos, StrCat("unexpected '", op, "', expected '", std::string(1, balance.back()), "'"));
          }
          balance.pop_back();
        }
        Emit(TokenKind::kOp, op, pos);
        pos += op.size();
      }
    }
  }

  // Integers (0b, 0o, 0x, decimal; "_" separators) and floats ("1.5", "1e3", "2.5e-3").
  size_t Number(size_t pos) {
    auto digits = [&](size_t p, auto is_digit) {
      while (p < src_.size() && (is_digit(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && is_digit(src_[p + 1]))))
        ++p;
      return p;
    };
    auto dec = [](char ch) { return IsDigit(ch); };
    if (src_[pos] == '0' && pos + 1 < src_.size()) {
      const char base = static_cast<char>(src_[pos + 1] | 0x20);
      auto hex = [](char ch) { return IsDigit(ch) || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f'); };
      auto oct = [](char ch) { return ch >= '0' && ch <= '7'; };
      auto bin = [](char ch) { return ch == '0' || ch == '1'; };
      size_t end = pos;
      if (base == 'x') end = digits(pos + 2, hex);
      if (base == 'o') end = digits(pos + 2, oct);
      if (base == 'b') end = digits(pos + 2, bin);
      if (end > pos + 2) {
        std::string text;
        for (size_t i = pos; i < end; ++i) {
          if (src_[i] != '_') text.push_back(src_[i]);
        }
        Emit(TokenKind::kInt, text, pos);
        return end;
      }
    }
    size_t end = digits(pos, dec);
    bool is_float = false;
    // jinja2's float pattern may not start right after a ".": `s.0.0` is s, 0, 0 (items), not s, 0.0.
    const bool after_dot = pos > 0 && src_[pos - 1] == '.';
    if (!after_dot && end + 1 < src_.size() && src_[end] == '.' && IsDigit(src_[end + 1])) {
      end = digits(end + 1, dec);
      is_float = true;
    }
    if (!after_dot && end < src_.size() && (src_[end] | 0x20) == 'e') {
      size_t p = end + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && IsDigit(src_[p])) {
        end = digits(p, dec);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = pos; i < end; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Emit(is_float ? TokenKind::kFloat : TokenKind::kInt, text, pos);
    return end;
  }

  // A string literal, unescaped as Python's "unicode-escape" codec does.
  absl::StatusOr<size_t> String(size_t pos) {
    const char quote = src_[pos];
    std::string out;
    size_t p = pos + 1;
    while (true) {
      if (p >= src_.size()) return Error(pos, "unexpected end of string");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) return Error(pos, "unexpected end of string");
      const char e = src_[p + 1];
      p += 2;
      if (const char c = ShortEscape(e); c != 0) {
        out.push_back(c);
        continue;
      }
      switch (e) {
        case '\n':
          break;
        case '\\':
        case '\'':
        case '"':
          out.push_back(e);
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const char h = p + k < src_.size() ? src_[p + k] : 0;
            int d = IsDigit(h) ? h - '0' : ((h | 0x20) >= 'a' && (h | 0x20) <= 'f') ? (h | 0x20) - 'a' + 10 : -1;
            if (d < 0) return Error(pos, StrCat("truncated \\", std::string(1, e), " escape"));
            cp = cp * 16 + static_cast<char32_t>(d);
          }
          if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            return Error(pos, "illegal Unicode character in a string escape");
          }
          AppendCodePoint(out, cp);
          p += n;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) {
              cp = cp * 8 + static_cast<char32_t>(src_[p++] - '0');
            }
            AppendCodePoint(out, cp);
          } else {
            out.push_back('\\');  // unknown escapes stay as written, as in Python
            out.push_back(e);
          }
      }
    }
    Emit(TokenKind::kString, out, pos);
    return p + 1;
  }

  std::string src_;
  std::string_view name_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source, std::string_view name) {
  return Lexer(source, name).Run();
}

}  // namespace strata::chat_template
