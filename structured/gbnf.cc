#include "structured/gbnf.h"

#include <vector>

namespace strata::structured {
namespace {

enum class Lexeme { kName, kAssign, kPipe, kOpen, kClose, kOther };

struct Token {
  Lexeme kind;
  size_t begin;
  size_t end;
};

// xgrammar's EBNFLexer::IsNameChar.
bool IsNameChar(char c, bool first) {
  return c == '_' || c == '-' || c == '.' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (!first && c >= '0' && c <= '9');
}

// The end of the quoted run starting at `i` (a string "..." or a class [...]): after its closing `close`, or the
// end of the text when it has none (xgrammar reports that).
size_t SkipQuoted(std::string_view text, size_t i, char close) {
  for (++i; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == close) {
      return i + 1;
    }
  }
  return text.size();
}

std::vector<Token> Lex(std::string_view text) {
  std::vector<Token> tokens;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
    } else if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '"' || c == '[') {
      const size_t end = SkipQuoted(text, i, c == '"' ? '"' : ']');
      tokens.push_back({Lexeme::kOther, i, end});
      i = end;
    } else if (text.substr(i, 3) == "::=") {
      tokens.push_back({Lexeme::kAssign, i, i + 3});
      i += 3;
    } else if (c == '|' || c == '(' || c == ')') {
      tokens.push_back({c == '|' ? Lexeme::kPipe : c == '(' ? Lexeme::kOpen : Lexeme::kClose, i, i + 1});
      ++i;
    } else if (IsNameChar(c, /*first=*/true)) {
      const size_t begin = i;
      while (i < text.size() && IsNameChar(text[i], /*first=*/false)) ++i;
      tokens.push_back({Lexeme::kName, begin, i});
    } else {
      tokens.push_back({Lexeme::kOther, i, i + 1});
      ++i;
    }
  }
  return tokens;
}

}  // namespace

std::string FillEmptyAlternatives(std::string_view ebnf) {
  const std::vector<Token> tokens = Lex(ebnf);
  // A position is where an alternative ends: the end of the text, a `)`, a `|`, or the name that starts the next
  // rule (a name followed by `::=`).
  auto ends_alternative = [&](size_t t) {
    if (t >= tokens.size()) return true;
    const Lexeme k = tokens[t].kind;
    return k == Lexeme::kClose || k == Lexeme::kPipe ||
           (k == Lexeme::kName && t + 1 < tokens.size() && tokens[t + 1].kind == Lexeme::kAssign);
  };
  auto starts_alternative = [&](size_t t) {
    const Lexeme k = tokens[t].kind;
    return k == Lexeme::kAssign || k == Lexeme::kOpen || k == Lexeme::kPipe;
  };
  std::vector<size_t> insert_at;  // byte offsets, ascending
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (starts_alternative(t) && ends_alternative(t + 1)) insert_at.push_back(tokens[t].end);
  }
  if (insert_at.empty()) return std::string(ebnf);
  std::string out;
  out.reserve(ebnf.size() + 3 * insert_at.size());
  size_t copied = 0;
  for (size_t at : insert_at) {
    out.append(ebnf.substr(copied, at - copied));
    out.append(" \"\"");
    copied = at;
  }
  out.append(ebnf.substr(copied));
  return out;
}

}  // namespace strata::structured
