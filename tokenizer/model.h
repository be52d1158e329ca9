// The model stage of the pipeline: what turns one pre-tokenized piece into ids, and the vocabulary the
// rest of the tokenizer looks tokens up in. Two kinds: BpeModel (tokenizer.json's "model") and
// TiktokenModel (a tiktoken rank file).
#ifndef STRATA_RUNTIME_TOKENIZER_MODEL_H_
#define STRATA_RUNTIME_TOKENIZER_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tokenizer {

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of one pre-tokenized piece. Thread-safe.
  virtual void Tokenize(std::string_view piece, std::vector<int32_t>& ids) const = 0;
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  // The vocabulary's token for `id`, or null when it has none.
  virtual const std::string* IdToToken(int32_t id) const = 0;
  // One past the largest id the vocabulary may have a token for.
  virtual int32_t IdCount() const = 0;
};

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_MODEL_H_
