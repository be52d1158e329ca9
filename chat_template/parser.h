#pragma once
// jinja2's parser (jinja2/parser.py) over the lexer's tokens: the statements transformers' environment
// knows (for, if, set, macro, call, filter, with, raw, break/continue from loopcontrols, generation
// from transformers' AssistantTracker) and jinja2's expression grammar with its precedences. Tags that
// load other templates (extends, block, include, import) and `for ... recursive` are refused with a
// syntax error naming the tag.

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "chat_template/ast.h"

namespace strata::chat_template {

// Nesting deeper than this (brackets, operators, blocks) is a syntax error: the parser and the renderer
// recurse along it, and no real template comes near.
inline constexpr int kMaxParseNesting = 200;

absl::StatusOr<std::unique_ptr<Program>> Parse(std::string_view source, std::string_view name);

}  // namespace strata::chat_template
