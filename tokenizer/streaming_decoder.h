// Incremental detokenization for a token stream: each Step() returns only text that no later token
// can change, and Step()s followed by Finish() concatenate to exactly Tokenizer::Decode of all ids.
//
// It decodes a short window: the tokens of the last emission (context) plus the tokens not yet
// emitted, and emits what the window's text adds to the context's text. Decoding with context keeps
// position-dependent rules right (Metaspace drops the replacement only in the sequence's first token;
// Strip after Fuse trims only the text's start). Text is held back while it
//   - ends in U+FFFD: a character's bytes are split across tokens (byte-level and byte-fallback), or
//   - ends in a run of "<0xAB>" tokens with a ByteFallback decoder: upstream decodes an invalid run as
//     one U+FFFD per byte, so a later byte can turn text already spelt by the run into U+FFFDs.
#ifndef STRATA_RUNTIME_TOKENIZER_STREAMING_DECODER_H_
#define STRATA_RUNTIME_TOKENIZER_STREAMING_DECODER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {

class StreamingDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Adds one id; returns the text that became final (often empty while a character is incomplete).
  std::string Step(int32_t id);
  // Ends the stream: returns what was held back (an incomplete character comes out as U+FFFD, as in
  // the full decode). The decoder is then empty and can start a new stream.
  std::string Finish();
  // Ids held in the window (context and not yet emitted): what each Step decodes again. Bounded by the
  // longest run of ids that cannot be emitted yet, never by the stream's length.
  size_t window_size() const { return window_.size(); }

 private:
  bool Stable(const std::string& text) const;

  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> window_;  // context ids, then ids not yet emitted
  size_t context_size_ = 0;
  std::string context_text_;  // Decode of the context ids
};

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_STREAMING_DECODER_H_
