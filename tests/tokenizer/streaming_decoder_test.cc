#include "tokenizer/streaming_decoder.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata::tokenizer {
namespace {

std::unique_ptr<Tokenizer> Load(nlohmann::json vocab, nlohmann::json decoder) {
  nlohmann::json j = {{"added_tokens", {{{"id", 9}, {"content", "<s>"}, {"special", true}, {"normalized", false}}}},
                      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                      {"decoder", decoder}};
  auto tok = Tokenizer::FromJson(j.dump());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

std::vector<std::string> Stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip = false) {
  StreamingDecoder stream(tok, skip);
  std::vector<std::string> steps;
  for (int32_t id : ids) steps.push_back(stream.Step(id));
  steps.push_back(stream.Finish());
  return steps;
}

// Byte-level: "é" is the bytes C3 A9, i.e. the alphabet characters "Ã" and "©".
const nlohmann::json kByteVocab = {{"Ã", 0}, {"©", 1}, {"a", 2}, {"Ġ", 3}, {"<s>", 9}};
const nlohmann::json kByteLevel = {{"type", "ByteLevel"}};

TEST(StreamingDecoder, HoldsBackACharacterSplitAcrossTokens) {
  auto tok = Load(kByteVocab, kByteLevel);
  EXPECT_EQ(Stream(*tok, {2, 0, 1, 3, 2}), (std::vector<std::string>{"a", "", "é", " ", "a", ""}));
}

TEST(StreamingDecoder, FinishFlushesAnIncompleteCharacterAsTheFullDecodeDoes) {
  auto tok = Load(kByteVocab, kByteLevel);
  const std::vector<int32_t> ids = {2, 0};
  auto steps = Stream(*tok, ids);
  EXPECT_EQ(steps[0] + steps[1] + steps[2], tok->Decode(ids, false));
  EXPECT_EQ(steps[2], "\xEF\xBF\xBD");
}

TEST(StreamingDecoder, MetaspaceLeadingSpaceOnlyAtTheStart) {
  auto tok = Load({{"▁a", 0}, {"▁b", 1}, {"<s>", 9}},
                  {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}});
  EXPECT_EQ(Stream(*tok, {0, 1, 0}), (std::vector<std::string>{"a", " b", " a", ""}));
  // A skipped special token first: the first text token still loses its "▁", as in the full decode.
  EXPECT_EQ(Stream(*tok, {9, 0, 1}, /*skip=*/true), (std::vector<std::string>{"", "a", " b", ""}));
}

TEST(StreamingDecoder, ByteFallbackRunIsHeldUntilItEnds) {
  // <0x41> then <0xFF>: upstream decodes the invalid run as two U+FFFD, so "A" must not leave early.
  const nlohmann::json vocab = {{"<0x41>", 0}, {"<0xFF>", 1}, {"x", 2}, {"<s>", 9}};
  const nlohmann::json decoder = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
  auto tok = Load(vocab, decoder);
  const std::vector<int32_t> ids = {0, 1, 2};
  auto steps = Stream(*tok, ids);
  EXPECT_EQ(steps, (std::vector<std::string>{"", "", "\xEF\xBF\xBD\xEF\xBF\xBDx", ""}));
  EXPECT_EQ(tok->Decode(ids, false), "\xEF\xBF\xBD\xEF\xBF\xBDx");
  EXPECT_EQ(Stream(*tok, {0, 2}), (std::vector<std::string>{"", "Ax", ""}));
}

TEST(StreamingDecoder, CanStartANewStreamAfterFinish) {
  auto tok = Load(kByteVocab, kByteLevel);
  StreamingDecoder stream(*tok, false);
  EXPECT_EQ(stream.Step(2), "a");
  EXPECT_EQ(stream.Finish(), "");
  EXPECT_EQ(stream.Step(3), " ");
}

TEST(StreamingDecoder, IdsThatDecodeToNothingDoNotGrowTheWindow) {
  // Before: ids without a token (a padded model vocabulary) and skipped special tokens stayed in the
  // window, which never became stable, and every step decoded the whole window: 50,000 of them took
  // seconds (quadratic). Found by tests/fuzz/fuzz_tokenizer (a timeout streaming raw ids). Checked by
  // the window's size (what each step decodes again), not by a clock.
  auto tok = Load(kByteVocab, kByteLevel);
  for (const auto& [nothing, skip] : {std::pair<int32_t, bool>{1000, false}, {-7, false}, {9, true}}) {
    StreamingDecoder stream(*tok, skip);
    std::string text;
    size_t largest_window = 0;
    for (int i = 0; i < 50000; ++i) {
      text += stream.Step(nothing);
      largest_window = std::max(largest_window, stream.window_size());
    }
    text += stream.Step(2);
    text += stream.Finish();
    EXPECT_EQ(text, "a") << nothing;
    EXPECT_LE(largest_window, 8u) << "id " << nothing << ": the window grew with the stream";
  }
  // Skipped only when skipping: kept, the special token is text.
  EXPECT_EQ(Stream(*tok, {9, 2}), (std::vector<std::string>{"<s>", "a", ""}));
}

}  // namespace
}  // namespace strata::tokenizer
