// Oniguruma, the regex engine HF tokenizers itself uses (through the `onig` crate), so that Split and
// Replace patterns from tokenizer.json match exactly as they do upstream: same syntax (Oniguruma's
// default), same Unicode property tables, same leftmost-first semantics.
#ifndef STRATA_RUNTIME_TOKENIZER_REGEX_H_
#define STRATA_RUNTIME_TOKENIZER_REGEX_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::tokenizer {

// A byte range [start, end) of a searched string.
using Match = std::pair<size_t, size_t>;

class Regex {
 public:
  // Compiles `pattern`; the error names what Oniguruma rejected.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends every non-overlapping match in `text`, left to right, with the empty-match rule of the
  // `onig` crate's find_iter (an empty match right after the previous match is skipped). Look-arounds
  // see all of `text`. Safe to call from several threads at once.
  void FindAll(std::string_view text, std::vector<Match>& out) const;

 private:
  explicit Regex(void* compiled) : compiled_(compiled) {}
  void* compiled_;  // regex_t*; kept opaque so oniguruma.h stays out of the headers
};

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_REGEX_H_
