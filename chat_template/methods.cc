// The methods of str, dict, list and tuple that jinja2's ImmutableSandboxedEnvironment lets a template
// call, as name -> function tables per type; the mutating ones (list.append, dict.update, ...) and every
// dunder are unsafe, as the sandbox's is_safe_attribute and modifies_known_mutable have it.

#include <memory>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/builtins.h"
#include "chat_template/py_str.h"

namespace strata::chat_template {

using base::StrCat;
namespace {

// `self.name(args)`; `name` is the method's, for messages (str.find and str.rfind share a function).
using MethodFn = Value (*)(Interpreter& in, const std::string& name, const Value& self, CallArgs& args);
using MethodTable = absl::flat_hash_map<std::string_view, MethodFn>;
using NameSet = absl::flat_hash_set<std::string_view>;

// --- str

// strip, lstrip, rstrip.
Value StrStrip(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"chars"});
  if (a[0] && !a[0]->is_none() && !a[0]->is_string()) in.Fail("TypeError", name + " arg must be None or str");
  const StripSide side = name == "lstrip" ? StripSide::kLeft : name == "rstrip" ? StripSide::kRight : StripSide::kBoth;
  return in.MakeString(PyStrip(self.str(), StrOrNone(Opt(a, 0)), side));
}

// split, rsplit.
Value StrSplit(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"sep", "maxsplit"});
  if (a[0] && !a[0]->is_none() && !a[0]->is_string()) in.Fail("TypeError", "must be str or None");
  if (a[0] && a[0]->is_string() && a[0]->str().empty()) in.Fail("ValueError", "empty separator");
  const int64_t maxsplit = a[1] ? RequireInt(in, Opt(a, 1), "maxsplit") : -1;
  in.Charge(self.str().size());
  return StringList(in, PySplit(self.str(), StrOrNone(Opt(a, 0)), maxsplit, name == "rsplit"));
}

Value StrSplitLines(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"keepends"});
  return StringList(in, PySplitLines(self.str(), a[0] && Truthy(*a[0])));
}

// startswith, endswith: a str or a tuple of str; start and end are refused.
Value StrStartsOrEndsWith(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"prefix", "start", "end"});
  if (!a[0]) in.Fail("TypeError", name + "() takes at least 1 argument (0 given)");
  if (a[1] || a[2]) in.Fail("TypeError", name + "(): start and end are not supported");
  std::vector<Value> options = a[0]->is_list() && a[0]->list->is_tuple ? a[0]->list->items : std::vector<Value>{*a[0]};
  const std::string& s = self.str();
  for (const Value& o : options) {
    if (!o.is_string()) in.Fail("TypeError", name + " first arg must be str or a tuple of str, not " + TypeName(o));
    const std::string& p = o.str();
    if (p.size() > s.size()) continue;
    if (name == "startswith" ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0)
      return Value::Bool(true);
  }
  return Value::Bool(false);
}

// Python's checks, then the replace filter (which bounds the result).
Value StrReplace(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"old", "new", "count"});
  const std::string old_s = RequireStr(in, Opt(a, 0), "replace() argument 1");
  const std::string new_s = RequireStr(in, Opt(a, 1), "replace() argument 2");
  const int64_t count = a[2] ? RequireInt(in, Opt(a, 2), "count") : -1;
  CallArgs filter_args;
  filter_args.positional = {Value::String(old_s), Value::String(new_s), Value::Int(count)};
  return CallFilter(in, "replace", self, filter_args);
}

// upper, lower, title, capitalize, swapcase.
template <std::string (*kCase)(std::string_view)>
Value StrCase(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  BindArgs(in, name, args, {});
  return in.MakeString(kCase(self.str()));
}

// islower, isupper.
template <bool (*kPredicate)(std::string_view)>
Value StrIsCase(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  BindArgs(in, name, args, {});
  return Value::Bool(kPredicate(self.str()));
}

bool IsAlnum(char32_t c) { return PyIsAlpha(c) || PyIsDigit(c); }

// isdigit, isnumeric, isdecimal, isalpha, isalnum, isspace: non-empty, and every character is one.
template <bool (*kClass)(char32_t)>
Value StrIsClass(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  BindArgs(in, name, args, {});
  const std::u32string cps = Decode(self.str());
  if (cps.empty()) return Value::Bool(false);
  for (char32_t c : cps) {
    if (!kClass(c)) return Value::Bool(false);
  }
  return Value::Bool(true);
}

// find, rfind, index, rindex (code point positions), count.
Value StrFind(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
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
}

Value StrJoin(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"iterable"});
  if (!a[0]) in.Fail("TypeError", "join() takes exactly one argument (0 given)");
  std::string out;
  bool first = true;
  for (const Value& item : in.Iterate(*a[0])) {
    if (!item.is_string()) in.Fail("TypeError", "sequence item: expected str instance, " + TypeName(item) + " found");
    if (!first) out += self.str();
    first = false;
    out += item.str();
    if (out.size() > in.limits().max_output_bytes) in.Fail("LimitError", "join: the result exceeds the output cap");
  }
  return in.MakeString(std::move(out));
}

// format, format_map: refused (the sandbox's format runs a formatter of its own).
Value StrFormat(Interpreter& in, const std::string&, const Value&, CallArgs&) {
  in.Fail("TemplateRuntimeError", "str.format is not supported");
}

const MethodTable& StrMethods() {
  static const auto* const methods = new MethodTable{
      {"capitalize", StrCase<PyCapitalize>},
      {"count", StrFind},
      {"endswith", StrStartsOrEndsWith},
      {"find", StrFind},
      {"format", StrFormat},
      {"format_map", StrFormat},
      {"index", StrFind},
      {"isalnum", StrIsClass<IsAlnum>},
      {"isalpha", StrIsClass<PyIsAlpha>},
      {"isdecimal", StrIsClass<PyIsDigit>},
      {"isdigit", StrIsClass<PyIsDigit>},
      {"islower", StrIsCase<PyIsLower>},
      {"isnumeric", StrIsClass<PyIsDigit>},
      {"isspace", StrIsClass<IsPySpace>},
      {"isupper", StrIsCase<PyIsUpper>},
      {"join", StrJoin},
      {"lower", StrCase<PyLower>},
      {"lstrip", StrStrip},
      {"replace", StrReplace},
      {"rfind", StrFind},
      {"rindex", StrFind},
      {"rsplit", StrSplit},
      {"rstrip", StrStrip},
      {"split", StrSplit},
      {"splitlines", StrSplitLines},
      {"startswith", StrStartsOrEndsWith},
      {"strip", StrStrip},
      {"swapcase", StrCase<PySwapCase>},
      {"title", StrCase<PyTitle>},
      {"upper", StrCase<PyUpper>},
  };
  return *methods;
}

// --- dict

Value DictItems(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  BindArgs(in, name, args, {});
  return Items(in, self, /*view=*/true);
}

// keys, values.
Value DictKeysOrValues(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  BindArgs(in, name, args, {});
  std::vector<Value> out;
  for (const auto& [key, value] : self.dict->entries) out.push_back(name == "keys" ? key : value);
  return DictView(in, std::move(out), name == "keys" ? "dict_keys" : "dict_values");
}

Value DictGet(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"key", "default"});
  if (!a[0]) in.Fail("TypeError", "get expected at least 1 argument, got 0");
  if (KeyOf(*a[0]).empty()) in.Fail("TypeError", StrCat("unhashable type: '", TypeName(*a[0]), "'"));
  if (const Value* v = self.dict->Find(*a[0])) return *v;
  return a[1].value_or(Value::None());
}

Value DictCopy(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
  BindArgs(in, name, args, {});
  return Value::Dict(std::make_shared<DictData>(*self.dict));
}

const MethodTable& DictMethods() {
  static const auto* const methods = new MethodTable{
      {"copy", DictCopy},           {"get", DictGet}, {"items", DictItems}, {"keys", DictKeysOrValues},
      {"values", DictKeysOrValues},
  };
  return *methods;
}

const NameSet& DictMutators() {
  static const auto* const names = new NameSet{"clear", "pop", "popitem", "setdefault", "update"};
  return *names;
}

// --- list and tuple

// index, count.
Value ListIndexOrCount(Interpreter& in, const std::string& name, const Value& self, CallArgs& args) {
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
}

const MethodTable& ListMethods() {
  static const auto* const methods = new MethodTable{{"count", ListIndexOrCount}, {"index", ListIndexOrCount}};
  return *methods;
}

const NameSet& ListMutators() {
  static const auto* const names =
      new NameSet{"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
  return *names;
}

Value Unsafe(const Value& obj, const std::string& name) {
  return Value::Undefined(StrCat("access to attribute '", name, "' of '", TypeName(obj), "' object is unsafe."), true);
}

bool IsDunder(const std::string& name) {
  return name.size() > 4 && name.rfind("__", 0) == 0 && name.compare(name.size() - 2, 2, "__") == 0;
}

}  // namespace

std::optional<Value> GetMethod(Interpreter&, const Value& obj, const std::string& name) {
  if (IsDunder(name)) return Unsafe(obj, name);
  const MethodTable* methods = nullptr;
  const NameSet* mutators = nullptr;  // tuples and str have none
  if (obj.is_string()) {
    methods = &StrMethods();
  } else if (obj.is_dict() && !obj.dict->is_namespace) {
    methods = &DictMethods();
    mutators = &DictMutators();
  } else if (obj.is_list()) {
    methods = &ListMethods();
    if (!obj.list->is_tuple) mutators = &ListMutators();
  } else {
    return std::nullopt;
  }
  if (const auto it = methods->find(name); it != methods->end()) {
    const MethodFn fn = it->second;
    return Value::Function(StrCat(TypeName(obj), ".", name), [self = obj, fn, name](Interpreter& in, CallArgs& args) {
      return fn(in, name, self, args);
    });
  }
  if (mutators != nullptr && mutators->contains(name)) return Unsafe(obj, name);
  return std::nullopt;
}

}  // namespace strata::chat_template
