#include "chat_template/interpreter.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/builtins.h"

namespace strata::chat_template {

using base::StrCat;
namespace {

absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

Interpreter::Interpreter(const Program& program, const RenderLimits& limits) : program_(program), limits_(limits) {}

Interpreter::Depth::Depth(Interpreter* interpreter) : in(interpreter) {
  if (++in->depth_ > in->limits_.max_nesting) {
    in->Fail("LimitError", StrCat("nesting deeper than ", in->limits_.max_nesting, " levels (macro recursion?)"));
  }
}

void Interpreter::Fail(std::string_view kind, std::string_view message) const {
  throw RenderError{StrCat(program_.name, ":", line_, ": ", AV(kind), ": ", AV(message))};
}

void Interpreter::FailUndefined(const Value& v) const {
  const std::string hint = v.text ? *v.text : "value is undefined";
  Fail(v.unsafe ? "SecurityError" : "UndefinedError", hint);
}

void Interpreter::Step(int64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps) {
    Fail("LimitError", StrCat("rendering takes more than ", limits_.max_steps, " steps"));
  }
}

Value Interpreter::MakeString(std::string s) {
  if (s.size() > limits_.max_output_bytes) {
    Fail("LimitError",
         StrCat("a string of ", s.size(), " bytes exceeds the output cap of ", limits_.max_output_bytes, " bytes"));
  }
  Charge(s.size());
  CountBuilt(s.size() + sizeof(std::string));
  return Value::String(std::move(s));
}

// Every string and list a rendering builds counts, freed or not: what a template can hold at once is
// bounded by what it may build (a quadratic pattern such as `set ns.l = ns.l + [x]` in a loop builds
// the most).
void Interpreter::CountBuilt(size_t bytes) {
  built_bytes_ += bytes;
  if (built_bytes_ > limits_.max_built_bytes) {
    Fail("LimitError", StrCat("rendering builds more than ", limits_.max_built_bytes, " bytes of values"));
  }
}

Value Interpreter::MakeList(std::vector<Value> items, bool is_tuple) {
  if (items.size() > limits_.max_output_bytes) Fail("LimitError", "a list exceeds the output cap");
  Charge(items.size() * 4);
  CountBuilt(items.size() * sizeof(Value));
  Value v = Value::List(std::move(items), is_tuple);
  if (v.depth() > limits_.max_value_depth) {
    Fail("LimitError", StrCat("lists and dicts nested deeper than ", limits_.max_value_depth, " levels"));
  }
  return v;
}

void Interpreter::Append(std::string& out, std::string_view text) {
  if (out.size() + text.size() > limits_.max_output_bytes) {
    Fail("LimitError", StrCat("the rendering exceeds the output cap of ", limits_.max_output_bytes, " bytes"));
  }
  Charge(text.size());
  out.append(text);
}

std::string Interpreter::Render(FramePtr context) {
  auto top = std::make_shared<Frame>();
  top->parent = std::move(context);
  std::string out;
  Exec(program_.body, top, out);
  return out;
}

// A macro holds the frame it was defined in, and may itself be stored in that frame (or where the frame
// reaches): a reference cycle. Every such cycle passes through a captured frame, so emptying those frames
// frees everything the rendering built.
Interpreter::~Interpreter() {
  for (const std::weak_ptr<Frame>& weak : captured_frames_) {
    if (FramePtr frame = weak.lock()) {
      frame->vars.clear();
      frame->parent.reset();
    }
  }
  for (const std::weak_ptr<std::optional<Value>>& weak : changed_states_) {
    if (auto state = weak.lock()) state->reset();
  }
}

// Whether `v` is, or holds, the namespace `target` (only containers that hold a namespace are walked).
bool Interpreter::Reaches(const Value& v, const DictData* target) {
  if (v.is_dict()) {
    if (v.dict.get() == target) return true;
    if (!v.dict->holds_namespace) return false;
    for (const auto& [key, value] : v.dict->entries) {
      Step();
      if (Reaches(value, target)) return true;
    }
    return false;
  }
  if (v.is_list() && v.list->holds_namespace) {
    for (const Value& item : v.list->items) {
      Step();
      if (Reaches(item, target)) return true;
    }
  }
  return false;
}

// --- statements

Flow Interpreter::Exec(const Body& body, const FramePtr& frame, std::string& out) {
  Depth depth(this);
  for (const StmtPtr& s : body) {
    const Flow flow = ExecStmt(*s, frame, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Flow Interpreter::ExecStmt(const Stmt& s, const FramePtr& frame, std::string& out) {
  Step();
  line_ = s.line;
  switch (s.kind) {
    case StmtKind::kText:
      Append(out, s.text);
      return Flow::kNormal;
    case StmtKind::kOutput: {
      const Value v = Eval(*s.expr, frame);
      line_ = s.line;
      if (v.is_string()) {
        Append(out, v.str());
      } else {
        Append(out, ToStr(v));
      }
      return Flow::kNormal;
    }
    case StmtKind::kIf:
      for (size_t i = 0; i < s.conditions.size(); ++i) {
        if (Truthy(Eval(*s.conditions[i], frame))) return Exec(s.bodies[i], frame, out);
      }
      return Exec(s.else_body, frame, out);
    case StmtKind::kFor:
      ExecFor(s, frame, out);
      return Flow::kNormal;
    case StmtKind::kSet:
      Assign(s, frame, Eval(*s.expr, frame));
      return Flow::kNormal;
    case StmtKind::kSetBlock: {
      auto inner = std::make_shared<Frame>();
      inner->parent = frame;
      std::string text;
      Exec(s.body, inner, text);
      Value v = MakeString(std::move(text));
      if (s.expr) v = ApplyFilters(*s.expr, frame, v);
      Assign(s, frame, v);
      return Flow::kNormal;
    }
    case StmtKind::kMacro:
      frame->vars[s.text] = MakeMacro(s, frame, s.text);
      return Flow::kNormal;
    case StmtKind::kCallBlock: {
      const Expr& call = *s.expr;
      Value callee = Eval(*call.items[0], frame);
      CallArgs args = EvalArgs(call, frame, 1);
      args.keywords.emplace_back("caller", MakeMacro(s, frame, "caller"));
      line_ = s.line;
      const Value v = Call(callee, args);
      Append(out, ToStr(v));
      return Flow::kNormal;
    }
    case StmtKind::kFilterBlock: {
      auto inner = std::make_shared<Frame>();
      inner->parent = frame;
      std::string text;
      Exec(s.body, inner, text);
      const Value v = ApplyFilters(*s.expr, frame, MakeString(std::move(text)));
      Append(out, ToStr(v));
      return Flow::kNormal;
    }
    case StmtKind::kWith: {
      auto inner = std::make_shared<Frame>();
      inner->parent = frame;
      for (size_t i = 0; i < s.targets.size(); ++i) inner->vars[s.targets[i]] = Eval(*s.values[i], frame);
      return Exec(s.body, inner, out);
    }
    case StmtKind::kGeneration: {
      auto inner = std::make_shared<Frame>();
      inner->parent = frame;
      std::string text;
      Exec(s.body, inner, text);
      Append(out, text);
      return Flow::kNormal;
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

void Interpreter::BindTargets(const std::vector<std::string>& targets, bool is_tuple, Frame& frame, const Value& v) {
  if (!is_tuple) {
    frame.vars[targets[0]] = v;
    return;
  }
  std::vector<Value> items = Iterate(v);
  if (items.size() != targets.size()) {
    Fail("ValueError",
         items.size() > targets.size()
             ? StrCat("too many values to unpack (expected ", targets.size(), ")")
             : StrCat("not enough values to unpack (expected ", targets.size(), ", got ", items.size(), ")"));
  }
  for (size_t i = 0; i < targets.size(); ++i) frame.vars[targets[i]] = items[i];
}

void Interpreter::Assign(const Stmt& s, const FramePtr& frame, const Value& v) {
  if (!s.attribute.empty()) {
    const Value* ns = frame->Find(s.targets[0]);
    if (ns == nullptr || !ns->is_dict() || !ns->dict->is_namespace || ns->dict->frozen) {
      Fail("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
    }
    if (s.attribute[0] == '_') {
      Fail("SecurityError", StrCat("Chat templates cannot store underscore-prefixed attributes on a "
                                   "namespace, but got '",
                                   s.attribute, "'"));
    }
    // Values are shared, and a namespace is the one mutable container: storing a namespace in itself
    // would make printing, comparing and freeing it endless.
    if (Reaches(v, ns->dict.get())) Fail("TemplateRuntimeError", "a namespace cannot contain itself");
    ns->dict->Set(Value::String(s.attribute), v);
    if (ns->dict->depth > limits_.max_value_depth) {
      Fail("LimitError", StrCat("lists and dicts nested deeper than ", limits_.max_value_depth, " levels"));
    }
    return;
  }
  BindTargets(s.targets, s.target_is_tuple, *frame, v);
}

// The loop object: index, index0, revindex, revindex0, first, last, length, depth, depth0, previtem,
// nextitem (absent at the ends: Undefined), cycle(...) and changed(...).
void Interpreter::ExecFor(const Stmt& s, const FramePtr& frame, std::string& out) {
  std::vector<Value> items = Iterate(Eval(*s.expr, frame));
  if (s.condition) {
    std::vector<Value> kept;
    for (Value& item : items) {
      Step();
      auto test = std::make_shared<Frame>();
      test->parent = frame;
      BindTargets(s.targets, s.target_is_tuple, *test, item);
      if (Truthy(Eval(*s.condition, test))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto inner = std::make_shared<Frame>();
    inner->parent = frame;
    Exec(s.else_body, inner, out);
    return;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  auto last_changed = std::make_shared<std::optional<Value>>();
  changed_states_.push_back(last_changed);  // loop.changed(loop) would hold its own loop: cut at the end
  for (int64_t i = 0; i < n; ++i) {
    Step();
    line_ = s.line;
    auto inner = std::make_shared<Frame>();
    inner->parent = frame;
    BindTargets(s.targets, s.target_is_tuple, *inner, items[static_cast<size_t>(i)]);
    auto loop = std::make_shared<DictData>();
    loop->is_namespace = true;  // attributes only, like jinja2's LoopContext
    loop->frozen = true;
    loop->Set(Value::String("index"), Value::Int(i + 1));
    loop->Set(Value::String("index0"), Value::Int(i));
    loop->Set(Value::String("revindex"), Value::Int(n - i));
    loop->Set(Value::String("revindex0"), Value::Int(n - i - 1));
    loop->Set(Value::String("first"), Value::Bool(i == 0));
    loop->Set(Value::String("last"), Value::Bool(i == n - 1));
    loop->Set(Value::String("length"), Value::Int(n));
    loop->Set(Value::String("depth"), Value::Int(1));
    loop->Set(Value::String("depth0"), Value::Int(0));
    if (i > 0) loop->Set(Value::String("previtem"), items[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) loop->Set(Value::String("nextitem"), items[static_cast<size_t>(i + 1)]);
    loop->Set(Value::String("cycle"), Value::Function("loop.cycle", [i](Interpreter& in, CallArgs& args) {
                if (args.positional.empty()) in.Fail("TypeError", "no items for cycling given");
                return args.positional[static_cast<size_t>(i) % args.positional.size()];
              }));
    loop->Set(Value::String("changed"),
              Value::Function("loop.changed", [last_changed](Interpreter& in, CallArgs& args) {
                Value now = in.MakeList(args.positional);
                if (last_changed->has_value() && Equals(**last_changed, now)) return Value::Bool(false);
                *last_changed = now;
                return Value::Bool(true);
              }));
    inner->vars["loop"] = Value::Dict(std::move(loop));
    if (Exec(s.body, inner, out) == Flow::kBreak) break;
  }
}

Value Interpreter::MakeMacro(const Stmt& s, FramePtr frame, std::string name) {
  const Stmt* macro = &s;
  captured_frames_.push_back(frame);  // the macro may be stored where `frame` reaches it: cut at the end
  return Value::Function("macro " + name, [macro, frame = std::move(frame), name](Interpreter& in, CallArgs& args) {
    Depth depth(&in);
    const int saved_line = in.line_;
    auto inner = std::make_shared<Frame>();
    inner->parent = frame;
    const auto& params = macro->params;
    std::vector<bool> bound(params.size(), false);
    std::vector<Value> varargs;
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < params.size()) {
        inner->vars[params[i].name] = args.positional[i];
        bound[i] = true;
      } else {
        varargs.push_back(args.positional[i]);
      }
    }
    auto kwargs = std::make_shared<DictData>();
    for (auto& [key, value] : args.keywords) {
      bool matched = false;
      for (size_t i = 0; i < params.size(); ++i) {
        if (params[i].name == key) {
          if (bound[i]) in.Fail("TypeError", StrCat(name, "() got multiple values for argument '", key, "'"));
          inner->vars[key] = value;
          bound[i] = true;
          matched = true;
        }
      }
      if (matched) continue;
      if (key == "caller") {
        inner->vars["caller"] = value;
      } else {
        kwargs->Set(Value::String(key), value);
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (bound[i]) continue;
      if (params[i].default_value) {
        inner->vars[params[i].name] = in.Eval(*params[i].default_value, inner);
      } else {
        inner->vars[params[i].name] = Value::Undefined(StrCat("parameter '", params[i].name, "' was not provided"));
      }
    }
    inner->vars["varargs"] = in.MakeList(std::move(varargs), /*is_tuple=*/true);
    inner->vars["kwargs"] = Value::Dict(std::move(kwargs));
    std::string out;
    in.Exec(macro->body, inner, out);
    in.line_ = saved_line;
    return in.MakeString(std::move(out));
  });
}

// --- expressions

CallArgs Interpreter::EvalArgs(const Expr& e, const FramePtr& frame, size_t first) {
  CallArgs args;
  for (size_t i = first; i < e.items.size(); ++i) args.positional.push_back(Eval(*e.items[i], frame));
  for (const auto& [key, value] : e.keywords) args.keywords.emplace_back(key, Eval(*value, frame));
  return args;
}

Value Interpreter::ApplyFilters(const Expr& chain, const FramePtr& frame, std::optional<Value> input) {
  Value value;
  if (chain.items[0] == nullptr) {
    value = *input;  // {% filter %} and {% set x | f %}: the rendered block
  } else if (input.has_value() && chain.items[0]->kind == ExprKind::kFilter) {
    value = ApplyFilters(*chain.items[0], frame, input);
  } else {
    value = Eval(*chain.items[0], frame);
  }
  CallArgs args = EvalArgs(chain, frame, 1);
  line_ = chain.line;
  return CallFilter(*this, chain.name, value, args);
}

Value Interpreter::Eval(const Expr& e, const FramePtr& frame) {
  Depth depth(this);
  Step();
  line_ = e.line;
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName: {
      const Value* v = frame->Find(e.name);
      if (v == nullptr) return Value::Undefined(StrCat("'", e.name, "' is undefined"));
      return *v;
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const ExprPtr& item : e.items) items.push_back(Eval(*item, frame));
      return MakeList(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict:
      return EvalDict(e, frame);
    case ExprKind::kGetAttr: {
      const Value obj = Eval(*e.items[0], frame);
      line_ = e.line;
      return GetAttr(obj, e.name);
    }
    case ExprKind::kGetItem: {
      const Value obj = Eval(*e.items[0], frame);
      const Value key = Eval(*e.items[1], frame);
      line_ = e.line;
      return GetItem(obj, key);
    }
    case ExprKind::kSlice: {
      const Value obj = Eval(*e.items[0], frame);
      Value parts[3];
      for (int i = 0; i < 3; ++i) parts[i] = e.items[i + 1] ? Eval(*e.items[i + 1], frame) : Value::None();
      line_ = e.line;
      return Slice(obj, parts[0], parts[1], parts[2]);
    }
    case ExprKind::kCall: {
      const Value callee = Eval(*e.items[0], frame);
      CallArgs args = EvalArgs(e, frame, 1);
      line_ = e.line;
      return Call(callee, args);
    }
    case ExprKind::kFilter:
      return ApplyFilters(e, frame, std::nullopt);
    case ExprKind::kTest: {
      const Value v = Eval(*e.items[0], frame);
      CallArgs args = EvalArgs(e, frame, 1);
      line_ = e.line;
      return Value::Bool(CallTest(*this, e.name, v, args) != e.negated);
    }
    case ExprKind::kNot:
      return Value::Bool(!Truthy(Eval(*e.items[0], frame)));
    case ExprKind::kNeg:
    case ExprKind::kPos:
      return EvalSign(e, frame);
    case ExprKind::kBinary: {
      const Value a = Eval(*e.items[0], frame);
      const Value b = Eval(*e.items[1], frame);
      line_ = e.line;
      return Binary(e.name, a, b);
    }
    case ExprKind::kAnd: {
      Value a = Eval(*e.items[0], frame);
      return Truthy(a) ? Eval(*e.items[1], frame) : a;
    }
    case ExprKind::kOr: {
      Value a = Eval(*e.items[0], frame);
      return Truthy(a) ? a : Eval(*e.items[1], frame);
    }
    case ExprKind::kCompare:
      return EvalCompare(e, frame);
    case ExprKind::kCond:
      if (Truthy(Eval(*e.items[0], frame))) return Eval(*e.items[1], frame);
      if (e.items[2]) return Eval(*e.items[2], frame);
      return Value::Undefined(
          StrCat("the inline if-expression on line ", e.line, " evaluated to false and no else section was defined."));
  }
  return Value::Undefined();
}

// `{k: v, ...}`: keys must be hashable.
Value Interpreter::EvalDict(const Expr& e, const FramePtr& frame) {
  auto dict = std::make_shared<DictData>();
  for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
    Value key = Eval(*e.items[i], frame);
    Value value = Eval(*e.items[i + 1], frame);
    line_ = e.line;
    if (KeyOf(key).empty()) Fail("TypeError", StrCat("unhashable type: '", TypeName(key), "'"));
    dict->Set(std::move(key), std::move(value));
  }
  if (dict->depth > limits_.max_value_depth) Fail("LimitError", "lists and dicts nested too deep");
  return Value::Dict(std::move(dict));
}

// Unary `-x` and `+x` (`+True` is 1).
Value Interpreter::EvalSign(const Expr& e, const FramePtr& frame) {
  const Value v = Eval(*e.items[0], frame);
  line_ = e.line;
  if (v.is_undefined()) FailUndefined(v);
  if (e.kind == ExprKind::kPos && v.is_number()) return v.kind == Kind::kBool ? Value::Int(v.boolean) : v;
  if (v.kind == Kind::kFloat) return Value::Float(-v.number);
  if (IsIntLike(v)) {
    if (AsInt(v) == INT64_MIN) FailOverflow();
    return Value::Int(-AsInt(v));
  }
  Fail("TypeError",
       StrCat("bad operand type for unary ", e.kind == ExprKind::kNeg ? "-" : "+", ": '", TypeName(v), "'"));
}

// Chained comparisons as Python's: `a < b < c` is `a < b and b < c`, each operand evaluated once.
Value Interpreter::EvalCompare(const Expr& e, const FramePtr& frame) {
  Value left = Eval(*e.items[0], frame);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = Eval(*e.items[i + 1], frame);
    line_ = e.line;
    if (!Compare(e.ops[i], left, right)) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

Value Interpreter::Binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = ToStr(a);
    s += ToStr(b);
    return MakeString(std::move(s));
  }
  // str % x is Python's formatting, which takes any right operand (Undefined included) before Undefined
  // could object.
  if (op == "%" && a.is_string()) return Format(a, b);
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  if (a.is_number() && b.is_number()) return Arithmetic(op, a, b);
  if (op == "+") return Concatenate(a, b);
  if (op == "*") return Repeat(a, b);
  FailOperands(op, a, b);
}

void Interpreter::FailOverflow() const { Fail("OverflowError", "integer overflow (strata's integers are 64-bit)"); }

// Python's arithmetic on int (bool included) and float: `/` is always true division, `**` with a negative
// int exponent is a float, the rest stay ints when both operands are.
Value Interpreter::Arithmetic(const std::string& op, const Value& a, const Value& b) {
  const bool ints = IsIntLike(a) && IsIntLike(b);
  const double fx = AsDouble(a);
  const double fy = AsDouble(b);
  if (op == "/") {
    if (fy == 0) Fail("ZeroDivisionError", "division by zero");
    return Value::Float(fx / fy);
  }
  if (op == "**" && !(ints && AsInt(b) >= 0)) {
    if (fx == 0 && fy < 0) Fail("ZeroDivisionError", "0.0 cannot be raised to a negative power");
    return Value::Float(std::pow(fx, fy));
  }
  return ints ? IntArithmetic(op, a, b) : FloatArithmetic(op, a, b);
}

Value Interpreter::IntArithmetic(const std::string& op, const Value& a, const Value& b) {
  const int64_t x = AsInt(a);
  const int64_t y = AsInt(b);
  int64_t r = 0;
  if (op == "+") {
    if (__builtin_add_overflow(x, y, &r)) FailOverflow();
  } else if (op == "-") {
    if (__builtin_sub_overflow(x, y, &r)) FailOverflow();
  } else if (op == "*") {
    if (__builtin_mul_overflow(x, y, &r)) FailOverflow();
  } else if (op == "//" || op == "%") {
    if (y == 0) Fail("ZeroDivisionError", "integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) FailOverflow();
    // Python floors the quotient: the remainder takes the divisor's sign.
    int64_t q = x / y;
    int64_t m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    r = op == "//" ? q : m;
  } else if (op == "**") {
    r = 1;  // y >= 0: squaring, one step per bit of the exponent
    int64_t base = x;
    for (int64_t e = y; e > 0;) {
      Step();
      if ((e & 1) && __builtin_mul_overflow(r, base, &r)) FailOverflow();
      e >>= 1;
      if (e > 0 && __builtin_mul_overflow(base, base, &base)) FailOverflow();
    }
  } else {
    FailOperands(op, a, b);
  }
  return Value::Int(r);
}

Value Interpreter::FloatArithmetic(const std::string& op, const Value& a, const Value& b) {
  const double fx = AsDouble(a);
  const double fy = AsDouble(b);
  if (op == "+") return Value::Float(fx + fy);
  if (op == "-") return Value::Float(fx - fy);
  if (op == "*") return Value::Float(fx * fy);
  if (op != "//" && op != "%") FailOperands(op, a, b);
  if (fy == 0) Fail("ZeroDivisionError", "float division by zero");
  // CPython's float_divmod, signs of zero included.
  double mod = std::fmod(fx, fy);
  double div = (fx - mod) / fy;
  if (mod != 0) {
    if ((fy < 0) != (mod < 0)) {
      mod += fy;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, fy);
  }
  double floordiv = 0;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, fx / fy);
  }
  return Value::Float(op == "//" ? floordiv : mod);
}

// `+` on str (markupsafe's Markup escapes the other side), list and tuple.
Value Interpreter::Concatenate(const Value& a, const Value& b) {
  if (a.is_string() && b.is_string() && (a.markup || b.markup)) {
    // markupsafe: Markup + str escapes the str (and str + Markup).
    Value v = MakeString((a.markup ? a.str() : HtmlEscape(a.str())) + (b.markup ? b.str() : HtmlEscape(b.str())));
    v.markup = true;
    return v;
  }
  if (a.is_string() && b.is_string()) {
    if (a.str().size() + b.str().size() > limits_.max_output_bytes) MakeString(std::string(a.str().size() + 1, ' '));
    return MakeString(a.str() + b.str());
  }
  if (a.is_list() && b.is_list() && a.list->is_tuple == b.list->is_tuple && a.list->python_type.empty() &&
      b.list->python_type.empty()) {
    std::vector<Value> items = a.list->items;
    items.insert(items.end(), b.list->items.begin(), b.list->items.end());
    return MakeList(std::move(items), a.list->is_tuple);
  }
  FailOperands("+", a, b);
}

// `*` of a str, list or tuple and an int, either way round; refused before it is built when the result
// would pass the output cap.
Value Interpreter::Repeat(const Value& a, const Value& b) {
  const Value* seq = IsIntLike(b) ? &a : &b;
  const Value* count = IsIntLike(b) ? &b : &a;
  if (!IsIntLike(*count) || !(seq->is_string() || (seq->is_list() && seq->list->python_type.empty()))) {
    FailOperands("*", a, b);
  }
  const int64_t n = std::max<int64_t>(0, AsInt(*count));
  const size_t unit = seq->is_string() ? seq->str().size() : seq->list->items.size();
  if (unit != 0 && static_cast<uint64_t>(n) > limits_.max_output_bytes / unit) {
    Fail("LimitError", StrCat("repeating a ", TypeName(*seq), " ", n, " times exceeds the output cap"));
  }
  if (seq->is_string()) {
    std::string s;
    s.reserve(unit * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) s += seq->str();
    Value v = MakeString(std::move(s));
    v.markup = seq->markup;
    return v;
  }
  std::vector<Value> items;
  items.reserve(unit * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq->list->items.begin(), seq->list->items.end());
  return MakeList(std::move(items), seq->list->is_tuple);
}

// Python's printf-style `str % args`: %s, %r, %d, %i and %% with one value, a tuple, or a dict (for a
// format without conversions). Other conversions are refused.
Value Interpreter::Format(const Value& format, const Value& args) {
  const std::vector<Value> values = args.is_list() && args.list->is_tuple ? args.list->items : std::vector<Value>{args};
  const std::string& f = format.str();
  std::string out;
  size_t used = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out.push_back(f[i]);
      continue;
    }
    if (i + 1 >= f.size()) Fail("ValueError", "incomplete format");
    const char c = f[++i];
    if (c == '%') {
      out.push_back('%');
      continue;
    }
    if (c != 's' && c != 'r' && c != 'd' && c != 'i') {
      Fail("TemplateRuntimeError", StrCat("string formatting with %", std::string(1, c), " is not supported"));
    }
    if (used >= values.size()) Fail("TypeError", "not enough arguments for format string");
    const Value& v = values[used++];
    if (c == 's') {
      out += ToStr(v);
    } else if (c == 'r') {
      out += Repr(v);
    } else {
      if (v.is_undefined()) FailUndefined(v);
      if (v.kind == Kind::kFloat) {
        out += StrCat(static_cast<int64_t>(v.number));
      } else if (IsIntLike(v)) {
        out += StrCat(AsInt(v));
      } else {
        Fail("TypeError", StrCat("%", std::string(1, c), " format: a real number is required, not ", TypeName(v)));
      }
    }
    if (out.size() > limits_.max_output_bytes) Fail("LimitError", "formatting exceeds the output cap");
  }
  // Python: an argument with __getitem__ (a dict, a list; not a tuple or a str) may go unused; anything
  // else must be used up.
  const bool mapping_like = args.is_dict() || args.is_undefined() || (args.is_list() && !args.list->is_tuple);
  if (used < values.size() && !(mapping_like && used == 0)) {
    Fail("TypeError", "not all arguments converted during string formatting");
  }
  return MakeString(std::move(out));
}

void Interpreter::FailOperands(const std::string& op, const Value& a, const Value& b) const {
  Fail("TypeError", StrCat("unsupported operand type(s) for ", op, ": '", TypeName(a), "' and '", TypeName(b), "'"));
}

bool Interpreter::Contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::kUndefined:
      return false;
    case Kind::kString:
      if (!item.is_string()) {
        Fail("TypeError", StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      Charge(container.str().size());
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      for (const Value& v : container.list->items) {
        Step();
        if (Equals(v, item)) return true;
      }
      return false;
    case Kind::kDict:
      if (container.dict->is_namespace) break;
      if (KeyOf(item).empty()) Fail("TypeError", StrCat("unhashable type: '", TypeName(item), "'"));
      return container.dict->Find(item) != nullptr;
    default:
      break;
  }
  Fail("TypeError", StrCat("argument of type '", TypeName(container), "' is not iterable"));
}

bool Interpreter::Compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Equals(a, b);
  if (op == "!=") return !Equals(a, b);
  if (op == "in") return Contains(b, a);
  if (op == "not in") return !Contains(b, a);
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  bool ok = true;
  bool result = false;
  if (op == "<") result = Less(a, b, &ok);
  if (op == ">") result = Less(b, a, &ok);
  if (op == "<=") result = !Less(b, a, &ok);
  if (op == ">=") result = !Less(a, b, &ok);
  if (!ok) {
    Fail("TypeError",
         StrCat("'", op, "' not supported between instances of '", TypeName(a), "' and '", TypeName(b), "'"));
  }
  return result;
}

std::vector<Value> Interpreter::Iterate(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
      if (v.list->lazy) {
        // A generator runs once: iterating it again gives nothing, as in Python.
        if (v.list->consumed) return {};
        v.list->consumed = true;
      }
      Charge(v.list->items.size() * 4);
      return v.list->items;
    case Kind::kDict: {
      if (v.dict->is_namespace) break;
      std::vector<Value> keys;
      keys.reserve(v.dict->entries.size());
      for (const auto& [key, value] : v.dict->entries) keys.push_back(key);
      Charge(keys.size() * 4);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : Decode(v.str())) {
        std::string s;
        AppendCodePoint(s, c);
        chars.push_back(Value::String(std::move(s)));
      }
      Charge(chars.size() * 4);
      return chars;
    }
    default:
      break;
  }
  Fail("TypeError", StrCat("'", TypeName(v), "' object is not iterable"));
}

Value Interpreter::Call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) FailUndefined(callee);
  if (callee.kind != Kind::kCallable) {
    Fail("TypeError", StrCat("'", TypeName(callee), "' object is not callable"));
  }
  Step();
  return callee.callable->call(*this, args);
}

// The sandbox's getattr: a Python attribute first (str/list/dict methods; refused ones are unsafe), then
// the item of that name; else Undefined.
Value Interpreter::GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (obj.is_dict() && obj.dict->is_namespace) {
    const Value* v = obj.dict->Find(Value::String(name));
    if (v != nullptr) return *v;
    return Value::Undefined(StrCat("'", TypeName(obj), " object' has no attribute '", name, "'"));
  }
  if (std::optional<Value> method = GetMethod(*this, obj, name)) return *method;
  if (obj.is_dict()) {
    const Value* v = obj.dict->Find(Value::String(name));
    if (v != nullptr) return *v;
  }
  return Value::Undefined(
      StrCat("'", obj.is_none() ? "None" : TypeName(obj) + " object", "' has no attribute '", name, "'"));
}

// The sandbox's getitem: the item first, then (for a string key) the attribute; else Undefined.
Value Interpreter::GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (obj.is_dict() && !obj.dict->is_namespace) {
    if (const Value* v = obj.dict->Find(key)) return *v;
  } else if (obj.is_list() && !obj.list->python_type.empty()) {
    // Generators and dict views are not subscriptable: the sandbox's getitem makes that Undefined.
  } else if ((obj.is_list() || obj.is_string()) && IsIntLike(key)) {
    int64_t i = AsInt(key);
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.list->items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.list->items[static_cast<size_t>(i)];
    } else {
      const std::u32string chars = Decode(obj.str());
      Charge(chars.size());
      const int64_t n = static_cast<int64_t>(chars.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) {
        std::string s;
        AppendCodePoint(s, chars[static_cast<size_t>(i)]);
        return Value::String(std::move(s));
      }
    }
    return Value::Undefined(StrCat("'", TypeName(obj), " object' has no element ", AsInt(key)));
  }
  if (key.is_string()) return GetAttr(obj, key.str());
  return Value::Undefined(StrCat("'", TypeName(obj), " object' has no element ", Repr(key)));
}

// Python slicing (negative bounds count from the end; a negative step walks backwards).
Value Interpreter::Slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) FailUndefined(obj);
  auto as_index = [&](const Value& v) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (!IsIntLike(v)) Fail("TypeError", "slice indices must be integers or None");
    return AsInt(v);
  };
  const std::optional<int64_t> start_o = as_index(start_v);
  const std::optional<int64_t> stop_o = as_index(stop_v);
  const int64_t step = as_index(step_v).value_or(1);
  if (step == 0) Fail("ValueError", "slice step cannot be zero");
  std::u32string chars;
  int64_t n = 0;
  if (obj.is_string()) {
    chars = Decode(obj.str());
    n = static_cast<int64_t>(chars.size());
  } else if (obj.is_list() && obj.list->python_type.empty()) {
    n = static_cast<int64_t>(obj.list->items.size());
  } else {
    // jinja2 compiles a slice to Python's own subscript (not the sandbox's getitem): a TypeError.
    Fail("TypeError", obj.is_dict() && !obj.dict->is_namespace
                          ? std::string("unhashable type: 'slice'")
                          : StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }
  Charge(static_cast<size_t>(n));
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t start = clamp(start_o, step < 0 ? n - 1 : 0);
  const int64_t stop = clamp(stop_o, step < 0 ? -1 : n);
  std::vector<int64_t> picked;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picked.push_back(i);
  if (obj.is_string()) {
    std::string s;
    for (int64_t i : picked) AppendCodePoint(s, chars[static_cast<size_t>(i)]);
    return MakeString(std::move(s));
  }
  std::vector<Value> items;
  for (int64_t i : picked) items.push_back(obj.list->items[static_cast<size_t>(i)]);
  return MakeList(std::move(items), obj.list->is_tuple);
}

}  // namespace strata::chat_template
