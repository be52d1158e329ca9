// The engine's OpenAI-facing sampling features over the tiny random Llama of engine_fixture.h: prompt
// log-probabilities (chunked prefill, the prefix cache, max_new_tokens 0), min_tokens, the frequency
// penalty. Their parity with transformers is in tests/runtime_parity/test_openai_sampling.py.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "runtime/engine/batch_generate.h"
#include "runtime/engine/engine.h"
#include "tests/runtime/engine_fixture.h"

namespace strata::runtime {
namespace {

std::vector<int32_t> Range(int32_t first, int32_t count) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < count; ++i) ids.push_back((first + 7 * i) % static_cast<int32_t>(kVocab));
  return ids;
}

// The log-probability of a prompt token given the tokens before it is what generation reports for the
// same token when the model chose it after the same tokens: a prompt made of a prompt and its greedy
// continuation must score the continuation as generation did, whatever the prefill chunking, the prefix
// cache (a request asking for prompt logprobs computes every position) and the requests around it.
TEST(EngineSampling, PromptLogprobsEqualTheLogprobsOfTheSameTokensGenerated) {
  auto model = Load(4);
  ASSERT_TRUE(model);
  const std::vector<int32_t> prompt = Range(3, 20);
  EngineOptions options;
  options.prefill_chunk_tokens = 5;  // the 31-token prompt below is prefilled in 7 chunks
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  SamplingParams greedy;
  greedy.max_new_tokens = 12;
  greedy.top_logprobs = 2;
  auto generated = GenerateBatch(**engine, {prompt}, greedy);
  ASSERT_TRUE(generated.ok()) << generated.status();
  EXPECT_TRUE((*generated)[0].prompt_logprobs.empty());  // not asked for
  std::vector<int32_t> scored = prompt;
  for (int k = 0; k < 11; ++k) scored.push_back((*generated)[0].tokens[k].id);
  // The whole of `scored` is in the prefix cache now (but its last, partial block): taken as it is by a
  // request that does not score its prompt.
  const uint64_t hits = StatsWhenIdle(**engine).prefix_hit_tokens;
  ASSERT_TRUE(GenerateBatch(**engine, {scored}, greedy).ok());
  ASSERT_GE(StatsWhenIdle(**engine).prefix_hit_tokens, hits + 16);

  SamplingParams score = greedy;
  score.max_new_tokens = 0;
  score.prompt_logprobs = 2;
  // Among other requests, which decode while the scored prompt is prefilled.
  Collector c;
  for (int i = 1; i < 4; ++i) {
    GenerationRequest other;
    other.prompt = Range(i, 3 + i);
    other.sampling.max_new_tokens = 8;
    ASSERT_TRUE((*engine)->Submit(other, c.For(i)).ok());
  }
  GenerationRequest request;
  request.prompt = scored;
  request.sampling = score;
  ASSERT_TRUE((*engine)->Submit(request, c.For(0)).ok());
  c.Wait(4);
  ASSERT_EQ(c.chunks[0].size(), 1u);  // prefill alone: one chunk, final, no token
  const GenerationChunk& chunk = c.chunks[0][0];
  EXPECT_EQ(chunk.finish, FinishReason::kLength);
  EXPECT_TRUE(chunk.tokens.empty());
  EXPECT_EQ(chunk.completion_tokens, 0);
  ASSERT_EQ(chunk.prompt_logprobs.size(), scored.size());
  EXPECT_FALSE(chunk.prompt_logprobs[0].has_value());
  for (size_t i = 1; i < scored.size(); ++i) {
    ASSERT_TRUE(chunk.prompt_logprobs[i].has_value()) << i;
    EXPECT_EQ(chunk.prompt_logprobs[i]->id, scored[i]);
    EXPECT_TRUE(std::isfinite(chunk.prompt_logprobs[i]->logprob));
    EXPECT_LE(chunk.prompt_logprobs[i]->logprob, 0);
    ASSERT_EQ(chunk.prompt_logprobs[i]->top.size(), 2u);
  }
  for (size_t k = 0; k < 11; ++k) {
    const GeneratedToken& expected = (*generated)[0].tokens[k];
    const GeneratedToken& got = *chunk.prompt_logprobs[prompt.size() + k];
    EXPECT_NEAR(got.logprob, expected.logprob, 1e-4) << "token " << k;
    EXPECT_EQ(got.top[0].first, expected.top[0].first) << "token " << k;  // greedy: it was the best
    EXPECT_NEAR(got.top[1].second, expected.top[1].second, 1e-4) << "token " << k;
  }

  // The same scores without chunking or a cache, and on the first chunk of a request that generates.
  EngineOptions whole;
  whole.prefix_cache = false;
  auto plain = Engine::Start(*model, nullptr, {}, whole);
  ASSERT_TRUE(plain.ok());
  score.max_new_tokens = 3;
  Collector d;
  request.sampling = score;
  ASSERT_TRUE((*plain)->Submit(request, d.For(0)).ok());
  d.Wait(1);
  ASSERT_EQ(d.Ids(0).size(), 3u);
  ASSERT_EQ(d.chunks[0].front().prompt_logprobs.size(), scored.size());
  for (size_t n = 1; n < d.chunks[0].size(); ++n) EXPECT_TRUE(d.chunks[0][n].prompt_logprobs.empty());
  for (size_t i = 1; i < scored.size(); ++i) {
    EXPECT_NEAR(d.chunks[0].front().prompt_logprobs[i]->logprob, chunk.prompt_logprobs[i]->logprob, 1e-4) << i;
  }
  EXPECT_EQ(d.Ids(0)[0], (*generated)[0].tokens[11].id);
}

// vLLM's min_tokens: the EOS ids cannot be chosen before min_tokens tokens, as if banned by logit_bias.
TEST(EngineSampling, MinTokensKeepsEosFromBeingChosen) {
  auto model = Load(2);
  ASSERT_TRUE(model);
  const std::vector<int32_t> prompt = {1, 5, 9};
  EngineOptions options;
  auto probe = Engine::Start(*model, nullptr, {}, options);
  ASSERT_TRUE(probe.ok());
  SamplingParams greedy;
  greedy.max_new_tokens = 6;
  auto free_run = GenerateBatch(**probe, {prompt}, greedy);
  ASSERT_TRUE(free_run.ok());
  const int32_t eos = (*free_run)[0].tokens[0].id;  // greedy's first choice
  SamplingParams banned = greedy;
  banned.logit_bias = {{eos, -std::numeric_limits<float>::infinity()}};
  auto banned_run = GenerateBatch(**probe, {prompt}, banned);
  ASSERT_TRUE(banned_run.ok());

  auto engine = Engine::Start(*model, nullptr, {eos}, options);
  ASSERT_TRUE(engine.ok());
  auto ended = GenerateBatch(**engine, {prompt}, greedy);
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ((*ended)[0].tokens.size(), 1u);
  EXPECT_EQ((*ended)[0].finish, FinishReason::kEos);
  SamplingParams min = greedy;
  min.min_tokens = 3;
  auto held = GenerateBatch(**engine, {prompt}, min);
  ASSERT_TRUE(held.ok());
  ASSERT_GE((*held)[0].tokens.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NE((*held)[0].tokens[k].id, eos) << k;
    EXPECT_EQ((*held)[0].tokens[k].id, (*banned_run)[0].tokens[k].id) << k;
  }
}

// The frequency penalty counts generated tokens: a large one makes greedy decoding never repeat a token it
// generated, where plain greedy decoding of this model does.
TEST(EngineSampling, FrequencyPenaltyCountsGeneratedTokens) {
  auto model = Load(2);
  ASSERT_TRUE(model);
  auto engine = Engine::Start(*model, nullptr, {}, EngineOptions{});
  ASSERT_TRUE(engine.ok());
  SamplingParams greedy;
  greedy.max_new_tokens = 24;
  auto distinct = [](const BatchOutput& out) {
    std::set<int32_t> ids;
    for (const GeneratedToken& t : out.tokens) ids.insert(t.id);
    return ids.size();
  };
  auto plain = GenerateBatch(**engine, {{4, 8, 15, 16}}, greedy);
  ASSERT_TRUE(plain.ok());
  ASSERT_LT(distinct((*plain)[0]), 24u) << "the test needs a model whose greedy output repeats";
  SamplingParams penalised = greedy;
  penalised.frequency_penalty = 1000;
  auto out = GenerateBatch(**engine, {{4, 8, 15, 16}}, penalised);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(distinct((*out)[0]), 24u);
  penalised.frequency_penalty = 0;
  penalised.presence_penalty = 1000;
  out = GenerateBatch(**engine, {{4, 8, 15, 16}}, penalised);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(distinct((*out)[0]), 24u);
}

}  // namespace
}  // namespace strata::runtime
