// tiktoken vocabularies, as Kimi K2 checkpoints ship them instead of a tokenizer.json: `tiktoken.model` (one
// line per token: the token's bytes in base64, a space, its rank, which is its id), special tokens named by
// tokenizer_config.json's `added_tokens_decoder`, and a pre-tokenizer regex that lives in the checkpoint's
// Python code (tokenization_kimi.py), not in any data file.
//
// Encoding is the `tiktoken` package's: special tokens are found first, the text between them is split by
// the regex, and each piece that is not itself a token is merged from single bytes, always merging the
// adjacent pair whose concatenation has the lowest rank (the leftmost on a tie). Tokens are raw bytes; the
// tokenizer shows them spelt in GPT-2's byte-level alphabet, as Kimi's tokenizer class does, so that
// IdToToken always gives text and the ByteLevel decoder turns ids back into bytes.
#ifndef STRATA_RUNTIME_TOKENIZER_TIKTOKEN_H_
#define STRATA_RUNTIME_TOKENIZER_TIKTOKEN_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tokenizer/json_path.h"
#include "tokenizer/model.h"

namespace strata::tokenizer {

// Kimi's pre-tokenizer (tokenization_kimi.py's pat_str): Han runs on their own; words as cased runs of
// letters and marks other than Han, with an optional leading non-letter and an English contraction; up to
// three digits; punctuation runs; whitespace as GPT-4's pattern splits it. Oniguruma reads the `&&` class
// intersections and the scoped `(?i:...)` as the Rust regex syntax tiktoken compiles it with does.
inline constexpr std::string_view kKimiPattern =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

// Kimi reserves this many ids right after the ranks for special tokens (its num_reserved_special_tokens).
inline constexpr int32_t kKimiReservedSpecialTokens = 256;

// The longest line tiktoken.model may have: a 3 KiB token in base64. Real vocabularies' longest tokens are
// a few hundred bytes.
inline constexpr size_t kMaxTiktokenLineBytes = 4096;

class TiktokenModel : public Model {
 public:
  // Reads the text of a rank file. Errors are InvalidArgument "<source>: line N: ..." for a line that is
  // not "<base64> <rank>", bad base64, a rank that is not a decimal integer or is too large, a token or a
  // rank seen on an earlier line, and a gap in the ranks (they must be 0..N-1); also a missing token for a
  // byte that UTF-8 text can hold (text holding it could not be encoded).
  static absl::StatusOr<std::unique_ptr<TiktokenModel>> Parse(std::string_view text, std::string_view source);

  void Tokenize(std::string_view piece, std::vector<int32_t>& ids) const override;
  // Tokens as the tokenizer shows them: their bytes spelt in the byte-level alphabet.
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  const std::string* IdToToken(int32_t id) const override;
  int32_t IdCount() const override { return size(); }

  // How many ranks the file has (N: the ranks are 0..N-1).
  int32_t size() const { return static_cast<int32_t>(spelled_.size()); }

 private:
  std::optional<int32_t> RankOf(std::string_view bytes) const;
  // Appends the ids byte-pair merging makes of `piece` (which is not itself a token).
  void MergePiece(std::string_view piece, std::vector<int32_t>& ids) const;

  absl::flat_hash_map<std::string, int32_t> ranks_;  // token bytes -> rank
  std::vector<std::string> spelled_;                 // rank -> the token in the byte-level alphabet
};

// The added tokens of a tiktoken checkpoint, as an "added_tokens" array that AddedVocabulary::Parse reads.
// As Kimi's tokenizer class builds them: the kKimiReservedSpecialTokens ids after the `num_ranks` ranks are
// special tokens, each named by `config`'s added_tokens_decoder ("<id>": {"content": ...}) or else
// "<|reserved_token_<id>|>"; entries for other ids are ignored, as Kimi ignores them. `config` is the
// tokenizer_config.json object, or null. Errors name the JSON path (a key that is not an id, a missing
// content, two ids with the same content).
absl::StatusOr<nlohmann::json> TiktokenSpecialTokens(const JsonAt& config, int32_t num_ranks);

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_TIKTOKEN_H_
