// UTF-8 helpers shared by the tokenizer's stages: validation, code point iteration, and the character
// classes of Rust's `char` that HF tokenizers' components are defined in terms of.
#ifndef STRATA_RUNTIME_TOKENIZER_UTF8_H_
#define STRATA_RUNTIME_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::tokenizer {

// Byte offset of the first byte that is not part of well-formed UTF-8 (overlongs, surrogates and code
// points above U+10FFFF are ill-formed), or std::string_view::npos when `text` is valid.
size_t FindInvalidUtf8(std::string_view text);

// Decodes the code point starting at text[pos] (text must be valid UTF-8) and advances pos past it.
char32_t NextCodepoint(std::string_view text, size_t& pos);

// Length in bytes of the UTF-8 sequence whose lead byte is `lead` (1 for continuation bytes).
inline size_t Utf8SequenceLength(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

void AppendUtf8(char32_t cp, std::string& out);

// Appends `bytes` as text the way Rust's String::from_utf8_lossy does: each maximal ill-formed
// subsequence becomes one U+FFFD (HF's ByteLevel decoder builds its output this way).
void AppendUtf8Lossy(std::string_view bytes, std::string& out);

// Rust's char::is_whitespace (the Unicode White_Space property).
bool IsWhitespace(char32_t cp);
// Rust's char::is_numeric (general categories Nd, Nl, No).
bool IsNumeric(char32_t cp);
// Rust's char::is_alphanumeric, approximated by general categories (letters, marks that are
// alphabetic in practice, numbers); used by added tokens' `single_word`.
bool IsAlphanumeric(char32_t cp);

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_UTF8_H_
