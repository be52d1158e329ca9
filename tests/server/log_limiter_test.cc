// LogLimiter: the first line of a kind at once, repeats within the window counted and summed up later.
#include "server/log_limiter.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace strata::server {
namespace {

struct Fixture {
  std::vector<std::string> lines;
  LogLimiter::Clock::time_point now{};
  LogLimiter limiter{[this](std::string_view line) { lines.emplace_back(line); }, std::chrono::seconds(60), 3,
                     [this] { return now; }};
};

TEST(LogLimiter, RepeatsWithinTheWindowAreCountedThenSummedUp) {
  Fixture f;
  for (int i = 0; i < 100; ++i) f.limiter.Log("bad UTF-8");
  f.limiter.Log("another line");
  EXPECT_EQ(f.lines, (std::vector<std::string>{"bad UTF-8", "another line"}));
  f.now += std::chrono::seconds(61);
  f.limiter.Log("bad UTF-8");
  ASSERT_EQ(f.lines.size(), 3u);
  EXPECT_EQ(f.lines[2], "bad UTF-8 (repeated 99 more times in the last 61 s)");
  f.limiter.Log("bad UTF-8");  // a new window
  EXPECT_EQ(f.lines.size(), 3u);
}

TEST(LogLimiter, ManyDistinctLinesStayBounded) {
  Fixture f;
  for (int i = 0; i < 10; ++i) f.limiter.Log("line " + std::to_string(i));
  EXPECT_EQ(f.lines.size(), 10u);  // each is new, so each is written; only 3 kinds are remembered
  f.limiter.Log("line 9");
  EXPECT_EQ(f.lines.size(), 10u);  // the newest kinds are still remembered
}

}  // namespace
}  // namespace strata::server
