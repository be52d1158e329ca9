// Speculative decoding's engine half alone (runtime/engine/speculation.h): n-gram proposals and the adaptive
// off-switch. The engine's exactness with it is engine_speculative_test.cc's.

#include "runtime/engine/speculation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace strata::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(ProposeNgram, TheLongestRecurringSuffixProposesWhatFollowedIt) {
  //                                  0  1  2  3  4  5  6  7  8  9
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 1, 6, 7, 2, 7};
  // The suffix [7] recurs (at 2 and 7); [2, 7] does not: the most recent earlier 7 (at 7) is followed by 2, 7.
  EXPECT_THAT(ProposeNgram(tokens, 1, 3, 4), ElementsAre(2, 7));
  // [6, 7] recurs at 1 and 6 when it ends the sequence: the most recent one (6) proposes 2, 7, then runs out.
  const std::vector<int32_t> two = {5, 6, 7, 8, 9, 1, 6, 7, 2, 7, 3, 6, 7};
  EXPECT_THAT(ProposeNgram(two, 1, 3, 4), ElementsAre(2, 7, 3, 6));
  EXPECT_THAT(ProposeNgram(two, 1, 3, 2), ElementsAre(2, 7));
  // A longer match wins over a more recent shorter one: [1, 6, 7] is found at 5, though [7] is at 9 too.
  const std::vector<int32_t> longer = {1, 6, 7, 4, 4, 2, 7, 9, 9, 1, 6, 7};
  EXPECT_THAT(ProposeNgram(longer, 1, 3, 3), ElementsAre(4, 4, 2));
  EXPECT_THAT(ProposeNgram(longer, 1, 1, 3), ElementsAre(9, 9, 1));  // only [7]: its most recent occurrence (6)
}

TEST(ProposeNgram, NothingWithoutARecurringSuffixOfAtLeastMinN) {
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{1, 2, 3, 4}, 1, 4, 4), IsEmpty());
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{1, 2, 3, 1}, 2, 4, 4), IsEmpty());  // [1] recurs, but min_n is 2
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{1, 2, 3, 1}, 1, 4, 4), ElementsAre(2, 3, 1));
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{}, 1, 4, 4), IsEmpty());
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{3}, 1, 4, 4), IsEmpty());
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{3, 3}, 1, 4, 0), IsEmpty());
  // A run of one token overlaps itself: [3, 3] recurs at 0 and proposes the 3 after it.
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{3, 3, 3}, 2, 2, 4), ElementsAre(3));
}

TEST(Speculation, LowAcceptancePausesProposalsAndTheBackoffGrows) {
  SpeculativeOptions o;
  o.adaptive_window = 8;
  o.min_acceptance = 0.25;
  Speculation s(o);
  EXPECT_TRUE(s.MayPropose());
  s.Record(4, 3);
  s.Record(4, 2);  // a moving average of 0.49 (from 0.4): above the bar
  EXPECT_TRUE(s.MayPropose());
  s.Record(4, 0);
  s.Record(4, 0);  // two misses in a row do not stop a sequence that did well (0.28)
  EXPECT_TRUE(s.MayPropose());
  s.Record(4, 0);  // a third does (0.21): it pauses for 32 steps
  int paused = 0;
  while (!s.MayPropose()) ++paused;
  EXPECT_EQ(paused, 32);
  for (int i = 0; i < 2; ++i) s.Record(4, 0);  // judged afresh from 0.4, still low: the next pause is twice as long
  paused = 0;
  while (!s.MayPropose()) ++paused;
  EXPECT_EQ(paused, 64);
  s.Record(8, 8);
  s.Record(8, 8);  // good again (0.66, over twice the bar): the backoff resets, nothing pauses
  EXPECT_TRUE(s.MayPropose());
  for (int i = 0; i < 4; ++i) s.Record(8, 0);
  paused = 0;
  while (!s.MayPropose()) ++paused;
  EXPECT_EQ(paused, 32);
}

TEST(Speculation, TheExpectedRateStartsHopefulAndFollowsRecentVerifications) {
  Speculation s(SpeculativeOptions{});
  EXPECT_DOUBLE_EQ(s.expected_rate(), 1.0);  // untried: tried
  s.Record(4, 4);
  s.Record(4, 4);
  EXPECT_DOUBLE_EQ(s.expected_rate(), 1.0);
  // A quarter kept, for long: the old verifications fade (10 kept of 40 in the decayed sums), the prior stays (4 of 4).
  for (int i = 0; i < 60; ++i) s.Record(4, 1);
  EXPECT_NEAR(s.expected_rate(), 14.0 / 44.0, 1e-3);
  const double before = s.expected_rate();
  s.Record(4, 0);
  EXPECT_LT(s.expected_rate(), before);
}

TEST(SpeculativeOptions, EachOutOfRangeFieldIsNamed) {
  SpeculativeOptions o;
  EXPECT_TRUE(ValidateSpeculativeOptions(o).ok());
  o.tokens = 0;
  EXPECT_THAT(std::string(ValidateSpeculativeOptions(o).message()), ::testing::HasSubstr("--num-speculative-tokens"));
  o = {};
  o.ngram_min = 0;
  EXPECT_THAT(std::string(ValidateSpeculativeOptions(o).message()), ::testing::HasSubstr("--ngram-min"));
  o = {};
  o.ngram_min = 3;
  o.ngram_max = 2;
  EXPECT_THAT(std::string(ValidateSpeculativeOptions(o).message()), ::testing::HasSubstr("--ngram-max"));
  EXPECT_FALSE(ParseSpeculativeMethod("eagle").ok());
  EXPECT_THAT(std::string(ParseSpeculativeMethod("eagle").status().message()), ::testing::HasSubstr("\"eagle\""));
  EXPECT_EQ(*ParseSpeculativeMethod("ngram"), SpeculativeOptions::Method::kNgram);
  EXPECT_EQ(*ParseSpeculativeMethod("none"), SpeculativeOptions::Method::kNone);
  EXPECT_EQ(*ParseSpeculativeMethod("draft"), SpeculativeOptions::Method::kDraft);
  o = {};
  o.method = SpeculativeOptions::Method::kDraft;
  EXPECT_THAT(std::string(ValidateSpeculativeOptions(o).message()), ::testing::HasSubstr("no --draft-model"));
  o.draft_model = "/models/draft";
  EXPECT_TRUE(ValidateSpeculativeOptions(o).ok());
  o.method = SpeculativeOptions::Method::kNgram;
  EXPECT_THAT(std::string(ValidateSpeculativeOptions(o).message()),
              ::testing::HasSubstr("--draft-model: given with --speculative ngram"));
}

TEST(PassCosts, EstimatesWithinAndBetweenMeasuredSizes) {
  PassCosts costs;
  EXPECT_FALSE(costs.Pass(4).has_value());
  costs.RecordPass(4, 0.010);
  EXPECT_DOUBLE_EQ(*costs.Pass(4), 0.010);
  EXPECT_DOUBLE_EQ(*costs.Pass(3), 0.010);   // the same bucket, no neighbour: its average
  EXPECT_FALSE(costs.Pass(20).has_value());  // past the largest measured: nothing known
  EXPECT_FALSE(costs.Pass(1).has_value());   // below every measured bucket: nothing known
  costs.RecordPass(20, 0.050);
  EXPECT_NEAR(*costs.Pass(12), 0.030, 1e-12);  // between the two, on their line
  EXPECT_NEAR(*costs.Pass(8), 0.020, 1e-12);
  for (int i = 0; i < 50; ++i) costs.RecordPass(4, 0.020);  // a moving average: the old time fades
  EXPECT_NEAR(*costs.Pass(4), 0.020, 1e-6);
  EXPECT_FALSE(costs.Draft(4).has_value());
  costs.RecordDraft(4, 0.002);
  EXPECT_DOUBLE_EQ(*costs.Draft(4), 0.002);
}

TEST(PassCosts, ProposalsPayWhenTheTokensKeptRepayTheLongerPass) {
  PassCosts costs;
  // Unmeasured: the plain pass is measured first, then the one with proposals is tried.
  EXPECT_FALSE(ProposalsPay(costs, 1, 4, 2.0, false));
  costs.RecordPass(1, 0.010);
  EXPECT_TRUE(ProposalsPay(costs, 1, 4, 2.0, false));
  // Weight-bound (one stream): 5 tokens cost 1.2x one; keeping 0.5 of 4 pays (1.5 / 1.2), 0.1 does not (1.1 / 1.2).
  costs.RecordPass(5, 0.012);
  EXPECT_TRUE(ProposalsPay(costs, 1, 4, 0.5, false));
  EXPECT_FALSE(ProposalsPay(costs, 1, 4, 0.1, false));
  // Compute-bound (16 streams): 80 tokens cost 4x 16; even 2 of 4 kept per row (48 / 4 = 12 < 16) does not pay.
  costs.RecordPass(16, 0.020);
  costs.RecordPass(80, 0.080);
  EXPECT_FALSE(ProposalsPay(costs, 16, 64, 32.0, false));
  EXPECT_TRUE(ProposalsPay(costs, 16, 64, 60.0, false));
  // A draft model's round counts too: unmeasured, it is tried; 10 ms more makes 0.5 kept per row not pay.
  EXPECT_TRUE(ProposalsPay(costs, 1, 4, 0.5, true));
  costs.RecordDraft(1, 0.010);
  EXPECT_FALSE(ProposalsPay(costs, 1, 4, 0.5, true));
  EXPECT_TRUE(ProposalsPay(costs, 1, 4, 3.5, true));  // 4.5 / 22 ms > 1 / 10 ms
  EXPECT_FALSE(ProposalsPay(costs, 1, 0, 0, false));  // nothing proposed
}

TEST(PassCosts, TheProposersAreTheBestFirstCountThatPaysMost) {
  PassCosts costs;
  EXPECT_EQ(ProposersThatPay(costs, 16, {{4, 3.0}}, false), 0);  // the plain pass is measured first
  costs.RecordPass(16, 0.020);
  // 16 rows, 4 tokens each: a pass of 20 tokens is unmeasured, so the best candidate alone tries it.
  const std::vector<ProposalCandidate> four_good_twelve_bad = {
      {4, 3.8}, {4, 3.8}, {4, 3.8}, {4, 3.8}, {4, 0.2}, {4, 0.2}, {4, 0.2}, {4, 0.2},
      {4, 0.2}, {4, 0.2}, {4, 0.2}, {4, 0.2}, {4, 0.2}, {4, 0.2}, {4, 0.2}, {4, 0.2}};
  EXPECT_EQ(ProposersThatPay(costs, 16, four_good_twelve_bad, false), 1);
  // Half compute-bound: 16 more tokens cost half a 16-row pass. The 4 good ones pay (15.2 tokens more for 1.5x the
  // time), the bad ones do not (0.2 kept for an eighth of a row's cost each, and later rows cost more).
  costs.RecordPass(32, 0.030);
  costs.RecordPass(80, 0.080);
  EXPECT_EQ(ProposersThatPay(costs, 16, four_good_twelve_bad, false), 4);
  // None good: nothing proposes.
  const std::vector<ProposalCandidate> bad(16, ProposalCandidate{4, 0.2});
  EXPECT_EQ(ProposersThatPay(costs, 16, bad, false), 0);
  // Weight-bound (a pass of 80 tokens costs what 16 do): everyone keeping one of four proposes; keeping 0.2 of four
  // would gain 15%, within the estimates' error: nobody does.
  PassCosts flat;
  flat.RecordPass(16, 0.020);
  flat.RecordPass(80, 0.021);
  EXPECT_EQ(ProposersThatPay(flat, 16, std::vector<ProposalCandidate>(16, ProposalCandidate{4, 1.0}), false), 16);
  EXPECT_EQ(ProposersThatPay(flat, 16, bad, false), 0);
}

// While nothing pays, a probe after 32 skipped steps, then 64, ... 1024; while proposing pays, a plain step after 32
// proposing ones, then 64, ... 1024; either run ending starts the other's count from 32 again.
TEST(CostProbes, ProbesBackOffAndStartOverWhenTheDecisionTurns) {
  using Step = CostProbes::Step;
  CostProbes probes;
  // The steps until the next `wanted`, all others `between`.
  auto steps_until = [&](int64_t proposers, Step wanted, Step between) {
    for (int n = 1; n <= 5000; ++n) {
      const Step step = probes.Next(proposers);
      if (step == wanted) return n;
      EXPECT_EQ(step, between) << "step " << n;
    }
    return -1;
  };
  for (const int expected : {32, 64, 128, 256, 512, 1024, 1024}) {
    EXPECT_EQ(steps_until(0, Step::kProbe, Step::kSkip), expected);
  }
  for (const int expected : {32, 64, 128, 256, 512, 1024, 1024}) {
    EXPECT_EQ(steps_until(3, Step::kPlain, Step::kPropose), expected);
  }
  EXPECT_EQ(steps_until(0, Step::kProbe, Step::kSkip), 32);  // proposing reset the probes' back-off
  EXPECT_EQ(steps_until(2, Step::kPlain, Step::kPropose), 32);
}

}  // namespace
}  // namespace strata::runtime
