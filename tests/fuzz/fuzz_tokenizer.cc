// libFuzzer harness: tokenizer.json loading, encode and decode (tokenizer/). The input is
//   TOKENIZER_JSON \0 TEXT
// (JSON text holds no raw NUL, so the first NUL splits the two; without one the whole input is the JSON
// and the text is empty). A tokenizer that loads encodes TEXT with and without special tokens, decodes
// the ids both ways and streams them, and decodes TEXT's bytes read as raw little-endian int32 ids
// (unknown, negative and huge ids included). Checked promises: ids encoded without special tokens are
// tokens of the vocabulary, and StreamingDecoder's Step()s and Finish() concatenate to exactly Decode
// (streaming_decoder.h).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace {

using strata::tokenizer::StreamingDecoder;
using strata::tokenizer::Tokenizer;

// Streams `ids` and checks the result against the one-shot decode.
void CheckStreaming(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip_special_tokens) {
  const std::string whole = tokenizer.Decode(ids, skip_special_tokens);
  StreamingDecoder stream(tokenizer, skip_special_tokens);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.Step(id);
  streamed += stream.Finish();
  if (streamed != whole) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string_view json = input.substr(0, split);
  const std::string_view text = split == std::string_view::npos ? std::string_view() : input.substr(split + 1);

  absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = Tokenizer::FromJson(json);
  if (!loaded.ok()) return 0;
  const Tokenizer& tokenizer = **loaded;

  for (bool add_special_tokens : {false, true}) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, add_special_tokens);
    if (!ids.ok()) continue;  // invalid UTF-8
    // Without the post-processor every id is a token of the vocabulary or an added token. (A template's
    // special-token ids are emitted as written, in or out of the vocabulary, as upstream does; the
    // server's validation checks them against the model's vocabulary.)
    for (int32_t id : *ids) {
      if (!add_special_tokens && !tokenizer.IdToToken(id).has_value()) std::abort();
    }
    for (bool skip : {false, true}) CheckStreaming(tokenizer, *ids, skip);
  }

  std::vector<int32_t> raw(text.size() / 4);
  if (!raw.empty()) std::memcpy(raw.data(), text.data(), raw.size() * 4);
  for (bool skip : {false, true}) CheckStreaming(tokenizer, raw, skip);
  return 0;
}
