// Debian's Abseil is built with its own absl::string_view (not an alias of std::string_view), and
// its string-keyed hash maps and StrCat accept only that. strata's tokenizer speaks std::string_view
// and converts at those calls.
#ifndef STRATA_BASE_ABSL_COMPAT_H_
#define STRATA_BASE_ABSL_COMPAT_H_

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace strata::base {

inline absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

namespace compat_internal {
template <typename T>
decltype(auto) Arg(const T& v) {
  if constexpr (std::is_same_v<T, std::string_view>) {
    return AbslView(v);
  } else {
    return (v);
  }
}
}  // namespace compat_internal

// absl::StrCat that also takes std::string_view arguments.
template <typename... Args>
std::string StrCat(const Args&... args) {
  return absl::StrCat(compat_internal::Arg(args)...);
}

}  // namespace strata::base

#endif  // STRATA_BASE_ABSL_COMPAT_H_
