#include "chat_template/parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <stdexcept>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "chat_template/lexer.h"

namespace strata::chat_template {

using base::StrCat;
namespace {

// jinja2 resolves filter and test names when it compiles a template: a name it does not know is an
// error even in a branch that never runs. These are jinja2 3.1's own (tojson replaced by transformers');
// the renderer refuses, when they run, the few strata does not implement (filters.cc, jinja_tests.cc).
bool KnownFilter(std::string_view name) {
  static const absl::flat_hash_set<std::string> kFilters = {
      "abs",       "attr",       "batch",       "capitalize", "center",  "count",
      "d",         "default",    "dictsort",    "e",          "escape",  "filesizeformat",
      "first",     "float",      "forceescape", "format",     "groupby", "indent",
      "int",       "join",       "last",        "length",     "list",    "lower",
      "items",     "map",        "min",         "max",        "pprint",  "random",
      "reject",    "rejectattr", "replace",     "reverse",    "round",   "safe",
      "select",    "selectattr", "slice",       "sort",       "string",  "striptags",
      "sum",       "title",      "trim",        "truncate",   "unique",  "upper",
      "urlencode", "urlize",     "wordcount",   "wordwrap",   "xmlattr", "tojson"};
  return kFilters.contains(std::string(name));
}

bool KnownTest(std::string_view name) {
  static const absl::flat_hash_set<std::string> kTests = {
      "odd",     "even",   "divisibleby", "defined",  "undefined", "filter", "test",    "none",
      "boolean", "false",  "true",        "integer",  "float",     "lower",  "upper",   "string",
      "mapping", "number", "sequence",    "iterable", "callable",  "sameas", "escaped", "in",
      "==",      "eq",     "equalto",     "!=",       "ne",        ">",      "gt",      "greaterthan",
      "ge",      ">=",     "<",           "lt",       "lessthan",  "<=",     "le"};
  return kTests.contains(std::string(name));
}

// Thrown inside the parser only (a recursive-descent parser unwinds through many frames on error);
// Parse() turns it into a Status.
struct SyntaxError {
  int line;
  int column;
  std::string message;
};

std::string Describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::kData:
      return "template data";
    case TokenKind::kVarBegin:
      return "begin of print statement";
    case TokenKind::kVarEnd:
      return "end of print statement";
    case TokenKind::kBlockBegin:
      return "begin of statement block";
    case TokenKind::kBlockEnd:
      return "end of statement block";
    case TokenKind::kEof:
      return "end of template";
    case TokenKind::kString:
      return "string";
    case TokenKind::kInt:
      return "integer";
    case TokenKind::kFloat:
      return "float";
    default:
      return StrCat("'", t.value, "'");
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body ParseTemplate() {
    Body body = Subparse({});
    if (Cur().kind != TokenKind::kEof) Fail(Cur(), "unexpected token");
    CheckNames(body, /*soft=*/false);
    return body;
  }

 private:
  // --- filter and test names, checked as jinja2's compiler checks them: an unknown name is an error
  // unless it sits in an `if` statement (its tests and branches, not in loops or macros nested there) or
  // in an `x if y else z` expression, where jinja2 defers the error to the moment it runs.
  void CheckNames(const Body& body, bool soft) {
    for (const StmtPtr& s : body) CheckStmt(*s, soft);
  }

  void CheckStmt(const Stmt& s, bool soft) {
    auto expr = [&](const ExprPtr& e, bool in_soft) {
      if (e) CheckExpr(*e, in_soft);
    };
    switch (s.kind) {
      case StmtKind::kIf:
        for (const ExprPtr& c : s.conditions) expr(c, true);
        for (const Body& b : s.bodies) CheckNames(b, true);
        CheckNames(s.else_body, true);
        return;
      case StmtKind::kFor:
        expr(s.expr, soft);
        expr(s.condition, false);
        CheckNames(s.body, false);
        CheckNames(s.else_body, false);
        return;
      case StmtKind::kMacro:
      case StmtKind::kCallBlock:
        for (const MacroParam& p : s.params) expr(p.default_value, false);
        if (s.kind == StmtKind::kCallBlock) expr(s.expr, soft);
        CheckNames(s.body, false);
        return;
      case StmtKind::kWith:
        for (const ExprPtr& v : s.values) expr(v, soft);
        CheckNames(s.body, false);
        return;
      case StmtKind::kSetBlock:
      case StmtKind::kFilterBlock:
        expr(s.expr, s.kind == StmtKind::kSetBlock ? soft : false);
        CheckNames(s.body, false);
        return;
      case StmtKind::kGeneration:
        CheckNames(s.body, false);
        return;
      default:
        expr(s.expr, soft);
        return;
    }
  }

  void CheckExpr(const Expr& e, bool soft) {
    if (e.kind == ExprKind::kCond) soft = true;
    if (!soft && e.kind == ExprKind::kFilter && !KnownFilter(e.name)) {
      throw SyntaxError{e.line, e.column, StrCat("No filter named '", e.name, "'.")};
    }
    if (!soft && e.kind == ExprKind::kTest && !KnownTest(e.name)) {
      throw SyntaxError{e.line, e.column, StrCat("No test named '", e.name, "'.")};
    }
    for (const ExprPtr& item : e.items) {
      if (item) CheckExpr(*item, soft);
    }
    for (const auto& [key, value] : e.keywords) CheckExpr(*value, soft);
  }

  // --- token helpers
  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t n = 1) const { return tokens_[std::min(pos_ + n, tokens_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsName(std::string_view name, const Token* t = nullptr) const {
    const Token& tok = t ? *t : Cur();
    return tok.kind == TokenKind::kName && tok.value == name;
  }
  bool IsOp(std::string_view op) const { return Cur().kind == TokenKind::kOp && Cur().value == op; }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  [[noreturn]] void Fail(const Token& t, std::string message) { throw SyntaxError{t.line, t.column, message}; }
  void ExpectOp(std::string_view op) {
    if (!SkipOp(op)) Fail(Cur(), StrCat("expected '", op, "', got ", Describe(Cur())));
  }
  std::string ExpectName() {
    if (Cur().kind != TokenKind::kName) Fail(Cur(), StrCat("expected a name, got ", Describe(Cur())));
    std::string name = Cur().value;
    Next();
    return name;
  }
  void ExpectBlockEnd() {
    if (Cur().kind != TokenKind::kBlockEnd) {
      Fail(Cur(), StrCat("expected end of statement block, got ", Describe(Cur())));
    }
    Next();
  }

  struct Depth {
    Depth(Parser* p) : parser(p) {
      if (++parser->depth_ > kMaxParseNesting) {
        parser->Fail(parser->Cur(), StrCat("nesting deeper than ", kMaxParseNesting, " levels"));
      }
    }
    ~Depth() { --parser->depth_; }
    Parser* parser;
  };

  // Sets e's depth from its children and refuses trees deeper than kMaxParseNesting: chains such as
  // `a + b + c ...` or `x|f|f|f...` nest without recursing in the parser, but rendering and freeing the
  // tree recurse along them.
  ExprPtr Finish(ExprPtr e) {
    int depth = 0;
    for (const ExprPtr& item : e->items) {
      if (item) depth = std::max(depth, item->depth);
    }
    for (const auto& [key, value] : e->keywords) depth = std::max(depth, value->depth);
    e->depth = depth + 1;
    if (e->depth > kMaxParseNesting) Fail(Cur(), StrCat("nesting deeper than ", kMaxParseNesting, " levels"));
    return e;
  }

  ExprPtr Make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // --- statements

  // Statements until a block whose first name is one of `end_tags` (left unconsumed, after its "{%").
  Body Subparse(const std::vector<std::string_view>& end_tags) {
    Depth depth(this);
    Body body;
    while (true) {
      const Token& t = Cur();
      if (t.kind == TokenKind::kEof) {
        if (!end_tags.empty()) {
          std::string expected;
          for (auto tag : end_tags) expected += StrCat(expected.empty() ? "" : " or ", "'", tag, "'");
          Fail(t, StrCat("unexpected end of template, expected ", expected));
        }
        return body;
      }
      if (t.kind == TokenKind::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.value;
        body.push_back(std::move(s));
        Next();
      } else if (t.kind == TokenKind::kVarBegin) {
        Next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = t.line;
        s->expr = ParseTuple(/*with_condexpr=*/true, {}, /*explicit_parentheses=*/false);
        if (Cur().kind != TokenKind::kVarEnd) {
          Fail(Cur(), StrCat("expected end of print statement, got ", Describe(Cur())));
        }
        Next();
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kBlockBegin) {
        Next();
        for (auto tag : end_tags) {
          if (IsName(tag)) return body;
        }
        body.push_back(ParseStatement());
      } else {
        Fail(t, StrCat("unexpected ", Describe(t)));
      }
    }
  }

  StmtPtr ParseStatement() {
    const Token& t = Cur();
    if (t.kind != TokenKind::kName) Fail(t, "tag name expected");
    const std::string& tag = t.value;
    if (tag == "for") return ParseFor();
    if (tag == "if") return ParseIf();
    if (tag == "set") return ParseSet();
    if (tag == "macro") return ParseMacro();
    if (tag == "call") return ParseCallBlock();
    if (tag == "filter") return ParseFilterBlock();
    if (tag == "with") return ParseWith();
    if (tag == "generation") return ParseGeneration();
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) Fail(t, StrCat("'", tag, "' outside of a loop"));
      auto s = std::make_unique<Stmt>();
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      s->line = t.line;
      Next();
      ExpectBlockEnd();
      return s;
    }
    if (tag == "extends" || tag == "include" || tag == "import" || tag == "from" || tag == "block") {
      Fail(t, StrCat("'", tag, "' is not supported: a chat template is one self-contained template"));
    }
    Fail(t, StrCat("Encountered unknown tag '", tag, "'"));
  }

  // "{% endX %}": the name (current token) and the block end.
  void EndTag(std::string_view name) {
    if (!SkipName(name)) Fail(Cur(), StrCat("expected '", name, "'"));
    ExpectBlockEnd();
  }

  // A statement of `kind` at the current tag's name, which it consumes.
  StmtPtr StartStmt(StmtKind kind) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = Cur().line;
    Next();
    return s;
  }

  StmtPtr ParseFor() {
    StmtPtr s = StartStmt(StmtKind::kFor);
    ParseAssignTargets(*s, "in");
    if (!SkipName("in")) Fail(Cur(), StrCat("expected 'in', got ", Describe(Cur())));
    s->expr = ParseTuple(/*with_condexpr=*/false, {"recursive"}, false);
    if (SkipName("if")) s->condition = ParseExpression(true);
    if (IsName("recursive")) Fail(Cur(), "recursive for loops are not supported");
    ExpectBlockEnd();
    ++loop_depth_;
    s->body = Subparse({"endfor", "else"});
    --loop_depth_;
    if (SkipName("else")) {
      ExpectBlockEnd();
      s->else_body = Subparse({"endfor"});
    }
    EndTag("endfor");
    return s;
  }

  StmtPtr ParseIf() {
    StmtPtr s = StartStmt(StmtKind::kIf);
    while (true) {
      s->conditions.push_back(ParseTuple(/*with_condexpr=*/false, {}, false));
      ExpectBlockEnd();
      s->bodies.push_back(Subparse({"elif", "else", "endif"}));
      if (SkipName("elif")) continue;
      if (SkipName("else")) {
        ExpectBlockEnd();
        s->else_body = Subparse({"endif"});
      }
      break;
    }
    EndTag("endif");
    return s;
  }

  // Names to assign (`a` or `a, b`), stopping before `stop` ("in" for loops).
  void ParseAssignTargets(Stmt& s, std::string_view stop) {
    while (true) {
      s.targets.push_back(ExpectName());
      if (IsName(stop) || !IsOp(",")) break;
      Next();
      s.target_is_tuple = true;
      if (IsName(stop) || IsOp("=")) break;
    }
    for (const auto& name : s.targets) {
      if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" || name == "None") {
        Fail(Cur(), StrCat("cannot assign to '", name, "'"));
      }
    }
  }

  StmtPtr ParseSet() {
    auto s = std::make_unique<Stmt>();
    s->line = Cur().line;
    Next();
    if (Cur().kind == TokenKind::kName && Peek().kind == TokenKind::kOp && Peek().value == ".") {
      s->targets.push_back(Cur().value);
      Next();
      Next();
      s->attribute = ExpectName();
    } else {
      ParseAssignTargets(*s, "");
    }
    if (SkipOp("=")) {
      s->kind = StmtKind::kSet;
      s->expr = ParseTuple(true, {}, false);
      ExpectBlockEnd();
      return s;
    }
    if (s->target_is_tuple) Fail(Cur(), "a block set assigns one name");
    s->kind = StmtKind::kSetBlock;
    s->expr = ParseFilterChain(nullptr);
    ExpectBlockEnd();
    s->body = Subparse({"endset"});
    EndTag("endset");
    return s;
  }

  void ParseParams(Stmt& s) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!s.params.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      MacroParam p;
      p.name = ExpectName();
      if (SkipOp("=")) {
        p.default_value = ParseExpression(true);
      } else {
        for (const auto& prev : s.params) {
          if (prev.default_value) Fail(Cur(), "non-default argument follows default argument");
        }
      }
      s.params.push_back(std::move(p));
    }
    ExpectOp(")");
  }

  StmtPtr ParseMacro() {
    StmtPtr s = StartStmt(StmtKind::kMacro);
    s->text = ExpectName();
    ParseParams(*s);
    ExpectBlockEnd();
    s->body = SubparseOutsideLoops("endmacro");
    return s;
  }

  // The body of a macro or call block up to its end tag: a body of its own, where break and continue are
  // outside any loop again (jinja2 refuses them there).
  Body SubparseOutsideLoops(std::string_view end_tag) {
    const int saved = loop_depth_;
    loop_depth_ = 0;
    Body body = Subparse({end_tag});
    loop_depth_ = saved;
    EndTag(end_tag);
    return body;
  }

  StmtPtr ParseCallBlock() {
    StmtPtr s = StartStmt(StmtKind::kCallBlock);
    if (IsOp("(")) ParseParams(*s);
    s->expr = ParseExpression(true);
    if (s->expr->kind != ExprKind::kCall) Fail(Cur(), "expected call");
    ExpectBlockEnd();
    s->body = SubparseOutsideLoops("endcall");
    return s;
  }

  StmtPtr ParseFilterBlock() {
    StmtPtr s = StartStmt(StmtKind::kFilterBlock);
    s->expr = ParseFilterChain(nullptr, /*leading_pipe=*/false);
    ExpectBlockEnd();
    s->body = Subparse({"endfilter"});
    EndTag("endfilter");
    return s;
  }

  StmtPtr ParseWith() {
    StmtPtr s = StartStmt(StmtKind::kWith);
    while (Cur().kind != TokenKind::kBlockEnd) {
      if (!s->targets.empty()) ExpectOp(",");
      s->targets.push_back(ExpectName());
      ExpectOp("=");
      s->values.push_back(ParseExpression(true));
    }
    ExpectBlockEnd();
    s->body = Subparse({"endwith"});
    EndTag("endwith");
    return s;
  }

  StmtPtr ParseGeneration() {
    StmtPtr s = StartStmt(StmtKind::kGeneration);
    ExpectBlockEnd();
    s->body = Subparse({"endgeneration"});
    EndTag("endgeneration");
    return s;
  }

  // --- expressions (jinja2/parser.py's precedence, lowest first)

  // `a, b` (a tuple) or one expression. Ends before a block/variable end, ")" or an extra end name.
  ExprPtr ParseTuple(bool with_condexpr, const std::vector<std::string_view>& extra_end, bool explicit_parentheses) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) ExpectOp(",");
      if (IsTupleEnd(extra_end)) break;
      items.push_back(ParseExpression(with_condexpr));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) Fail(Cur(), StrCat("Expected an expression, got ", Describe(Cur())));
    }
    auto e = Make(ExprKind::kTuple, line);
    e->items = std::move(items);
    return Finish(std::move(e));
  }

  bool IsTupleEnd(const std::vector<std::string_view>& extra_end) const {
    const Token& t = Cur();
    if (t.kind == TokenKind::kVarEnd || t.kind == TokenKind::kBlockEnd || t.kind == TokenKind::kEof) return true;
    if (t.kind == TokenKind::kOp && t.value == ")") return true;
    for (auto name : extra_end) {
      if (IsName(name)) return true;
    }
    return false;
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    Depth depth(this);
    return with_condexpr ? ParseCondExpr() : ParseOr();
  }

  ExprPtr ParseCondExpr() {
    ExprPtr expr = ParseOr();
    while (IsName("if")) {
      const int line = Cur().line;
      Next();
      ExprPtr test = ParseOr();
      ExprPtr otherwise;
      if (SkipName("else")) otherwise = ParseCondExpr();
      auto e = Make(ExprKind::kCond, line);
      e->items.push_back(std::move(test));
      e->items.push_back(std::move(expr));
      e->items.push_back(std::move(otherwise));
      expr = Finish(std::move(e));
    }
    return expr;
  }

  ExprPtr Binary(ExprKind kind, ExprPtr left, ExprPtr right, int line, std::string op = "") {
    auto e = Make(kind, line);
    e->name = std::move(op);
    e->items.push_back(std::move(left));
    e->items.push_back(std::move(right));
    return Finish(std::move(e));
  }

  // `operand (keyword operand)*`, left-associative: `or` over `and` over `not`.
  ExprPtr ParseKeywordChain(const char* keyword, ExprKind kind, ExprPtr (Parser::*operand)()) {
    ExprPtr left = (this->*operand)();
    while (IsName(keyword)) {
      const int line = Cur().line;
      Next();
      left = Binary(kind, std::move(left), (this->*operand)(), line);
    }
    return left;
  }
  ExprPtr ParseOr() { return ParseKeywordChain("or", ExprKind::kOr, &Parser::ParseAnd); }
  ExprPtr ParseAnd() { return ParseKeywordChain("and", ExprKind::kAnd, &Parser::ParseNot); }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      Depth depth(this);
      auto e = Make(ExprKind::kNot, Cur().line);
      Next();
      e->items.push_back(ParseNot());
      return Finish(std::move(e));
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const int line = Cur().line;
    ExprPtr first = ParseMath1();
    ExprPtr e;
    while (true) {
      std::string op;
      const Token& t = Cur();
      if (t.kind == TokenKind::kOp && (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == "<=" ||
                                       t.value == ">" || t.value == ">=")) {
        op = t.value;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && IsName("in", &Peek())) {
        op = "not in";
        Next();
        Next();
      } else {
        break;
      }
      if (!e) {
        e = Make(ExprKind::kCompare, line);
        e->items.push_back(std::move(first));
      }
      e->ops.push_back(op);
      e->items.push_back(ParseMath1());
    }
    return e ? Finish(std::move(e)) : std::move(first);
  }

  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Cur().value;
      const int line = Cur().line;
      Next();
      left = Binary(ExprKind::kBinary, std::move(left), ParseConcat(), line, op);
    }
    return left;
  }

  ExprPtr ParseConcat() {
    ExprPtr left = ParseMath2();
    while (IsOp("~")) {
      const int line = Cur().line;
      Next();
      left = Binary(ExprKind::kBinary, std::move(left), ParseMath2(), line, "~");
    }
    return left;
  }

  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Cur().value;
      const int line = Cur().line;
      Next();
      left = Binary(ExprKind::kBinary, std::move(left), ParsePow(), line, op);
    }
    return left;
  }

  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary(true);
    while (IsOp("**")) {
      const int line = Cur().line;
      Next();
      left = Binary(ExprKind::kBinary, std::move(left), ParseUnary(true), line, "**");
    }
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    Depth depth(this);
    ExprPtr node;
    const int line = Cur().line;
    if (IsOp("-") || IsOp("+")) {
      const bool neg = IsOp("-");
      Next();
      node = Make(neg ? ExprKind::kNeg : ExprKind::kPos, line);
      node->items.push_back(ParseUnary(false));
      node = Finish(std::move(node));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr Literal(Value v, int line) {
    auto e = Make(ExprKind::kLiteral, line);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr ParsePrimary() {
    const Token& t = Cur();
    const int line = t.line;
    switch (t.kind) {
      case TokenKind::kName: {
        std::string name = t.value;
        Next();
        if (name == "true" || name == "True") return Literal(Value::Bool(true), line);
        if (name == "false" || name == "False") return Literal(Value::Bool(false), line);
        if (name == "none" || name == "None") return Literal(Value::None(), line);
        auto e = Make(ExprKind::kName, line);
        e->name = std::move(name);
        return e;
      }
      case TokenKind::kString: {
        std::string s;
        while (Cur().kind == TokenKind::kString) {
          s += Cur().value;
          Next();
        }
        return Literal(Value::String(std::move(s)), line);
      }
      case TokenKind::kInt: {
        const std::string& text = t.value;
        int base = 10;
        size_t skip = 0;
        if (text.size() > 2 && text[0] == '0') {
          const char b = static_cast<char>(text[1] | 0x20);
          base = b == 'x' ? 16 : b == 'o' ? 8 : b == 'b' ? 2 : 10;
          skip = base == 10 ? 0 : 2;
        }
        int64_t value = 0;
        auto [ptr, ec] = std::from_chars(text.data() + skip, text.data() + text.size(), value, base);
        if (ec != std::errc() || ptr != text.data() + text.size()) {
          Fail(t, StrCat("integer ", text, " does not fit in 64 bits"));
        }
        Next();
        return Literal(Value::Int(value), line);
      }
      case TokenKind::kFloat: {
        const double value = std::strtod(t.value.c_str(), nullptr);
        Next();
        return Literal(Value::Float(value), line);
      }
      case TokenKind::kOp:
        if (t.value == "(") {
          Next();
          ExprPtr e = ParseTuple(true, {}, /*explicit_parentheses=*/true);
          ExpectOp(")");
          return e;
        }
        if (t.value == "[") {
          Next();
          auto e = Make(ExprKind::kList, line);
          while (!IsOp("]")) {
            if (!e->items.empty()) ExpectOp(",");
            if (IsOp("]")) break;
            e->items.push_back(ParseExpression(true));
          }
          ExpectOp("]");
          return Finish(std::move(e));
        }
        if (t.value == "{") {
          Next();
          auto e = Make(ExprKind::kDict, line);
          while (!IsOp("}")) {
            if (!e->items.empty()) ExpectOp(",");
            if (IsOp("}")) break;
            e->items.push_back(ParseExpression(true));
            ExpectOp(":");
            e->items.push_back(ParseExpression(true));
          }
          ExpectOp("}");
          return Finish(std::move(e));
        }
        [[fallthrough]];
      default:
        Fail(t, StrCat("unexpected ", Describe(t)));
    }
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        node = ParseFilterChain(std::move(node));
      } else if (IsName("is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    Depth depth(this);
    const Token& t = Cur();
    const int line = t.line;
    if (SkipOp(".")) {
      const Token& attr = Cur();
      if (attr.kind == TokenKind::kName) {
        auto e = Make(ExprKind::kGetAttr, line);
        e->name = attr.value;
        e->items.push_back(std::move(node));
        Next();
        return Finish(std::move(e));
      }
      if (attr.kind == TokenKind::kInt) {
        auto e = Make(ExprKind::kGetItem, line);
        e->items.push_back(std::move(node));
        e->items.push_back(ParsePrimary());
        return Finish(std::move(e));
      }
      Fail(attr, "expected name or number");
    }
    ExpectOp("[");
    std::vector<ExprPtr> args;
    while (!IsOp("]")) {
      if (!args.empty()) ExpectOp(",");
      args.push_back(ParseSubscribed());
    }
    ExpectOp("]");
    if (args.size() == 1 && args[0]->kind == ExprKind::kSlice) {
      args[0]->items[0] = std::move(node);
      return Finish(std::move(args[0]));
    }
    auto e = Make(ExprKind::kGetItem, line);
    e->items.push_back(std::move(node));
    if (args.size() == 1) {
      e->items.push_back(std::move(args[0]));
    } else {
      auto tuple = Make(ExprKind::kTuple, line);
      tuple->items = std::move(args);
      e->items.push_back(Finish(std::move(tuple)));
    }
    return Finish(std::move(e));
  }

  // An index or a slice `start:stop:step` (parts optional); a slice comes back as kSlice with items[0]
  // left for the sliced object.
  ExprPtr ParseSubscribed() {
    const int line = Cur().line;
    std::vector<ExprPtr> parts;
    if (IsOp(":")) {
      Next();
      parts.push_back(nullptr);
    } else {
      ExprPtr node = ParseExpression(true);
      if (!IsOp(":")) return node;
      Next();
      parts.push_back(std::move(node));
    }
    if (IsOp(":")) {
      parts.push_back(nullptr);
    } else if (!IsOp("]") && !IsOp(",")) {
      parts.push_back(ParseExpression(true));
    } else {
      parts.push_back(nullptr);
    }
    if (SkipOp(":")) {
      parts.push_back(!IsOp("]") && !IsOp(",") ? ParseExpression(true) : nullptr);
    } else {
      parts.push_back(nullptr);
    }
    auto e = Make(ExprKind::kSlice, line);
    e->items.push_back(nullptr);
    for (auto& p : parts) e->items.push_back(std::move(p));
    return e;
  }

  // "(" args ")" into e->items (after items[0]) and e->keywords.
  void ParseArgs(Expr& e) {
    ExpectOp("(");
    bool first = true;
    while (!IsOp(")")) {
      if (!first) ExpectOp(",");
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) Fail(Cur(), "*args and **kwargs in calls are not supported");
      if (Cur().kind == TokenKind::kName && Peek().kind == TokenKind::kOp && Peek().value == "=") {
        std::string key = Cur().value;
        Next();
        Next();
        e.keywords.emplace_back(std::move(key), ParseExpression(true));
      } else {
        if (!e.keywords.empty()) Fail(Cur(), "positional argument follows keyword argument");
        e.items.push_back(ParseExpression(true));
      }
    }
    ExpectOp(")");
  }

  ExprPtr ParseCall(ExprPtr node) {
    Depth depth(this);
    auto e = Make(ExprKind::kCall, Cur().line);
    e->items.push_back(std::move(node));
    ParseArgs(*e);
    return Finish(std::move(e));
  }

  // `| name(args) | name ...` applied to `node` (null for {% filter %} and {% set x | f %}); without
  // `leading_pipe` the first filter has no "|" before it ({% filter upper %}).
  ExprPtr ParseFilterChain(ExprPtr node, bool leading_pipe = true) {
    Depth depth(this);
    if (!leading_pipe) node = ParseOneFilter(std::move(node));
    while (SkipOp("|")) node = ParseOneFilter(std::move(node));
    return node;
  }

  ExprPtr ParseOneFilter(ExprPtr node) {
    const int line = Cur().line;
    const Token& at = Cur();
    std::string name = ExpectName();
    while (IsOp(".") && Peek().kind == TokenKind::kName) {
      Next();
      name += "." + Cur().value;
      Next();
    }
    auto e = Make(ExprKind::kFilter, line);
    e->column = at.column;
    e->name = std::move(name);
    e->items.push_back(std::move(node));
    if (IsOp("(")) ParseArgs(*e);
    return Finish(std::move(e));
  }

  ExprPtr ParseTest(ExprPtr node) {
    Depth depth(this);
    auto e = Make(ExprKind::kTest, Cur().line);
    Next();  // "is"
    if (SkipName("not")) e->negated = true;
    const Token& at = Cur();
    std::string name = ExpectName();
    while (IsOp(".") && Peek().kind == TokenKind::kName) {
      Next();
      name += "." + Cur().value;
      Next();
    }
    e->column = at.column;
    e->name = std::move(name);
    e->items.push_back(std::move(node));
    const Token& t = Cur();
    if (IsOp("(")) {
      ParseArgs(*e);
    } else if ((t.kind == TokenKind::kName || t.kind == TokenKind::kString || t.kind == TokenKind::kInt ||
                t.kind == TokenKind::kFloat ||
                (t.kind == TokenKind::kOp && (t.value == "(" || t.value == "[" || t.value == "{"))) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) Fail(t, "You cannot chain multiple tests with is");
      e->items.push_back(ParsePostfix(ParsePrimary()));
    }
    return Finish(std::move(e));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Program>> Parse(std::string_view source, std::string_view name) {
  absl::StatusOr<std::vector<Token>> tokens = Tokenize(source, name);
  if (!tokens.ok()) return tokens.status();
  auto program = std::make_unique<Program>();
  program->name = std::string(name);
  program->source = std::string(source);
  try {
    program->body = Parser(std::move(*tokens)).ParseTemplate();
  } catch (const SyntaxError& e) {
    return absl::InvalidArgumentError(SyntaxErrorText(name, e.line, e.column, e.message));
  }
  return program;
}

}  // namespace strata::chat_template
