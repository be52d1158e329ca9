#include "runtime/engine/stop_strings.h"

#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

TEST(StopStrings, TextBeforeTheStopIsEmittedAndTheStopIsNot) {
  StopStringMatcher m({"END"});
  std::string out;
  out += m.Push("hello E").text;
  EXPECT_EQ(out, "hello ");  // "E" may start "END": held back
  auto r = m.Push("N");
  out += r.text;
  EXPECT_FALSE(r.stopped);
  r = m.Push("D and more");
  out += r.text;
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(out, "hello ");
  EXPECT_TRUE(m.Push("x").text.empty());
}

TEST(StopStrings, HeldBackTextComesOutWhenItStopsMatching) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.Push("EN").text, "");
  EXPECT_EQ(m.Push("x").text, "ENx");
  EXPECT_EQ(m.Push("E").text, "");
  EXPECT_EQ(m.Flush(), "E");
}

TEST(StopStrings, TheEarliestOfSeveralStopsWins) {
  StopStringMatcher m({"world", "lo w"});
  auto r = m.Push("hello world");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "hel");
}

TEST(StopStrings, WithoutStopStringsEverythingPasses) {
  StopStringMatcher m({});
  EXPECT_EQ(m.Push("abc").text, "abc");
  EXPECT_EQ(m.Flush(), "");
}

}  // namespace
}  // namespace strata::runtime
