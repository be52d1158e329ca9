// The engine's rules one at a time: each expectation is what jinja2 (as transformers configures it)
// renders for the same template, checked by hand against jinja2 3.1.

#include "chat_template/chat_template.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace strata::chat_template {
namespace {

using ::testing::HasSubstr;
using testing::R;
using ::testing::StartsWith;

TEST(ChatTemplateSyntax, ErrorsNameTheFileLineAndColumn) {
  auto t = ParseTemplate("line one\n{% if x %}\n  {{ x + }}\n{% endif %}", "chat_template.jinja");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), StartsWith("chat_template.jinja:3:"));
  EXPECT_TRUE(absl::IsInvalidArgument(t.status()));
}

TEST(ChatTemplateSyntax, UnclosedBlockIsAnErrorNamingWhatWasExpected) {
  auto t = ParseTemplate("{% for m in messages %}\n{{ m }}\n", "t.jinja");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().ToString(), HasSubstr("t.jinja:"));
  EXPECT_THAT(t.status().ToString(), HasSubstr("'endfor'"));
}

TEST(ChatTemplateSyntax, UnknownTagsAndOtherTemplatesAreRefused) {
  EXPECT_THAT(ParseTemplate("{% do x.append(1) %}", "t").status().ToString(), HasSubstr("unknown tag 'do'"));
  EXPECT_THAT(ParseTemplate("{% include 'x' %}", "t").status().ToString(), HasSubstr("'include' is not supported"));
  EXPECT_THAT(ParseTemplate("{% for x in y recursive %}{% endfor %}", "t").status().ToString(), HasSubstr("recursive"));
  EXPECT_THAT(ParseTemplate("{% break %}", "t").status().ToString(), HasSubstr("outside of a loop"));
  EXPECT_THAT(ParseTemplate("{{ 'unterminated }}", "t").status().ToString(), HasSubstr("t:1:4:"));
  EXPECT_THAT(ParseTemplate("{# no end", "t").status().ToString(), HasSubstr("Missing end of comment tag"));
  EXPECT_THAT(ParseTemplate("{{ (1 }}", "t").status().ToString(), HasSubstr("unexpected '}'"));
  EXPECT_FALSE(ParseTemplate("\xff\xfe", "t").ok());
}

TEST(ChatTemplateWhitespace, TrimAndLstripBlocksAsTransformersSetsThem) {
  EXPECT_EQ(R("  {% if true %}\n  yes\n  {% endif %}\nafter"), "  yes\nafter");
  EXPECT_EQ(R("a {%- if true -%} b {%- endif %} c"), "ab c");
  EXPECT_EQ(R("x {%+ if true %}y{% endif %}"), "x y");
  EXPECT_EQ(R("{# comment #}\nline"), "line");
  EXPECT_EQ(R("{{ 1 }}\n{{ 2 }}\n"), "1\n2");  // no trim after }}; one trailing newline dropped
  EXPECT_EQ(R("a\r\nb\rc"), "a\nb\nc");
  EXPECT_EQ(R("{% raw %}{{ not }}{% endraw %}"), "{{ not }}");
}

TEST(ChatTemplatePrinting, ValuesPrintAsPythonStrDoes) {
  EXPECT_EQ(R("{{ x }}", R"({"x": [1, 2.5, null, true, "a'b", {"k": "v"}]})"),
            R"([1, 2.5, None, True, "a'b", {'k': 'v'}])");
  EXPECT_EQ(R("{{ 1e20 }} {{ 1.5e-5 }} {{ 0.1 + 0.2 }} {{ 100.0 }} {{ (1,) }}"),
            "1e+20 1.5e-05 0.30000000000000004 100.0 (1,)");
  EXPECT_EQ(R("{{ missing }}|{{ none }}"), "|None");
}

TEST(ChatTemplateOperators, ArithmeticFollowsPython) {
  EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 ~ 'a' }}"), "3 -4 2 3.5 1024 1a");
  EXPECT_EQ(R("{{ 'ab' * 2 }} {{ [1] + [2] }} {{ 'a' + 'b' }} {{ 1 < 2 < 3 }} {{ 'a' in 'cat' }}"),
            "abab [1, 2] ab True True");
  EXPECT_EQ(R("{{ 1 if false }}|{{ 1 if false else 2 }}|{{ none or 'x' }}|{{ 0 and 1 }}"), "|2|x|0");
  EXPECT_THAT(R("{{ 1 / 0 }}"), HasSubstr("ZeroDivisionError"));
  EXPECT_THAT(R("{{ 'a' + 1 }}"), HasSubstr("TypeError"));
  EXPECT_THAT(R("{{ 9223372036854775807 + 1 }}"), HasSubstr("OverflowError"));
}

TEST(ChatTemplateStrings, SlicesIndexCodePoints) {
  EXPECT_EQ(R("{{ s[1:3] }}|{{ s[::-1] }}|{{ s[-1] }}|{{ s|length }}", R"({"s": "héllo"})"), "él|olléh|o|5");
  EXPECT_EQ(R("{{ x[1:] }} {{ x[::2] }} {{ x[-2:] }} {{ x[10] }}", R"({"x": [1, 2, 3, 4]})"),
            "[2, 3, 4] [1, 3] [3, 4] ");
}

TEST(ChatTemplateStrings, MethodsFollowPython) {
  EXPECT_EQ(R("{{ s.strip() }}|{{ s.split() }}|{{ s.lstrip().startswith('a') }}|{{ s.replace('b', 'B') }}",
              R"({"s": "  a b  "})"),
            "a b|['a', 'b']|True|  a B  ");
  EXPECT_EQ(R("{{ 'a,b,,c'.split(',') }} {{ 'a b c'.rsplit(' ', 1) }} {{ 'x'.upper() }} {{ 'ab'.endswith(('b',)) }}"),
            "['a', 'b', '', 'c'] ['a b', 'c'] X True");
  EXPECT_EQ(R("{{ '<think>x</think>y'.split('</think>')[-1] }}"), "y");
}

TEST(ChatTemplateDicts, MethodsAndAttributeFallBackToItems) {
  const char* ctx = R"({"d": {"b": 1, "a": 2, "items": 3}})";
  EXPECT_EQ(R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", ctx), "b=1;a=2;items=3;");
  EXPECT_EQ(R("{{ d.keys()|list }} {{ d.get('z', 9) }} {{ d['items'] }} {{ d.a }} {{ d.zz }}", ctx),
            "['b', 'a', 'items'] 9 3 2 ");
  EXPECT_THAT(R("{{ d.zz.yy }}", ctx), HasSubstr("UndefinedError"));
}

TEST(ChatTemplateLoops, LoopVariablesAndScoping) {
  EXPECT_EQ(R("{% for i in [5, 6, 7] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
              "{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }};"
              "{% endfor %}"),
            "103TrueFalse36a;212FalseFalse357b;321FalseTrue36a;");
  // A set inside a loop body does not leak out of the loop, nor into the next iteration.
  EXPECT_EQ(R("{% set c = 0 %}{% for i in [1, 2, 3] %}{% set c = c + 1 %}{{ c }}{% endfor %}{{ c }}"), "1110");
  EXPECT_EQ(R("{% set ns = namespace(c=0) %}{% for i in [1, 2, 3] %}{% set ns.c = ns.c + i %}{% endfor %}{{ ns.c }}"),
            "6");
  EXPECT_EQ(R("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}"
              "{% endif %}{{ i }}{% endfor %}"),
            "0134");
  EXPECT_EQ(R("{% for i in [] %}x{% else %}empty{% endfor %}{% for i in [0, 1, 2] if i %}{{ i }}/{{ loop.length }}"
              "{% endfor %}"),
            "empty1/22/2");
  EXPECT_EQ(R("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}"), "37");
}

TEST(ChatTemplateMacros, ArgumentsDefaultsCallerAndLateBinding) {
  EXPECT_EQ(R("{% macro f(a, b=2) %}{{ a }}/{{ b }}{% endmacro %}{{ f(1) }} {{ f(1, 3) }} {{ f(1, b=4) }}"),
            "1/2 1/3 1/4");
  EXPECT_EQ(R("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}"), "<in>");
  EXPECT_EQ(R("{% macro m() %}{{ c }}{% endmacro %}{% set c = 1 %}{{ m() }}{% set c = 2 %}{{ m() }}"), "12");
  EXPECT_EQ(R("{% set t %}block{% endset %}{{ t }}{% filter upper %}low{% endfilter %}{% with z = 5 %}{{ z }}"
              "{% endwith %}{{ z }}"),
            "blockLOW5");
  EXPECT_EQ(R("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(ChatTemplateFilters, TheFiltersTemplatesUse) {
  EXPECT_EQ(R("{{ '  x '|trim }}|{{ 'ab'|upper }}|{{ 'a-b c'|title }}|{{ 'aB'|capitalize }}|{{ [1, 2]|join(',') }}"),
            "x|AB|A-B C|Ab|1,2");
  EXPECT_EQ(R("{{ q|default('d') }}|{{ ''|default('e', true) }}|{{ [3, 1, 2]|sort }}|{{ [3, 1]|first }}"
              "|{{ [3, 1]|last }}|{{ ['a', 'A']|unique|list }}|{{ [1, 2]|reverse|list }}"),
            "d|e|[1, 2, 3]|3|1|['a']|[2, 1]");
  EXPECT_EQ(R("{{ '3'|int + 1 }}|{{ '2.5'|float }}|{{ 2.567|round(2) }}|{{ -3|abs }}|{{ 'a\nb'|indent(2) }}"
              "|{{ {'b': 1, 'a': 2}|dictsort }}|{{ 'a b'|wordcount }}|{{ '<a>'|e }}|{{ [1, 2, 3]|batch(2)|list }}"),
            "4|2.5|2.57|3|a\n  b|[('a', 2), ('b', 1)]|2|&lt;a&gt;|[[1, 2], [3]]");
  const char* ms = R"({"m": [{"role": "system"}, {"role": "user"}, {"role": "user"}]})";
  EXPECT_EQ(
      R("{{ m|selectattr('role', 'equalto', 'user')|list|length }}|{{ m|map(attribute='role')|join(',') }}"
        "|{{ m|rejectattr('role', 'eq', 'user')|list }}|{{ [0, 1, '']|select|list }}|{{ none|selectattr('a')|list }}",
        ms),
      "2|system,user,user|[{'role': 'system'}]|[1]|[]");
  // jinja2 resolves filter and test names when it compiles: an unknown one fails even where it never
  // runs, except in an `if` statement or an if-expression, where the error waits until it runs.
  EXPECT_THAT(R("{% for i in [] %}{{ 1|nosuchfilter }}{% endfor %}"), HasSubstr("t.jinja:1:23: No filter named"));
  EXPECT_THAT(R("{{ 1 is nosuchtest }}"), HasSubstr("No test named 'nosuchtest'"));
  EXPECT_EQ(R("{% if false %}{{ 1|nosuchfilter }}{% endif %}{{ 1 if true else 2|nosuch }}"), "1");
  EXPECT_THAT(R("{% if true %}{{ 1|nosuchfilter }}{% endif %}"), HasSubstr("No filter named 'nosuchfilter'"));
  EXPECT_THAT(R("{% if false %}{% for i in [] %}{{ 1|nosuchfilter }}{% endfor %}{% endif %}"),
              HasSubstr("No filter named"));
  // Generators (select, map, unique, ...) are truthy even when empty, have no len() and run once.
  EXPECT_EQ(R("{% if []|select %}T{% endif %}{% set g = [1, 2]|select %}{% for a in g %}{{ a }}{% endfor %}"
              "{% for a in g %}{{ a }}{% endfor %}{{ ([1, 2]|reverse)[0] }}"),
            "T12");
  EXPECT_THAT(R("{{ ([1]|map('string'))|length }}"), HasSubstr("has no len()"));
  EXPECT_EQ(R("{{ {'a': 1}.items() }} {{ {'a': 1}.keys()|length }} {{ range(3) }}"),
            "dict_items([('a', 1)]) 1 range(0, 3)");
}

TEST(ChatTemplateFilters, TojsonIsTransformersJsonDumps) {
  const char* ctx = R"({"d": {"b": "é\n\"", "a": [1, 2.0, null, true]}})";
  EXPECT_EQ(R("{{ d|tojson }}", ctx), R"({"b": "é\n\"", "a": [1, 2.0, null, true]})");
  EXPECT_EQ(R("{{ d|tojson(sort_keys=true) }}", ctx), R"({"a": [1, 2.0, null, true], "b": "é\n\""})");
  EXPECT_EQ(R("{{ d.a|tojson(indent=2) }}", ctx), "[\n  1,\n  2.0,\n  null,\n  true\n]");
  EXPECT_EQ(R("{{ d.b|tojson(ensure_ascii=true) }}", ctx), R"("\u00e9\n\"")");
  EXPECT_EQ(R("{{ d.a|tojson(separators=(',', ':')) }}", ctx), "[1,2.0,null,true]");
  EXPECT_THAT(R("{{ q|tojson }}"), HasSubstr("not JSON serializable"));
}

TEST(ChatTemplateTests, TheTestsTemplatesUse) {
  EXPECT_EQ(R("{{ q is defined }}{{ q is undefined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}"
              "{{ [] is iterable }}{{ 'a' is sequence }}{{ 1 is number }}{{ 1 is integer }}{{ 1.5 is float }}"
              "{{ true is boolean }}{{ true is true }}{{ false is false }}"),
            "FalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(R("{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 1 is in [1] }}"
              "{{ 'ab' is lower }}{{ 'AB' is upper }}{{ range is callable }}{{ 1 is not none }}"),
            "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
}

TEST(ChatTemplateSandbox, MutationIsASecurityErrorAndUndefinedUseFails) {
  EXPECT_THAT(R("{{ x.append(1) }}", R"({"x": []})"), HasSubstr("SecurityError"));
  EXPECT_EQ(R("{{ x.append }}", R"({"x": []})"), "");  // unsafe, but printing an Undefined is empty
  EXPECT_THAT(R("{{ d.update({}) }}", R"({"d": {}})"), HasSubstr("SecurityError"));
  EXPECT_THAT(R("{{ x.__class__() }}", R"({"x": ""})"), HasSubstr("SecurityError"));
  EXPECT_THAT(R("{% set ns = namespace() %}{% set ns._x = 1 %}"), HasSubstr("SecurityError"));
  EXPECT_THAT(R("{% set x = 1 %}{% set x.y = 2 %}"), HasSubstr("non-namespace"));
  EXPECT_THAT(R("{% for i in [1] %}{% set loop.x = 2 %}{% endfor %}"), HasSubstr("non-namespace"));
  // A namespace is the one mutable value: it may not hold itself (printing it would never end).
  EXPECT_THAT(R("{% set ns = namespace(a=[]) %}{% set ns.a = ns.a + [{'n': ns}] %}{{ ns }}"),
              HasSubstr("a namespace cannot contain itself"));
  EXPECT_EQ(R("{% set a = namespace(x=1) %}{% set b = namespace(y=a) %}{% set a.x = 2 %}{{ b.y.x }}"), "2");
  // A macro stored where its own scope reaches it (a reference cycle) renders, and is freed after.
  EXPECT_EQ(R("{% set ns = namespace() %}{% macro m() %}m{% endmacro %}{% set ns.m = m %}{{ ns.m() }}"), "m");
  EXPECT_THAT(R("{{ q + 1 }}"), HasSubstr("UndefinedError: 'q' is undefined"));
  EXPECT_THAT(R("{{ q() }}"), HasSubstr("UndefinedError"));
  EXPECT_EQ(R("{% for x in q %}x{% endfor %}{{ q|length }}{{ not q }}"), "0True");
}

TEST(ChatTemplateGlobals, RaiseExceptionNamesTheMessageAndLine) {
  EXPECT_EQ(R("\n{{ raise_exception('Conversation roles must alternate') }}"),
            "ERROR: t.jinja:2: TemplateError: Conversation roles must alternate");
  EXPECT_EQ(R("{{ strftime_now('%Y')|length }}"), "4");
  EXPECT_EQ(R("{{ dict(a=1) }} {{ namespace(a=1).a }} {{ range(1, 7, 2)|list }}"), "{'a': 1} 1 [1, 3, 5]");
}

TEST(ChatTemplateApply, DropsNullKeysAliasesReasoningAndPassesSpecialTokens) {
  auto t = ParseTemplate(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}:{{ m.tool_calls is defined }}:"
      "{{ m.thinking }};{% endfor %}{{ tools }}{{ add_generation_prompt }}{{ extra }}",
      "t");
  ASSERT_TRUE(t.ok());
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "hi", "tool_calls": null}, {"role": "assistant", "content": "x",
          "reasoning_content": "r"}])");
  request.add_generation_prompt = true;
  request.extra["extra"] = 7;
  auto out = ApplyChatTemplate(*t, request, nlohmann::ordered_json{{"bos_token", "<s>"}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<s>user:hi:False:;assistant:x:False:r;NoneTrue7");
}

TEST(ChatTemplateApply, ContinueFinalMessageCutsAfterTheFinalText) {
  auto t = ParseTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}", "t");
  ASSERT_TRUE(t.ok());
  ChatRequest request;
  request.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "q"},
                                                       {"role": "assistant", "content": "The answer is"}])");
  request.continue_final_message = "content";
  auto out = ApplyChatTemplate(*t, request, {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<user>q</user><assistant>The answer is");
  request.add_generation_prompt = true;
  EXPECT_FALSE(ApplyChatTemplate(*t, request, {}).ok());
  request.add_generation_prompt = false;
  request.messages = nlohmann::ordered_json::array();
  EXPECT_FALSE(ApplyChatTemplate(*t, request, {}).ok());
}

}  // namespace
}  // namespace strata::chat_template
