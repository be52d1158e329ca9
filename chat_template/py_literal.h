#pragma once
// Python values that vLLM's XML tool-call parsers make of an argument's text, written as json.dumps
// (ensure_ascii=False) writes them: ast.literal_eval (Glm4MoeModelToolParser, when json.loads refused the
// text) and int() / float() of a string (MinimaxM2ToolParser's typed parameters). Python 3.11's rules.

#include <optional>
#include <string>
#include <string_view>

namespace strata::chat_template {

// What ast.literal_eval(text), then json.dumps of its value, come to.
//   kValue:      `json` holds the dump.
//   kNotLiteral: literal_eval raised SyntaxError or ValueError (not Python syntax, or not a literal: a name,
//                a call, an operator other than a complex number's), which vLLM catches.
//   kError:      it raised TypeError (an unhashable dict key or set element): vLLM's parser then fails as a
//                whole.
//   kUnwritable: a value json.dumps will refuse (bytes, a complex number, a set, Ellipsis, a tuple as a dict
//                key, an integer of more than 4,300 digits): the parser fails when it dumps the arguments, unless a
//                later argument of the same name replaced this one first.
// Not supported, read as kNotLiteral: `\N{NAME}` escapes (Python looks the name up in the Unicode database),
// and expressions Python parses that are no literal inside a container whose earlier item is an unhashable
// key (Python raises TypeError first; strata stops at the expression).
enum class LiteralOutcome { kValue, kNotLiteral, kError, kUnwritable };
struct LiteralDump {
  LiteralOutcome outcome = LiteralOutcome::kNotLiteral;
  std::string json;
};
LiteralDump LiteralEvalDumps(std::string_view text);

// int(text) in base 10: Unicode whitespace around, a sign, Unicode decimal digits with single underscores
// between them. The decimal text of the value, or nullopt where Python raises ValueError (more than 4,300
// digits included).
std::optional<std::string> PyIntText(std::string_view text);
// float(text): whitespace around, a sign, decimal digits (any Unicode Nd) with single underscores between
// them, a fraction, an exponent; or inf, infinity, nan in any case. nullopt where Python raises ValueError.
std::optional<double> PyFloatText(std::string_view text);
// The decimal text of int(x) for a finite x (exact: int(1e300) has 301 digits).
std::string IntegralDoubleText(double x);

}  // namespace strata::chat_template
