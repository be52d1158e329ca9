#include "base/json.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace strata::base {
namespace {

template <typename Json>
absl::StatusOr<Json> ParseBounded(std::string_view text, int max_depth, std::string_view what) {
  if (absl::Status depth = CheckJsonDepth(text, max_depth, what); !depth.ok()) return depth;
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const typename Json::exception& e) {
    // parse_error names the byte; out_of_range.406 a number too large for a double.
    return absl::InvalidArgumentError(
        absl::StrCat(absl::string_view(what.data(), what.size()), ": not valid JSON: ", e.what()));
  }
}

}  // namespace

absl::Status CheckJsonDepth(std::string_view text, int max_depth, std::string_view what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(absl::StrCat(absl::string_view(what.data(), what.size()),
                                                       ": JSON nests deeper than ", max_depth, " levels at byte ", i));
      }
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced text is the parser's to report
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, int max_depth, std::string_view what) {
  return ParseBounded<nlohmann::json>(text, max_depth, what);
}

absl::StatusOr<nlohmann::ordered_json> ParseOrderedJson(std::string_view text, int max_depth, std::string_view what) {
  return ParseBounded<nlohmann::ordered_json>(text, max_depth, what);
}

}  // namespace strata::base
