#include "runtime/engine/stop_strings.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

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

TEST(StopStrings, AnOccurrenceTheGrammarRefusesPassesAsText) {
  // A constrained request: "}" stops only where the text before it is balanced (a stand-in for a grammar).
  std::vector<std::string> seen;
  StopStringMatcher m({"}"}, [&](std::string_view before) {
    seen.emplace_back(before);
    return before.find('{') == std::string_view::npos;
  });
  std::string out;
  auto r = m.Push("{\"a\": 1}");
  out += r.text;
  EXPECT_FALSE(r.stopped);
  r = m.Push(" x");
  out += r.text;
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(out, "{\"a\": 1} x");
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], "{\"a\": 1");  // the whole stream before the occurrence
  StopStringMatcher plain({"}"}, [](std::string_view before) { return before == "ok "; });
  r = plain.Push("ok }");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "ok ");
}

}  // namespace
}  // namespace strata::runtime
