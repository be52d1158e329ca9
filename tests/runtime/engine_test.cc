// The engine over a real (tiny, random) Llama checkpoint written by the test: continuous batching and
// micro-batch pipelining must not change what a request produces.

#include "runtime/engine/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "runtime/engine/batch_generate.h"
#include "runtime/executor/loaded_model.h"
#include "tests/runtime/engine_fixture.h"

namespace strata::runtime {
namespace {

std::vector<std::vector<int32_t>> Prompts() {
  return {{1, 5, 9}, {4}, {7, 7, 2, 3, 11, 40, 41}, {90, 3}, {12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22}};
}

// The reference: each prompt alone, one micro-batch in flight, prefilled whole (GenerateBatch: the offline
// path of strata-generate, whose output tests/runtime_parity checks against transformers).
std::vector<std::vector<int32_t>> AloneGreedy(LoadedModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                              int32_t new_tokens) {
  EngineOptions options;
  options.micro_batches = 1;
  auto engine = Engine::Start(model, nullptr, {}, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  SamplingParams greedy;
  greedy.max_new_tokens = new_tokens;
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : prompts) {
    auto r = GenerateBatch(**engine, {p}, greedy);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<int32_t> ids;
    for (const GeneratedToken& t : (*r)[0].tokens) ids.push_back(t.id);
    out.push_back(std::move(ids));
  }
  return out;
}

TEST(Engine, GreedyAloneEqualsGreedyUnderPipelinedMicroBatches) {
  auto model = Load(4);
  ASSERT_TRUE(model);
  std::vector<std::vector<int32_t>> prompts = Prompts();
  const std::vector<std::vector<int32_t>> expected = AloneGreedy(*model, prompts, 12);
  for (int64_t micro_batches : {1, 3}) {
    EngineOptions options;
    options.micro_batches = micro_batches;
    options.prefill_chunk_tokens = 4;  // the 7- and 11-token prompts are prefilled in chunks
    auto engine = Engine::Start(*model, nullptr, {}, options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    Collector c;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest r;
      r.prompt = prompts[i];
      r.sampling.max_new_tokens = 12;
      ASSERT_TRUE((*engine)->Submit(r, c.For(static_cast<int>(i))).ok());
    }
    c.Wait(static_cast<int>(prompts.size()));
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(c.Ids(static_cast<int>(i)), expected[i]) << "prompt " << i << ", micro_batches " << micro_batches;
      EXPECT_EQ(c.Reason(static_cast<int>(i)), FinishReason::kLength);
      EXPECT_EQ(c.chunks[static_cast<int>(i)].back().completion_tokens, 12);
    }
    EngineStats stats = StatsWhenIdle(**engine);
    EXPECT_EQ(stats.active, 0);
    EXPECT_EQ(stats.kv_used, 0);
    EXPECT_EQ(stats.kv_free + stats.kv_cached, stats.kv_blocks);
    ASSERT_EQ(stats.stages.size(), 2u);
    EXPECT_GT(stats.stages[0].busy_seconds, 0);
  }
}

TEST(Engine, SeededSamplingDoesNotDependOnTheBatch) {
  auto model = Load(8);
  ASSERT_TRUE(model);
  EngineOptions options;
  options.micro_batches = 2;
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_TRUE(engine.ok());
  GenerationRequest seeded;
  seeded.prompt = {3, 1, 4, 1, 5};
  seeded.sampling.temperature = 1.3f;
  seeded.sampling.top_p = 0.9f;
  seeded.sampling.top_k = 30;
  seeded.sampling.repetition_penalty = 1.2f;
  seeded.sampling.seed = 1234;
  seeded.sampling.max_new_tokens = 20;
  Collector alone;
  ASSERT_TRUE((*engine)->Submit(seeded, alone.For(0)).ok());
  alone.Wait(1);
  Collector crowd;
  for (int i = 1; i < 8; ++i) {
    GenerationRequest other;
    other.prompt = {static_cast<int32_t>(i), static_cast<int32_t>(i * 3)};
    other.sampling.temperature = 0.8f;
    other.sampling.max_new_tokens = 20;
    ASSERT_TRUE((*engine)->Submit(other, crowd.For(i)).ok());
    if (i == 4) {
      ASSERT_TRUE((*engine)->Submit(seeded, crowd.For(0)).ok());
    }
  }
  crowd.Wait(8);
  EXPECT_EQ(crowd.Ids(0), alone.Ids(0));
  EXPECT_EQ(alone.Ids(0).size(), 20u);
  // A different seed gives a different continuation (the test can fail).
  seeded.sampling.seed = 99;
  Collector other;
  ASSERT_TRUE((*engine)->Submit(seeded, other.For(0)).ok());
  other.Wait(1);
  EXPECT_NE(other.Ids(0), alone.Ids(0));
}

TEST(Engine, EosEndsTheSequence) {
  auto model = Load(2);
  ASSERT_TRUE(model);
  const int32_t third = AloneGreedy(*model, {{1, 5, 9}}, 4)[0][2];
  auto engine = Engine::Start(*model, nullptr, {third}, EngineOptions{});
  ASSERT_TRUE(engine.ok());
  Collector c;
  GenerationRequest r;
  r.prompt = {1, 5, 9};
  r.sampling.max_new_tokens = 10;
  ASSERT_TRUE((*engine)->Submit(r, c.For(0)).ok());
  c.Wait(1);
  const std::vector<int32_t> ids = c.Ids(0);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), third);
  EXPECT_LE(ids.size(), 3u);
  EXPECT_EQ(c.Reason(0), FinishReason::kEos);
}

TEST(Engine, CancelledRequestsFreeTheirSlots) {
  auto model = Load(4);
  ASSERT_TRUE(model);
  EngineOptions options;
  options.micro_batches = 2;
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_TRUE(engine.ok());
  Collector c;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 10; ++i) {
    GenerationRequest r;
    r.prompt = {static_cast<int32_t>(i + 1), 2, 3};
    r.sampling.max_new_tokens = 60;
    auto h = (*engine)->Submit(r, c.For(i));
    ASSERT_TRUE(h.ok());
    handles.push_back(*h);
  }
  for (auto& h : handles) h->Cancel();
  c.Wait(10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(c.Reason(i), FinishReason::kCancelled);
  // The blocks come back once in-flight micro-batches return.
  EngineStats stats = StatsWhenIdle(**engine);
  EXPECT_EQ(stats.active, 0);
  EXPECT_EQ(stats.queued, 0);
  EXPECT_EQ(stats.kv_used, 0);
  EXPECT_EQ(stats.kv_free + stats.kv_cached, stats.kv_blocks);
}

TEST(Engine, FullQueueIsResourceExhausted) {
  auto model = Load(1);
  ASSERT_TRUE(model);
  EngineOptions options;
  options.max_queue = 0;
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_TRUE(engine.ok());
  GenerationRequest r;
  r.prompt = {1};
  auto h = (*engine)->Submit(r, [](GenerationChunk) {});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace strata::runtime

namespace strata::runtime {
namespace {

TEST(GenerateBatch, ChecksEveryPromptFirstNamingIt) {
  auto model = Load(2);
  ASSERT_TRUE(model);
  EngineOptions options;
  options.max_queue = 4;
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  SamplingParams greedy;
  greedy.max_new_tokens = 4;
  auto error = [&](const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& s) {
    auto r = GenerateBatch(**engine, prompts, s);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  EXPECT_EQ(error({{1, 2}, {3, kVocab}}, greedy),
            absl::StrCat("prompt 1: token id ", kVocab, " at position 1 is outside the vocabulary [0, ", kVocab, ")"));
  EXPECT_EQ(error({{1, 2}, {}}, greedy), "prompt 1: no token ids");
  std::vector<int32_t> longest((*engine)->max_context() - 3, 1);
  EXPECT_THAT(error({longest}, greedy), ::testing::HasSubstr("prompt 0: "));
  EXPECT_THAT(error({longest}, greedy), ::testing::HasSubstr("more than --max-context"));
  SamplingParams top = greedy;
  top.top_logprobs = kVocab + 1;
  EXPECT_THAT(error({{1}}, top), ::testing::HasSubstr("--top-logprobs"));
  // Nothing was submitted: the engine is idle and serves the next batch.
  EXPECT_EQ(StatsWhenIdle(**engine).kv_used, 0);
  auto ok = GenerateBatch(**engine, {{1, 2}, {3}}, greedy);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0].tokens.size(), 4u);
  EXPECT_EQ((*ok)[1].finish, FinishReason::kLength);
  greedy.max_new_tokens = 0;
  auto none = GenerateBatch(**engine, {{1, 2}}, greedy);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE((*none)[0].tokens.empty());
}

TEST(GenerateBatch, TimesPrefillAndDecodeAndCountsTheSteps) {
  auto model = Load(2);
  ASSERT_TRUE(model);
  auto engine = Engine::Start(*model, nullptr, {}, EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  SamplingParams greedy;
  greedy.max_new_tokens = 6;
  BatchTiming timing;
  auto r = GenerateBatch(**engine, {{1, 2, 3}, {4}}, greedy, &timing);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(timing.decode_steps, 5);
  EXPECT_GT(timing.prefill_seconds, 0);
  EXPECT_GT(timing.decode_seconds, 0);
}

TEST(GenerateBatch, AFullQueueIsAnErrorAndLeavesNothingRunning) {
  auto model = Load(1);  // one sequence runs, one waits: the third of eight 50-token requests is refused
  ASSERT_TRUE(model);
  EngineOptions options;
  options.max_queue = 1;
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  SamplingParams greedy;
  greedy.max_new_tokens = 50;
  std::vector<std::vector<int32_t>> many(8, std::vector<int32_t>{1, 2, 3});
  auto r = GenerateBatch(**engine, many, greedy);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), ::testing::StartsWith("prompt "));
  EngineStats stats = StatsWhenIdle(**engine);
  EXPECT_EQ(stats.active, 0);
  EXPECT_EQ(stats.kv_used, 0);
}

}  // namespace
}  // namespace strata::runtime
