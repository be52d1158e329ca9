// jinja2's filters and tests, the str/list/dict methods the immutable sandbox allows, the globals
// transformers' environment has, and transformers' tojson. Each follows the Python function of the same
// name in jinja2/filters.py, jinja2/tests.py, jinja2/sandbox.py or transformers' chat_template_utils.py.

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/interpreter.h"

namespace strata::chat_template {

using base::StrCat;
namespace {

bool IsIntLike(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kBool; }
int64_t AsInt(const Value& v) { return v.kind == Kind::kBool ? static_cast<int64_t>(v.boolean) : v.integer; }
double AsDouble(const Value& v) { return v.kind == Kind::kFloat ? v.number : static_cast<double>(AsInt(v)); }

// Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic: the scripts chat text
// in Latin, Greek and Cyrillic letters uses. Python maps all of Unicode (and ß to "SS", which Upper does
// as a special case in CaseMap); other scripts stay as they are here.
// Python's str.upper/lower per code point: Unicode's simple case mappings (utf8proc, Debian's, as the
// tokenizer uses). Python applies the full mappings where they differ (the few that turn one code point into
// several, such as U+00DF to "SS"); those keep the code point here.
char32_t Upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t Lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }

bool IsUpperCp(char32_t c) { return Lower(c) != c; }
bool IsLowerCp(char32_t c) { return Upper(c) != c || c == 0xdf || c == 0x138 || c == 0x149; }
bool IsCased(char32_t c) { return IsUpperCp(c) || IsLowerCp(c); }
bool IsAlpha(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80; }
bool IsDigitCp(char32_t c) { return c >= '0' && c <= '9'; }

void AppendUpper(std::string& out, char32_t c) {
  if (c == 0xdf) {
    out += "SS";  // Python's full case mapping of ß
  } else {
    AppendCodePoint(out, Upper(c));
  }
}

// The lower case of cps[i], with Python's two context rules: İ becomes "i" + combining dot, and a capital
// sigma that ends a word (a cased letter before it, none after) becomes the final sigma ς.
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

std::string LowerStr(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const std::u32string cps = Decode(s);
  for (size_t i = 0; i < cps.size(); ++i) AppendLower(out, cps, i);
  return out;
}

std::string UpperStr(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : Decode(s)) AppendUpper(out, c);
  return out;
}

// Python's str.title(): a cased character after an uncased one is upper-cased, others lower-cased.
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

// Python's str.capitalize(): the first character upper-cased (title case), the rest lower-cased.
std::string Capitalize(std::string_view s) {
  std::u32string cps = Decode(s);
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

// str.strip(chars): whitespace when `chars` is None.
std::string Strip(std::string_view s, const Value* chars, bool left, bool right) {
  std::u32string cps = Decode(s);
  std::u32string set;
  const bool whitespace = chars == nullptr || chars->is_none();
  if (!whitespace) set = Decode(chars->str());
  auto strip = [&](char32_t c) { return whitespace ? IsPySpace(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0;
  size_t e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return Encode(std::u32string_view(cps).substr(b, e - b));
}

// str.replace(old, new, count).
std::string Replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` before every character and at the end.
    std::u32string cps = Decode(s);
    int64_t done = 0;
    for (char32_t c : cps) {
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
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(repl);
    pos = hit + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

// str.split(sep, maxsplit) / str.rsplit.
std::vector<std::string> Split(std::string_view s, const Value* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep == nullptr || sep->is_none()) {
    std::u32string cps = Decode(s);
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
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
      for (auto [b, e] : words) parts.push_back(Encode(std::u32string_view(cps).substr(b, e - b)));
      return parts;
    }
    const size_t n = static_cast<size_t>(maxsplit);
    if (!from_right) {
      for (size_t k = 0; k < n; ++k)
        parts.push_back(Encode(std::u32string_view(cps).substr(words[k].first, words[k].second - words[k].first)));
      size_t b = words[n].first;
      size_t e = cps.size();
      while (e > b && IsPySpace(cps[e - 1])) --e;
      parts.push_back(Encode(std::u32string_view(cps).substr(b, e - b)));
    } else {
      const size_t first = words.size() - n;
      size_t b = 0;
      while (b < cps.size() && IsPySpace(cps[b])) ++b;
      parts.push_back(Encode(std::u32string_view(cps).substr(b, words[first - 1].second - b)));
      for (size_t k = first; k < words.size(); ++k) {
        parts.push_back(Encode(std::u32string_view(cps).substr(words[k].first, words[k].second - words[k].first)));
      }
    }
    return parts;
  }
  const std::string& d = sep->str();
  if (!from_right) {
    size_t pos = 0;
    int64_t done = 0;
    while (maxsplit < 0 || done < maxsplit) {
      const size_t hit = s.find(d, pos);
      if (hit == std::string_view::npos) break;
      parts.emplace_back(s.substr(pos, hit - pos));
      pos = hit + d.size();
      ++done;
    }
    parts.emplace_back(s.substr(pos));
    return parts;
  }
  size_t end = s.size();
  int64_t done = 0;
  std::vector<std::string> reversed;
  while (maxsplit < 0 || done < maxsplit) {
    if (end < d.size()) break;
    const size_t hit = s.rfind(d, end - d.size());
    if (hit == std::string_view::npos) break;
    reversed.emplace_back(s.substr(hit + d.size(), end - hit - d.size()));
    end = hit;
    ++done;
  }
  reversed.emplace_back(s.substr(0, end));
  return std::vector<std::string>(reversed.rbegin(), reversed.rend());
}

// str.splitlines(keepends).
std::vector<std::string> SplitLines(std::string_view s, bool keepends) {
  std::vector<std::string> lines;
  std::u32string cps = Decode(s);
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    size_t end = i + 1;
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') end = i + 2;
    lines.push_back(Encode(std::u32string_view(cps).substr(start, (keepends ? end : i) - start)));
    start = end;
    i = end - 1;
  }
  if (start < cps.size()) lines.push_back(Encode(std::u32string_view(cps).substr(start)));
  return lines;
}

// What jinja2's generator filters return (select, map, unique, batch, items, ...).
Value Lazy(Interpreter& in, std::vector<Value> items, const char* python_type = "generator") {
  Value v = in.MakeList(std::move(items));
  auto data = std::make_shared<ListData>(*v.list);
  data->python_type = python_type;
  data->lazy = true;
  v.list = std::move(data);
  return v;
}

// dict.keys() / values() / items(): sized, iterable, not subscriptable.
Value View(Interpreter& in, std::vector<Value> items, const char* python_type) {
  Value v = in.MakeList(std::move(items));
  auto data = std::make_shared<ListData>(*v.list);
  data->python_type = python_type;
  v.list = std::move(data);
  return v;
}

Value StringList(Interpreter& in, const std::vector<std::string>& parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const auto& p : parts) items.push_back(in.MakeString(p));
  return in.MakeList(std::move(items));
}

const Value* Opt(const std::vector<std::optional<Value>>& a, size_t i) { return a[i].has_value() ? &*a[i] : nullptr; }

std::string RequireStr(Interpreter& in, const Value* v, std::string_view what) {
  if (v == nullptr || !v->is_string()) {
    in.Fail("TypeError",
            StrCat(absl::string_view(what.data(), what.size()), " must be str, not ", v ? TypeName(*v) : "nothing"));
  }
  return v->str();
}

int64_t RequireInt(Interpreter& in, const Value* v, std::string_view what) {
  if (v == nullptr || !IsIntLike(*v)) {
    in.Fail("TypeError", StrCat(absl::string_view(what.data(), what.size()), " must be an integer, not ",
                                v ? TypeName(*v) : "nothing"));
  }
  return AsInt(*v);
}

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0 (environment.getitem).
Value GetAttribute(Interpreter& in, const Value& item, const Value& attribute) {
  if (IsIntLike(attribute)) return in.GetItem(item, attribute);
  if (!attribute.is_string()) return in.GetItem(item, attribute);
  Value v = item;
  const std::string& path = attribute.str();
  size_t begin = 0;
  while (true) {
    const size_t dot = path.find('.', begin);
    const std::string part = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    bool digits = !part.empty() && part.size() < 18;
    for (char c : part) digits = digits && c >= '0' && c <= '9';
    if (v.is_undefined()) return v;
    v = in.GetItem(v, digits ? Value::Int(std::stoll(part)) : Value::String(part));
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  return v;
}

// jinja2's ignore_case: strings compare lower-cased unless case_sensitive.
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(LowerStr(v.str()));
  return v;
}

void SortValues(Interpreter& in, std::vector<std::pair<Value, Value>>& keyed, bool reverse) {
  bool ok = true;
  in.Charge(keyed.size() * 16);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    bool this_ok = true;
    const bool r = reverse ? Less(b.first, a.first, &this_ok) : Less(a.first, b.first, &this_ok);
    ok = ok && this_ok;
    return this_ok && r;
  });
  if (!ok) in.Fail("TypeError", "'<' not supported between the items being sorted");
}

size_t Length(Interpreter& in, const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return CodePointCount(v.str());
    case Kind::kList:
      if (v.list->lazy) break;
      return v.list->items.size();
    case Kind::kDict:
      if (!v.dict->is_namespace) return v.dict->entries.size();
      break;
    default:
      break;
  }
  in.Fail("TypeError", StrCat("object of type '", TypeName(v), "' has no len()"));
}

std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Python's int(str) after jinja2's do_int: base prefixes, underscores, surrounding whitespace.
std::optional<int64_t> ParseInt(std::string_view text, int base) {
  std::string s = Strip(text, nullptr, true, true);
  std::string digits;
  for (char c : s) {
    if (c != '_') digits.push_back(c);
  }
  if (digits.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, base);
  if (errno != 0 || end != digits.c_str() + digits.size()) return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<double> ParseFloat(std::string_view text) {
  std::string s = Strip(text, nullptr, true, true);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

// Python's round(x, n) for floats: round-half-even on the decimal value.
double PyRound(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits > 300) return x;
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::max<int64_t>(ndigits, 0)), x);
  if (ndigits >= 0) return std::strtod(buf, nullptr);
  const double p = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / p) * p;
}

void JsonString(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t c : Decode(s)) {
    if (AppendJsonEscape(out, c)) continue;
    if (ensure_ascii && c > 0x7e) {
      char buf[16];
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (v >> 10)),
                      static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      AppendCodePoint(out, c);
    }
  }
  out.push_back('"');
}

struct JsonOptions {
  bool ensure_ascii;
  std::optional<std::string> indent;
  std::string item_sep;
  std::string key_sep;
  bool sort_keys;
};

void JsonEncode(Interpreter& in, std::string& out, const Value& v, const JsonOptions& o, int level) {
  in.Step();
  if (out.size() > in.limits().max_output_bytes) in.Fail("LimitError", "tojson output exceeds the output cap");
  auto newline = [&](int l) {
    if (!o.indent) return;
    out.push_back('\n');
    for (int i = 0; i < l; ++i) out += *o.indent;
  };
  switch (v.kind) {
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kBool:
      out += v.boolean ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(v.integer);
      return;
    case Kind::kFloat:
      if (std::isnan(v.number)) {
        out += "NaN";
      } else if (std::isinf(v.number)) {
        out += v.number > 0 ? "Infinity" : "-Infinity";
      } else {
        out += FloatRepr(v.number);
      }
      return;
    case Kind::kString:
      JsonString(out, v.str(), o.ensure_ascii);
      return;
    case Kind::kList: {
      if (!v.list->range_repr.empty() || !v.list->python_type.empty()) break;  // range, generator, dict view
      if (v.list->items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      newline(level + 1);
      bool first = true;
      for (const Value& item : v.list->items) {
        if (!first) {
          out += o.item_sep;
          newline(level + 1);
        }
        first = false;
        JsonEncode(in, out, item, o, level + 1);
      }
      newline(level);
      out.push_back(']');
      return;
    }
    case Kind::kDict: {
      if (v.dict->is_namespace) break;
      if (v.dict->entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<Value, Value>> entries = v.dict->entries;
      if (o.sort_keys) SortValues(in, entries, false);
      out.push_back('{');
      newline(level + 1);
      bool first = true;
      for (const auto& [key, value] : entries) {
        if (!first) {
          out += o.item_sep;
          newline(level + 1);
        }
        first = false;
        switch (key.kind) {
          case Kind::kString:
            JsonString(out, key.str(), o.ensure_ascii);
            break;
          case Kind::kNone:
            out += "\"null\"";
            break;
          case Kind::kBool:
            out += key.boolean ? "\"true\"" : "\"false\"";
            break;
          case Kind::kInt:
            absl::StrAppend(&out, "\"", key.integer, "\"");
            break;
          case Kind::kFloat: {
            std::string f;
            JsonEncode(in, f, key, o, level);
            absl::StrAppend(&out, "\"", f, "\"");
            break;
          }
          default:
            in.Fail("TypeError", StrCat("keys must be str, int, float, bool or None, not ", TypeName(key)));
        }
        out += o.key_sep;
        JsonEncode(in, out, value, o, level + 1);
      }
      newline(level);
      out.push_back('}');
      return;
    }
    default:
      break;
  }
  in.Fail("TypeError", StrCat("Object of type ", v.is_list() && !v.list->range_repr.empty() ? "range" : TypeName(v),
                              " is not JSON serializable"));
}

// Python's str() of a value for string filters (Undefined is "").
std::string S(const Value& v) { return ToStr(v); }

// The |items filter (a generator) and dict.items() (a view).
Value Items(Interpreter& in, const Value& v, bool view) {
  if (v.is_undefined()) return Lazy(in, {});
  if (!v.is_dict() || v.dict->is_namespace) in.Fail("TypeError", "Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [key, value] : v.dict->entries) pairs.push_back(Value::List({key, value}, /*is_tuple=*/true));
  return view ? View(in, std::move(pairs), "dict_items") : Lazy(in, std::move(pairs));
}

// select/reject/selectattr/rejectattr: keep items whose test (truthiness without one) is `keep`.
Value SelectOrReject(Interpreter& in, const Value& seq, CallArgs& args, bool keep, bool by_attribute) {
  std::vector<Value> rest = args.positional;
  Value attribute;
  if (by_attribute) {
    if (rest.empty()) in.Fail("TypeError", "Missing parameter for attribute name");
    attribute = rest[0];
    rest.erase(rest.begin());
  }
  std::string test;
  if (!rest.empty()) {
    if (!rest[0].is_string()) in.Fail("TypeError", "the test name must be a string");
    test = rest[0].str();
    rest.erase(rest.begin());
  }
  std::vector<Value> out;
  if (!Truthy(seq)) return Lazy(in, {});  // jinja2: `if value:` guards the loop (None selects nothing)
  for (const Value& item : in.Iterate(seq)) {
    in.Step();
    const Value subject = by_attribute ? GetAttribute(in, item, attribute) : item;
    bool passed;
    if (test.empty()) {
      passed = Truthy(subject);
    } else {
      CallArgs test_args;
      test_args.positional = rest;
      test_args.keywords = args.keywords;
      passed = CallTest(in, test, subject, test_args);
    }
    if (passed == keep) out.push_back(item);
  }
  return Lazy(in, std::move(out));
}

Value MapFilter(Interpreter& in, const Value& seq, CallArgs& args) {
  std::vector<Value> out;
  if (!Truthy(seq)) return Lazy(in, {});  // jinja2: `if value:` guards the loop (None maps to nothing)
  std::optional<Value> attribute;
  std::optional<Value> dflt;
  for (auto& [key, value] : args.keywords) {
    if (key == "attribute") {
      attribute = value;
    } else if (key == "default") {
      dflt = value;
    } else if (!attribute) {
      in.Fail("TypeError", StrCat("map() got an unexpected keyword argument '", key, "'"));
    }
  }
  if (attribute) {
    for (const Value& item : in.Iterate(seq)) {
      in.Step();
      Value v = GetAttribute(in, item, *attribute);
      out.push_back(v.is_undefined() && dflt ? *dflt : v);
    }
    return Lazy(in, std::move(out));
  }
  if (args.positional.empty()) in.Fail("TypeError", "map requires a filter argument");
  if (!args.positional[0].is_string()) in.Fail("TypeError", "the filter name must be a string");
  const std::string filter = args.positional[0].str();
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  for (const Value& item : in.Iterate(seq)) {
    in.Step();
    CallArgs a = rest;
    out.push_back(CallFilter(in, filter, item, a));
  }
  return Lazy(in, std::move(out));
}

// jinja2's do_indent.
std::string Indent(std::string s, const Value& width, bool first, bool blank) {
  const std::string indention = width.is_string() ? width.str() : std::string(std::max<int64_t>(0, AsInt(width)), ' ');
  s += "\n";
  std::vector<std::string> lines = SplitLines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        if (!lines[i].empty()) rv += indention;
        rv += lines[i];
      }
    }
  }
  if (first) rv = indention + rv;
  return rv;
}

// jinja2's do_title: words split at runs of "-", whitespace and opening brackets.
std::string JinjaTitle(std::string_view s) {
  std::string out;
  std::u32string cps = Decode(s);
  auto sep = [](char32_t c) { return c == '-' || IsPySpace(c) || c == '(' || c == '{' || c == '[' || c == '<'; };
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    const bool is_sep = sep(cps[i]);
    while (j < cps.size() && sep(cps[j]) == is_sep) ++j;
    std::u32string_view part = std::u32string_view(cps).substr(i, j - i);
    if (is_sep) {
      out += Encode(part);
    } else {
      AppendUpper(out, part[0]);
      for (size_t k = 1; k < part.size(); ++k) AppendLower(out, part, k);
    }
    i = j;
  }
  return out;
}

}  // namespace

std::string HtmlEscape(std::string_view s) { return Escape(s); }

std::vector<std::optional<Value>> BindArgs(Interpreter& in, std::string_view what, CallArgs& args,
                                           const std::vector<std::string_view>& names) {
  const absl::string_view w(what.data(), what.size());
  std::vector<std::optional<Value>> bound(names.size());
  if (args.positional.size() > names.size()) {
    in.Fail("TypeError",
            StrCat(w, "() takes at most ", names.size(), " arguments (", args.positional.size(), " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (auto& [key, value] : args.keywords) {
    size_t i = 0;
    while (i < names.size() && names[i] != key) ++i;
    if (i == names.size()) in.Fail("TypeError", StrCat(w, "() got an unexpected keyword argument '", key, "'"));
    if (bound[i].has_value()) in.Fail("TypeError", StrCat(w, "() got multiple values for argument '", key, "'"));
    bound[i] = value;
  }
  return bound;
}

std::string JsonDumps(Interpreter& in, const Value& v, bool ensure_ascii, const Value& indent,
                      const std::string& item_sep, const std::string& key_sep, bool sort_keys) {
  JsonOptions o{ensure_ascii, std::nullopt, item_sep, key_sep, sort_keys};
  if (indent.is_string()) {
    o.indent = indent.str();
  } else if (IsIntLike(indent)) {
    o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(AsInt(indent), 0, 1024)), ' ');
  } else if (!indent.is_none()) {
    in.Fail("TypeError", "tojson: indent must be an integer, a string or None");
  }
  std::string out;
  JsonEncode(in, out, v, o, 0);
  return out;
}

Value CallFilter(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  in.Step();
  auto bind = [&](std::vector<std::string_view> names) { return BindArgs(in, name, args, names); };
  // soft_str keeps a Markup a Markup through the string filters.
  auto keep_markup = [&](Value out) {
    out.markup = v.is_string() && v.markup;
    return out;
  };
  if (name == "tojson") {
    auto a = bind({"ensure_ascii", "indent", "separators", "sort_keys"});
    const Value indent = a[1].value_or(Value::None());
    std::string item_sep = indent.is_none() ? ", " : ",";
    std::string key_sep = ": ";
    if (a[2] && !a[2]->is_none()) {
      std::vector<Value> seps = in.Iterate(*a[2]);
      if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
        in.Fail("ValueError", "tojson: separators must be a pair of strings");
      }
      item_sep = seps[0].str();
      key_sep = seps[1].str();
    }
    return in.MakeString(JsonDumps(in, v, a[0] && Truthy(*a[0]), indent, item_sep, key_sep, a[3] && Truthy(*a[3])));
  }
  if (name == "trim") {
    auto a = bind({"chars"});
    if (a[0] && !a[0]->is_none() && !a[0]->is_string()) in.Fail("TypeError", "trim: chars must be a string");
    return keep_markup(in.MakeString(Strip(S(v), Opt(a, 0), true, true)));
  }
  if (name == "length" || name == "count") {
    bind({});
    return Value::Int(static_cast<int64_t>(Length(in, v)));
  }
  if (name == "upper") return bind({}), keep_markup(in.MakeString(UpperStr(S(v))));
  if (name == "lower") return bind({}), keep_markup(in.MakeString(LowerStr(S(v))));
  if (name == "title") return bind({}), keep_markup(in.MakeString(JinjaTitle(S(v))));
  if (name == "capitalize") return bind({}), keep_markup(in.MakeString(Capitalize(S(v))));
  if (name == "string") return bind({}), v.is_string() ? v : in.MakeString(S(v));
  if (name == "safe" || name == "forceescape" || name == "e" || name == "escape") {
    bind({});
    Value out;
    if (name == "safe" || (v.is_string() && v.markup && name != "forceescape")) {
      out = v.is_string() ? v : in.MakeString(S(v));
    } else {
      out = in.MakeString(Escape(S(v)));
    }
    out.markup = true;
    return out;
  }
  if (name == "replace") {
    auto a = bind({"old", "new", "count"});
    if (!a[0] || !a[1]) in.Fail("TypeError", "replace() takes at least 2 arguments");
    const std::string old_s = S(*a[0]);
    const std::string new_s = S(*a[1]);
    const int64_t count = a[2] && !a[2]->is_none() ? RequireInt(in, Opt(a, 2), "replace count") : -1;
    const std::string s = S(v);
    if (!old_s.empty()) {
      // Bound the result before building it: each hit may grow the text.
      size_t hits = 0;
      for (size_t p = s.find(old_s); p != std::string::npos; p = s.find(old_s, p + old_s.size())) ++hits;
      if (new_s.size() > old_s.size() &&
          s.size() + hits * (new_s.size() - old_s.size()) > in.limits().max_output_bytes) {
        in.Fail("LimitError", "replace: the result exceeds the output cap");
      }
    } else if ((CodePointCount(s) + 1) * new_s.size() + s.size() > in.limits().max_output_bytes) {
      in.Fail("LimitError", "replace: the result exceeds the output cap");
    }
    return in.MakeString(Replace(s, old_s, new_s, count));
  }
  if (name == "join") {
    auto a = bind({"d", "attribute"});
    const std::string sep = a[0] ? S(*a[0]) : "";
    std::string out;
    bool first = true;
    for (const Value& item : in.Iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += S(a[1] && !a[1]->is_none() ? GetAttribute(in, item, *a[1]) : item);
      if (out.size() > in.limits().max_output_bytes) in.Fail("LimitError", "join: the result exceeds the output cap");
      in.Step();
    }
    return in.MakeString(std::move(out));
  }
  if (name == "default" || name == "d") {
    auto a = bind({"default_value", "boolean"});
    const bool boolean = a[1] && Truthy(*a[1]);
    if (v.is_undefined() || (boolean && !Truthy(v))) return a[0].value_or(Value::String(""));
    return v;
  }
  if (name == "first") {
    bind({});
    if (v.is_list())
      return v.list->items.empty() ? Value::Undefined("No first item, sequence was empty.") : v.list->items.front();
    std::vector<Value> items = in.Iterate(v);
    return items.empty() ? Value::Undefined("No first item, sequence was empty.") : items.front();
  }
  if (name == "last") {
    bind({});
    if (v.is_list() && v.list->lazy) {
      in.Fail("TypeError", StrCat("'", v.list->python_type, "' object is not reversible"));
    }
    if (v.is_list())
      return v.list->items.empty() ? Value::Undefined("No last item, sequence was empty.") : v.list->items.back();
    std::vector<Value> items = in.Iterate(v);
    return items.empty() ? Value::Undefined("No last item, sequence was empty.") : items.back();
  }
  if (name == "list") return bind({}), in.MakeList(in.Iterate(v));
  if (name == "items") return bind({}), Items(in, v, /*view=*/false);
  if (name == "selectattr") return SelectOrReject(in, v, args, true, true);
  if (name == "rejectattr") return SelectOrReject(in, v, args, false, true);
  if (name == "select") return SelectOrReject(in, v, args, true, false);
  if (name == "reject") return SelectOrReject(in, v, args, false, false);
  if (name == "map") return MapFilter(in, v, args);
  if (name == "int") {
    auto a = bind({"default", "base"});
    const Value dflt = a[0].value_or(Value::Int(0));
    const int64_t base = a[1] ? RequireInt(in, Opt(a, 1), "int base") : 10;
    if (v.is_undefined()) in.FailUndefined(v);  // int(Undefined) raises UndefinedError, not the default
    if (v.is_string()) {
      if (auto i = ParseInt(v.str(), static_cast<int>(base))) return Value::Int(*i);
      if (auto f = ParseFloat(v.str()); f && std::isfinite(*f) && std::fabs(*f) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(*f));
      }
      return dflt;
    }
    if (IsIntLike(v)) return Value::Int(AsInt(v));
    if (v.kind == Kind::kFloat) {
      if (!std::isfinite(v.number) || std::fabs(v.number) >= 9.2e18) return dflt;
      return Value::Int(static_cast<int64_t>(v.number));
    }
    return dflt;
  }
  if (name == "float") {
    auto a = bind({"default"});
    const Value dflt = a[0].value_or(Value::Float(0));
    if (v.is_undefined()) in.FailUndefined(v);
    if (v.is_string()) {
      if (auto f = ParseFloat(v.str())) return Value::Float(*f);
      return dflt;
    }
    if (v.is_number()) return Value::Float(AsDouble(v));
    return dflt;
  }
  if (name == "abs") {
    bind({});
    if (v.kind == Kind::kFloat) return Value::Float(std::fabs(v.number));
    if (IsIntLike(v)) {
      if (AsInt(v) == INT64_MIN) in.Fail("OverflowError", "integer overflow (strata's integers are 64-bit)");
      return Value::Int(std::abs(AsInt(v)));
    }
    if (v.is_undefined()) in.FailUndefined(v);
    in.Fail("TypeError", StrCat("bad operand type for abs(): '", TypeName(v), "'"));
  }
  if (name == "round") {
    auto a = bind({"precision", "method"});
    const int64_t precision = a[0] ? RequireInt(in, Opt(a, 0), "round precision") : 0;
    const std::string method = a[1] ? S(*a[1]) : "common";
    if (v.is_undefined()) in.FailUndefined(v);
    if (!v.is_number()) in.Fail("TypeError", StrCat("type ", TypeName(v), " doesn't define __round__"));
    if (method == "common") {
      if (IsIntLike(v)) return Value::Int(AsInt(v));
      return Value::Float(PyRound(v.number, precision));
    }
    if (method != "ceil" && method != "floor") in.Fail("FilterArgumentError", "method must be common, ceil or floor");
    const double p = std::pow(10.0, static_cast<double>(precision));
    const double x = AsDouble(v) * p;
    return Value::Float((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
  }
  if (name == "indent") {
    auto a = bind({"width", "first", "blank"});
    const Value width = a[0].value_or(Value::Int(4));
    if (!width.is_string() && !IsIntLike(width)) in.Fail("TypeError", "indent: width must be an integer or a string");
    const std::string s = S(v);
    const size_t unit =
        width.is_string() ? width.str().size() : static_cast<size_t>(std::max<int64_t>(0, AsInt(width)));
    if (unit > in.limits().max_output_bytes ||
        (std::count(s.begin(), s.end(), '\n') + 2) * unit + s.size() > in.limits().max_output_bytes) {
      in.Fail("LimitError", "indent: the result exceeds the output cap");
    }
    return keep_markup(in.MakeString(Indent(s, width, a[1] && Truthy(*a[1]), a[2] && Truthy(*a[2]))));
  }
  if (name == "unique") {
    auto a = bind({"case_sensitive", "attribute"});
    const bool cs = a[0] && Truthy(*a[0]);
    std::vector<Value> out;
    std::vector<Value> seen;
    absl::flat_hash_map<std::string, bool> seen_keys;
    for (const Value& item : in.Iterate(v)) {
      in.Step();
      const Value key = SortKey(a[1] && !a[1]->is_none() ? GetAttribute(in, item, *a[1]) : item, cs);
      const std::string k = KeyOf(key);
      if (k.empty()) in.Fail("TypeError", StrCat("unhashable type: '", TypeName(key), "'"));
      if (seen_keys.emplace(k, true).second) out.push_back(item);
    }
    return Lazy(in, std::move(out));
  }
  if (name == "sort") {
    auto a = bind({"reverse", "case_sensitive", "attribute"});
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value& item : in.Iterate(v)) {
      const Value key = a[2] && !a[2]->is_none() ? GetAttribute(in, item, *a[2]) : item;
      keyed.emplace_back(SortKey(key, a[1] && Truthy(*a[1])), item);
    }
    SortValues(in, keyed, a[0] && Truthy(*a[0]));
    std::vector<Value> out;
    for (auto& [key, item] : keyed) out.push_back(std::move(item));
    return in.MakeList(std::move(out));
  }
  if (name == "dictsort") {
    auto a = bind({"case_sensitive", "by", "reverse"});
    if (!v.is_dict() || v.dict->is_namespace) in.Fail("TypeError", "dictsort: expected a mapping");
    const std::string by = a[1] ? S(*a[1]) : "key";
    if (by != "key" && by != "value")
      in.Fail("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
    std::vector<std::pair<Value, Value>> keyed;
    for (const auto& [key, value] : v.dict->entries) {
      keyed.emplace_back(SortKey(by == "key" ? key : value, a[0] && Truthy(*a[0])), Value::List({key, value}, true));
    }
    SortValues(in, keyed, a[2] && Truthy(*a[2]));
    std::vector<Value> out;
    for (auto& [key, item] : keyed) out.push_back(std::move(item));
    return in.MakeList(std::move(out));
  }
  if (name == "reverse") {
    bind({});
    if (v.is_string()) {
      std::u32string cps = Decode(v.str());
      std::reverse(cps.begin(), cps.end());
      return in.MakeString(Encode(cps));
    }
    const bool reversible = v.is_list() && !v.list->lazy;  // reversed() works; else list(value) reversed
    std::vector<Value> items = in.Iterate(v);
    std::reverse(items.begin(), items.end());
    if (reversible) return Lazy(in, std::move(items), v.list->is_tuple ? "reversed" : "list_reverseiterator");
    return in.MakeList(std::move(items));
  }
  if (name == "wordcount") {
    bind({});
    int64_t words = 0;
    bool in_word = false;
    for (char32_t c : Decode(S(v))) {
      const bool w = IsAlpha(c) || IsDigitCp(c) || c == '_';
      if (w && !in_word) ++words;
      in_word = w;
    }
    return Value::Int(words);
  }
  if (name == "batch") {
    auto a = bind({"linecount", "fill_with"});
    const int64_t n = RequireInt(in, Opt(a, 0), "batch linecount");
    if (n <= 0) in.Fail("ValueError", "batch: linecount must be positive");
    std::vector<Value> rows;
    std::vector<Value> row;
    for (const Value& item : in.Iterate(v)) {
      row.push_back(item);
      if (static_cast<int64_t>(row.size()) == n) {
        rows.push_back(in.MakeList(std::move(row)));
        row.clear();
      }
    }
    if (!row.empty()) {
      if (a[1] && !a[1]->is_none()) {
        while (static_cast<int64_t>(row.size()) < n) row.push_back(*a[1]);
      }
      rows.push_back(in.MakeList(std::move(row)));
    }
    return Lazy(in, std::move(rows));
  }
  if (name == "sum") {
    auto a = bind({"attribute", "start"});
    Value total = a[1].value_or(Value::Int(0));
    for (const Value& item : in.Iterate(v)) {
      const Value x = a[0] && !a[0]->is_none() ? GetAttribute(in, item, *a[0]) : item;
      if (!x.is_number() || !total.is_number()) in.Fail("TypeError", "sum: unsupported operand types");
      if (IsIntLike(x) && IsIntLike(total)) {
        int64_t r = 0;
        if (__builtin_add_overflow(AsInt(total), AsInt(x), &r)) in.Fail("OverflowError", "integer overflow");
        total = Value::Int(r);
      } else {
        total = Value::Float(AsDouble(total) + AsDouble(x));
      }
    }
    return total;
  }
  if (name == "min" || name == "max") {
    auto a = bind({"case_sensitive", "attribute"});
    std::optional<std::pair<Value, Value>> best;
    for (const Value& item : in.Iterate(v)) {
      const Value key = SortKey(a[1] && !a[1]->is_none() ? GetAttribute(in, item, *a[1]) : item, a[0] && Truthy(*a[0]));
      bool ok = true;
      if (!best || (name == "min" ? Less(key, best->first, &ok) : Less(best->first, key, &ok))) best = {key, item};
      if (!ok) in.Fail("TypeError", StrCat(name, ": the items do not compare"));
    }
    if (!best) return Value::Undefined(StrCat("No aggregated item, sequence was empty."));
    return best->second;
  }
  if (name == "center") {
    auto a = bind({"width"});
    const int64_t width = a[0] ? RequireInt(in, Opt(a, 0), "center width") : 80;
    const std::string s = S(v);
    const int64_t len = static_cast<int64_t>(CodePointCount(s));
    if (width <= len) return in.MakeString(s);
    if (static_cast<uint64_t>(width) > in.limits().max_output_bytes) in.Fail("LimitError", "center: width too large");
    const int64_t pad = width - len;
    const int64_t left = pad / 2 + (pad & width & 1);
    return in.MakeString(std::string(static_cast<size_t>(left), ' ') + s +
                         std::string(static_cast<size_t>(pad - left), ' '));
  }
  if (name == "attr") {
    auto a = bind({"name"});
    return in.GetAttr(v, RequireStr(in, Opt(a, 0), "attr name"));
  }
  in.Fail("TemplateRuntimeError", StrCat("No filter named '", name, "'."));
}

bool CallTest(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  in.Step();
  auto one = [&]() -> Value {
    auto a = BindArgs(in, name, args, {"other"});
    if (!a[0]) in.Fail("TypeError", StrCat("test '", name, "' takes one argument"));
    return *a[0];
  };
  auto none = [&]() { BindArgs(in, name, args, {}); };
  if (name == "defined") return none(), !v.is_undefined();
  if (name == "undefined") return none(), v.is_undefined();
  if (name == "none") return none(), v.is_none();
  if (name == "boolean") return none(), v.kind == Kind::kBool;
  if (name == "true") return none(), v.kind == Kind::kBool && v.boolean;
  if (name == "false") return none(), v.kind == Kind::kBool && !v.boolean;
  if (name == "integer") return none(), v.kind == Kind::kInt;
  if (name == "float") return none(), v.kind == Kind::kFloat;
  if (name == "number") return none(), v.is_number();
  if (name == "string") return none(), v.is_string();
  if (name == "mapping") return none(), v.is_dict() && !v.dict->is_namespace;
  if (name == "iterable") {
    none();
    return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.dict->is_namespace);
  }
  if (name == "sequence") {
    none();
    return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.dict->is_namespace);
  }
  if (name == "callable") return none(), v.kind == Kind::kCallable || v.is_undefined();  // Undefined has __call__
  if (name == "sameas") {
    const Value other = one();
    if (v.kind != other.kind) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.kind == Kind::kBool) return v.boolean == other.boolean;
    if (v.is_list()) return v.list == other.list;
    if (v.is_dict()) return v.dict == other.dict;
    if (v.kind == Kind::kCallable) return v.callable == other.callable;
    return Equals(v, other) && (v.kind == Kind::kInt ? v.integer >= -5 && v.integer <= 256 : false);
  }
  if (name == "eq" || name == "equalto" || name == "==") return Equals(v, one());
  if (name == "ne" || name == "!=") return !Equals(v, one());
  if (name == "lt" || name == "lessthan" || name == "<" || name == "gt" || name == "greaterthan" || name == ">" ||
      name == "le" || name == "<=" || name == "ge" || name == ">=") {
    const Value other = one();
    if (v.is_undefined()) in.FailUndefined(v);
    bool ok = true;
    bool r = false;
    if (name == "lt" || name == "lessthan" || name == "<") r = Less(v, other, &ok);
    if (name == "gt" || name == "greaterthan" || name == ">") r = Less(other, v, &ok);
    if (name == "le" || name == "<=") r = !Less(other, v, &ok);
    if (name == "ge" || name == ">=") r = !Less(v, other, &ok);
    if (!ok)
      in.Fail("TypeError", StrCat("'", name, "' not supported between instances of '", TypeName(v), "' and '",
                                  TypeName(other), "'"));
    return r;
  }
  if (name == "in") {
    const Value container = one();
    switch (container.kind) {
      case Kind::kString:
        if (!v.is_string()) in.Fail("TypeError", "'in <string>' requires string as left operand");
        return container.str().find(v.str()) != std::string::npos;
      case Kind::kList:
        for (const Value& item : container.list->items) {
          if (Equals(item, v)) return true;
        }
        return false;
      case Kind::kDict:
        return !container.dict->is_namespace && container.dict->Find(v) != nullptr;
      case Kind::kUndefined:
        return false;
      default:
        in.Fail("TypeError", StrCat("argument of type '", TypeName(container), "' is not iterable"));
    }
  }
  // jinja2: value % 2 == 1, value % 2 == 0, value % num == 0 (Python's %, floats included).
  if (name == "odd" || name == "even") {
    none();
    const Value rest = in.BinaryOp("%", v, Value::Int(2));
    return Equals(rest, Value::Int(name == "odd" ? 1 : 0));
  }
  if (name == "divisibleby") {
    const Value other = one();
    return Equals(in.BinaryOp("%", v, other), Value::Int(0));
  }
  if (name == "lower" || name == "upper") {
    none();
    bool cased = false;
    for (char32_t c : Decode(ToStr(v))) {
      if (!IsCased(c)) continue;
      cased = true;
      if (name == "lower" ? IsUpperCp(c) : IsLowerCp(c)) return false;
    }
    return cased;
  }
  if (name == "filter" || name == "test") {
    const Value other = one();
    (void)other;
    in.Fail("TemplateRuntimeError", StrCat("test '", name, "' is not supported"));
  }
  in.Fail("TemplateRuntimeError", StrCat("No test named '", name, "'."));
}

std::optional<Value> GetMethod(Interpreter& in, const Value& obj, const std::string& name) {
  (void)in;
  auto unsafe = [&]() {
    return Value::Undefined(StrCat("access to attribute '", name, "' of '", TypeName(obj), "' object is unsafe."),
                            true);
  };
  if (name.size() > 4 && name.rfind("__", 0) == 0 && name.compare(name.size() - 2, 2, "__") == 0) return unsafe();
  auto method = [&](auto fn) {
    Value self = obj;
    return Value::Function(StrCat(TypeName(obj), ".", name),
                           [self, fn, name = name](Interpreter& in, CallArgs& args) { return fn(in, self, args); });
  };
  if (obj.is_string()) {
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      return method([name](Interpreter& in, const Value& self, CallArgs& args) {
        auto a = BindArgs(in, name, args, {"chars"});
        if (a[0] && !a[0]->is_none() && !a[0]->is_string()) in.Fail("TypeError", name + " arg must be None or str");
        return in.MakeString(Strip(self.str(), Opt(a, 0), name != "rstrip", name != "lstrip"));
      });
    }
    if (name == "split" || name == "rsplit") {
      return method([name](Interpreter& in, const Value& self, CallArgs& args) {
        auto a = BindArgs(in, name, args, {"sep", "maxsplit"});
        if (a[0] && !a[0]->is_none() && !a[0]->is_string()) in.Fail("TypeError", "must be str or None");
        if (a[0] && a[0]->is_string() && a[0]->str().empty()) in.Fail("ValueError", "empty separator");
        const int64_t maxsplit = a[1] ? RequireInt(in, Opt(a, 1), "maxsplit") : -1;
        in.Charge(self.str().size());
        return StringList(in, Split(self.str(), Opt(a, 0), maxsplit, name == "rsplit"));
      });
    }
    if (name == "splitlines") {
      return method([](Interpreter& in, const Value& self, CallArgs& args) {
        auto a = BindArgs(in, "splitlines", args, {"keepends"});
        return StringList(in, SplitLines(self.str(), a[0] && Truthy(*a[0])));
      });
    }
    if (name == "startswith" || name == "endswith") {
      return method([name](Interpreter& in, const Value& self, CallArgs& args) {
        auto a = BindArgs(in, name, args, {"prefix", "start", "end"});
        if (!a[0]) in.Fail("TypeError", name + "() takes at least 1 argument (0 given)");
        if (a[1] || a[2]) in.Fail("TypeError", name + "(): start and end are not supported");
        std::vector<Value> options =
            a[0]->is_list() && a[0]->list->is_tuple ? a[0]->list->items : std::vector<Value>{*a[0]};
        const std::string& s = self.str();
        for (const Value& o : options) {
          if (!o.is_string()) {
            in.Fail("TypeError", name + " first arg must be str or a tuple of str, not " + TypeName(o));
          }
          const std::string& p = o.str();
          if (p.size() > s.size()) continue;
          if (name == "startswith" ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0)
            return Value::Bool(true);
        }
        return Value::Bool(false);
      });
    }
    if (name == "replace") {
      return method([](Interpreter& in, const Value& self, CallArgs& args) {
        auto a = BindArgs(in, "replace", args, {"old", "new", "count"});
        const std::string old_s = RequireStr(in, Opt(a, 0), "replace() argument 1");
        const std::string new_s = RequireStr(in, Opt(a, 1), "replace() argument 2");
        const int64_t count = a[2] ? RequireInt(in, Opt(a, 2), "count") : -1;
        CallArgs filter_args;
        filter_args.positional = {Value::String(old_s), Value::String(new_s), Value::Int(count)};
        return CallFilter(in, "replace", self, filter_args);
      });
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase" ||
        name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
        name == "isupper" || name == "isnumeric" || name == "isdecimal") {
      return method([name](Interpreter& in, const Value& self, CallArgs& args) {
        BindArgs(in, name, args, {});
        const std::string& s = self.str();
        if (name == "upper") return in.MakeString(UpperStr(s));
        if (name == "lower") return in.MakeString(LowerStr(s));
        if (name == "title") return in.MakeString(PyTitle(s));
        if (name == "capitalize") return in.MakeString(Capitalize(s));
        if (name == "swapcase") {
          std::string out;
          const std::u32string cps = Decode(s);
          for (size_t i = 0; i < cps.size(); ++i) {
            if (IsLowerCp(cps[i])) {
              AppendUpper(out, cps[i]);
            } else {
              AppendLower(out, cps, i);
            }
          }
          return in.MakeString(std::move(out));
        }
        const std::u32string cps = Decode(s);
        if (name == "islower" || name == "isupper") {
          bool cased = false;
          for (char32_t c : cps) {
            if (!IsCased(c)) continue;
            cased = true;
            if (name == "islower" ? IsUpperCp(c) : IsLowerCp(c)) return Value::Bool(false);
          }
          return Value::Bool(cased);
        }
        if (cps.empty()) return Value::Bool(false);
        for (char32_t c : cps) {
          bool ok = false;
          if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") ok = IsDigitCp(c);
          if (name == "isalpha") ok = IsAlpha(c);
          if (name == "isalnum") ok = IsAlpha(c) || IsDigitCp(c);
          if (name == "isspace") ok = IsPySpace(c);
          if (!ok) return Value::Bool(false);
        }
        return Value::Bool(true);
      });
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
      return method([name](Interpreter& in, const Value& self, CallArgs& args) {
        auto a = BindArgs(in, name, args, {"sub"});
        const std::string sub = RequireStr(in, Opt(a, 0), name + "() argument");
        const std::string& s = self.str();
        in.Charge(s.size());
        if (name == "count") {
          if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointCount(s) + 1));
          int64_t n = 0;
          for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
          return Value::Int(n);
        }
        const size_t p = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
        if (p == std::string::npos) {
          if (name == "index" || name == "rindex") in.Fail("ValueError", "substring not found");
          return Value::Int(-1);
        }
        return Value::Int(static_cast<int64_t>(CodePointCount(std::string_view(s).substr(0, p))));
      });
    }
    if (name == "join") {
      return method([](Interpreter& in, const Value& self, CallArgs& args) {
        auto a = BindArgs(in, "join", args, {"iterable"});
        if (!a[0]) in.Fail("TypeError", "join() takes exactly one argument (0 given)");
        std::string out;
        bool first = true;
        for (const Value& item : in.Iterate(*a[0])) {
          if (!item.is_string())
            in.Fail("TypeError", "sequence item: expected str instance, " + TypeName(item) + " found");
          if (!first) out += self.str();
          first = false;
          out += item.str();
          if (out.size() > in.limits().max_output_bytes)
            in.Fail("LimitError", "join: the result exceeds the output cap");
        }
        return in.MakeString(std::move(out));
      });
    }
    if (name == "format" || name == "format_map") {
      return method([](Interpreter& in, const Value&, CallArgs&) -> Value {
        in.Fail("TemplateRuntimeError", "str.format is not supported");
      });
    }
    return std::nullopt;
  }
  if (obj.is_dict() && !obj.dict->is_namespace) {
    if (name == "items") {
      return method([](Interpreter& in, const Value& self, CallArgs& args) {
        BindArgs(in, "items", args, {});
        return Items(in, self, /*view=*/true);
      });
    }
    if (name == "keys" || name == "values") {
      return method([name](Interpreter& in, const Value& self, CallArgs& args) {
        BindArgs(in, name, args, {});
        std::vector<Value> out;
        for (const auto& [key, value] : self.dict->entries) out.push_back(name == "keys" ? key : value);
        return View(in, std::move(out), name == "keys" ? "dict_keys" : "dict_values");
      });
    }
    if (name == "get") {
      return method([](Interpreter& in, const Value& self, CallArgs& args) {
        auto a = BindArgs(in, "get", args, {"key", "default"});
        if (!a[0]) in.Fail("TypeError", "get expected at least 1 argument, got 0");
        if (KeyOf(*a[0]).empty()) in.Fail("TypeError", StrCat("unhashable type: '", TypeName(*a[0]), "'"));
        if (const Value* v = self.dict->Find(*a[0])) return *v;
        return a[1].value_or(Value::None());
      });
    }
    if (name == "copy") {
      return method([](Interpreter& in, const Value& self, CallArgs& args) {
        BindArgs(in, "copy", args, {});
        auto copy = std::make_shared<DictData>(*self.dict);
        return Value::Dict(std::move(copy));
      });
    }
    if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear") {
      return unsafe();
    }
    return std::nullopt;
  }
  if (obj.is_list()) {
    if (name == "index" || name == "count") {
      return method([name](Interpreter& in, const Value& self, CallArgs& args) {
        auto a = BindArgs(in, name, args, {"value"});
        if (!a[0]) in.Fail("TypeError", name + "() takes exactly one argument (0 given)");
        int64_t n = 0;
        for (size_t i = 0; i < self.list->items.size(); ++i) {
          in.Step();
          if (!Equals(self.list->items[i], *a[0])) continue;
          if (name == "index") return Value::Int(static_cast<int64_t>(i));
          ++n;
        }
        if (name == "index") in.Fail("ValueError", StrCat(Repr(*a[0]), " is not in list"));
        return Value::Int(n);
      });
    }
    if (!obj.list->is_tuple && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                                name == "remove" || name == "reverse" || name == "sort" || name == "clear")) {
      return unsafe();
    }
    return std::nullopt;
  }
  return std::nullopt;
}

void AddGlobals(Frame& frame) {
  frame.vars["range"] = Value::Function("range", [](Interpreter& in, CallArgs& args) {
    auto a = BindArgs(in, "range", args, {"start", "stop", "step"});
    int64_t start = 0;
    int64_t stop = 0;
    int64_t step = 1;
    if (!a[0]) in.Fail("TypeError", "range expected at least 1 argument, got 0");
    if (!a[1]) {
      stop = RequireInt(in, Opt(a, 0), "range() argument");
    } else {
      start = RequireInt(in, Opt(a, 0), "range() argument");
      stop = RequireInt(in, Opt(a, 1), "range() argument");
      if (a[2]) step = RequireInt(in, Opt(a, 2), "range() argument");
    }
    if (step == 0) in.Fail("ValueError", "range() arg 3 must not be zero");
    const __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
    const __int128 abs_step = step > 0 ? step : -static_cast<__int128>(step);
    const __int128 n = span <= 0 ? 0 : (span + abs_step - 1) / abs_step;
    if (n > in.limits().max_range) {
      in.Fail("OverflowError",
              StrCat("Range too big. The sandbox blocks ranges larger than MAX_RANGE (", in.limits().max_range, ")."));
    }
    std::vector<Value> items;
    // Each element lies between start and stop; the product i * step alone may not fit in 64 bits.
    for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) {
      items.push_back(Value::Int(static_cast<int64_t>(static_cast<__int128>(start) + static_cast<__int128>(i) * step)));
    }
    Value v = in.MakeList(std::move(items));
    // Python's range object: iterates as the list, prints as range(...), is not JSON.
    auto data = std::make_shared<ListData>(*v.list);
    data->range_repr =
        step == 1 ? StrCat("range(", start, ", ", stop, ")") : StrCat("range(", start, ", ", stop, ", ", step, ")");
    v.list = std::move(data);
    return v;
  });
  auto make_dict = [](Interpreter& in, CallArgs& args, bool ns) {
    auto dict = std::make_shared<DictData>();
    dict->is_namespace = ns;
    if (args.positional.size() > 1) in.Fail("TypeError", "expected at most 1 positional argument");
    if (!args.positional.empty()) {
      const Value& init = args.positional[0];
      if (init.is_dict() && !init.dict->is_namespace) {
        for (const auto& [key, value] : init.dict->entries) dict->Set(key, value);
      } else {
        for (const Value& pair : in.Iterate(init)) {
          std::vector<Value> kv = in.Iterate(pair);
          if (kv.size() != 2) in.Fail("ValueError", "dictionary update sequence element has the wrong length");
          if (KeyOf(kv[0]).empty()) in.Fail("TypeError", "unhashable type");
          dict->Set(kv[0], kv[1]);
        }
      }
    }
    for (auto& [key, value] : args.keywords) dict->Set(Value::String(key), value);
    if (ns) {
      for (const auto& [key, value] : dict->entries) {
        if (key.is_string() && !key.str().empty() && key.str()[0] == '_') {
          in.Fail("SecurityError", StrCat("Chat templates cannot store underscore-prefixed attributes on a "
                                          "namespace, but got ",
                                          StrRepr(key.str())));
        }
      }
    }
    return Value::Dict(std::move(dict));
  };
  frame.vars["namespace"] =
      Value::Function("namespace", [make_dict](Interpreter& in, CallArgs& args) { return make_dict(in, args, true); });
  frame.vars["dict"] =
      Value::Function("dict", [make_dict](Interpreter& in, CallArgs& args) { return make_dict(in, args, false); });
  frame.vars["raise_exception"] = Value::Function("raise_exception", [](Interpreter& in, CallArgs& args) -> Value {
    auto a = BindArgs(in, "raise_exception", args, {"message"});
    in.Fail("TemplateError", a[0] ? ToStr(*a[0]) : "");
  });
  frame.vars["strftime_now"] = Value::Function("strftime_now", [](Interpreter& in, CallArgs& args) {
    auto a = BindArgs(in, "strftime_now", args, {"format"});
    const std::string format = RequireStr(in, Opt(a, 0), "strftime_now() argument");
    if (format.size() > 1024) in.Fail("ValueError", "strftime_now: format too long");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    std::string out(format.size() * 8 + 64, '\0');
    const size_t n = std::strftime(out.data(), out.size(), format.c_str(), &local);
    out.resize(n);
    return in.MakeString(std::move(out));
  });
}

}  // namespace strata::chat_template
