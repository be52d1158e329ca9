// jinja2's tests (`x is name`, jinja2/tests.py), as a name -> function table like jinja2's TESTS; TestX
// is jinja2's test_x. Each function gets the name the template used (aliases such as `eq` and `==` share
// one), which argument errors name.

#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/builtins.h"
#include "chat_template/py_str.h"

namespace strata::chat_template {

using base::StrCat;
namespace {

using TestFn = bool (*)(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);

// The one argument of a test such as `divisibleby(3)` or `in [..]`.
Value OneArg(Interpreter& in, const std::string& name, CallArgs& args) {
  auto a = BindArgs(in, name, args, {"other"});
  if (!a[0]) in.Fail("TypeError", StrCat("test '", name, "' takes one argument"));
  return *a[0];
}

// A test of the value alone: `kPredicate` after checking that no argument was given.
template <bool (*kPredicate)(const Value&)>
bool NoArgTest(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  return kPredicate(v);
}

bool IsDefined(const Value& v) { return !v.is_undefined(); }
bool IsUndefined(const Value& v) { return v.is_undefined(); }
bool IsNone(const Value& v) { return v.is_none(); }
bool IsBoolean(const Value& v) { return v.kind == Kind::kBool; }
bool IsTrue(const Value& v) { return v.kind == Kind::kBool && v.boolean; }
bool IsFalse(const Value& v) { return v.kind == Kind::kBool && !v.boolean; }
bool IsInteger(const Value& v) { return v.kind == Kind::kInt; }
bool IsFloat(const Value& v) { return v.kind == Kind::kFloat; }
bool IsNumber(const Value& v) { return v.is_number(); }
bool IsString(const Value& v) { return v.is_string(); }
bool IsMapping(const Value& v) { return v.is_dict() && !v.dict->is_namespace; }
// iterable and sequence: Undefined is both (it iterates empty and has __len__).
bool IsIterable(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.dict->is_namespace);
}
bool IsCallable(const Value& v) { return v.kind == Kind::kCallable || v.is_undefined(); }  // Undefined has __call__
bool IsLower(const Value& v) { return PyIsLower(ToStr(v)); }
bool IsUpper(const Value& v) { return PyIsUpper(ToStr(v)); }

// Python's `is`: containers by identity; None and Undefined are singletons; small ints (-5..256) are
// cached by CPython, other ints and every float and str built at render time are distinct objects.
bool TestSameAs(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  const Value other = OneArg(in, name, args);
  if (v.kind != other.kind) return false;
  if (v.is_none() || v.is_undefined()) return true;
  if (v.kind == Kind::kBool) return v.boolean == other.boolean;
  if (v.is_list()) return v.list == other.list;
  if (v.is_dict()) return v.dict == other.dict;
  if (v.kind == Kind::kCallable) return v.callable == other.callable;
  return Equals(v, other) && (v.kind == Kind::kInt ? v.integer >= -5 && v.integer <= 256 : false);
}

bool TestEq(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  return Equals(v, OneArg(in, name, args));
}

bool TestNe(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  return !Equals(v, OneArg(in, name, args));
}

enum class Order { kLt, kGt, kLe, kGe };

// lt/lessthan/<, gt/greaterthan/>, le/<=, ge/>=: Python's comparison operators.
template <Order kOrder>
bool TestOrder(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  const Value other = OneArg(in, name, args);
  if (v.is_undefined()) in.FailUndefined(v);
  bool ok = true;
  bool r = false;
  switch (kOrder) {
    case Order::kLt:
      r = Less(v, other, &ok);
      break;
    case Order::kGt:
      r = Less(other, v, &ok);
      break;
    case Order::kLe:
      r = !Less(other, v, &ok);
      break;
    case Order::kGe:
      r = !Less(v, other, &ok);
      break;
  }
  if (!ok) {
    in.Fail("TypeError",
            StrCat("'", name, "' not supported between instances of '", TypeName(v), "' and '", TypeName(other), "'"));
  }
  return r;
}

bool TestIn(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  const Value container = OneArg(in, name, args);
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
bool TestOdd(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  return Equals(in.BinaryOp("%", v, Value::Int(2)), Value::Int(1));
}

bool TestEven(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  BindArgs(in, name, args, {});
  return Equals(in.BinaryOp("%", v, Value::Int(2)), Value::Int(0));
}

bool TestDivisibleBy(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  const Value other = OneArg(in, name, args);
  return Equals(in.BinaryOp("%", v, other), Value::Int(0));
}

// jinja2's `filter` and `test` tests look a name up in the environment; templates have no use for them.
bool TestUnsupported(Interpreter& in, const std::string& name, const Value&, CallArgs& args) {
  OneArg(in, name, args);
  in.Fail("TemplateRuntimeError", StrCat("test '", name, "' is not supported"));
}

const absl::flat_hash_map<std::string_view, TestFn>& Tests() {
  static const auto* const tests = new absl::flat_hash_map<std::string_view, TestFn>{
      {"!=", TestNe},
      {"<", TestOrder<Order::kLt>},
      {"<=", TestOrder<Order::kLe>},
      {"==", TestEq},
      {">", TestOrder<Order::kGt>},
      {">=", TestOrder<Order::kGe>},
      {"boolean", NoArgTest<IsBoolean>},
      {"callable", NoArgTest<IsCallable>},
      {"defined", NoArgTest<IsDefined>},
      {"divisibleby", TestDivisibleBy},
      {"eq", TestEq},
      {"equalto", TestEq},
      {"even", TestEven},
      {"false", NoArgTest<IsFalse>},
      {"filter", TestUnsupported},
      {"float", NoArgTest<IsFloat>},
      {"ge", TestOrder<Order::kGe>},
      {"greaterthan", TestOrder<Order::kGt>},
      {"gt", TestOrder<Order::kGt>},
      {"in", TestIn},
      {"integer", NoArgTest<IsInteger>},
      {"iterable", NoArgTest<IsIterable>},
      {"le", TestOrder<Order::kLe>},
      {"lessthan", TestOrder<Order::kLt>},
      {"lower", NoArgTest<IsLower>},
      {"lt", TestOrder<Order::kLt>},
      {"mapping", NoArgTest<IsMapping>},
      {"ne", TestNe},
      {"none", NoArgTest<IsNone>},
      {"number", NoArgTest<IsNumber>},
      {"odd", TestOdd},
      {"sameas", TestSameAs},
      {"sequence", NoArgTest<IsIterable>},
      {"string", NoArgTest<IsString>},
      {"test", TestUnsupported},
      {"true", NoArgTest<IsTrue>},
      {"undefined", NoArgTest<IsUndefined>},
      {"upper", NoArgTest<IsUpper>},
  };
  return *tests;
}

}  // namespace

bool CallTest(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  in.Step();
  const auto& tests = Tests();
  const auto it = tests.find(name);
  if (it == tests.end()) in.Fail("TemplateRuntimeError", StrCat("No test named '", name, "'."));
  return it->second(in, name, input, args);
}

}  // namespace strata::chat_template
