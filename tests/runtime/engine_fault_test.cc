// Failures are failures: a stage that throws (the fault seam, runtime/executor/executor.h) ends the
// requests of its micro-batch with kError naming the stage and its device, is counted, and leaves the
// engine serving; a sticky device error ends everything, calls on_device_lost and refuses new requests.

#include <gtest/gtest.h>

#include <atomic>

#include "runtime/engine/engine.h"
#include "runtime/executor/executor.h"
#include "tests/runtime/engine_fixture.h"

namespace strata::runtime {
namespace {

GenerationRequest Request(int32_t first, int32_t max_new_tokens) {
  GenerationRequest r;
  r.prompt = {first, 2, 3};
  r.sampling.max_new_tokens = max_new_tokens;
  return r;
}

TEST(FaultInjection, ParsesTheSeamAndNamesBadFields) {
  absl::StatusOr<FaultInjection> f = ParseFaultInjection("stage=1,call=3,repeat");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->stage, 1);
  EXPECT_EQ(f->call, 3);
  EXPECT_TRUE(f->repeat);
  EXPECT_FALSE(f->device_lost);
  EXPECT_TRUE(ParseFaultInjection("stage=0,device_lost")->device_lost);
  EXPECT_NE(ParseFaultInjection("call=2").status().message().find("stage=N is required"), std::string::npos);
  EXPECT_NE(ParseFaultInjection("stage=1,call=0").status().message().find("call"), std::string::npos);
  EXPECT_NE(ParseFaultInjection("stage=x").status().message().find("stage=\"x\""), std::string::npos);
  EXPECT_NE(ParseFaultInjection("stage=1,boom").status().message().find("boom"), std::string::npos);
}

TEST(FaultInjection, StageThatDoesNotExistIsRefusedAtStart) {
  auto model = Load(2);
  ASSERT_TRUE(model);
  EngineOptions options;
  options.fault = FaultInjection{5, 1, false, false};
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("stage 5"), std::string::npos);
}

TEST(FaultInjection, FailedForwardEndsItsRequestsWithErrorAndTheEngineServesOn) {
  auto model = Load(4);
  ASSERT_TRUE(model);
  EngineOptions options;
  options.micro_batches = 1;  // one micro-batch at a time: the third one is the prefill's second decode step
  options.fault = FaultInjection{1, 3, false, false};
  std::atomic<int> lost{0};
  options.on_device_lost = [&](const absl::Status&) { ++lost; };
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  Collector c;
  ASSERT_TRUE((*engine)->Submit(Request(1, 8), c.For(0)).ok());
  c.Wait(1);
  EXPECT_EQ(c.Reason(0), FinishReason::kError);
  const GenerationChunk& last = c.chunks[0].back();
  EXPECT_EQ(last.error.code(), absl::StatusCode::kInternal);
  // The message names the stage, its plan device, where it ran and the error.
  EXPECT_NE(last.error.message().find("stage 1 (plan device 1 on cpu)"), std::string::npos) << last.error;
  EXPECT_NE(last.error.message().find("injected fault"), std::string::npos) << last.error;
  EXPECT_EQ(c.Ids(0).size(), 2u);  // the tokens before the failure were streamed
  // The readiness rule's count: one request ended kError since the last micro-batch that made a token.
  EXPECT_EQ((*engine)->Stats().failed_in_a_row, 1);

  // Not sticky: the next request is served in full.
  Collector after;
  ASSERT_TRUE((*engine)->Submit(Request(4, 6), after.For(0)).ok());
  after.Wait(1);
  EXPECT_EQ(after.Reason(0), FinishReason::kLength);
  EXPECT_EQ(after.Ids(0).size(), 6u);
  EngineStats stats = StatsWhenIdle(**engine);
  ASSERT_EQ(stats.errors.size(), 1u);
  EXPECT_EQ(stats.errors[0].stage, "1");
  EXPECT_EQ(stats.errors[0].device, "1");
  EXPECT_EQ(stats.errors[0].count, 1u);
  EXPECT_FALSE(stats.device_lost);
  EXPECT_EQ(stats.failed_in_a_row, 0);  // a token since
  EXPECT_EQ(lost.load(), 0);
}

// until=N: micro-batches call..until fail, the later ones run (what the server's readiness test uses).
TEST(FaultInjection, RepeatUntilStopsFailing) {
  absl::StatusOr<FaultInjection> fault = ParseFaultInjection("stage=0,call=1,repeat,until=3");
  ASSERT_TRUE(fault.ok()) << fault.status();
  EXPECT_EQ(fault->until, 3);
  EXPECT_FALSE(ParseFaultInjection("stage=0,call=1,until=3").ok());  // needs repeat
  EXPECT_FALSE(ParseFaultInjection("stage=0,call=4,repeat,until=3").ok());
  auto model = Load(4);
  ASSERT_TRUE(model);
  EngineOptions options;
  options.micro_batches = 1;
  options.fault = *fault;
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int i = 0; i < 3; ++i) {
    Collector c;
    ASSERT_TRUE((*engine)->Submit(Request(i + 1, 2), c.For(0)).ok());
    c.Wait(1);
    EXPECT_EQ(c.Reason(0), FinishReason::kError) << "request " << i;
  }
  EXPECT_EQ((*engine)->Stats().failed_in_a_row, 3);
  Collector c;
  ASSERT_TRUE((*engine)->Submit(Request(4, 2), c.For(0)).ok());
  c.Wait(1);
  EXPECT_EQ(c.Reason(0), FinishReason::kLength);
  EXPECT_EQ((*engine)->Stats().failed_in_a_row, 0);
}

TEST(FaultInjection, StickyDeviceErrorEndsEveryRequestAndRefusesNewOnes) {
  auto model = Load(4);
  ASSERT_TRUE(model);
  EngineOptions options;
  options.micro_batches = 2;
  options.fault = FaultInjection{0, 4, false, true};
  std::atomic<int> lost{0};
  std::string lost_message;
  options.on_device_lost = [&](const absl::Status& s) {
    lost_message = std::string(s.message());
    ++lost;
  };
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  Collector c;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE((*engine)->Submit(Request(i + 1, 40), c.For(i)).ok());
  c.Wait(6);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(c.Reason(i), FinishReason::kError) << "request " << i;
    EXPECT_EQ(c.chunks[i].back().error.code(), absl::StatusCode::kInternal);
  }
  EXPECT_EQ(lost.load(), 1);
  EXPECT_NE(lost_message.find("illegal memory access"), std::string::npos) << lost_message;
  auto refused = (*engine)->Submit(Request(1, 4), [](GenerationChunk) {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE((*engine)->Stats().device_lost);
}

}  // namespace
}  // namespace strata::runtime
