// Decoders: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence. Like upstream, each
// rewrites the list of token strings (a "decode chain"); the tokenizer joins what comes out.
#ifndef STRATA_RUNTIME_TOKENIZER_DECODERS_H_
#define STRATA_RUNTIME_TOKENIZER_DECODERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/json_path.h"

namespace strata::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>& tokens) const = 0;
  // Whether this decoder (or one in its Sequence) is ByteFallback. Its output for a run of "<0xAB>"
  // tokens can change when the run grows (an invalid run turns into one U+FFFD per byte), which the
  // streaming decoder must know.
  virtual bool HasByteFallback() const { return false; }
};

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const JsonAt& json);

// Whether `token` is a byte-fallback token "<0xAB>"; its byte goes to `byte`.
bool ParseByteToken(std::string_view token, unsigned char& byte);

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_DECODERS_H_
