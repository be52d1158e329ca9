#pragma once
// JSON as Python's json module reads and writes it, for the tool-call parsers that restate vLLM's json calls
// (tool_calls.cc, glm45_tool_calls.cc, minimax_m2_tool_calls.cc, harmony.cc): json.loads and
// JSONDecoder.raw_decode (strict: no control characters in strings; NaN, Infinity, -Infinity; duplicate keys
// keep the first position and the last value) and json.dumps (", " and ": " separators, floats as repr(), ints
// exact, ensure_ascii either way).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::chat_template {

// Deeper JSON is malformed here; Python's json.loads fails at its recursion limit (about 1,000).
inline constexpr int kMaxJsonDepth = 512;
// Python (3.10.7+) refuses to convert an integer of more digits to or from text (ValueError).
inline constexpr size_t kMaxIntDigits = 4300;

struct PyJson {
  enum class Kind : uint8_t { kNull, kTrue, kFalse, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  std::string text;  // kNumber: its Python repr; kString: the decoded string (WTF-8)
  std::vector<std::string> keys;
  std::vector<PyJson> items;  // array elements, or object values (parallel to keys)

  const PyJson* Find(std::string_view key) const {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == key) return &items[i];
    }
    return nullptr;
  }
};

// How json.loads ended: a value, a JSONDecodeError, or the ValueError of an integer of more than
// kMaxIntDigits digits met before any syntax error (vLLM's parsers catch only JSONDecodeError).
enum class JsonLoad { kOk, kDecodeError, kValueError };

// json.loads(text): one value, JSON whitespace around it and nothing else.
JsonLoad PyJsonLoads(std::string_view text, PyJson& out);
// JSONDecoder.raw_decode(text, pos) (no whitespace skipped before the value): the value and the offset after it.
bool PyJsonRawDecode(std::string_view text, size_t pos, PyJson& out, size_t& end);

// json.dumps(value, ensure_ascii=ENSURE_ASCII). A lone surrogate (from a \udXXX escape) is written as its
// escape and invalid UTF-8 as U+FFFD, so the result is valid UTF-8.
void DumpPyJson(const PyJson& value, std::string& out, bool ensure_ascii = false);
// json.dumps of a string (WTF-8), quotes included.
void DumpPyString(std::string_view s, std::string& out, bool ensure_ascii = false);

// repr(x) of a float, as json.dumps writes it (NaN, Infinity and -Infinity for the others).
std::string PythonFloatRepr(double value);

// `text` with each invalid byte and each lone surrogate replaced by U+FFFD (a name must be valid UTF-8).
std::string ValidUtf8(std::string_view text);

bool IsJsonSpace(char c);
size_t SkipJsonSpace(std::string_view s, size_t pos);

}  // namespace strata::chat_template
