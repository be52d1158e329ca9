#pragma once
// The parsed template: expressions (Expr) and statements (Stmt) as jinja2's parser builds them. Every
// node keeps its line for the errors raised while rendering it.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat_template/value.h"

namespace strata::chat_template {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind : uint8_t {
  kLiteral,  // literal
  kName,     // name
  kList,     // items
  kTuple,    // items
  kDict,     // items: key, value, key, value, ...
  kGetAttr,  // items[0] . name
  kGetItem,  // items[0] [ items[1] ]
  kSlice,    // items[0] [ items[1] : items[2] : items[3] ] (null parts absent)
  kCall,     // items[0] ( items[1..] , keywords )
  kFilter,   // items[0] | name ( items[1..], keywords ); items[0] null in {% filter %}
  kTest,     // items[0] is [not] name ( items[1..], keywords )
  kNot,
  kNeg,
  kPos,
  kBinary,  // items[0] op items[1]: + - * / // % ** ~
  kAnd,
  kOr,
  kCompare,  // items[0] ops[0] items[1] ops[1] items[2] ... (chained as in Python)
  kCond,     // items[1] if items[0] else items[2] (items[2] null: undefined)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;  // kName, kGetAttr, kFilter, kTest; kBinary: the operator
  Value literal;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;  // kCall, kFilter, kTest
  std::vector<std::string> ops;                           // kCompare
  bool negated = false;                                   // kTest: "is not"
  int depth = 1;                                          // of the tree under this node (the parser bounds it)
  int column = 0;                                         // kFilter, kTest: where the name is
};

enum class StmtKind : uint8_t {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // conditions[i] -> bodies[i]; else_body
  kFor,          // for targets in expr [if condition]: body; else_body
  kSet,          // set targets = expr  |  set ns.attr = expr (attribute)
  kSetBlock,     // set target [| filters]: body
  kMacro,        // macro name(params) body
  kCallBlock,    // call(params) expr: body is the caller
  kFilterBlock,  // filter chain (expr, a kFilter chain over null): body
  kWith,         // with targets = values: body
  kBreak,
  kContinue,
  kGeneration,  // transformers' {% generation %}: renders its body
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                  // kText; kMacro: the name
  std::vector<std::string> targets;  // kFor, kSet, kSetBlock, kWith: the names assigned
  std::string attribute;             // kSet/kSetBlock on a namespace: targets[0].attribute
  bool target_is_tuple = false;      // kFor/kSet: unpack
  ExprPtr expr;                      // kOutput, kFor (iterable), kSet, kCallBlock (the call), kFilterBlock
  ExprPtr condition;                 // kFor: the loop filter
  std::vector<ExprPtr> conditions;   // kIf
  std::vector<ExprPtr> values;       // kWith
  std::vector<Body> bodies;          // kIf
  Body body;
  Body else_body;
  std::vector<MacroParam> params;  // kMacro, kCallBlock
};

// A parsed template: its statements, and the name errors are reported under.
struct Program {
  std::string name;
  std::string source;
  Body body;
};

}  // namespace strata::chat_template
