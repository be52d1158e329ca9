// Rendering is bounded: a template or a context that would run long, recurse deep, or build too much
// text is an error naming the limit, never a hang, a stack overflow or an exhausted server.

#include <string>

#include "chat_template/chat_template.h"
#include "chat_template/parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace strata::chat_template {
namespace {

using ::testing::HasSubstr;
using testing::RenderSource;

TEST(ChatTemplateBounds, InfiniteWorkRunsOutOfSteps) {
  RenderLimits limits;
  limits.max_steps = 100'000;
  auto out =
      RenderSource("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "{}", limits);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().ToString(), HasSubstr("LimitError: rendering takes more than 100000 steps"));
}

TEST(ChatTemplateBounds, RecursiveMacrosHitTheNestingLimit) {
  auto out = RenderSource("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().ToString(), HasSubstr("nesting deeper than"));
}

TEST(ChatTemplateBounds, OutputIsCapped) {
  RenderLimits limits;
  limits.max_output_bytes = 1000;
  auto out = RenderSource("{% for i in range(100) %}0123456789ABCDEF{% endfor %}", "{}", limits);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().ToString(), HasSubstr("output cap"));
  // Building a huge value is refused before it is built.
  EXPECT_THAT(RenderSource("{{ 'x' * 100000000000 }}").status().ToString(), HasSubstr("output cap"));
  EXPECT_THAT(RenderSource("{% set s = 'ab' * 1000000 %}{{ s|replace('a', s) }}").status().ToString(),
              HasSubstr("output cap"));
  EXPECT_THAT(RenderSource("{{ [1] * 100000000000 }}").status().ToString(), HasSubstr("output cap"));
}

TEST(ChatTemplateBounds, WhatARenderingBuildsIsCapped) {
  RenderLimits limits;
  limits.max_built_bytes = 1 << 20;
  // Each step keeps every earlier list alive through the next one: quadratic memory.
  auto out = RenderSource(
      "{% set ns = namespace(a=[], keep=[]) %}{% for i in range(10000) %}{% set ns.a = ns.a + [i] %}"
      "{% set ns.keep = ns.keep + [ns.a] %}{% endfor %}",
      "{}", limits);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().ToString(), HasSubstr("LimitError: rendering builds more than 1048576 bytes"));
}

TEST(ChatTemplateBounds, RangeIsCappedAsTheSandboxCapsIt) {
  auto out = RenderSource("{{ range(100001)|length }}");
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().ToString(), HasSubstr("MAX_RANGE (100000)"));
  EXPECT_EQ(*RenderSource("{{ range(100000)|length }}"), "100000");
  EXPECT_EQ(*RenderSource("{{ range(-9223372036854775807, 9223372036854775807, 4611686018427387904)|length }}"), "4");
}

TEST(ChatTemplateBounds, ValuesCannotNestWithoutBound) {
  auto out = RenderSource(
      "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}");
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().ToString(), HasSubstr("nested deeper than"));
  std::string deep(5000, '[');
  deep += std::string(5000, ']');
  auto t = ParseTemplate("{{ x }}", "t");
  ASSERT_TRUE(t.ok());
  auto rendered = t->Render(nlohmann::ordered_json{{"x", nlohmann::ordered_json::parse(deep)}});
  ASSERT_FALSE(rendered.ok());
  EXPECT_THAT(rendered.status().ToString(), HasSubstr("nests deeper than"));
}

TEST(ChatTemplateBounds, DeeplyNestedSourceIsASyntaxErrorNotAStackOverflow) {
  struct Nest {
    std::string_view open, close;
  };
  for (Nest n : {Nest{"(", ")"}, Nest{"[", "]"}, Nest{"not ", ""}, Nest{"-", ""}, Nest{"", "|trim"}, Nest{"", " + 1"},
                 Nest{"", ".a"}, Nest{"", "()"}}) {
    std::string source = "{{ ";
    for (int i = 0; i < 100000; ++i) source += n.open;
    source += "1";
    for (int i = 0; i < 100000; ++i) source += n.close;
    source += " }}";
    auto t = ParseTemplate(source, "deep.jinja");
    ASSERT_FALSE(t.ok()) << n.open;
    EXPECT_THAT(t.status().ToString(), HasSubstr("nesting deeper than")) << n.open;
  }
  std::string blocks;
  for (int i = 0; i < 100000; ++i) blocks += "{% if x %}";
  for (int i = 0; i < 100000; ++i) blocks += "{% endif %}";
  EXPECT_THAT(ParseTemplate(blocks, "deep.jinja").status().ToString(), HasSubstr("nesting deeper than"));
}

TEST(ChatTemplateBounds, IntegerOverflowIsAnErrorNotUndefinedBehaviour) {
  EXPECT_THAT(RenderSource("{{ 2 ** 64 }}").status().ToString(), HasSubstr("OverflowError"));
  EXPECT_THAT(RenderSource("{{ -(-9223372036854775807 - 1) }}").status().ToString(), HasSubstr("OverflowError"));
  EXPECT_THAT(RenderSource("{{ (-9223372036854775807 - 1) // -1 }}").status().ToString(), HasSubstr("OverflowError"));
  EXPECT_THAT(ParseTemplate("{{ 99999999999999999999 }}", "t").status().ToString(), HasSubstr("64 bits"));
}

}  // namespace
}  // namespace strata::chat_template
