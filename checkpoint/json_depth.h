#pragma once
// How deep the JSON that strata reads may nest. nlohmann-json parses without recursion, but printing a
// value (error messages quote what they refuse), copying and comparing one recurse, as do the tokenizer's
// readers of Sequence components: a file of a few megabytes of "[" would overflow the stack. Every JSON
// text from outside is checked here before it is parsed.

#include <string_view>

#include "absl/status/status.h"

namespace strata::checkpoint {

// serde_json's limit ("recursion limit exceeded" at 128 levels), which the safetensors and tokenizers
// libraries read their files with. Real config.json, index and device-map files nest a few levels.
inline constexpr int kMaxJsonDepth = 127;

// An InvalidArgument "`what`: JSON nests deeper than `max_depth` levels at byte N" when `text` nests
// arrays and objects deeper than `max_depth`. One pass over the bytes; brackets inside strings are text.
// Text that is not JSON passes (the parser reports it).
absl::Status CheckJsonDepth(std::string_view text, int max_depth, std::string_view what);

}  // namespace strata::checkpoint
