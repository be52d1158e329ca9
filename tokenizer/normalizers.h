// Normalizers: Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD, Lowercase, Strip. Unicode
// normalisation comes from utf8proc (Debian), not hand-made tables.
#ifndef STRATA_RUNTIME_TOKENIZER_NORMALIZERS_H_
#define STRATA_RUNTIME_TOKENIZER_NORMALIZERS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tokenizer/json_path.h"

namespace strata::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` (valid UTF-8). Upstream normalises each piece of the input that is not an added
  // token separately, and so does the tokenizer: a Prepend applies to every such piece.
  virtual void Normalize(std::string& text) const = 0;
};

// Parses the normalizer object at `json` (e.g. the top-level "normalizer").
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const JsonAt& json);

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_NORMALIZERS_H_
