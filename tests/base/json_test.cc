// The one bounded JSON parser (base/json.h): depth checked before anything is built, brackets in
// strings are text, every refusal an InvalidArgument naming the source.
#include "base/json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata::base {
namespace {

using ::testing::HasSubstr;

std::string Nested(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

TEST(ParseJson, ParsesWithinTheDepthAndKeepsKeyOrderWhenAsked) {
  absl::StatusOr<nlohmann::json> value = ParseJson(R"({"b": [1, {"c": null}], "a": "x"})", 3, "config.json");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ((*value)["b"][1]["c"], nullptr);
  absl::StatusOr<nlohmann::ordered_json> ordered = ParseOrderedJson(R"({"b": 1, "a": 2})", 1, "body");
  ASSERT_TRUE(ordered.ok()) << ordered.status();
  EXPECT_EQ(ordered->begin().key(), "b");
  EXPECT_TRUE(ParseJson(Nested(127), kMaxJsonDepth, "x").ok());
}

TEST(ParseJson, RefusesDeepNestingBeforeParsingNamingTheSourceAndTheByte) {
  // A million levels: parsed and then printed or copied, it would overflow the stack.
  for (const std::string& text : {Nested(1'000'000), "{\"a\":" + Nested(65) + "}"}) {
    absl::StatusOr<nlohmann::ordered_json> value = ParseOrderedJson(text, 64, "messages[1].tool_calls_json");
    ASSERT_FALSE(value.ok());
    EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(value.status().message(),
                HasSubstr("messages[1].tool_calls_json: JSON nests deeper than 64 levels at byte"));
  }
}

TEST(ParseJson, BracketsInsideStringsAreText) {
  const std::string text = R"({"arguments": ")" + std::string(100000, '[') + R"(\"]"})";
  absl::StatusOr<nlohmann::json> value = ParseJson(text, 2, "body");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ((*value)["arguments"].get<std::string>(), std::string(100000, '[') + "\"]");
}

TEST(ParseJson, RefusesTextThatIsNotJsonNamingTheSource) {
  for (const char* text : {"{not json", "", "[1, 2", "1e999999"}) {
    absl::StatusOr<nlohmann::json> value = ParseJson(text, kMaxJsonDepth, "tokenizer.json");
    ASSERT_FALSE(value.ok()) << text;
    EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(value.status().message(), HasSubstr("tokenizer.json: not valid JSON: ")) << text;
  }
}

}  // namespace
}  // namespace strata::base
