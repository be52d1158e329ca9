#include "chat_template/stream_text.h"

#include <utf8proc.h>

#include <algorithm>

#include "chat_template/value.h"

namespace strata::chat_template {
namespace {

// The length of a sequence that its lead byte announces, or 0 for a byte that cannot lead one.
int SequenceLength(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

}  // namespace

int ValidSequenceAt(std::string_view text, size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  const int n = SequenceLength(c);
  if (n <= 1 || i + n > text.size()) return n == 1 ? 1 : 0;
  const auto c1 = static_cast<unsigned char>(text[i + 1]);
  if ((c1 & 0xC0) != 0x80) return 0;
  if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) {
    return 0;
  }
  for (int k = 2; k < n; ++k) {
    if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

char32_t CodePointAt(std::string_view text, size_t i, int n) {
  const auto c = static_cast<unsigned char>(text[i]);
  if (n == 1) return c;
  char32_t cp = c & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  return cp;
}

size_t IncompleteUtf8Tail(std::string_view text) {
  for (size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const int n = SequenceLength(c);
    return n > static_cast<int>(back) ? back : 0;
  }
  return 0;
}

size_t MarkerOverlap(std::string_view text, std::string_view marker, size_t max_k) {
  for (size_t k = std::min(max_k, text.size()); k > 0; --k) {
    if (text.ends_with(marker.substr(0, k))) return k;
  }
  return 0;
}

bool IsRegexSpace(char32_t c) { return IsPySpace(c) && !(c >= 0x1C && c <= 0x1F); }

std::string_view StripPySpace(std::string_view text) {
  size_t b = 0;
  while (b < text.size()) {
    const int n = ValidSequenceAt(text, b);
    if (n == 0 || !IsPySpace(CodePointAt(text, b, n))) break;
    b += n;
  }
  size_t e = text.size();
  while (e > b) {
    size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80 && e - start < 4) --start;
    const int n = ValidSequenceAt(text, start);
    if (n == 0 || start + n != e || !IsPySpace(CodePointAt(text, start, n))) break;
    e = start;
  }
  return text.substr(b, e - b);
}

bool IsDecimalDigit(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND;
}

}  // namespace strata::chat_template
