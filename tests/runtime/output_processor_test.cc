// The engine's output thread (runtime/engine/output_processor.h): stop strings wait for min_tokens (vLLM),
// prompt log-probabilities ride on the first chunk.

#include "runtime/engine/output_processor.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

namespace strata::runtime {
namespace {

// One character per token: "a" 0, "b" 1, "c" 2; without a decoder, decoded tokens are joined by spaces.
std::unique_ptr<tokenizer::Tokenizer> Letters() {
  nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}}}, {"merges", nlohmann::json::array()}}}};
  auto tok = tokenizer::Tokenizer::FromJson(j.dump());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

struct Received {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<GenerationChunk> chunks;
  bool ended = false;
};

// Streams `ids` (the last one with kLength) through an output thread with stop string "b" and min_tokens;
// returns the chunks the callback got.
std::vector<GenerationChunk> Stream(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids,
                                    int64_t min_tokens) {
  auto received = std::make_shared<Received>();
  OutputProcessor output;
  auto stream = std::make_unique<OutputStream>();
  stream->callback = [received](GenerationChunk chunk) {
    std::lock_guard lock(received->mutex);
    received->ended = received->ended || chunk.finish.has_value();
    received->chunks.push_back(std::move(chunk));
    received->changed.notify_all();
  };
  stream->stopped = std::make_shared<std::atomic<bool>>(false);
  stream->decoder.emplace(tok, /*skip_special_tokens=*/true);
  stream->stop.emplace(std::vector<std::string>{"b"});
  stream->min_tokens = min_tokens;
  output.Emit(OpenStream{1, std::move(stream)});
  for (size_t k = 0; k < ids.size(); ++k) {
    SequenceStep step{1, GeneratedToken{ids[k], -0.5, {}}, std::nullopt, absl::OkStatus(), {}};
    if (k + 1 == ids.size()) step.finish = FinishReason::kLength;
    if (k == 0) step.prompt_logprobs = {std::nullopt, GeneratedToken{2, -1.5, {}}};
    output.Emit(std::move(step));
  }
  output.Close();
  std::lock_guard lock(received->mutex);
  return received->chunks;
}

std::string Text(const std::vector<GenerationChunk>& chunks) {
  std::string text;
  for (const GenerationChunk& c : chunks) text += c.text;
  return text;
}

TEST(OutputProcessor, StopStringsAreMatchedFromMinTokensOn) {
  auto tok = Letters();
  // Without min_tokens the first "b" (token 2) ends the request.
  std::vector<GenerationChunk> chunks = Stream(*tok, {0, 1, 0, 1, 2}, 0);
  EXPECT_EQ(Text(chunks), "a ");
  EXPECT_EQ(chunks.back().finish, FinishReason::kStop);
  // min_tokens 3: token 2's "b" passes; token 4's ends it.
  chunks = Stream(*tok, {0, 1, 0, 1, 2}, 3);
  EXPECT_EQ(Text(chunks), "a b a ");
  EXPECT_EQ(chunks.back().finish, FinishReason::kStop);
  EXPECT_EQ(chunks.back().completion_tokens, 4);
  // min_tokens 2: token 2 is the second token, matched.
  EXPECT_EQ(Text(Stream(*tok, {0, 1, 0, 1, 2}, 2)), "a ");
  // Never reached: everything passes.
  chunks = Stream(*tok, {0, 1, 1}, 9);
  EXPECT_EQ(Text(chunks), "a b b");
  EXPECT_EQ(chunks.back().finish, FinishReason::kLength);
}

TEST(OutputProcessor, PromptLogprobsComeWithTheFirstChunkOnly) {
  auto tok = Letters();
  std::vector<GenerationChunk> chunks = Stream(*tok, {0, 2, 2}, 0);
  ASSERT_EQ(chunks.size(), 3u);
  ASSERT_EQ(chunks[0].prompt_logprobs.size(), 2u);
  EXPECT_FALSE(chunks[0].prompt_logprobs[0].has_value());
  EXPECT_EQ(chunks[0].prompt_logprobs[1]->id, 2);
  EXPECT_TRUE(chunks[1].prompt_logprobs.empty());
  EXPECT_TRUE(chunks[2].prompt_logprobs.empty());
}

}  // namespace
}  // namespace strata::runtime
