#include "chat_template/py_literal.h"

#include <utf8proc.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "chat_template/escapes.h"
#include "chat_template/py_json.h"
#include "chat_template/stream_text.h"
#include "chat_template/value.h"

namespace strata::chat_template {
namespace {

// ---------------------------------------------------------------------------------------------------------
// Big integers as decimal text

// Decimal text of a non-negative number given as digits in `base` (2, 8, 16), or nullopt when it would have
// more than kMaxIntDigits digits (json.dumps refuses to write it). Quadratic, so the bound is checked first
// from the number of bits.
std::optional<std::string> BaseDigitsToDecimal(std::string_view digits, int base) {
  size_t start = 0;
  while (start < digits.size() && digits[start] == '0') ++start;
  digits.remove_prefix(start);
  if (digits.empty()) return std::string("0");
  const int bits_per_digit = base == 16 ? 4 : base == 8 ? 3 : 1;
  // 2^14300 > 10^4300: a number of more bits certainly has more than 4,300 digits.
  if (digits.size() * static_cast<size_t>(bits_per_digit) > 14300 + static_cast<size_t>(bits_per_digit)) {
    return std::nullopt;
  }
  std::vector<uint32_t> limbs;  // base 1e9, least significant first
  for (char c : digits) {
    uint64_t carry = static_cast<uint64_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    for (uint32_t& limb : limbs) {
      const uint64_t v = static_cast<uint64_t>(limb) * static_cast<uint64_t>(base) + carry;
      limb = static_cast<uint32_t>(v % 1000000000u);
      carry = v / 1000000000u;
    }
    while (carry > 0) {
      limbs.push_back(static_cast<uint32_t>(carry % 1000000000u));
      carry /= 1000000000u;
    }
  }
  std::string out = std::to_string(limbs.back());
  for (size_t i = limbs.size() - 1; i-- > 0;) {
    const std::string part = std::to_string(limbs[i]);
    out.append(9 - part.size(), '0');
    out += part;
  }
  if (out.size() > kMaxIntDigits) return std::nullopt;
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Python values (what literal_eval returns)

struct PyValue {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,
    kFloat,
    kComplex,
    kStr,
    kBytes,
    kEllipsis,
    kTuple,
    kList,
    kSet,
    kDict
  };
  Kind kind = Kind::kNone;
  bool flag = false;  // kBool: the value; kInt: too long to write (more than 4,300 digits)
  std::string text;   // kInt: decimal ("-12"); kStr: WTF-8; kBytes: the bytes
  double re = 0, im = 0;
  std::vector<PyValue> items;  // tuple, list, set elements; dict values
  std::vector<PyValue> keys;   // dict keys
};

bool Hashable(const PyValue& v) {
  switch (v.kind) {
    case PyValue::Kind::kList:
    case PyValue::Kind::kSet:
    case PyValue::Kind::kDict:
      return false;
    case PyValue::Kind::kTuple:
      for (const PyValue& item : v.items) {
        if (!Hashable(item)) return false;
      }
      return true;
    default:
      return true;
  }
}

// A text equal for keys Python's dict treats as equal (numbers by value: 1 == 1.0 == True == 1+0j).
std::string NumberKey(double re) {
  if (std::isnan(re)) return "";  // never equal, not even to itself (a new object each time)
  if (std::isinf(re)) return re > 0 ? "n:inf" : "n:-inf";
  if (re == std::trunc(re)) return "n" + IntegralDoubleText(re);
  return "f" + PythonFloatRepr(re);
}

std::string KeyText(const PyValue& v, bool& unique) {
  switch (v.kind) {
    case PyValue::Kind::kNone:
      return "N";
    case PyValue::Kind::kEllipsis:
      return "E";
    case PyValue::Kind::kBool:
      return v.flag ? "n1" : "n0";
    case PyValue::Kind::kInt:
      if (v.flag) unique = true;  // too long to matter: it fails json.dumps wherever it stays
      return "n" + v.text;
    case PyValue::Kind::kFloat: {
      std::string key = NumberKey(v.re);
      if (key.empty()) unique = true;
      return key;
    }
    case PyValue::Kind::kComplex: {
      if (v.im == 0) {
        std::string key = NumberKey(v.re);
        if (key.empty()) unique = true;
        return key;
      }
      if (std::isnan(v.re) || std::isnan(v.im)) unique = true;
      return "c" + PythonFloatRepr(v.re) + "," + PythonFloatRepr(v.im);
    }
    case PyValue::Kind::kStr:
      return "s" + v.text;
    case PyValue::Kind::kBytes:
      return "b" + v.text;
    case PyValue::Kind::kTuple: {
      std::string key = "(";
      for (const PyValue& item : v.items) {
        const std::string part = KeyText(item, unique);
        key += std::to_string(part.size()) + ":" + part;
      }
      return key + ")";
    }
    default:
      unique = true;
      return "";
  }
}

// json.dumps(value, ensure_ascii=False) (the C encoder: dict keys str, float, bool, None, int in that
// order of checks); false where it raises (TypeError, or ValueError for an integer of too many digits).
bool DumpValue(const PyValue& v, std::string& out) {
  switch (v.kind) {
    case PyValue::Kind::kNone:
      out += "null";
      return true;
    case PyValue::Kind::kBool:
      out += v.flag ? "true" : "false";
      return true;
    case PyValue::Kind::kInt:
      if (v.flag) return false;
      out += v.text;
      return true;
    case PyValue::Kind::kFloat:
      out += PythonFloatRepr(v.re);
      return true;
    case PyValue::Kind::kStr:
      DumpPyString(v.text, out);
      return true;
    case PyValue::Kind::kTuple:
    case PyValue::Kind::kList:
      out.push_back('[');
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i > 0) out += ", ";
        if (!DumpValue(v.items[i], out)) return false;
      }
      out.push_back(']');
      return true;
    case PyValue::Kind::kDict:
      out.push_back('{');
      for (size_t i = 0; i < v.keys.size(); ++i) {
        if (i > 0) out += ", ";
        const PyValue& key = v.keys[i];
        switch (key.kind) {
          case PyValue::Kind::kStr:
            DumpPyString(key.text, out);
            break;
          case PyValue::Kind::kFloat:
            out += '"' + PythonFloatRepr(key.re) + '"';
            break;
          case PyValue::Kind::kBool:
            out += key.flag ? "\"true\"" : "\"false\"";
            break;
          case PyValue::Kind::kNone:
            out += "\"null\"";
            break;
          case PyValue::Kind::kInt:
            if (key.flag) return false;
            out += '"' + key.text + '"';
            break;
          default:
            return false;  // "keys must be str, int, float, bool or None"
        }
        out += ": ";
        if (!DumpValue(v.items[i], out)) return false;
      }
      out.push_back('}');
      return true;
    default:
      return false;  // bytes, complex, set, Ellipsis: "not JSON serializable"
  }
}

// ---------------------------------------------------------------------------------------------------------
// Python's tokenizer, as far as literals need it

enum class Tok : uint8_t { kEnd, kNumber, kString, kName, kOp };

struct Token {
  Tok kind = Tok::kEnd;
  std::string text;  // kName: the name; kOp: the operator; kString: the decoded value
  PyValue number;    // kNumber
  bool bytes = false;
  bool fstring = false;
};

// Python's tokenizer refuses more nested brackets ("too many nested parentheses").
constexpr int kMaxBrackets = 200;

bool IsIdentByte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c >= 0x80;
}
bool IsDigitChar(char c) { return c >= '0' && c <= '9'; }
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) {
    // The source's line ends become "\n", as compile() reads a string.
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        src_.push_back(src[i]);
      }
    }
  }

  // The tokens, or false on a syntax error (or a construct this reader does not know, which is read alike).
  bool Run(std::vector<Token>& out) {
    int depth = 0;
    while (true) {
      // Whitespace, comments, continuation lines; line ends inside brackets.
      while (pos_ < src_.size()) {
        const char c = src_[pos_];
        if (c == ' ' || c == '\t' || c == '\f') {
          ++pos_;
        } else if (c == '#') {
          while (pos_ < src_.size() && src_[pos_] != '\n') ++pos_;
        } else if (c == '\\' && pos_ + 1 < src_.size() && src_[pos_ + 1] == '\n') {
          pos_ += 2;
        } else if (c == '\n' && depth > 0) {
          ++pos_;
        } else if (c == '\n') {
          // A line end outside brackets ends the expression: only blank lines and comments may follow.
          for (size_t p = pos_; p < src_.size(); ++p) {
            const char d = src_[p];
            if (d == '#') {
              while (p < src_.size() && src_[p] != '\n') ++p;
              if (p >= src_.size()) break;
            } else if (d != '\n' && d != ' ' && d != '\t' && d != '\f') {
              return false;
            }
          }
          pos_ = src_.size();
        } else {
          break;
        }
      }
      if (pos_ >= src_.size()) {
        out.push_back(Token{});
        return depth == 0;
      }
      const char c = src_[pos_];
      Token token;
      if (c == '\0') return false;
      if (IsDigitChar(c) || (c == '.' && pos_ + 1 < src_.size() && IsDigitChar(src_[pos_ + 1]))) {
        if (!Number(token)) return false;
      } else if (IsIdentByte(static_cast<unsigned char>(c))) {
        const size_t start = pos_;
        while (pos_ < src_.size() && IsIdentByte(static_cast<unsigned char>(src_[pos_]))) ++pos_;
        token.kind = Tok::kName;
        token.text = src_.substr(start, pos_ - start);
        if (pos_ < src_.size() && (src_[pos_] == '\'' || src_[pos_] == '"')) {
          if (!Prefixed(token)) return false;
        } else if (!ValidUtf8Name(token.text)) {
          return false;
        }
      } else if (c == '\'' || c == '"') {
        token.text.clear();
        if (!String(token, false, false, false)) return false;
      } else if (src_.compare(pos_, 3, "...") == 0) {
        token.kind = Tok::kOp;
        token.text = "...";
        pos_ += 3;
      } else if (src_.compare(pos_, 2, "**") == 0 || src_.compare(pos_, 2, "//") == 0 ||
                 src_.compare(pos_, 2, "==") == 0 || src_.compare(pos_, 2, "!=") == 0 ||
                 src_.compare(pos_, 2, "<=") == 0 || src_.compare(pos_, 2, ">=") == 0 ||
                 src_.compare(pos_, 2, ":=") == 0 || src_.compare(pos_, 2, "->") == 0) {
        token.kind = Tok::kOp;
        token.text = src_.substr(pos_, 2);
        pos_ += 2;
      } else if (std::string_view("()[]{},:+-*/%@<>=.|&^~;").find(c) != std::string_view::npos) {
        token.kind = Tok::kOp;
        token.text = std::string(1, c);
        ++pos_;
        if (c == '(' || c == '[' || c == '{') {
          if (++depth >= kMaxBrackets) return false;
        } else if (c == ')' || c == ']' || c == '}') {
          if (--depth < 0) return false;
        }
      } else {
        return false;  // any other character outside a string
      }
      out.push_back(std::move(token));
    }
  }

 private:
  // A name Python's tokenizer takes for an identifier: a letter (or `_`) first, then letters, marks, digits and
  // connectors (Unicode's ID_Start / ID_Continue by general category); anything else is a syntax error.
  static bool ValidUtf8Name(std::string_view name) {
    for (size_t i = 0; i < name.size();) {
      const int n = ValidSequenceAt(name, i);
      if (n == 0) return false;
      const char32_t c = CodePointAt(name, i, n);
      if (c >= 0x80) {
        const utf8proc_category_t category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
        const bool start = category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL ||
                           category == UTF8PROC_CATEGORY_LT || category == UTF8PROC_CATEGORY_LM ||
                           category == UTF8PROC_CATEGORY_LO || category == UTF8PROC_CATEGORY_NL;
        const bool next = category == UTF8PROC_CATEGORY_MN || category == UTF8PROC_CATEGORY_MC ||
                          category == UTF8PROC_CATEGORY_ND || category == UTF8PROC_CATEGORY_PC;
        if (!(start || (i > 0 && next))) return false;
      } else if (i == 0 && c >= '0' && c <= '9') {
        return false;
      }
      i += n;
    }
    return true;
  }

  // digitpart: digits with single underscores between them.
  size_t DigitPart(size_t p, bool (*is_digit)(char)) const {
    if (p >= src_.size() || !is_digit(src_[p])) return p;
    ++p;
    while (p < src_.size()) {
      if (is_digit(src_[p])) {
        ++p;
      } else if (src_[p] == '_' && p + 1 < src_.size() && is_digit(src_[p + 1])) {
        p += 2;
      } else {
        break;
      }
    }
    return p;
  }

  static std::string WithoutUnderscores(std::string_view s) {
    std::string out;
    for (char c : s) {
      if (c != '_') out.push_back(c);
    }
    return out;
  }

  bool Number(Token& token) {
    token.kind = Tok::kNumber;
    const size_t start = pos_;
    PyValue& v = token.number;
    if (src_[pos_] == '0' && pos_ + 1 < src_.size() &&
        std::string_view("xXoObB").find(src_[pos_ + 1]) != std::string_view::npos) {
      const char kind = static_cast<char>(src_[pos_ + 1] | 0x20);
      const int base = kind == 'x' ? 16 : kind == 'o' ? 8 : 2;
      size_t p = pos_ + 2;
      std::string digits;
      while (p < src_.size()) {
        const char c = src_[p];
        if (c == '_' && p + 1 < src_.size() && HexValue(src_[p + 1]) >= 0 && HexValue(src_[p + 1]) < base) {
          ++p;
          continue;
        }
        const int d = HexValue(c);
        if (d < 0 || d >= base) break;
        digits.push_back(c);
        ++p;
      }
      if (digits.empty()) return false;
      if (p < src_.size() && IsIdentByte(static_cast<unsigned char>(src_[p]))) return false;
      pos_ = p;
      v.kind = PyValue::Kind::kInt;
      std::optional<std::string> decimal = BaseDigitsToDecimal(digits, base);
      if (decimal) {
        v.text = *std::move(decimal);
      } else {
        v.flag = true;  // a value, but json.dumps cannot write it
      }
      return true;
    }
    auto digit = [](char c) { return c >= '0' && c <= '9'; };
    size_t p = DigitPart(pos_, digit);
    const bool int_part = p > pos_;
    bool is_float = false;
    if (p < src_.size() && src_[p] == '.') {
      is_float = true;
      p = DigitPart(p + 1, digit);
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      const size_t e = DigitPart(q, digit);
      if (e == q) return false;  // "invalid decimal literal"
      p = e;
      is_float = true;
    }
    bool imaginary = false;
    if (p < src_.size() && (src_[p] == 'j' || src_[p] == 'J')) {
      imaginary = true;
      ++p;
    }
    if (p < src_.size() && IsIdentByte(static_cast<unsigned char>(src_[p]))) return false;
    if (!int_part && !is_float) return false;
    const std::string text = WithoutUnderscores(std::string_view(src_).substr(start, p - start - imaginary));
    pos_ = p;
    if (imaginary) {
      v.kind = PyValue::Kind::kComplex;
      v.im = std::strtod(text.c_str(), nullptr);
      return true;
    }
    if (is_float) {
      v.kind = PyValue::Kind::kFloat;
      v.re = std::strtod(text.c_str(), nullptr);
      return true;
    }
    // "leading zeros in decimal integer literals are not permitted" (0, 00, 0_0 are).
    size_t nonzero = 0;
    while (nonzero < text.size() && text[nonzero] == '0') ++nonzero;
    if (nonzero > 0 && nonzero < text.size()) return false;
    if (text.size() - nonzero > kMaxIntDigits) return false;  // Python's parser refuses to convert it
    v.kind = PyValue::Kind::kInt;
    v.text = nonzero == text.size() ? "0" : text.substr(nonzero);
    return true;
  }

  // A name right before a quote: a string prefix (r, u, b, f and their combinations), else a syntax error
  // (a name followed by a string).
  bool Prefixed(Token& token) {
    std::string prefix;
    for (char c : token.text) prefix.push_back(static_cast<char>(c | 0x20));
    const bool ok = prefix == "r" || prefix == "u" || prefix == "b" || prefix == "f" || prefix == "br" ||
                    prefix == "rb" || prefix == "fr" || prefix == "rf";
    if (!ok) return false;
    token.text.clear();
    return String(token, prefix.find('r') != std::string::npos, prefix.find('b') != std::string::npos,
                  prefix.find('f') != std::string::npos);
  }

  bool String(Token& token, bool raw, bool bytes, bool fstring) {
    token.kind = Tok::kString;
    token.bytes = bytes;
    token.fstring = fstring;
    const char quote = src_[pos_];
    const bool triple = src_.compare(pos_, 3, std::string(3, quote)) == 0;
    const size_t open = triple ? 3 : 1;
    size_t p = pos_ + open;
    std::string body;
    while (true) {
      if (p >= src_.size()) return false;  // unterminated
      const char c = src_[p];
      if (c == quote && (!triple || src_.compare(p, 3, std::string(3, quote)) == 0)) break;
      if (c == '\n' && !triple) return false;
      if (c == '\0') return false;
      if (c == '\\' && p + 1 < src_.size()) {
        body.push_back(c);
        body.push_back(src_[p + 1]);
        p += 2;
        continue;
      }
      body.push_back(c);
      ++p;
    }
    pos_ = p + open;
    if (bytes) {
      for (unsigned char c : body) {
        if (c >= 0x80) return false;  // "bytes can only contain ASCII literal characters"
      }
    }
    if (raw || fstring) {
      token.text = std::move(body);
      return true;
    }
    return Unescape(body, bytes, token.text);
  }

  // Python's escapes in a string (or bytes) literal.
  static bool Unescape(std::string_view body, bool bytes, std::string& out) {
    for (size_t i = 0; i < body.size();) {
      const char c = body[i];
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      const char e = body[i + 1];  // a backslash is always followed by a character (String keeps pairs)
      i += 2;
      if (const char short_escape = ShortEscape(e); short_escape != 0) {
        out.push_back(short_escape);
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
        case 'x': {
          if (i + 2 > body.size() || HexValue(body[i]) < 0 || HexValue(body[i + 1]) < 0) return false;
          const int value = HexValue(body[i]) * 16 + HexValue(body[i + 1]);
          i += 2;
          if (bytes) {
            out.push_back(static_cast<char>(value));
          } else {
            AppendCodePoint(out, static_cast<char32_t>(value));
          }
          break;
        }
        case 'u':
        case 'U':
        case 'N':
          if (bytes) {
            out.push_back('\\');
            out.push_back(e);
            break;
          }
          if (e == 'N') return false;  // \N{NAME}: the Unicode name database is not here (see the header)
          {
            const size_t n = e == 'u' ? 4 : 8;
            char32_t cp = 0;
            for (size_t k = 0; k < n; ++k) {
              const int d = i + k < body.size() ? HexValue(body[i + k]) : -1;
              if (d < 0) return false;
              cp = cp * 16 + static_cast<char32_t>(d);
            }
            if (cp > 0x10FFFF) return false;
            i += n;
            AppendCodePoint(out, cp);  // a lone surrogate is kept (WTF-8), as Python keeps it
          }
          break;
        default:
          if (e >= '0' && e <= '7') {
            int value = e - '0';
            for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k) {
              value = value * 8 + (body[i++] - '0');
            }
            if (bytes) {
              out.push_back(static_cast<char>(value & 0xFF));
            } else {
              AppendCodePoint(out, static_cast<char32_t>(value));
            }
          } else {
            out.push_back('\\');  // an unknown escape stays as written
            out.push_back(e);
          }
      }
    }
    return true;
  }

  std::string src_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------------------------
// The parse (Python's grammar, as far as literals go) and literal_eval's conversion

struct Node {
  enum class Kind : uint8_t { kConstant, kName, kTuple, kList, kSet, kDict, kUnary, kBinary, kCall, kJoinedStr };
  Kind kind = Kind::kConstant;
  PyValue constant;
  std::string name;  // kName, kCall: the function's name; kUnary, kBinary: the operator
  std::vector<Node> items;
  std::vector<Node> keys;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  bool Expression(Node& out) {
    if (!ExpressionList(out, /*parenthesized=*/false)) return false;
    return Peek().kind == Tok::kEnd;
  }

 private:
  const Token& Peek() const { return tokens_[pos_]; }
  bool IsOp(std::string_view op) const { return Peek().kind == Tok::kOp && Peek().text == op; }
  bool StartsExpression() const {
    const Token& t = Peek();
    if (t.kind == Tok::kNumber || t.kind == Tok::kString || t.kind == Tok::kName) return true;
    return t.kind == Tok::kOp &&
           (t.text == "(" || t.text == "[" || t.text == "{" || t.text == "-" || t.text == "+" || t.text == "...");
  }

  // expr (',' expr)* [','] : a tuple when there is a comma.
  bool ExpressionList(Node& out, bool parenthesized) {
    Node first;
    if (!Sum(first)) return false;
    if (!IsOp(",")) {
      out = std::move(first);
      return true;
    }
    out = Node{};
    out.kind = Node::Kind::kTuple;
    out.items.push_back(std::move(first));
    while (IsOp(",")) {
      ++pos_;
      if (!StartsExpression()) break;
      out.items.emplace_back();
      if (!Sum(out.items.back())) return false;
    }
    (void)parenthesized;
    return true;
  }

  // term (('+' | '-') term)*
  bool Sum(Node& out) {
    if (!Unary(out)) return false;
    while (IsOp("+") || IsOp("-")) {
      Node binary;
      binary.kind = Node::Kind::kBinary;
      binary.name = Peek().text;
      ++pos_;
      binary.items.push_back(std::move(out));
      binary.items.emplace_back();
      if (!Unary(binary.items.back())) return false;
      out = std::move(binary);
    }
    return true;
  }

  // ('+' | '-')* atom, the signs applied innermost first (iteratively: a long run of signs is no recursion).
  bool Unary(Node& out) {
    std::vector<std::string> signs;
    while (IsOp("+") || IsOp("-")) {
      signs.push_back(Peek().text);
      ++pos_;
    }
    if (!Atom(out)) return false;
    if (signs.size() > 1) {
      // A sign applied to a signed number is no literal (literal_eval's ValueError): no need to nest them.
      out = Node{};
      out.kind = Node::Kind::kName;
      return true;
    }
    while (!signs.empty()) {
      Node unary;
      unary.kind = Node::Kind::kUnary;
      unary.name = std::move(signs.back());
      signs.pop_back();
      unary.items.push_back(std::move(out));
      out = std::move(unary);
    }
    return true;
  }

  bool Atom(Node& out) {
    out = Node{};
    const Token& t = Peek();
    switch (t.kind) {
      case Tok::kNumber:
        out.constant = t.number;
        ++pos_;
        return true;
      case Tok::kString: {
        // Adjacent literals are one: bytes with bytes, str with str; an f-string makes a JoinedStr.
        const bool bytes = t.bytes;
        bool joined = false;
        std::string text;
        while (Peek().kind == Tok::kString) {
          if (Peek().bytes != bytes) return false;  // "cannot mix bytes and nonbytes literals"
          joined |= Peek().fstring;
          text += Peek().text;
          ++pos_;
        }
        if (joined) {
          out.kind = Node::Kind::kJoinedStr;
          return true;
        }
        out.constant.kind = bytes ? PyValue::Kind::kBytes : PyValue::Kind::kStr;
        out.constant.text = std::move(text);
        return true;
      }
      case Tok::kName: {
        const std::string name = t.text;
        ++pos_;
        if (name == "True" || name == "False") {
          out.constant.kind = PyValue::Kind::kBool;
          out.constant.flag = name == "True";
          return true;
        }
        if (name == "None") return true;
        if (IsOp("(")) {
          ++pos_;
          out.kind = Node::Kind::kCall;
          out.name = name;
          while (!IsOp(")")) {
            out.items.emplace_back();
            if (!Sum(out.items.back())) return false;
            if (IsOp(",")) {
              ++pos_;
            } else if (!IsOp(")")) {
              return false;
            }
          }
          ++pos_;
          return true;
        }
        out.kind = Node::Kind::kName;
        out.name = name;
        return true;
      }
      case Tok::kOp:
        if (t.text == "...") {
          out.constant.kind = PyValue::Kind::kEllipsis;
          ++pos_;
          return true;
        }
        if (t.text == "(") {
          ++pos_;
          if (IsOp(")")) {
            ++pos_;
            out.kind = Node::Kind::kTuple;
            return true;
          }
          if (!ExpressionList(out, true) || !IsOp(")")) return false;
          ++pos_;
          return true;
        }
        if (t.text == "[") {
          ++pos_;
          out.kind = Node::Kind::kList;
          return Items(out.items, "]");
        }
        if (t.text == "{") {
          ++pos_;
          return Braces(out);
        }
        return false;
      case Tok::kEnd:
        return false;
    }
    return false;
  }

  // expr (',' expr)* [','] then `close`.
  bool Items(std::vector<Node>& items, std::string_view close) {
    while (!IsOp(close)) {
      items.emplace_back();
      if (!Sum(items.back())) return false;
      if (IsOp(",")) {
        ++pos_;
      } else if (!IsOp(close)) {
        return false;
      }
    }
    ++pos_;
    return true;
  }

  // After '{': a dict (key ':' value, ...) or a set (expr, ...); `{}` is a dict.
  bool Braces(Node& out) {
    out.kind = Node::Kind::kDict;
    if (IsOp("}")) {
      ++pos_;
      return true;
    }
    Node first;
    if (!Sum(first)) return false;
    if (!IsOp(":")) {
      out.kind = Node::Kind::kSet;
      out.items.push_back(std::move(first));
      if (IsOp(",")) {
        ++pos_;
      } else if (!IsOp("}")) {
        return false;
      }
      return Items(out.items, "}");
    }
    out.keys.push_back(std::move(first));
    while (true) {
      ++pos_;  // ':'
      out.items.emplace_back();
      if (!Sum(out.items.back())) return false;
      if (IsOp("}")) break;
      if (!IsOp(",")) return false;
      ++pos_;
      if (IsOp("}")) break;
      out.keys.emplace_back();
      if (!Sum(out.keys.back()) || !IsOp(":")) return false;
    }
    ++pos_;
    return true;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
};

enum class Convert { kOk, kValueError, kTypeError };

// _convert_num: a Constant int, float or complex (bool is not one).
Convert ConvertNumber(const Node& node, PyValue& out) {
  if (node.kind != Node::Kind::kConstant) return Convert::kValueError;
  const PyValue::Kind k = node.constant.kind;
  if (k != PyValue::Kind::kInt && k != PyValue::Kind::kFloat && k != PyValue::Kind::kComplex) {
    return Convert::kValueError;
  }
  out = node.constant;
  return Convert::kOk;
}

PyValue Negate(PyValue v) {
  switch (v.kind) {
    case PyValue::Kind::kInt:
      if (!v.flag && v.text != "0") v.text = v.text[0] == '-' ? v.text.substr(1) : "-" + v.text;
      break;
    case PyValue::Kind::kComplex:
      v.im = -v.im;
      v.re = -v.re;
      break;
    default:
      v.re = -v.re;
  }
  return v;
}

// _convert_signed_num: a number, or + / - applied to one.
Convert ConvertSignedNumber(const Node& node, PyValue& out) {
  if (node.kind == Node::Kind::kUnary) {
    if (Convert c = ConvertNumber(node.items[0], out); c != Convert::kOk) return c;
    if (node.name == "-") out = Negate(std::move(out));
    return Convert::kOk;
  }
  return ConvertNumber(node, out);
}

// ast.literal_eval's _convert, in its order of evaluation (a TypeError is raised where a dict or set
// inserts an unhashable item, after converting that item and, for a dict, its value).
Convert ConvertNode(const Node& node, PyValue& out) {
  switch (node.kind) {
    case Node::Kind::kConstant:
      out = node.constant;
      return Convert::kOk;
    case Node::Kind::kTuple:
    case Node::Kind::kList:
      out = PyValue{};
      out.kind = node.kind == Node::Kind::kTuple ? PyValue::Kind::kTuple : PyValue::Kind::kList;
      for (const Node& item : node.items) {
        out.items.emplace_back();
        if (Convert c = ConvertNode(item, out.items.back()); c != Convert::kOk) return c;
      }
      return Convert::kOk;
    case Node::Kind::kSet:
      out = PyValue{};
      out.kind = PyValue::Kind::kSet;
      for (const Node& item : node.items) {
        PyValue v;
        if (Convert c = ConvertNode(item, v); c != Convert::kOk) return c;
        if (!Hashable(v)) return Convert::kTypeError;
        out.items.push_back(std::move(v));  // a set never reaches JSON: its members need no dedup
      }
      return Convert::kOk;
    case Node::Kind::kCall:
      if (node.name == "set" && node.items.empty()) {
        out = PyValue{};
        out.kind = PyValue::Kind::kSet;
        return Convert::kOk;
      }
      return Convert::kValueError;
    case Node::Kind::kDict: {
      out = PyValue{};
      out.kind = PyValue::Kind::kDict;
      absl::flat_hash_map<std::string, size_t> index;
      for (size_t i = 0; i < node.keys.size(); ++i) {
        PyValue key, value;
        if (Convert c = ConvertNode(node.keys[i], key); c != Convert::kOk) return c;
        if (Convert c = ConvertNode(node.items[i], value); c != Convert::kOk) return c;
        if (!Hashable(key)) return Convert::kTypeError;
        bool unique = false;
        const std::string text = KeyText(key, unique);
        if (!unique) {
          if (auto it = index.find(text); it != index.end()) {
            out.items[it->second] = std::move(value);  // the first key stays, with the last value
            continue;
          }
          index.emplace(text, out.keys.size());
        }
        out.keys.push_back(std::move(key));
        out.items.push_back(std::move(value));
      }
      return Convert::kOk;
    }
    case Node::Kind::kBinary: {
      PyValue left, right;
      if (Convert c = ConvertSignedNumber(node.items[0], left); c != Convert::kOk) return c;
      if (Convert c = ConvertNumber(node.items[1], right); c != Convert::kOk) return c;
      if (left.kind == PyValue::Kind::kComplex || right.kind != PyValue::Kind::kComplex) return Convert::kValueError;
      // A real number plus or minus an imaginary one: a complex, which json.dumps refuses whatever it is.
      out = PyValue{};
      out.kind = PyValue::Kind::kComplex;
      out.re = left.kind == PyValue::Kind::kFloat ? left.re : std::strtod(left.text.c_str(), nullptr);
      out.im = node.name == "-" ? -right.im : right.im;
      return Convert::kOk;
    }
    case Node::Kind::kUnary:
      return ConvertSignedNumber(node, out);
    default:
      return Convert::kValueError;  // a name, a JoinedStr
  }
}

// Python's int() of Unicode digits: the digit's value, or -1.
int DecimalValue(char32_t c) {
  if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
  if (c < 0x80 || !IsDecimalDigit(c)) return -1;
  // Nd digits come in runs of ten, 0 to 9; find the run's zero.
  for (int d = 0; d <= 9; ++d) {
    if (!IsDecimalDigit(c - static_cast<char32_t>(d))) return d - 1;
  }
  return 9;
}

// The text with Unicode digits made ASCII and Python-whitespace stripped, or nullopt for invalid UTF-8.
std::optional<std::string> AsciiDigits(std::string_view text, bool& other_non_ascii) {
  std::u32string cps;
  for (size_t i = 0; i < text.size();) {
    const int n = ValidSequenceAt(text, i);
    if (n == 0) return std::nullopt;
    cps.push_back(CodePointAt(text, i, n));
    i += n;
  }
  size_t b = 0, e = cps.size();
  while (b < e && IsPySpace(cps[b])) ++b;
  while (e > b && IsPySpace(cps[e - 1])) --e;
  std::string out;
  other_non_ascii = false;
  for (size_t i = b; i < e; ++i) {
    const char32_t c = cps[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (const int d = DecimalValue(c); d >= 0) {
      out.push_back(static_cast<char>('0' + d));
    } else {
      other_non_ascii = true;
    }
  }
  return out;
}

// Digits with single underscores between them, from `p`: the end (p when none).
size_t UnderscoredDigits(std::string_view s, size_t p) {
  if (p >= s.size() || !IsDigitChar(s[p])) return p;
  ++p;
  while (p < s.size()) {
    if (IsDigitChar(s[p])) {
      ++p;
    } else if (s[p] == '_' && p + 1 < s.size() && IsDigitChar(s[p + 1])) {
      p += 2;
    } else {
      break;
    }
  }
  return p;
}

}  // namespace

LiteralDump LiteralEvalDumps(std::string_view text) {
  LiteralDump result;
  // literal_eval strips leading spaces and tabs (its caller already stripped the rest).
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  std::vector<Token> tokens;
  if (!Lexer(text).Run(tokens)) return result;
  Node node;
  if (!Parser(std::move(tokens)).Expression(node)) return result;
  PyValue value;
  switch (ConvertNode(node, value)) {
    case Convert::kOk:
      break;
    case Convert::kValueError:
      return result;
    case Convert::kTypeError:
      result.outcome = LiteralOutcome::kError;
      return result;
  }
  if (!DumpValue(value, result.json)) {
    result.json.clear();
    result.outcome = LiteralOutcome::kUnwritable;
    return result;
  }
  result.outcome = LiteralOutcome::kValue;
  return result;
}

std::optional<std::string> PyIntText(std::string_view text) {
  bool other = false;
  std::optional<std::string> s = AsciiDigits(text, other);
  if (!s || other) return std::nullopt;
  size_t p = 0;
  bool negative = false;
  if (p < s->size() && ((*s)[p] == '+' || (*s)[p] == '-')) negative = (*s)[p++] == '-';
  const size_t end = UnderscoredDigits(*s, p);
  if (end == p || end != s->size()) return std::nullopt;
  std::string digits;
  for (size_t i = p; i < end; ++i) {
    if ((*s)[i] != '_') digits.push_back((*s)[i]);
  }
  if (digits.size() > kMaxIntDigits) return std::nullopt;
  size_t nonzero = 0;
  while (nonzero + 1 < digits.size() && digits[nonzero] == '0') ++nonzero;
  digits.erase(0, nonzero);
  if (negative && digits != "0") digits.insert(0, "-");
  return digits;
}

std::optional<double> PyFloatText(std::string_view text) {
  bool other = false;
  std::optional<std::string> s = AsciiDigits(text, other);
  if (!s || other || s->empty()) return std::nullopt;
  size_t p = 0;
  bool negative = false;
  if ((*s)[p] == '+' || (*s)[p] == '-') negative = (*s)[p++] == '-';
  std::string word;
  for (size_t i = p; i < s->size(); ++i) word.push_back(static_cast<char>((*s)[i] | 0x20));
  if (word == "inf" || word == "infinity") return negative ? -HUGE_VAL : HUGE_VAL;
  if (word == "nan") return negative ? -std::nan("") : std::nan("");
  size_t q = UnderscoredDigits(*s, p);
  const bool int_part = q > p;
  bool fraction = false;
  if (q < s->size() && (*s)[q] == '.') {
    const size_t f = UnderscoredDigits(*s, q + 1);
    fraction = f > q + 1;
    q = f;
  }
  if (!int_part && !fraction) return std::nullopt;
  if (q < s->size() && ((*s)[q] == 'e' || (*s)[q] == 'E')) {
    size_t e = q + 1;
    if (e < s->size() && ((*s)[e] == '+' || (*s)[e] == '-')) ++e;
    const size_t end = UnderscoredDigits(*s, e);
    if (end == e) return std::nullopt;
    q = end;
  }
  if (q != s->size()) return std::nullopt;
  std::string plain;
  for (char c : *s) {
    if (c != '_') plain.push_back(c);
  }
  return std::strtod(plain.c_str(), nullptr);
}

std::string IntegralDoubleText(double x) {
  x = std::trunc(x);
  if (x == 0) return "0";
  const bool negative = x < 0;
  int exponent = 0;
  const double mantissa = std::frexp(std::fabs(x), &exponent);  // |x| = mantissa * 2^exponent, mantissa in [0.5, 1)
  uint64_t m = static_cast<uint64_t>(std::ldexp(mantissa, 53));
  int shift = exponent - 53;
  std::string out;
  if (shift <= 0) {
    out = std::to_string(m >> -shift);
  } else {
    std::vector<uint32_t> limbs;  // base 1e9, least significant first
    while (m > 0) {
      limbs.push_back(static_cast<uint32_t>(m % 1000000000u));
      m /= 1000000000u;
    }
    for (; shift > 0; --shift) {
      uint64_t carry = 0;
      for (uint32_t& limb : limbs) {
        const uint64_t v = static_cast<uint64_t>(limb) * 2 + carry;
        limb = static_cast<uint32_t>(v % 1000000000u);
        carry = v / 1000000000u;
      }
      if (carry > 0) limbs.push_back(static_cast<uint32_t>(carry));
    }
    out = std::to_string(limbs.back());
    for (size_t i = limbs.size() - 1; i-- > 0;) {
      const std::string part = std::to_string(limbs[i]);
      out.append(9 - part.size(), '0');
      out += part;
    }
  }
  return negative ? "-" + out : out;
}

}  // namespace strata::chat_template
