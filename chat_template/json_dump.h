#pragma once
// transformers' tojson filter: Python's json.dumps(x, ensure_ascii, indent, separators, sort_keys) of a
// template value.

#include <string>

#include "chat_template/interpreter.h"
#include "chat_template/value.h"

namespace strata::chat_template {

// `indent` is None, an int (spaces, clamped to 0..1024) or a str; another type is a TypeError. Floats
// print as Python's repr, NaN and infinities as JavaScript's names; a range, a generator, a dict view,
// a namespace or a callable is "Object of type T is not JSON serializable"; dict keys must be str, int,
// float, bool or None (printed as Python's json prints them).
std::string JsonDumps(Interpreter& in, const Value& v, bool ensure_ascii, const Value& indent,
                      const std::string& item_sep, const std::string& key_sep, bool sort_keys);

}  // namespace strata::chat_template
