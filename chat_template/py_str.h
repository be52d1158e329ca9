#pragma once
// Python's str semantics on UTF-8 text, as templates see them through jinja2: case mapping, the is*
// predicates, strip, replace, split, splitlines, and int()/float() of a string. Python strings count,
// index and classify code points, so every function here works on code points (value.h's Decode).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::chat_template {

// Case mapping: Unicode's simple mappings (utf8proc), with Python's ß → "SS", İ → "i̇" and final-sigma
// rules; the few other code points whose full mapping is several characters keep their simple one.
std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
std::string PyTitle(std::string_view s);       // str.title()
std::string PyCapitalize(std::string_view s);  // str.capitalize()
std::string PySwapCase(std::string_view s);    // str.swapcase()
// The upper case of `c` appended ("SS" for ß), and the lower case of cps[i] (İ and a word-final Σ
// depend on their neighbours).
void AppendUpper(std::string& out, char32_t c);
void AppendLower(std::string& out, std::u32string_view cps, size_t i);

// str.islower() / str.isupper(): some cased character, and none of the other case.
bool PyIsLower(std::string_view s);
bool PyIsUpper(std::string_view s);
// One code point as str.isalpha() (every non-ASCII code point counts as a letter) and str.isdigit()
// (ASCII digits) see it.
bool PyIsAlpha(char32_t c);
bool PyIsDigit(char32_t c);

enum class StripSide { kBoth, kLeft, kRight };
// str.strip(chars) / lstrip / rstrip: Python's whitespace when `chars` is nullopt (None).
std::string PyStrip(std::string_view s, std::optional<std::string_view> chars = std::nullopt,
                    StripSide side = StripSide::kBoth);
// str.replace(old, new, count); count < 0 replaces every occurrence.
std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
// str.split(sep, maxsplit) / str.rsplit: runs of whitespace when `sep` is nullopt (None); maxsplit < 0
// is no limit. `sep` must not be empty (Python's ValueError is the caller's).
std::vector<std::string> PySplit(std::string_view s, std::optional<std::string_view> sep, int64_t maxsplit,
                                 bool from_right);
// str.splitlines(keepends): Python's line boundaries (\r\n, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029).
std::vector<std::string> PySplitLines(std::string_view s, bool keepends);

// int(text, base) (base prefixes, underscores, surrounding whitespace) and float(text): nullopt where
// Python raises ValueError, and for integers beyond 64 bits.
std::optional<int64_t> PyIntOf(std::string_view text, int base);
std::optional<double> PyFloatOf(std::string_view text);

}  // namespace strata::chat_template
