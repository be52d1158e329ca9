#pragma once
// jinja2's lexer, with the environment transformers renders chat templates in: trim_blocks (the first
// newline after a block or comment tag is removed), lstrip_blocks (spaces and tabs from the start of a
// line up to a block or comment tag are removed), "-" and "+" whitespace control, {% raw %}, newlines
// normalised to "\n" and one trailing newline of the source dropped (keep_trailing_newline=False).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::chat_template {

enum class TokenKind : uint8_t {
  kData,        // template text, already whitespace-controlled
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // value: the unescaped text
  kInt,     // value: the digits as written, underscores removed
  kFloat,
  kOp,  // value: the operator ("+", "//", "(", ...)
  kEof,
};

struct Token {
  TokenKind kind;
  std::string value;
  int line = 1;
  int column = 1;
};

// The tokens of `source`; a lexical error is an InvalidArgument "NAME:LINE:COLUMN: message".
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source, std::string_view name);

// "NAME:LINE:COLUMN: message" (line and column from 1), the form of every syntax error.
std::string SyntaxErrorText(std::string_view name, int line, int column, std::string_view message);

}  // namespace strata::chat_template
