// The globals a chat template sees: jinja2's range (capped as the sandbox's MAX_RANGE), dict and
// namespace, and transformers' raise_exception and strftime_now (chat_template_utils.py).

#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/builtins.h"

namespace strata::chat_template {

using base::StrCat;
namespace {

Value Range(Interpreter& in, CallArgs& args) {
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
}

// dict(mapping or pairs, **kwargs), and namespace(...), which transformers' TemplateNamespace keeps from
// `_`-prefixed attributes.
Value MakeDict(Interpreter& in, CallArgs& args, bool ns) {
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
}

Value Dict(Interpreter& in, CallArgs& args) { return MakeDict(in, args, /*ns=*/false); }
Value Namespace(Interpreter& in, CallArgs& args) { return MakeDict(in, args, /*ns=*/true); }

Value RaiseException(Interpreter& in, CallArgs& args) {
  auto a = BindArgs(in, "raise_exception", args, {"message"});
  in.Fail("TemplateError", a[0] ? ToStr(*a[0]) : "");
}

// datetime.now().strftime(format): local time, C's strftime (which Python's calls).
Value StrftimeNow(Interpreter& in, CallArgs& args) {
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
}

}  // namespace

void AddGlobals(Frame& frame) {
  frame.vars["range"] = Value::Function("range", Range);
  frame.vars["namespace"] = Value::Function("namespace", Namespace);
  frame.vars["dict"] = Value::Function("dict", Dict);
  frame.vars["raise_exception"] = Value::Function("raise_exception", RaiseException);
  frame.vars["strftime_now"] = Value::Function("strftime_now", StrftimeNow);
}

}  // namespace strata::chat_template
