// strata's tokenizer: reads a Hugging Face tokenizer.json (+ tokenizer_config.json) and encodes and
// decodes token for token as the `tokenizers` library does; or a tiktoken vocabulary (tiktoken.model, as
// Kimi K2 ships it) and does so as the `tiktoken` package does. The public API speaks plain C++ types.
//
//   auto tok = strata::tokenizer::Tokenizer::FromPath("/models/llama");  // dir or tokenizer.json
//   auto ids = (*tok)->Encode("Hello", /*add_special_tokens=*/true);
//   std::string text = (*tok)->Decode(*ids, /*skip_special_tokens=*/true);
#ifndef STRATA_RUNTIME_TOKENIZER_TOKENIZER_H_
#define STRATA_RUNTIME_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace strata::tokenizer {

class AddedVocabulary;
class Decoder;
class Model;
class Normalizer;
class PostProcessor;
class PreTokenizer;

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a checkpoint directory holding one; a directory's
  // tokenizer_config.json is read too (add_bos_token/add_eos_token, used when tokenizer.json has no
  // post-processor). A directory without tokenizer.json but with tiktoken.model is read by FromTiktoken
  // (with its tokenizer_config.json), and so is a file named tiktoken.model or *.tiktoken. Errors name the
  // file and the JSON path or line of what is wrong or unsupported.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromPath(const std::string& path);
  // Whether checkpoint directory `dir` holds a tokenizer FromPath reads (tokenizer.json or tiktoken.model),
  // or may: anything at either path counts, so that reading it reports what is wrong with it.
  static bool DirectoryHasTokenizer(const std::string& dir);
  // From the text of a tokenizer.json (and optionally of a tokenizer_config.json). `source` names the
  // file in messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view tokenizer_json,
                                                             std::string_view config_json = {},
                                                             std::string_view source = "tokenizer.json");
  // From the text of a tiktoken rank file (and optionally of a tokenizer_config.json, whose
  // added_tokens_decoder names the special tokens), with Kimi's pre-tokenizer pattern and special-token
  // layout (see tiktoken.h). Encode and Decode then equal tiktoken's encode(text, allowed_special="all")
  // and decode; `add_special_tokens` adds nothing, as Kimi's tokenizer adds nothing. `source` names the
  // rank file in messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromTiktoken(std::string_view ranks,
                                                                 std::string_view config_json = {},
                                                                 std::string_view source = "tiktoken.model");
  ~Tokenizer();

  // Token ids of `text` (UTF-8 of at most 1 GiB; anything else is InvalidArgument). Special
  // tokens in the text are always recognised; `add_special_tokens` adds the post-processor's (BOS...).
  // Thread-safe.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const;

  // Text of `ids`, as upstream's decode: ids with no token are dropped, special tokens too when
  // `skip_special_tokens`. Invalid UTF-8 produced by byte tokens comes out as U+FFFD.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // Whether `id` is a special added token (what skip_special_tokens drops).
  bool IsSpecial(int32_t id) const;
  // Whether the decoder turns runs of "<0xAB>" tokens into bytes (see StreamingDecoder).
  bool HasByteFallbackDecoder() const;
  // One past the largest id of any token, the vocabulary's or an added one (ids below it may have none).
  int64_t IdCount() const;

  // How the vocabulary's tokens (IdToToken) spell the bytes they decode to, which a grammar engine that matches
  // tokens against text must know (structured/). Read as xgrammar's TokenizerInfo::DetectMetadataFromHF reads a
  // tokenizer.json: the first ByteLevel or ByteFallback decoder (alone or in a Sequence) decides; kRaw otherwise.
  // A tiktoken vocabulary's tokens are shown in the byte-level alphabet.
  enum class TokenSpelling {
    kRaw,           // a token is its text
    kByteLevel,     // GPT-2's byte-level alphabet: one character per byte
    kByteFallback,  // SentencePiece: "<0xAB>" is a byte, "\u2581" a space
  };
  TokenSpelling token_spelling() const { return token_spelling_; }
  // Whether encoding prepends "\u2581" to the text: a Prepend("\u2581") normalizer (alone or in a Sequence) or a
  // Metaspace pre-tokenizer with prepend_scheme "always" or "first" (DetectMetadataFromHF's add_prefix_space).
  bool adds_prefix_space() const { return adds_prefix_space_; }

 private:
  Tokenizer();
  void EncodeText(std::string_view text, std::vector<int32_t>& ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<AddedVocabulary> added_;
  // Read from a tiktoken vocabulary. Then an added token's text is its bytes, like any token's, so Decode
  // hands the ByteLevel decoder added tokens spelt in the byte-level alphabet too (a tokenizer.json's go to
  // its decoder as written); and special means a special added token's id (tiktoken knows special tokens
  // by id, where tokenizer.json's decode skips every token whose text is a special token's).
  bool tiktoken_ = false;
  TokenSpelling token_spelling_ = TokenSpelling::kRaw;
  bool adds_prefix_space_ = false;
};

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_TOKENIZER_H_
