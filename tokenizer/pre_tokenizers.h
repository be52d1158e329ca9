// Pre-tokenizers: ByteLevel, Split, Digits, Metaspace, Sequence. Each cuts pieces into smaller pieces
// (and may rewrite them); the model then tokenizes every piece on its own.
#ifndef STRATA_RUNTIME_TOKENIZER_PRE_TOKENIZERS_H_
#define STRATA_RUNTIME_TOKENIZER_PRE_TOKENIZERS_H_

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/json_path.h"
#include "tokenizer/pieces.h"

namespace strata::tokenizer {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by the pieces this stage makes of them; rewritten text lives in `arena`.
  virtual void PreTokenize(std::vector<Piece>& pieces, PieceArena& arena) const = 0;
};

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const JsonAt& json);

// GPT-2's byte-to-character table (`bytes_to_unicode`): printable Latin-1 bytes stand for
// themselves, the others for U+0100 upwards, so that any byte string is visible text. Entry b is the
// UTF-8 encoding of the character for byte b.
const std::array<std::string, 256>& ByteLevelAlphabet();

// The inverse: the byte a character of the alphabet stands for, or -1.
int ByteLevelByteOf(char32_t cp);

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_PRE_TOKENIZERS_H_
