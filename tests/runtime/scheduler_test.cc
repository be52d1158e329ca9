// The scheduler alone: plain numbers in, micro-batches out (no tensors, no model).

#include "runtime/engine/scheduler.h"

#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

SchedulerOptions Options(int64_t slots, int64_t micro_batches, int64_t chunk = 4) {
  SchedulerOptions o;
  o.slots = slots;
  o.max_context = 64;
  o.prefill_chunk_tokens = chunk;
  o.micro_batch_tokens = 8;
  o.micro_batches = micro_batches;
  return o;
}

TEST(Scheduler, AdmitsOnlyWhileSlotsAreFree) {
  Scheduler s(Options(2, 1));
  s.Add(1, 3);
  s.Add(2, 3);
  s.Add(3, 3);
  auto batch = s.Next();
  ASSERT_TRUE(batch);
  EXPECT_EQ(s.running(), 2);
  EXPECT_EQ(s.queued(), 1);
  EXPECT_EQ(s.free_slots(), 0);
  // Equal-length prompts share one prefill micro-batch; each row feeds its whole prompt and samples.
  ASSERT_EQ(batch->rows.size(), 2u);
  for (const ScheduledRow& row : batch->rows) {
    EXPECT_EQ(row.start, 0);
    EXPECT_EQ(row.count, 3);
    EXPECT_TRUE(row.samples);
  }
  EXPECT_NE(batch->rows[0].slot, batch->rows[1].slot);
}

// longrope (SchedulerOptions::recompute_at): a sequence whose cache was computed at <= 5 tokens is fed again
// from position 0 when it reaches 6, as transformers' generate() drops the cache there; a prompt already
// longer than 5 is prefilled in chunks once, never recomputed.
TEST(Scheduler, RecomputesFromZeroWhenGrowingPastRecomputeAt) {
  SchedulerOptions o = Options(2, 1, /*chunk=*/4);
  o.recompute_at = 5;
  Scheduler s(o);
  s.Add(1, 4);
  auto prefill = s.Next();
  ASSERT_TRUE(prefill);
  EXPECT_EQ(prefill->rows[0].length, 4);
  s.Append(1);  // 5 tokens
  s.Complete(*prefill);
  auto decode = s.Next();
  ASSERT_TRUE(decode);
  EXPECT_EQ(decode->rows[0].start, 4);
  EXPECT_EQ(decode->rows[0].count, 1);
  s.Append(1);  // 6 tokens: past recompute_at
  s.Complete(*decode);
  auto first = s.Next();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->rows[0].start, 0);
  EXPECT_EQ(first->rows[0].count, 4);
  EXPECT_EQ(first->rows[0].length, 6);
  EXPECT_FALSE(first->rows[0].samples);
  s.Complete(*first);
  auto second = s.Next();
  ASSERT_TRUE(second);
  EXPECT_EQ(second->rows[0].start, 4);
  EXPECT_EQ(second->rows[0].count, 2);
  EXPECT_TRUE(second->rows[0].samples);
  s.Append(1);  // 7 tokens: decodes on, no second recomputation
  s.Complete(*second);
  auto next = s.Next();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->rows[0].start, 6);
  EXPECT_EQ(next->rows[0].count, 1);

  s.Add(2, 9);  // longer than recompute_at from the start: chunks of 4, 4, 1 and no recomputation
  s.Complete(*next);
  int64_t fed = 0;
  for (int i = 0; i < 3; ++i) {
    auto b = s.Next();
    ASSERT_TRUE(b);
    for (const ScheduledRow& row : b->rows) {
      if (row.sequence != 2) continue;
      EXPECT_EQ(row.start, fed);
      fed += row.count;
    }
    s.Complete(*b);
  }
  EXPECT_EQ(fed, 9);
}

TEST(Scheduler, LongPromptsArePrefilledInChunks) {
  Scheduler s(Options(1, 1, /*chunk=*/4));
  s.Add(7, 10);
  std::vector<std::pair<int64_t, int64_t>> chunks;
  for (int i = 0; i < 3; ++i) {
    auto batch = s.Next();
    ASSERT_TRUE(batch);
    ASSERT_EQ(batch->rows.size(), 1u);
    chunks.push_back({batch->rows[0].start, batch->rows[0].count});
    EXPECT_EQ(batch->rows[0].samples, i == 2);
    // Nothing else may run while the sequence is in flight.
    EXPECT_FALSE(s.Next());
    s.Complete(*batch);
  }
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 4}, {8, 2}}));
}

TEST(Scheduler, DecodesFeedOneTokenAtTheNextPosition) {
  Scheduler s(Options(1, 1));
  s.Add(1, 3);
  auto prefill = s.Next();
  s.Append(1);
  s.Complete(*prefill);
  auto decode = s.Next();
  ASSERT_TRUE(decode);
  EXPECT_EQ(decode->rows[0].start, 3);
  EXPECT_EQ(decode->rows[0].count, 1);
  EXPECT_TRUE(decode->rows[0].samples);
}

TEST(Scheduler, MicroBatchesSplitTheActiveSequences) {
  Scheduler s(Options(8, 4));
  for (uint64_t id = 1; id <= 8; ++id) s.Add(id, 1);  // one-token prompts: decode-shaped rows
  std::vector<ScheduledMicroBatch> batches;
  while (auto b = s.Next()) batches.push_back(*b);
  ASSERT_EQ(batches.size(), 4u);
  for (const auto& b : batches) EXPECT_EQ(b.rows.size(), 2u);
  EXPECT_EQ(s.in_flight(), 4);
}

TEST(Scheduler, PrefillGoesBeforeDecode) {
  Scheduler s(Options(2, 2));
  s.Add(1, 1);
  auto first = s.Next();
  s.Append(1);
  s.Complete(*first);
  s.Add(2, 5);
  auto next = s.Next();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->rows[0].sequence, 2u);
}

TEST(Scheduler, FinishingInFlightFreesTheSlotWhenItComesBack) {
  Scheduler s(Options(1, 1));
  s.Add(1, 2);
  s.Add(2, 2);
  auto batch = s.Next();
  s.Finish(1);
  EXPECT_EQ(s.free_slots(), 0);
  s.Complete(*batch);
  EXPECT_EQ(s.free_slots(), 1);
  EXPECT_EQ(s.running(), 0);
  auto next = s.Next();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->rows[0].sequence, 2u);
}

TEST(Scheduler, FinishingQueuedOrIdleSequencesIsImmediate) {
  Scheduler s(Options(1, 1));
  s.Add(1, 2);
  s.Add(2, 2);
  auto batch = s.Next();
  s.Append(1);
  s.Complete(*batch);
  s.Finish(2);  // queued
  EXPECT_EQ(s.queued(), 0);
  s.Finish(1);  // idle
  EXPECT_EQ(s.free_slots(), 1);
  EXPECT_FALSE(s.Next());
}

}  // namespace
}  // namespace strata::runtime
