// The BPE model: vocab, ranked merges, byte_fallback, unk_token/fuse_unk, ignore_merges,
// continuing_subword_prefix/end_of_word_suffix, as HF tokenizers' `models::bpe::BPE` defines them.
#ifndef STRATA_RUNTIME_TOKENIZER_BPE_H_
#define STRATA_RUNTIME_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "tokenizer/json_path.h"
#include "tokenizer/model.h"

namespace strata::tokenizer {

// The largest token id model.vocab may use: 16x the largest vocabularies in use (262,144), and small
// enough that the id -> token table stays within a few hundred MB.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

class BpeModel : public Model {
 public:
  // Parses the "model" object at `json`; rejects models other than BPE, merges naming unknown tokens,
  // and dropout (a sampling feature, not reproducible token for token).
  static absl::StatusOr<std::unique_ptr<BpeModel>> Parse(const JsonAt& json);

  // Appends the ids of one pre-tokenized piece. Thread-safe.
  void Tokenize(std::string_view word, std::vector<int32_t>& ids) const override;

  std::optional<int32_t> TokenToId(std::string_view token) const override;
  // The vocab entry for `id`, or null when the vocab has none.
  const std::string* IdToToken(int32_t id) const override;
  int32_t MaxId() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  int32_t IdCount() const override { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct MergeRule {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Parse's steps: model.vocab (and the id -> token table), the options, model.merges (after both).
  absl::Status ParseVocab(const JsonAt& vocab);
  absl::Status ParseOptions(const JsonAt& json);
  absl::Status ParseMerges(const JsonAt& merges);
  // The initial symbols of `word` (characters, byte-fallback bytes, unk), then every merge.
  void MergeWord(std::string_view word, std::vector<int32_t>& ids) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;
  absl::flat_hash_map<uint64_t, MergeRule> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::array<int32_t, 256> byte_ids_;  // "<0xAB>" tokens for byte_fallback; -1 where missing

  // Word cache: a piece's ids once merged. Real text repeats its words, and merging dominates the
  // cost of a miss. Bounded; when full, new words are merged but not remembered (as upstream does).
  // Requests are tokenized on several threads at once (the server's admission pool), so the cache is
  // guarded by a std::shared_mutex: a pthread rwlock, which ThreadSanitizer sees, where Debian's
  // uninstrumented absl::Mutex is invisible to it. Guarded by cache_mu_: cache_, cache_ids_.
  mutable std::shared_mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::pair<uint32_t, uint32_t>> cache_;
  mutable std::vector<int32_t> cache_ids_;
};

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_BPE_H_
