#pragma once
// The tree-walking renderer of a parsed template, with jinja2's runtime semantics (scoping: a for loop's
// body is a new scope each iteration, macros close over the scope they are defined in and see its
// later assignments, `set` in an `if` assigns in the enclosing scope) and the immutable sandbox's
// attribute rules. Errors unwind as RenderError (a renderer recursing through expressions, statements
// and macro calls would otherwise test a status at every node); Template::Render turns them into
// absl::Status.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "chat_template/ast.h"
#include "chat_template/chat_template.h"
#include "chat_template/value.h"

namespace strata::chat_template {

struct RenderError {
  std::string message;  // "NAME:LINE: Kind: text"
};

struct Frame {
  absl::flat_hash_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;

  const Value* Find(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using FramePtr = std::shared_ptr<Frame>;

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  Interpreter(const Program& program, const RenderLimits& limits);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders with `globals` (jinja2's environment globals) under `context` (the render() arguments).
  std::string Render(FramePtr context);

  // --- for the builtins (builtins.h: filters, tests, methods, globals)
  // Raises "NAME:LINE: kind: message" at the node being evaluated.
  [[noreturn]] void Fail(std::string_view kind, std::string_view message) const;
  [[noreturn]] void FailUndefined(const Value& v) const;
  // Counts work against RenderLimits::max_steps; Charge counts the bytes or items a result holds.
  void Step(int64_t n = 1);
  void Charge(size_t units) { Step(static_cast<int64_t>(units / 16) + 1); }
  // Counts bytes of values built against RenderLimits::max_built_bytes.
  void CountBuilt(size_t bytes);
  // A string result, checked against the output cap (no value may outgrow the whole rendering).
  Value MakeString(std::string s);
  Value MakeList(std::vector<Value> items, bool is_tuple = false);
  Value Call(const Value& callee, CallArgs& args);
  Value GetAttr(const Value& obj, const std::string& name);
  Value GetItem(const Value& obj, const Value& key);
  // Python's iter(): the items of a list or tuple, a dict's keys, a string's characters; Undefined is
  // empty; anything else is a TypeError.
  std::vector<Value> Iterate(const Value& v);
  const RenderLimits& limits() const { return limits_; }
  // A binary operator as the template's `a op b` computes it (for tests such as divisibleby).
  Value BinaryOp(const std::string& op, const Value& a, const Value& b) { return Binary(op, a, b); }

 private:
  friend class MacroCall;
  Value Eval(const Expr& e, const FramePtr& frame);
  Value EvalDict(const Expr& e, const FramePtr& frame);
  Value EvalSign(const Expr& e, const FramePtr& frame);
  Value EvalCompare(const Expr& e, const FramePtr& frame);
  Flow Exec(const Body& body, const FramePtr& frame, std::string& out);
  Flow ExecStmt(const Stmt& s, const FramePtr& frame, std::string& out);
  void ExecFor(const Stmt& s, const FramePtr& frame, std::string& out);
  Value ApplyFilters(const Expr& chain, const FramePtr& frame, std::optional<Value> input);
  // A binary operator, dispatched to Python's number arithmetic, `+` on sequences or `*` repetition.
  Value Binary(const std::string& op, const Value& a, const Value& b);
  Value Arithmetic(const std::string& op, const Value& a, const Value& b);
  Value IntArithmetic(const std::string& op, const Value& a, const Value& b);
  Value FloatArithmetic(const std::string& op, const Value& a, const Value& b);
  Value Concatenate(const Value& a, const Value& b);
  Value Repeat(const Value& a, const Value& b);
  [[noreturn]] void FailOperands(const std::string& op, const Value& a, const Value& b) const;
  [[noreturn]] void FailOverflow() const;
  bool Reaches(const Value& v, const DictData* target);
  Value Format(const Value& format, const Value& args);
  bool Compare(const std::string& op, const Value& a, const Value& b);
  bool Contains(const Value& container, const Value& item);
  Value Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
  void Assign(const Stmt& s, const FramePtr& frame, const Value& v);
  void BindTargets(const std::vector<std::string>& targets, bool is_tuple, Frame& frame, const Value& v);
  CallArgs EvalArgs(const Expr& e, const FramePtr& frame, size_t first);
  Value MakeMacro(const Stmt& s, FramePtr frame, std::string name);
  void Append(std::string& out, std::string_view text);

  struct Depth {
    explicit Depth(Interpreter* in);
    ~Depth() { --in->depth_; }
    Interpreter* in;
  };

  const Program& program_;
  RenderLimits limits_;
  int64_t steps_ = 0;
  size_t built_bytes_ = 0;
  int depth_ = 0;
  int line_ = 0;
  std::vector<std::weak_ptr<Frame>> captured_frames_;
  std::vector<std::weak_ptr<std::optional<Value>>> changed_states_;
};

}  // namespace strata::chat_template
