// What the filters, tests, methods and globals share: Python's argument binding, generators and dict
// views, len() and sorted(), and jinja2's attribute getter.

#include "chat_template/builtins.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/py_str.h"

namespace strata::chat_template {

using base::StrCat;
namespace {

absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A list that Python would hold as another type (a generator, a dict view).
Value AsPythonType(Interpreter& in, std::vector<Value> items, const char* python_type, bool lazy) {
  Value v = in.MakeList(std::move(items));
  auto data = std::make_shared<ListData>(*v.list);
  data->python_type = python_type;
  data->lazy = lazy;
  v.list = std::move(data);
  return v;
}

}  // namespace

std::vector<std::optional<Value>> BindArgs(Interpreter& in, std::string_view what, CallArgs& args,
                                           const std::vector<std::string_view>& names) {
  const absl::string_view w = AV(what);
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

const Value* Opt(const std::vector<std::optional<Value>>& bound, size_t i) {
  return bound[i].has_value() ? &*bound[i] : nullptr;
}

std::string RequireStr(Interpreter& in, const Value* v, std::string_view what) {
  if (v == nullptr || !v->is_string()) {
    in.Fail("TypeError", StrCat(AV(what), " must be str, not ", v ? TypeName(*v) : "nothing"));
  }
  return v->str();
}

int64_t RequireInt(Interpreter& in, const Value* v, std::string_view what) {
  if (v == nullptr || !IsIntLike(*v)) {
    in.Fail("TypeError", StrCat(AV(what), " must be an integer, not ", v ? TypeName(*v) : "nothing"));
  }
  return AsInt(*v);
}

std::optional<std::string_view> StrOrNone(const Value* v) {
  if (v == nullptr || v->is_none()) return std::nullopt;
  return v->str();
}

Value Lazy(Interpreter& in, std::vector<Value> items, const char* python_type) {
  return AsPythonType(in, std::move(items), python_type, /*lazy=*/true);
}

Value DictView(Interpreter& in, std::vector<Value> items, const char* python_type) {
  return AsPythonType(in, std::move(items), python_type, /*lazy=*/false);
}

Value StringList(Interpreter& in, const std::vector<std::string>& parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const auto& p : parts) items.push_back(in.MakeString(p));
  return in.MakeList(std::move(items));
}

Value Items(Interpreter& in, const Value& v, bool view) {
  if (v.is_undefined()) return Lazy(in, {});
  if (!v.is_dict() || v.dict->is_namespace) in.Fail("TypeError", "Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [key, value] : v.dict->entries) pairs.push_back(Value::List({key, value}, /*is_tuple=*/true));
  return view ? DictView(in, std::move(pairs), "dict_items") : Lazy(in, std::move(pairs));
}

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

Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(PyLower(v.str()));
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

}  // namespace strata::chat_template
