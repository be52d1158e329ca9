#pragma once
// Whether a string is UTF-8 by its lead and continuation bytes (no check of overlong forms or surrogates): what the
// streaming tests of the tool-call and reasoning parsers ask of every delta when the text fed was UTF-8.

#include <cstddef>
#include <string_view>

namespace strata::chat_template {

inline bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80                 ? 1
                  : c >= 0xC2 && c <= 0xDF ? 2
                  : c >= 0xE0 && c <= 0xEF ? 3
                  : c >= 0xF0 && c <= 0xF4 ? 4
                                           : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (int k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace strata::chat_template
