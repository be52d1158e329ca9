#include "chat_template/py_str.h"

#include <utf8proc.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "chat_template/value.h"

namespace strata::chat_template {
namespace {

// Python's str.upper/lower per code point: Unicode's simple case mappings (utf8proc, Debian's, as the
// tokenizer uses). Python applies the full mappings where they differ (the few that turn one code point into
// several, such as U+00DF to "SS"); those keep the code point here.
char32_t Upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t Lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }

bool IsUpperCp(char32_t c) { return Lower(c) != c; }
bool IsLowerCp(char32_t c) { return Upper(c) != c || c == 0xdf || c == 0x138 || c == 0x149; }
bool IsCased(char32_t c) { return IsUpperCp(c) || IsLowerCp(c); }

std::string Slice(std::u32string_view cps, size_t begin, size_t end) { return Encode(cps.substr(begin, end - begin)); }

// str.split() without a separator: runs of whitespace, none leading or trailing.
std::vector<std::string> SplitWhitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  const std::u32string cps = Decode(s);
  std::vector<std::pair<size_t, size_t>> words;
  size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && IsPySpace(cps[i])) ++i;
    if (i >= cps.size()) break;
    size_t j = i;
    while (j < cps.size() && !IsPySpace(cps[j])) ++j;
    words.emplace_back(i, j);
    i = j;
  }
  std::vector<std::string> parts;
  if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
    for (auto [b, e] : words) parts.push_back(Slice(cps, b, e));
    return parts;
  }
  const size_t n = static_cast<size_t>(maxsplit);
  if (!from_right) {
    // The last part is the rest of the text, less its trailing whitespace.
    for (size_t k = 0; k < n; ++k) parts.push_back(Slice(cps, words[k].first, words[k].second));
    size_t e = cps.size();
    while (e > words[n].first && IsPySpace(cps[e - 1])) --e;
    parts.push_back(Slice(cps, words[n].first, e));
    return parts;
  }
  // rsplit: the first part is the start of the text, less its leading whitespace.
  const size_t first = words.size() - n;
  size_t b = 0;
  while (b < cps.size() && IsPySpace(cps[b])) ++b;
  parts.push_back(Slice(cps, b, words[first - 1].second));
  for (size_t k = first; k < words.size(); ++k) parts.push_back(Slice(cps, words[k].first, words[k].second));
  return parts;
}

std::vector<std::string> SplitAt(std::string_view s, std::string_view sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  size_t pos = 0;
  for (int64_t done = 0; maxsplit < 0 || done < maxsplit; ++done) {
    const size_t hit = s.find(sep, pos);
    if (hit == std::string_view::npos) break;
    parts.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  parts.emplace_back(s.substr(pos));
  return parts;
}

std::vector<std::string> RSplitAt(std::string_view s, std::string_view sep, int64_t maxsplit) {
  std::vector<std::string> reversed;
  size_t end = s.size();
  for (int64_t done = 0; maxsplit < 0 || done < maxsplit; ++done) {
    if (end < sep.size()) break;
    const size_t hit = s.rfind(sep, end - sep.size());
    if (hit == std::string_view::npos) break;
    reversed.emplace_back(s.substr(hit + sep.size(), end - hit - sep.size()));
    end = hit;
  }
  reversed.emplace_back(s.substr(0, end));
  return std::vector<std::string>(reversed.rbegin(), reversed.rend());
}

// Some cased character, and none for which `other_case` holds.
bool AllCasedAre(std::string_view s, bool (*other_case)(char32_t)) {
  bool cased = false;
  for (char32_t c : Decode(s)) {
    if (!IsCased(c)) continue;
    cased = true;
    if (other_case(c)) return false;
  }
  return cased;
}

}  // namespace

void AppendUpper(std::string& out, char32_t c) {
  if (c == 0xdf) {
    out += "SS";  // Python's full case mapping of ß
  } else {
    AppendCodePoint(out, Upper(c));
  }
}

// Python's two context rules: İ becomes "i" + combining dot, and a capital sigma that ends a word (a cased
// letter before it, none after) becomes the final sigma ς.
void AppendLower(std::string& out, std::u32string_view cps, size_t i) {
  const char32_t c = cps[i];
  if (c == 0x130) {
    out += "i\u0307";
  } else if (c == 0x3a3 && i > 0 && IsCased(cps[i - 1]) && !(i + 1 < cps.size() && IsCased(cps[i + 1]))) {
    AppendCodePoint(out, 0x3c2);
  } else {
    AppendCodePoint(out, Lower(c));
  }
}

std::string PyLower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const std::u32string cps = Decode(s);
  for (size_t i = 0; i < cps.size(); ++i) AppendLower(out, cps, i);
  return out;
}

std::string PyUpper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : Decode(s)) AppendUpper(out, c);
  return out;
}

// A cased character after an uncased one is upper-cased, others lower-cased.
std::string PyTitle(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  const std::u32string cps = Decode(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    if (IsCased(c)) {
      if (prev_cased) {
        AppendLower(out, cps, i);
      } else {
        AppendCodePoint(out, c == 0xdf ? c : Upper(c));  // ß titlecases to "Ss" in Python; kept as is
      }
      prev_cased = true;
    } else {
      AppendCodePoint(out, c);
      prev_cased = false;
    }
  }
  return out;
}

// The first character upper-cased (title case), the rest lower-cased.
std::string PyCapitalize(std::string_view s) {
  const std::u32string cps = Decode(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      AppendCodePoint(out, Upper(cps[i]));
    } else {
      AppendLower(out, cps, i);
    }
  }
  return out;
}

std::string PySwapCase(std::string_view s) {
  std::string out;
  const std::u32string cps = Decode(s);
  for (size_t i = 0; i < cps.size(); ++i) {
    if (IsLowerCp(cps[i])) {
      AppendUpper(out, cps[i]);
    } else {
      AppendLower(out, cps, i);
    }
  }
  return out;
}

bool PyIsLower(std::string_view s) { return AllCasedAre(s, IsUpperCp); }
bool PyIsUpper(std::string_view s) { return AllCasedAre(s, IsLowerCp); }
bool PyIsAlpha(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80; }
bool PyIsDigit(char32_t c) { return c >= '0' && c <= '9'; }

std::string PyStrip(std::string_view s, std::optional<std::string_view> chars, StripSide side) {
  const std::u32string cps = Decode(s);
  const std::u32string set = chars ? Decode(*chars) : std::u32string();
  auto strip = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : IsPySpace(c); };
  size_t b = 0;
  size_t e = cps.size();
  if (side != StripSide::kRight) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (side != StripSide::kLeft) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return Slice(cps, b, e);
}

std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` before every character and at the end.
    int64_t done = 0;
    for (char32_t c : Decode(s)) {
      if (count < 0 || done < count) {
        out.append(repl);
        ++done;
      }
      AppendCodePoint(out, c);
    }
    if (count < 0 || done < count) out.append(repl);
    return out;
  }
  size_t pos = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(repl);
    pos = hit + old.size();
  }
  out.append(s.substr(pos));
  return out;
}

std::vector<std::string> PySplit(std::string_view s, std::optional<std::string_view> sep, int64_t maxsplit,
                                 bool from_right) {
  if (!sep) return SplitWhitespace(s, maxsplit, from_right);
  return from_right ? RSplitAt(s, *sep, maxsplit) : SplitAt(s, *sep, maxsplit);
}

std::vector<std::string> PySplitLines(std::string_view s, bool keepends) {
  std::vector<std::string> lines;
  const std::u32string cps = Decode(s);
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    size_t end = i + 1;
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') end = i + 2;
    lines.push_back(Slice(cps, start, keepends ? end : i));
    start = end;
    i = end - 1;
  }
  if (start < cps.size()) lines.push_back(Slice(cps, start, cps.size()));
  return lines;
}

std::optional<int64_t> PyIntOf(std::string_view text, int base) {
  std::string digits;
  for (char c : PyStrip(text)) {
    if (c != '_') digits.push_back(c);
  }
  if (digits.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, base);
  if (errno != 0 || end != digits.c_str() + digits.size()) return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<double> PyFloatOf(std::string_view text) {
  const std::string s = PyStrip(text);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

}  // namespace strata::chat_template
