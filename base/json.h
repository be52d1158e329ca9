#pragma once
// JSON from outside (request bodies, strings that hold JSON, files read at start): how deep it may nest,
// and the one bounded parser every such text goes through. nlohmann-json parses without recursion, but
// printing a value (error messages quote what they refuse), copying and comparing one recurse, as do the
// tokenizer's readers of Sequence components and the chat templates' tojson: a few megabytes of "["
// would overflow the stack. ParseJson checks the depth before anything is built.

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace strata::base {

// serde_json's limit ("recursion limit exceeded" at 128 levels), which the safetensors and tokenizers
// libraries read their files with. Real config.json, index and device-map files nest a few levels.
inline constexpr int kMaxJsonDepth = 127;

// An InvalidArgument "`what`: JSON nests deeper than `max_depth` levels at byte N" when `text` nests
// arrays and objects deeper than `max_depth`. One pass over the bytes; brackets inside strings are text.
// Text that is not JSON passes (the parser reports it).
absl::Status CheckJsonDepth(std::string_view text, int max_depth, std::string_view what);

// `text` parsed after CheckJsonDepth: InvalidArgument "`what`: JSON nests deeper than ..." or
// "`what`: not valid JSON: <the parser's reason>" (a syntax error at byte N, a number beyond a double, ...).
// Any JSON value is returned; the caller checks its type.
absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, int max_depth, std::string_view what);
// The same, keeping the objects' key order (request bodies, chat messages: templates iterate in order).
absl::StatusOr<nlohmann::ordered_json> ParseOrderedJson(std::string_view text, int max_depth, std::string_view what);

}  // namespace strata::base
