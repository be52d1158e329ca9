// The scheduler alone: plain numbers in, micro-batches out (no tensors, no model).

#include "runtime/engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace strata::runtime {
namespace {

// Room for `running` sequences of 64 tokens in blocks of 16 (the dense layout's memory).
SchedulerOptions Options(int64_t running, int64_t micro_batches, int64_t chunk = 4) {
  SchedulerOptions o;
  o.max_running = running;
  o.kv_blocks = running * 4;
  o.block_tokens = 16;
  o.prefill_chunk_tokens = chunk;
  o.micro_batch_tokens = 8;
  o.micro_batches = micro_batches;
  return o;
}

// The token lists the scheduler reads (the engine's Sequence::tokens): stable while it runs.
class Tokens {
 public:
  // A prompt of `length` tokens unlike any other's, or `shared` tokens of a common prefix first.
  const std::vector<int32_t>& Prompt(uint64_t id, int64_t length, int64_t shared = 0) {
    std::vector<int32_t>& t = lists_[id];
    for (int64_t i = 0; i < length; ++i)
      t.push_back(i < shared ? static_cast<int32_t>(i) : static_cast<int32_t>(id * 100000 + i));
    return t;
  }
  void Append(Scheduler& s, uint64_t id) {
    lists_[id].push_back(7);
    s.Append(id);
  }

 private:
  std::map<uint64_t, std::vector<int32_t>> lists_;
};

TEST(Scheduler, AdmitsOnlyUpToMaxRunning) {
  Scheduler s(Options(2, 1));
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 3));
  s.Add(2, tokens.Prompt(2, 3));
  s.Add(3, tokens.Prompt(3, 3));
  auto batch = s.Next();
  ASSERT_TRUE(batch);
  EXPECT_EQ(s.running(), 2);
  EXPECT_EQ(s.queued(), 1);
  EXPECT_EQ(s.blocks().counts().used, 2);
  // Equal-length prompts share one prefill micro-batch; each row feeds its whole prompt and samples.
  ASSERT_EQ(batch->rows.size(), 2u);
  for (const ScheduledRow& row : batch->rows) {
    EXPECT_EQ(row.start, 0);
    EXPECT_EQ(row.count, 3);
    EXPECT_TRUE(row.samples);
  }
  EXPECT_EQ(batch->rows[0].blocks, (std::vector<int32_t>{0}));
  EXPECT_EQ(batch->rows[1].blocks, (std::vector<int32_t>{1}));
}

// longrope (SchedulerOptions::recompute_at): a sequence whose cache was computed at <= 5 tokens is fed again
// from position 0 when it reaches 6, as transformers' generate() drops the cache there; a prompt already
// longer than 5 is prefilled in chunks once, never recomputed.
TEST(Scheduler, RecomputesFromZeroWhenGrowingPastRecomputeAt) {
  SchedulerOptions o = Options(2, 1, /*chunk=*/4);
  o.recompute_at = 5;
  Scheduler s(o);
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 4));
  auto prefill = s.Next();
  ASSERT_TRUE(prefill);
  EXPECT_EQ(prefill->rows[0].length, 4);
  tokens.Append(s, 1);  // 5 tokens
  s.Complete(*prefill);
  auto decode = s.Next();
  ASSERT_TRUE(decode);
  EXPECT_EQ(decode->rows[0].start, 4);
  EXPECT_EQ(decode->rows[0].count, 1);
  tokens.Append(s, 1);  // 6 tokens: past recompute_at
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
  tokens.Append(s, 1);  // 7 tokens: decodes on, no second recomputation
  s.Complete(*second);
  auto next = s.Next();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->rows[0].start, 6);
  EXPECT_EQ(next->rows[0].count, 1);

  s.Add(2, tokens.Prompt(2, 9));  // longer than recompute_at from the start: chunks of 4, 4, 1 and no recomputation
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
  Tokens tokens;
  s.Add(7, tokens.Prompt(7, 10));
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
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 3));
  auto prefill = s.Next();
  tokens.Append(s, 1);
  s.Complete(*prefill);
  auto decode = s.Next();
  ASSERT_TRUE(decode);
  EXPECT_EQ(decode->rows[0].start, 3);
  EXPECT_EQ(decode->rows[0].count, 1);
  EXPECT_TRUE(decode->rows[0].samples);
}

// Sequence 1 with a 3-token prompt prefilled and its first token appended: decoding, 4 tokens known, 3 computed.
void PrefillOne(Scheduler& s, Tokens& tokens) {
  s.Add(1, tokens.Prompt(1, 3));
  auto prefill = s.Next();
  ASSERT_TRUE(prefill);
  tokens.Append(s, 1);
  s.Complete(*prefill);
}

TEST(Scheduler, AProposalFeedsAfterTheLastTokenAndOnlyAcceptedPositionsCount) {
  SchedulerOptions o = Options(1, 1);
  o.max_positions = 22;
  Scheduler s(o);
  Tokens tokens;
  PrefillOne(s, tokens);
  s.Propose(1, 5);
  auto verify = s.Next();
  ASSERT_TRUE(verify);
  EXPECT_EQ(verify->rows[0].start, 3);
  EXPECT_EQ(verify->rows[0].count, 6);  // the last known token and 5 proposed ones
  EXPECT_EQ(verify->rows[0].draft, 5);
  EXPECT_TRUE(verify->rows[0].samples);
  // 2 of the 5 accepted, then the model's own token: 3 tokens appended; positions 3..5 are computed.
  for (int i = 0; i < 3; ++i) tokens.Append(s, 1);
  verify->rows[0].accepted = 2;
  s.Complete(*verify);
  auto next = s.Next();  // no proposal this time: one token, at the first position not computed
  ASSERT_TRUE(next);
  EXPECT_EQ(next->rows[0].start, 6);
  EXPECT_EQ(next->rows[0].count, 1);
  EXPECT_EQ(next->rows[0].draft, 0);
  tokens.Append(s, 1);
  s.Complete(*next);
  // The token budget (8 tokens in all) and then the context end (22 positions) cut proposals.
  s.Propose(1, 20);
  auto cut = s.Next();
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->rows[0].draft, 7);
  for (int i = 0; i < 8; ++i) tokens.Append(s, 1);
  cut->rows[0].accepted = 7;
  s.Complete(*cut);
  s.Propose(1, 20);
  auto end = s.Next();
  ASSERT_TRUE(end);
  EXPECT_EQ(end->rows[0].start, 15);
  EXPECT_EQ(end->rows[0].draft, 6);  // positions 16..21
  EXPECT_EQ(end->rows[0].blocks.size(), 2u);
}

TEST(Scheduler, BlocksOnlyRejectedPositionsTookAreFreedWhenTheRowCompletes) {
  SchedulerOptions o = Options(1, 1);
  o.block_tokens = 4;
  Scheduler s(o);
  Tokens tokens;
  PrefillOne(s, tokens);
  EXPECT_EQ(s.blocks().counts().used, 1);
  s.Propose(1, 6);
  auto verify = s.Next();  // positions 3..9: three blocks of 4
  ASSERT_TRUE(verify);
  EXPECT_EQ(verify->rows[0].draft, 6);
  EXPECT_EQ(verify->rows[0].blocks.size(), 3u);
  EXPECT_EQ(s.blocks().counts().used, 3);
  // One accepted, then the model's own token: 6 tokens known, 5 computed; the third block held only rejected ones.
  tokens.Append(s, 1);
  tokens.Append(s, 1);
  verify->rows[0].accepted = 1;
  s.Complete(*verify);
  EXPECT_EQ(s.blocks().counts().used, 2);
  auto next = s.Next();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->rows[0].start, 5);
  EXPECT_EQ(next->rows[0].count, 1);
}

TEST(Scheduler, MicroBatchesSplitTheActiveSequences) {
  Scheduler s(Options(8, 4));
  Tokens tokens;
  for (uint64_t id = 1; id <= 8; ++id) s.Add(id, tokens.Prompt(id, 1));  // one-token prompts: decode-shaped rows
  std::vector<ScheduledMicroBatch> batches;
  while (auto b = s.Next()) batches.push_back(*b);
  ASSERT_EQ(batches.size(), 4u);
  for (const auto& b : batches) EXPECT_EQ(b.rows.size(), 2u);
  EXPECT_EQ(s.in_flight(), 4);
}

// One micro-batch carries the running decode and the new prompt's chunk together: decodes first, then
// chunks of different lengths fill the token budget (8 here), the last one cut to fit.
TEST(Scheduler, DecodesAndPrefillChunksShareAMicroBatch) {
  Scheduler s(Options(4, 1));
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 1));
  auto first = s.Next();
  tokens.Append(s, 1);
  s.Complete(*first);
  s.Add(2, tokens.Prompt(2, 5));
  s.Add(3, tokens.Prompt(3, 9));
  auto next = s.Next();
  ASSERT_TRUE(next);
  ASSERT_EQ(next->rows.size(), 3u);
  EXPECT_EQ(next->rows[0].sequence, 1u);  // the decode
  EXPECT_EQ(next->rows[0].count, 1);
  EXPECT_EQ(next->rows[1].sequence, 2u);  // a chunk of 4 (prefill_chunk_tokens)
  EXPECT_EQ(next->rows[1].count, 4);
  EXPECT_EQ(next->rows[2].sequence, 3u);  // what the budget leaves: 8 - 1 - 4
  EXPECT_EQ(next->rows[2].count, 3);
  EXPECT_EQ(next->tokens(), 8);
}

// A burst of prompts never keeps a running decode out of the next micro-batch.
TEST(Scheduler, ABurstOfPromptsDoesNotStarveDecodes) {
  Scheduler s(Options(16, 1, /*chunk=*/8));
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 1));
  auto first = s.Next();
  tokens.Append(s, 1);
  s.Complete(*first);
  for (uint64_t id = 2; id <= 12; ++id) s.Add(id, tokens.Prompt(id, 30));
  for (int step = 0; step < 10; ++step) {
    auto b = s.Next();
    ASSERT_TRUE(b);
    ASSERT_FALSE(b->rows.empty());
    EXPECT_EQ(b->rows[0].sequence, 1u) << "step " << step;
    EXPECT_LE(b->tokens(), 8);
    for (const ScheduledRow& row : b->rows) {
      if (row.samples) tokens.Append(s, row.sequence);
    }
    s.Complete(*b);
  }
}

TEST(Scheduler, FinishingInFlightFreesTheBlocksWhenItComesBack) {
  Scheduler s(Options(1, 1));
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 2));
  s.Add(2, tokens.Prompt(2, 2));
  auto batch = s.Next();
  s.Finish(1);
  EXPECT_EQ(s.blocks().counts().used, 1);
  s.Complete(*batch);
  EXPECT_EQ(s.blocks().counts().used, 0);
  EXPECT_EQ(s.running(), 0);
  auto next = s.Next();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->rows[0].sequence, 2u);
}

TEST(Scheduler, FinishingQueuedOrIdleSequencesIsImmediate) {
  Scheduler s(Options(1, 1));
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 2));
  s.Add(2, tokens.Prompt(2, 2));
  auto batch = s.Next();
  tokens.Append(s, 1);
  s.Complete(*batch);
  s.Finish(2);  // queued
  EXPECT_EQ(s.queued(), 0);
  s.Finish(1);  // idle
  EXPECT_EQ(s.blocks().counts().used, 0);
  EXPECT_FALSE(s.Next());
}

SchedulerOptions Paged(int64_t running, int64_t blocks, int64_t block_tokens, int64_t micro_batches = 1) {
  SchedulerOptions o;
  o.max_running = running;
  o.kv_blocks = blocks;
  o.block_tokens = block_tokens;
  o.prefill_chunk_tokens = 16;
  o.micro_batch_tokens = 64;
  o.micro_batches = micro_batches;
  return o;
}

TEST(Scheduler, ASequenceGainsABlockWhenItsNextTokenStartsOne) {
  Scheduler s(Paged(1, 4, 4));
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 3));
  auto prefill = s.Next();
  ASSERT_TRUE(prefill);
  EXPECT_EQ(prefill->rows[0].blocks, (std::vector<int32_t>{0}));
  tokens.Append(s, 1);  // 4 tokens: position 3 is still in block 0
  s.Complete(*prefill);
  auto decode = s.Next();
  EXPECT_EQ(decode->rows[0].blocks, (std::vector<int32_t>{0}));
  tokens.Append(s, 1);  // 5 tokens: position 4 starts block 1
  s.Complete(*decode);
  auto next = s.Next();
  EXPECT_EQ(next->rows[0].start, 4);
  EXPECT_EQ(next->rows[0].blocks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(s.blocks().counts().used, 2);
}

// Three blocks of 4 tokens, two 4-token prompts: both admitted (one block each, the watermark block
// left); when both need a second block the older one gets it and the newer one is preempted, its full
// block kept in the prefix cache. Admitted again, it takes that block back and feeds only its last token.
TEST(Scheduler, PreemptsTheMostRecentlyAdmittedWhenBlocksRunOut) {
  Scheduler s(Paged(2, 3, 4));
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 4));
  s.Add(2, tokens.Prompt(2, 4));
  auto prefill = s.Next();
  ASSERT_EQ(prefill->rows.size(), 2u);
  tokens.Append(s, 1);
  tokens.Append(s, 2);
  s.Complete(*prefill);

  auto decode = s.Next();
  ASSERT_TRUE(decode);
  ASSERT_EQ(decode->rows.size(), 1u);
  EXPECT_EQ(decode->rows[0].sequence, 1u);
  EXPECT_EQ(decode->rows[0].blocks, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(s.preemptions(), 1u);
  EXPECT_EQ(s.running(), 1);
  EXPECT_EQ(s.queued(), 1);
  EXPECT_EQ(s.blocks().counts().cached, 1);  // sequence 2's computed block

  s.Finish(1);
  s.Complete(*decode);
  auto resumed = s.Next();
  ASSERT_TRUE(resumed);
  ASSERT_EQ(resumed->rows.size(), 1u);
  const ScheduledRow& row = resumed->rows[0];
  EXPECT_EQ(row.sequence, 2u);
  EXPECT_EQ(row.start, 4);  // its first block came back from the prefix cache
  EXPECT_EQ(row.count, 1);
  EXPECT_TRUE(row.samples);
  EXPECT_EQ(row.length, 5);
  EXPECT_EQ(row.blocks, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(s.prefix_queried_tokens(), 4u + 4u + 5u);
  EXPECT_EQ(s.prefix_hit_tokens(), 4u);
}

TEST(Scheduler, WithoutThePrefixCacheAPreemptedSequenceIsRecomputedWhole) {
  SchedulerOptions o = Paged(2, 3, 4);
  o.prefix_cache = false;
  Scheduler s(o);
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 4));
  s.Add(2, tokens.Prompt(2, 4));
  auto prefill = s.Next();
  tokens.Append(s, 1);
  tokens.Append(s, 2);
  s.Complete(*prefill);
  auto decode = s.Next();
  EXPECT_EQ(s.preemptions(), 1u);
  s.Finish(1);
  s.Complete(*decode);
  auto resumed = s.Next();
  ASSERT_TRUE(resumed);
  EXPECT_EQ(resumed->rows[0].start, 0);
  EXPECT_EQ(resumed->rows[0].count, 5);
  EXPECT_EQ(s.blocks().counts().cached, 0);
  EXPECT_EQ(s.prefix_queried_tokens(), 0u);
}

// 40-token prompts sharing their first 36 tokens: the second takes the first's two full blocks (32
// tokens) and prefills the other 8 in a block of its own.
TEST(Scheduler, APromptSharingCachedBlocksPrefillsOnlyTheRest) {
  Scheduler s(Paged(2, 16, 16));
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 40, /*shared=*/40));
  std::vector<int32_t> first_blocks;
  while (auto b = s.Next()) {  // prefilled in chunks of 16; its sampled token is never appended
    first_blocks = b->rows[0].blocks;
    s.Complete(*b);
  }
  ASSERT_EQ(first_blocks.size(), 3u);
  s.Add(2, tokens.Prompt(2, 40, /*shared=*/36));
  auto batch = s.Next();
  ASSERT_TRUE(batch);
  const ScheduledRow* row = nullptr;
  for (const ScheduledRow& r : batch->rows) {
    if (r.sequence == 2) row = &r;
  }
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->start, 32);
  EXPECT_EQ(row->count, 8);
  ASSERT_EQ(row->blocks.size(), 3u);
  EXPECT_EQ(row->blocks[0], first_blocks[0]);
  EXPECT_EQ(row->blocks[1], first_blocks[1]);
  EXPECT_NE(row->blocks[2], first_blocks[2]);
  EXPECT_EQ(s.prefix_hit_tokens(), 32u);
}

// A sequence added without prefix reuse (prompt log-probabilities need every position's logits) feeds
// its whole prompt though the cache holds its first blocks, and is not counted as a lookup.
TEST(Scheduler, ASequenceWithoutPrefixReuseFeedsItsWholePrompt) {
  Scheduler s(Paged(2, 16, 16));
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 40, /*shared=*/40));
  while (auto b = s.Next()) s.Complete(*b);
  const uint64_t queried = s.prefix_queried_tokens();
  s.Add(2, tokens.Prompt(2, 40, /*shared=*/36), /*reuse_prefix=*/false);
  int64_t fed = 0;
  while (auto b = s.Next()) {
    for (const ScheduledRow& r : b->rows) {
      if (r.sequence != 2) continue;
      EXPECT_EQ(r.start, fed);
      fed += r.count;
    }
    s.Complete(*b);
  }
  EXPECT_EQ(fed, 40);
  EXPECT_EQ(s.prefix_hit_tokens(), 0u);
  EXPECT_EQ(s.prefix_queried_tokens(), queried);
  // The cache still serves a later sequence that reuses prefixes.
  s.Finish(2);
  s.Add(3, tokens.Prompt(3, 40, /*shared=*/36));
  auto batch = s.Next();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->rows.back().start, 32);
  EXPECT_EQ(s.prefix_hit_tokens(), 32u);
}

// A cached block is evicted when a new sequence needs it (least recently used first); its prefix is then
// no longer found, and a block registered after it (its child) can never match a reused parent.
TEST(Scheduler, EvictsCachedBlocksLeastRecentlyUsedFirst) {
  Scheduler s(Paged(1, 4, 4));
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 9, /*shared=*/9));
  while (auto b = s.Next()) s.Complete(*b);  // prefilled (its sample is never appended)
  s.Finish(1);
  EXPECT_EQ(s.blocks().counts().cached, 2);  // blocks 0 and 1 (positions 0-7); block 2 was partial
  s.Add(2, tokens.Prompt(2, 9));             // 3 blocks: the free 2 and 3, then block 0 is evicted
  auto b2 = s.Next();
  EXPECT_EQ(b2->rows[0].blocks, (std::vector<int32_t>{2, 3, 0}));
  EXPECT_EQ(s.blocks().counts().cached, 1);
  s.Complete(*b2);
  s.Finish(2);
  s.Add(3, tokens.Prompt(3, 9, /*shared=*/9));  // sequence 1's prompt: its first block is gone
  auto b3 = s.Next();
  EXPECT_EQ(b3->rows[0].start, 0);
  EXPECT_EQ(s.prefix_hit_tokens(), 0u);
}

TEST(Scheduler, ASequenceWaitsForBlocksHeldInFlight) {
  Scheduler s(Paged(2, 3, 4, /*micro_batches=*/2));
  Tokens tokens;
  s.Add(1, tokens.Prompt(1, 8));  // two blocks
  auto first = s.Next();
  ASSERT_TRUE(first);
  s.Add(2, tokens.Prompt(2, 3));  // one block (with the watermark: none left)
  EXPECT_FALSE(s.Next());         // sequence 1 is in flight, nothing to preempt, nothing to admit
  EXPECT_EQ(s.queued(), 1);
  EXPECT_EQ(s.preemptions(), 0u);
}

// 500 requests on a pool too small for them, with random prompts (a third share a prefix), random
// lengths, micro-batches completing in random order and random cancellations of queued, running and
// in-flight sequences: rows in flight never write a block another sequence holds, every request ends,
// and every block comes back (used 0, free + cached = all).
TEST(Scheduler, NoBlockLeaksAfterRandomCancellationsAndPreemptions) {
  std::mt19937 random(1234);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random); };
  SchedulerOptions o = Paged(6, 24, 4, /*micro_batches=*/3);
  o.prefill_chunk_tokens = 8;
  Scheduler s(o);
  Tokens tokens;
  std::map<uint64_t, int> remaining;  // new tokens each live sequence will still generate
  std::vector<ScheduledMicroBatch> in_flight;
  uint64_t next_id = 1;
  int cancelled = 0;
  while (next_id <= 500 || !remaining.empty()) {
    if (next_id <= 500 && uniform(0, 2) == 0) {
      const int length = uniform(1, 40);
      s.Add(next_id, tokens.Prompt(next_id, length, uniform(0, 2) == 0 ? length : 0));
      remaining[next_id] = uniform(1, 30);
      ++next_id;
    }
    while (auto b = s.Next()) {
      std::map<int32_t, uint64_t> written;  // blocks this batch's rows write
      for (const ScheduledRow& row : b->rows) {
        for (int64_t block = row.start / 4; block <= (row.start + row.count - 1) / 4; ++block) {
          written[row.blocks[block]] = row.sequence;
        }
      }
      for (const ScheduledMicroBatch& other : in_flight) {
        for (const ScheduledRow& row : other.rows) {
          for (int32_t block : row.blocks) {
            auto it = written.find(block);
            ASSERT_TRUE(it == written.end()) << "block " << block << " written by sequence " << it->second
                                             << " while sequence " << row.sequence << " reads it";
          }
        }
      }
      in_flight.push_back(*b);
    }
    if (uniform(0, 9) == 0 && !remaining.empty()) {
      auto it = std::next(remaining.begin(), uniform(0, static_cast<int>(remaining.size()) - 1));
      s.Finish(it->first);
      remaining.erase(it);
      ++cancelled;
    }
    if (in_flight.empty()) continue;
    const size_t pick = static_cast<size_t>(uniform(0, static_cast<int>(in_flight.size()) - 1));
    ScheduledMicroBatch done = in_flight[pick];
    in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(pick));
    for (const ScheduledRow& row : done.rows) {
      auto it = remaining.find(row.sequence);
      if (!row.samples || it == remaining.end()) continue;
      if (--it->second == 0) {
        s.Finish(row.sequence);
        remaining.erase(it);
      } else {
        tokens.Append(s, row.sequence);
      }
    }
    s.Complete(done);
  }
  for (const ScheduledMicroBatch& b : in_flight) s.Complete(b);
  EXPECT_EQ(s.running(), 0);
  EXPECT_EQ(s.queued(), 0);
  const KvBlockCounts counts = s.blocks().counts();
  EXPECT_EQ(counts.used, 0);
  EXPECT_EQ(counts.free + counts.cached, 24);
  EXPECT_GT(s.preemptions(), 20u);
  EXPECT_GT(s.prefix_hit_tokens(), 0u);
  EXPECT_GT(cancelled, 20);
}

}  // namespace
}  // namespace strata::runtime
