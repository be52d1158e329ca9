#pragma once
// The one-letter escapes that Python string literals (lexer.cc) and JSON strings (tool_calls.cc) share.

namespace strata::chat_template {

// \b \f \n \r \t: the character `e` stands for after a backslash, or 0 where it is not one of them.
inline char ShortEscape(char e) {
  switch (e) {
    case 'b':
      return '\b';
    case 'f':
      return '\f';
    case 'n':
      return '\n';
    case 'r':
      return '\r';
    case 't':
      return '\t';
    default:
      return 0;
  }
}

}  // namespace strata::chat_template
