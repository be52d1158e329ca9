#pragma once
// What the parsers of a model's output (tool_calls.h, reasoning.h) share: UTF-8 sequences, the tail of a
// streamed piece that must wait for the next one (an unfinished UTF-8 sequence, the start of a marker), and
// the character classes of the Python regular expressions they restate.

#include <cstddef>
#include <string_view>

namespace strata::chat_template {

// The length of a valid UTF-8 sequence at text[i] (surrogates excluded), or 0.
int ValidSequenceAt(std::string_view text, size_t i);

// The code point of the valid sequence of `n` bytes (ValidSequenceAt) at text[i].
char32_t CodePointAt(std::string_view text, size_t i, int n);

// How many bytes at the end of `text` begin a UTF-8 sequence that the next bytes may complete.
size_t IncompleteUtf8Tail(std::string_view text);

// The longest k <= max_k such that `text` ends with marker[:k] (vLLM's partial_tag_overlap).
size_t MarkerOverlap(std::string_view text, std::string_view marker, size_t max_k);

// `\s` and `\d` of the `regex` module that vLLM's parsers compile: Unicode's White_Space property (which,
// unlike Python's str.isspace and the `re` module, leaves out U+001C..U+001F) and general category Nd.
bool IsRegexSpace(char32_t c);
bool IsDecimalDigit(char32_t c);

// Python's str.strip() (str.isspace characters at both ends) on UTF-8 text; an invalid byte counts as a
// character that is not a space (Python's text, decoded with replacement, would hold U+FFFD there).
std::string_view StripPySpace(std::string_view text);

}  // namespace strata::chat_template
