#pragma once
// What the tool-call parsers' tests share (tool_calls_test.cc, typed_tool_calls_test.cc, harmony_test.cc): the
// whole parse with seeded ids, and the stream parser fed at given cuts, whose deltas must add up to it.

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "chat_template/tool_calls.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/chat_template/utf8_check.h"

namespace strata::chat_template {

inline constexpr uint64_t kSeed = 7;

// `tools`: the request's tools (glm45 and minimax_m2 type arguments by them).
inline ParsedToolCalls Parse(ToolCallFormat format, std::string_view text,
                             const nlohmann::ordered_json& tools = nullptr) {
  ToolCallIds ids(kSeed);
  return ParseToolCalls(format, text, ids, &tools);
}

struct Streamed {
  ParsedToolCalls result;
  std::vector<std::vector<ToolCallDelta>> feeds;  // what each Feed returned, then Finish
};

inline void Add(const std::vector<ToolCallDelta>& deltas, ParsedToolCalls& result) {
  for (const ToolCallDelta& delta : deltas) {
    if (delta.tool_index < 0) {
      EXPECT_FALSE(delta.content.empty());
      result.content += delta.content;
      continue;
    }
    ASSERT_LE(static_cast<size_t>(delta.tool_index), result.calls.size()) << "calls are announced in order";
    if (static_cast<size_t>(delta.tool_index) == result.calls.size()) {
      EXPECT_FALSE(delta.id.empty()) << "a call's first delta has its id";
      EXPECT_FALSE(delta.name.empty() && delta.id.empty());
      result.calls.emplace_back();
    } else {
      EXPECT_TRUE(delta.id.empty() && delta.name.empty()) << "only the first delta has the id and name";
    }
    ToolCall& call = result.calls[delta.tool_index];
    call.id += delta.id;
    call.name += delta.name;
    call.arguments += delta.arguments;
  }
}

// Feeds `text` cut at `cuts` (increasing offsets) to `parser` (a ToolCallStreamParser or a
// ForcedToolCallStreamParser) and adds up the deltas.
template <class Parser>
Streamed StreamThrough(Parser& parser, std::string_view text, const std::vector<size_t>& cuts) {
  Streamed streamed;
  size_t start = 0;
  for (size_t cut : cuts) {
    streamed.feeds.push_back(parser.Feed(text.substr(start, cut - start)));
    start = cut;
  }
  streamed.feeds.push_back(parser.Feed(text.substr(start)));
  streamed.feeds.push_back(parser.Finish());
  for (const auto& deltas : streamed.feeds) Add(deltas, streamed.result);
  return streamed;
}

// `text` through the streaming parser of `format`, cut at `cuts`.
inline Streamed Stream(ToolCallFormat format, std::string_view text, const std::vector<size_t>& cuts,
                       const nlohmann::ordered_json& tools = nullptr) {
  ToolCallStreamParser parser(format, ToolCallIds(kSeed), tools);
  return StreamThrough(parser, text, cuts);
}

inline void ExpectSame(const ParsedToolCalls& expected, const ParsedToolCalls& actual, std::string_view what) {
  EXPECT_EQ(expected.content, actual.content) << what;
  ASSERT_EQ(expected.calls.size(), actual.calls.size()) << what;
  for (size_t i = 0; i < expected.calls.size(); ++i) {
    EXPECT_EQ(expected.calls[i].id, actual.calls[i].id) << what << " call " << i;
    EXPECT_EQ(expected.calls[i].name, actual.calls[i].name) << what << " call " << i;
    EXPECT_EQ(expected.calls[i].arguments, actual.calls[i].arguments) << what << " call " << i;
  }
}

// Every cut into two pieces, every byte alone, and random cuts: the deltas add up to ParseToolCalls, and
// with valid UTF-8 in, every content delta is valid UTF-8.
inline void ExpectStreamsLikeParse(ToolCallFormat format, std::string_view text,
                                   const nlohmann::ordered_json& tools = nullptr) {
  const ParsedToolCalls expected = Parse(format, text, tools);
  const bool utf8 = IsValidUtf8(text);
  auto check = [&](const std::vector<size_t>& cuts, const std::string& what) {
    const Streamed streamed = Stream(format, text, cuts, tools);
    ExpectSame(expected, streamed.result, what);
    if (!utf8) return;
    for (const auto& deltas : streamed.feeds) {
      for (const ToolCallDelta& delta : deltas) {
        EXPECT_TRUE(IsValidUtf8(delta.content)) << what;
        EXPECT_TRUE(IsValidUtf8(delta.arguments)) << what;
      }
    }
  };
  check({}, "whole");
  for (size_t cut = 0; cut <= text.size(); ++cut) check({cut}, "cut at " + std::to_string(cut));
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  check(every, "byte by byte");
  std::mt19937 rng(static_cast<uint32_t>(text.size()));
  for (int round = 0; round < 20; ++round) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i) {
      if (rng() % 4 == 0) cuts.push_back(i);
    }
    check(cuts, "random cuts " + std::to_string(round));
  }
}

}  // namespace strata::chat_template
