// jinja2's filters (jinja2/filters.py) and transformers' tojson, as a name -> function table like
// jinja2's FILTERS; DoX is jinja2's do_x. Each function gets the name the template used (aliases such as
// `d` and `default` share one), which argument errors name.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/builtins.h"
#include "chat_template/json_dump.h"
#include "chat_template/py_str.h"

namespace strata::chat_template {

using base::StrCat;
namespace {

using FilterFn = Value (*)(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);

// markupsafe's soft_str: a Markup input stays a Markup through the string filters.
Value KeepMarkup(const Value& input, Value out) {
  out.markup = input.is_string() && input.markup;
  return out;
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

// jinja2's do_indent.
std::string Indent(std::string s, const Value& width, bool first, bool blank) {
  const std::string indention = width.is_string() ? width.str() : std::string(std::max<int64_t>(0, AsInt(width)), ' ');
  s += "\n";
  std::vector<std::string> lines = PySplitLines(s, false);
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

bool IsTrue(const std::optional<Value>& arg) { return arg && Truthy(*arg); }
bool IsGiven(const std::optional<Value>& arg) { return arg && !arg->is_none(); }
// The item, or its `attribute` when one is given (jinja2's make_attrgetter).
Value ItemOrAttribute(Interpreter& in, const Value& item, const std::optional<Value>& attribute) {
  return IsGiven(attribute) ? GetAttribute(in, item, *attribute) : item;
}

// --- strings

Value DoToJson(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  const Value indent = a[1].value_or(Value::None());
  std::string item_sep = indent.is_none() ? ", " : ",";
  std::string key_sep = ": ";
  if (IsGiven(a[2])) {
    std::vector<Value> seps = in.Iterate(*a[2]);
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      in.Fail("ValueError", "tojson: separators must be a pair of strings");
    }
    item_sep = seps[0].str();
    key_sep = seps[1].str();
  }
  return in.MakeString(JsonDumps(in, v, IsTrue(a[0]), indent, item_sep, key_sep, IsTrue(a[3])));
}

Value DoTrim(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"chars"});
  if (a[0] && !a[0]->is_none() && !a[0]->is_string()) in.Fail("TypeError", "trim: chars must be a string");
  return KeepMarkup(v, in.MakeString(PyStrip(ToStr(v), StrOrNone(Opt(a, 0)))));
}

// upper, lower, title, capitalize.
template <std::string (*kCase)(std::string_view)>
Value DoCase(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  return KeepMarkup(v, in.MakeString(kCase(ToStr(v))));
}

Value DoString(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  return v.is_string() ? v : in.MakeString(ToStr(v));
}

// safe marks the text Markup; escape (e) escapes what is not Markup yet; forceescape escapes anyway.
Value DoEscape(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  Value out;
  if (name == "safe" || (v.is_string() && v.markup && name != "forceescape")) {
    out = v.is_string() ? v : in.MakeString(ToStr(v));
  } else {
    out = in.MakeString(HtmlEscape(ToStr(v)));
  }
  out.markup = true;
  return out;
}

Value DoReplace(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"old", "new", "count"});
  if (!a[0] || !a[1]) in.Fail("TypeError", "replace() takes at least 2 arguments");
  const std::string old_s = ToStr(*a[0]);
  const std::string new_s = ToStr(*a[1]);
  const int64_t count = IsGiven(a[2]) ? RequireInt(in, Opt(a, 2), "replace count") : -1;
  const std::string s = ToStr(v);
  if (!old_s.empty()) {
    // Bound the result before building it: each hit may grow the text.
    size_t hits = 0;
    for (size_t p = s.find(old_s); p != std::string::npos; p = s.find(old_s, p + old_s.size())) ++hits;
    if (new_s.size() > old_s.size() && s.size() + hits * (new_s.size() - old_s.size()) > in.limits().max_output_bytes) {
      in.Fail("LimitError", "replace: the result exceeds the output cap");
    }
  } else if ((CodePointCount(s) + 1) * new_s.size() + s.size() > in.limits().max_output_bytes) {
    in.Fail("LimitError", "replace: the result exceeds the output cap");
  }
  return in.MakeString(PyReplace(s, old_s, new_s, count));
}

Value DoJoin(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"d", "attribute"});
  const std::string sep = a[0] ? ToStr(*a[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& item : in.Iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += ToStr(ItemOrAttribute(in, item, a[1]));
    if (out.size() > in.limits().max_output_bytes) in.Fail("LimitError", "join: the result exceeds the output cap");
    in.Step();
  }
  return in.MakeString(std::move(out));
}

Value DoIndent(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"width", "first", "blank"});
  const Value width = a[0].value_or(Value::Int(4));
  if (!width.is_string() && !IsIntLike(width)) in.Fail("TypeError", "indent: width must be an integer or a string");
  const std::string s = ToStr(v);
  const size_t unit = width.is_string() ? width.str().size() : static_cast<size_t>(std::max<int64_t>(0, AsInt(width)));
  if (unit > in.limits().max_output_bytes ||
      (std::count(s.begin(), s.end(), '\n') + 2) * unit + s.size() > in.limits().max_output_bytes) {
    in.Fail("LimitError", "indent: the result exceeds the output cap");
  }
  return KeepMarkup(v, in.MakeString(Indent(s, width, IsTrue(a[1]), IsTrue(a[2]))));
}

Value DoWordCount(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : Decode(ToStr(v))) {
    const bool w = PyIsAlpha(c) || PyIsDigit(c) || c == '_';
    if (w && !in_word) ++words;
    in_word = w;
  }
  return Value::Int(words);
}

Value DoCenter(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"width"});
  const int64_t width = a[0] ? RequireInt(in, Opt(a, 0), "center width") : 80;
  const std::string s = ToStr(v);
  const int64_t len = static_cast<int64_t>(CodePointCount(s));
  if (width <= len) return in.MakeString(s);
  if (static_cast<uint64_t>(width) > in.limits().max_output_bytes) in.Fail("LimitError", "center: width too large");
  const int64_t pad = width - len;
  const int64_t left = pad / 2 + (pad & width & 1);
  return in.MakeString(std::string(static_cast<size_t>(left), ' ') + s +
                       std::string(static_cast<size_t>(pad - left), ' '));
}

// --- values

Value DoLength(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  return Value::Int(static_cast<int64_t>(Length(in, v)));
}

Value DoDefault(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"default_value", "boolean"});
  if (v.is_undefined() || (IsTrue(a[1]) && !Truthy(v))) return a[0].value_or(Value::String(""));
  return v;
}

Value DoAttr(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"name"});
  return in.GetAttr(v, RequireStr(in, Opt(a, 0), "attr name"));
}

Value DoInt(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"default", "base"});
  const Value dflt = a[0].value_or(Value::Int(0));
  const int64_t base = a[1] ? RequireInt(in, Opt(a, 1), "int base") : 10;
  if (v.is_undefined()) in.FailUndefined(v);  // int(Undefined) raises UndefinedError, not the default
  if (v.is_string()) {
    if (auto i = PyIntOf(v.str(), static_cast<int>(base))) return Value::Int(*i);
    if (auto f = PyFloatOf(v.str()); f && std::isfinite(*f) && std::fabs(*f) < 9.2e18) {
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

Value DoFloat(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"default"});
  const Value dflt = a[0].value_or(Value::Float(0));
  if (v.is_undefined()) in.FailUndefined(v);
  if (v.is_string()) {
    if (auto f = PyFloatOf(v.str())) return Value::Float(*f);
    return dflt;
  }
  if (v.is_number()) return Value::Float(AsDouble(v));
  return dflt;
}

Value DoAbs(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  if (v.kind == Kind::kFloat) return Value::Float(std::fabs(v.number));
  if (IsIntLike(v)) {
    if (AsInt(v) == INT64_MIN) in.Fail("OverflowError", "integer overflow (strata's integers are 64-bit)");
    return Value::Int(std::abs(AsInt(v)));
  }
  if (v.is_undefined()) in.FailUndefined(v);
  in.Fail("TypeError", StrCat("bad operand type for abs(): '", TypeName(v), "'"));
}

Value DoRound(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"precision", "method"});
  const int64_t precision = a[0] ? RequireInt(in, Opt(a, 0), "round precision") : 0;
  const std::string method = a[1] ? ToStr(*a[1]) : "common";
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

// --- sequences

Value DoFirst(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  if (v.is_list())
    return v.list->items.empty() ? Value::Undefined("No first item, sequence was empty.") : v.list->items.front();
  std::vector<Value> items = in.Iterate(v);
  return items.empty() ? Value::Undefined("No first item, sequence was empty.") : items.front();
}

Value DoLast(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  if (v.is_list() && v.list->lazy) {
    in.Fail("TypeError", StrCat("'", v.list->python_type, "' object is not reversible"));
  }
  if (v.is_list())
    return v.list->items.empty() ? Value::Undefined("No last item, sequence was empty.") : v.list->items.back();
  std::vector<Value> items = in.Iterate(v);
  return items.empty() ? Value::Undefined("No last item, sequence was empty.") : items.back();
}

Value DoList(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  return in.MakeList(in.Iterate(v));
}

Value DoItems(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  return Items(in, v, /*view=*/false);
}

// select/reject/selectattr/rejectattr: keep items whose test (truthiness without one) is `kKeep`.
template <bool kKeep, bool kByAttribute>
Value DoSelectOrReject(Interpreter& in, const std::string&, const Value& seq, CallArgs& args) {
  std::vector<Value> rest = args.positional;
  Value attribute;
  if (kByAttribute) {
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
    const Value subject = kByAttribute ? GetAttribute(in, item, attribute) : item;
    bool passed;
    if (test.empty()) {
      passed = Truthy(subject);
    } else {
      CallArgs test_args;
      test_args.positional = rest;
      test_args.keywords = args.keywords;
      passed = CallTest(in, test, subject, test_args);
    }
    if (passed == kKeep) out.push_back(item);
  }
  return Lazy(in, std::move(out));
}

// map(attribute=..., default=...) or map(FILTER, args...).
Value DoMap(Interpreter& in, const std::string&, const Value& seq, CallArgs& args) {
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

Value DoUnique(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"case_sensitive", "attribute"});
  std::vector<Value> out;
  absl::flat_hash_set<std::string> seen;
  for (const Value& item : in.Iterate(v)) {
    in.Step();
    const Value key = SortKey(ItemOrAttribute(in, item, a[1]), IsTrue(a[0]));
    const std::string k = KeyOf(key);
    if (k.empty()) in.Fail("TypeError", StrCat("unhashable type: '", TypeName(key), "'"));
    if (seen.insert(k).second) out.push_back(item);
  }
  return Lazy(in, std::move(out));
}

// The items of sorted (key, item) pairs.
Value SortedItems(Interpreter& in, std::vector<std::pair<Value, Value>>& keyed, bool reverse) {
  SortValues(in, keyed, reverse);
  std::vector<Value> out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return in.MakeList(std::move(out));
}

Value DoSort(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"reverse", "case_sensitive", "attribute"});
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : in.Iterate(v)) {
    keyed.emplace_back(SortKey(ItemOrAttribute(in, item, a[2]), IsTrue(a[1])), item);
  }
  return SortedItems(in, keyed, IsTrue(a[0]));
}

Value DoDictSort(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict() || v.dict->is_namespace) in.Fail("TypeError", "dictsort: expected a mapping");
  const std::string by = a[1] ? ToStr(*a[1]) : "key";
  if (by != "key" && by != "value") in.Fail("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& [key, value] : v.dict->entries) {
    keyed.emplace_back(SortKey(by == "key" ? key : value, IsTrue(a[0])), Value::List({key, value}, true));
  }
  return SortedItems(in, keyed, IsTrue(a[2]));
}

Value DoReverse(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
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

Value DoBatch(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"linecount", "fill_with"});
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
    if (IsGiven(a[1])) {
      while (static_cast<int64_t>(row.size()) < n) row.push_back(*a[1]);
    }
    rows.push_back(in.MakeList(std::move(row)));
  }
  return Lazy(in, std::move(rows));
}

Value DoSum(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"attribute", "start"});
  Value total = a[1].value_or(Value::Int(0));
  for (const Value& item : in.Iterate(v)) {
    const Value x = ItemOrAttribute(in, item, a[0]);
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

// min and max.
Value DoMinMax(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"case_sensitive", "attribute"});
  std::optional<std::pair<Value, Value>> best;
  for (const Value& item : in.Iterate(v)) {
    const Value key = SortKey(ItemOrAttribute(in, item, a[1]), IsTrue(a[0]));
    bool ok = true;
    if (!best || (name == "min" ? Less(key, best->first, &ok) : Less(best->first, key, &ok))) best = {key, item};
    if (!ok) in.Fail("TypeError", StrCat(name, ": the items do not compare"));
  }
  if (!best) return Value::Undefined(StrCat("No aggregated item, sequence was empty."));
  return best->second;
}

const absl::flat_hash_map<std::string_view, FilterFn>& Filters() {
  static const auto* const filters = new absl::flat_hash_map<std::string_view, FilterFn>{
      {"abs", DoAbs},
      {"attr", DoAttr},
      {"batch", DoBatch},
      {"capitalize", DoCase<PyCapitalize>},
      {"center", DoCenter},
      {"count", DoLength},
      {"d", DoDefault},
      {"default", DoDefault},
      {"dictsort", DoDictSort},
      {"e", DoEscape},
      {"escape", DoEscape},
      {"first", DoFirst},
      {"float", DoFloat},
      {"forceescape", DoEscape},
      {"indent", DoIndent},
      {"int", DoInt},
      {"items", DoItems},
      {"join", DoJoin},
      {"last", DoLast},
      {"length", DoLength},
      {"list", DoList},
      {"lower", DoCase<PyLower>},
      {"map", DoMap},
      {"max", DoMinMax},
      {"min", DoMinMax},
      {"reject", DoSelectOrReject<false, false>},
      {"rejectattr", DoSelectOrReject<false, true>},
      {"replace", DoReplace},
      {"reverse", DoReverse},
      {"round", DoRound},
      {"safe", DoEscape},
      {"select", DoSelectOrReject<true, false>},
      {"selectattr", DoSelectOrReject<true, true>},
      {"sort", DoSort},
      {"string", DoString},
      {"sum", DoSum},
      {"title", DoCase<JinjaTitle>},
      {"tojson", DoToJson},
      {"trim", DoTrim},
      {"unique", DoUnique},
      {"upper", DoCase<PyUpper>},
      {"wordcount", DoWordCount},
  };
  return *filters;
}

}  // namespace

std::string HtmlEscape(std::string_view s) {
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

Value CallFilter(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  in.Step();
  const auto& filters = Filters();
  const auto it = filters.find(name);
  if (it == filters.end()) in.Fail("TemplateRuntimeError", StrCat("No filter named '", name, "'."));
  return it->second(in, name, input, args);
}

}  // namespace strata::chat_template
