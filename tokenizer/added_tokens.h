// Added tokens (tokenizer.json "added_tokens"): found in the input before the model sees it and never
// split. Like HF's AddedVocabulary, tokens with "normalized": false are matched in the raw input, and
// tokens with "normalized": true in each remaining piece after normalisation (their content
// normalised too). `single_word`, `lstrip` and `rstrip` decide whether a match counts and how much
// surrounding whitespace it swallows.
#ifndef STRATA_RUNTIME_TOKENIZER_ADDED_TOKENS_H_
#define STRATA_RUNTIME_TOKENIZER_ADDED_TOKENS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "base/absl_compat.h"
#include "tokenizer/json_path.h"
#include "tokenizer/normalizers.h"

namespace strata::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A part of a string: an added token (id >= 0) or text between tokens (id == -1).
struct Segment {
  size_t start;
  size_t end;
  int32_t id;
};

// Leftmost-longest matching of a fixed set of strings (the semantics of the aho-corasick crate's
// LeftmostLongest mode that upstream uses): a byte trie, entered only at bytes that start a pattern.
class TokenMatcher {
 public:
  void Add(std::string_view pattern, int32_t token_index);
  bool empty() const { return nodes_.size() <= 1; }
  // Finds the leftmost position >= from where a pattern starts and the longest pattern there.
  // Returns false when none does.
  bool Next(std::string_view text, size_t from, size_t& start, size_t& end, int32_t& token_index) const;

 private:
  std::vector<int32_t> nodes_{-1};                // node -> token index ending here, or -1
  absl::flat_hash_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
  bool first_byte_[256] = {};
};

class AddedVocabulary {
 public:
  // Parses the "added_tokens" array at `json`; `normalizer` (may be null) normalises the content of
  // tokens marked "normalized". `model_token_to_id` is consulted for tokens whose id is missing.
  static absl::StatusOr<AddedVocabulary> Parse(const JsonAt& json, const Normalizer* normalizer);

  // Appends `text`'s segments to `out` (offsets into `text`), matching the raw-input tokens
  // (normalized == false) or the normalised ones.
  void Split(std::string_view text, bool normalized_tokens, std::vector<Segment>& out) const;

  bool has_raw_tokens() const { return !raw_.empty(); }
  bool has_normalized_tokens() const { return !normalized_.empty(); }
  const AddedToken* ById(int32_t id) const;
  std::optional<int32_t> IdOf(std::string_view content) const;
  // Whether `content` is the content of a special token (what skip_special_tokens drops on decode).
  bool IsSpecialContent(std::string_view content) const { return special_contents_.contains(base::AbslView(content)); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  absl::flat_hash_map<std::string, int32_t> by_content_;
  absl::flat_hash_set<std::string> special_contents_;
  TokenMatcher raw_;
  TokenMatcher normalized_;
};

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_ADDED_TOKENS_H_
