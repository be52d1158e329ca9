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
  s.Record(4, 2);  // 5 of 8: above the bar
  EXPECT_TRUE(s.MayPropose());
  s.Record(4, 0);
  s.Record(4, 1);  // 1 of 8: pauses for 32 steps
  int paused = 0;
  while (!s.MayPropose()) ++paused;
  EXPECT_EQ(paused, 32);
  s.Record(8, 0);  // still low: the next pause is twice as long
  paused = 0;
  while (!s.MayPropose()) ++paused;
  EXPECT_EQ(paused, 64);
  s.Record(8, 8);  // good again: the backoff resets, nothing pauses
  EXPECT_TRUE(s.MayPropose());
  s.Record(8, 0);
  paused = 0;
  while (!s.MayPropose()) ++paused;
  EXPECT_EQ(paused, 32);
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
}

}  // namespace
}  // namespace strata::runtime
