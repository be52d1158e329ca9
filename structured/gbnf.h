#pragma once
// llama.cpp's GBNF in xgrammar's EBNF. xgrammar reads GBNF (rules, strings, character classes, comments, *, +, ?,
// {m,n}) but not an empty alternative, which GBNF grammars use for "nothing": llama.cpp's own json.gbnf ends with
// `ws ::= | " " | "\n" [ \t]{0,20}`. Each empty alternative is written as the empty string "" instead; a grammar
// without one is returned as it is.

#include <string>
#include <string_view>

namespace strata::structured {

// `ebnf` with an empty string literal in every empty alternative: between `::=`, `(` or `|` and the `|` that
// follows, and between a `|` and the `)`, the next rule or the end that follows. Strings, character classes and
// comments are skipped as xgrammar's lexer skips them.
std::string FillEmptyAlternatives(std::string_view ebnf);

}  // namespace strata::structured
