// The engine over a real (tiny, random) Llama checkpoint written by the test: continuous batching and
// micro-batch pipelining must not change what a request produces.

#include "runtime/engine/engine.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "runtime/executor/loaded_model.h"
#include "tests/runtime/engine_fixture.h"

namespace strata::runtime {
namespace {

std::vector<std::vector<int32_t>> Prompts() {
  return {{1, 5, 9}, {4}, {7, 7, 2, 3, 11, 40, 41}, {90, 3}, {12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22}};
}

TEST(Engine, GreedyEqualsOfflineGreedyUnderPipelinedMicroBatches) {
  auto model = Load(4);
  ASSERT_TRUE(model);
  std::vector<std::vector<int32_t>> prompts = Prompts();
  std::vector<std::vector<int64_t>> expected;
  for (const auto& p : prompts) {
    GreedyRequest g;
    g.prompts = {std::vector<int64_t>(p.begin(), p.end())};
    g.max_new_tokens = 12;
    auto r = model->Greedy(g);
    ASSERT_TRUE(r.ok()) << r.status();
    expected.push_back((*r)[0].ids);
  }
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
      EXPECT_EQ(c.Ids(static_cast<int>(i)), std::vector<int32_t>(expected[i].begin(), expected[i].end()))
          << "prompt " << i << ", micro_batches " << micro_batches;
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
  GreedyRequest g;
  g.prompts = {{1, 5, 9}};
  g.max_new_tokens = 4;
  auto greedy = model->Greedy(g);
  ASSERT_TRUE(greedy.ok());
  const int32_t third = static_cast<int32_t>((*greedy)[0].ids[2]);
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
