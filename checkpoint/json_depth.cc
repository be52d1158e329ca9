#include "checkpoint/json_depth.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace strata::checkpoint {

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

}  // namespace strata::checkpoint
