// The patterns of Split, Replace (normalizer and decoder): {"String": s} matches s literally,
// {"Regex": r} is an Oniguruma regex. Also the split behaviours HF applies to a piece's matches.
#ifndef STRATA_RUNTIME_TOKENIZER_PATTERN_H_
#define STRATA_RUNTIME_TOKENIZER_PATTERN_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/json_path.h"
#include "tokenizer/pieces.h"
#include "tokenizer/regex.h"

namespace strata::tokenizer {

class Pattern {
 public:
  // Parses {"String": "..."} or {"Regex": "..."} at `json`.
  static absl::StatusOr<Pattern> Parse(const JsonAt& json);
  static absl::StatusOr<Pattern> Literal(std::string text);

  // Appends the non-overlapping matches in `text`, left to right.
  void FindAll(std::string_view text, std::vector<Match>& out) const;
  // Appends `text` with every match replaced by `content`.
  void ReplaceAll(std::string_view text, std::string_view content, std::string& out) const;

 private:
  std::string literal_;           // used when regex_ is null
  std::shared_ptr<Regex> regex_;  // shared: components are copied into Sequences at parse time
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<SplitBehavior> ParseSplitBehavior(const JsonAt& json);

// Cuts `piece` at `matches` (sorted, non-overlapping byte ranges of piece.text) the way HF's
// NormalizedString::split does for `behavior`, and appends the non-empty results to `out`. With
// `invert`, the matches and the text between them swap roles.
void SplitPiece(const Piece& piece, const std::vector<Match>& matches, SplitBehavior behavior, bool invert,
                std::vector<Piece>& out);

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_PATTERN_H_
