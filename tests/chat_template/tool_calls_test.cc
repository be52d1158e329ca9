// chat_template/tool_calls: vLLM's hermes, llama3_json, deepseek_v3 and kimi_k2 tool-call parsers on outputs
// shaped as Qwen2.5, Llama 3.1, DeepSeek-V3 and Kimi K2 write them, and the stream parser whose deltas add up
// to the non-streamed result (glm45 and minimax_m2: typed_tool_calls_test.cc; openai: harmony_test.cc).

#include "chat_template/tool_calls.h"

#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chat_template/tool_call_checks.h"

namespace strata::chat_template {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

// ---------------------------------------------------------------------------------------------------------

TEST(ToolCallFormat, NamesAreVllms) {
  EXPECT_EQ(*ParseToolCallFormat("hermes"), ToolCallFormat::kHermes);
  EXPECT_EQ(*ParseToolCallFormat("llama3_json"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(*ParseToolCallFormat("deepseek_v3"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(*ParseToolCallFormat("kimi_k2"), ToolCallFormat::kKimiK2);
  EXPECT_EQ(*ParseToolCallFormat("glm45"), ToolCallFormat::kGlm45);
  EXPECT_EQ(*ParseToolCallFormat("minimax_m2"), ToolCallFormat::kMinimaxM2);
  EXPECT_EQ(*ParseToolCallFormat("openai"), ToolCallFormat::kOpenAi);
  absl::StatusOr<ToolCallFormat> bad = ParseToolCallFormat("mistral");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("\"mistral\""));
  EXPECT_THAT(bad.status().message(),
              HasSubstr("hermes, llama3_json, deepseek_v3, kimi_k2, glm45, minimax_m2, openai"));
  for (ToolCallFormat format :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kDeepSeekV3, ToolCallFormat::kKimiK2,
        ToolCallFormat::kGlm45, ToolCallFormat::kMinimaxM2, ToolCallFormat::kOpenAi}) {
    EXPECT_EQ(*ParseToolCallFormat(ToolCallFormatName(format)), format);
    EXPECT_EQ(ReadsWholeOutput(format), format == ToolCallFormat::kOpenAi);
  }
}

TEST(ToolCallIds, AreOpenAiShapedAndSeeded) {
  ToolCallIds a(42), b(42), c(43);
  const std::string first = a.Next();
  EXPECT_THAT(first, MatchesRegex("call_[A-Za-z0-9]{24}"));
  EXPECT_EQ(first, b.Next());
  EXPECT_NE(first, c.Next());
  EXPECT_NE(first, a.Next());
  EXPECT_NE(ToolCallIds().Next(), ToolCallIds().Next());
}

// --- hermes (Qwen2.5 / Qwen3) ------------------------------------------------------------------------------

constexpr std::string_view kQwenSingle =
    "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", "
    "\"unit\": \"celsius\"}}\n</tool_call>";

TEST(HermesToolCalls, QwenSingleCall) {
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kHermes, kQwenSingle);
  EXPECT_EQ(parsed.content, "");
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "get_current_temperature");
  EXPECT_EQ(parsed.calls[0].arguments, R"({"location": "San Francisco, CA, USA", "unit": "celsius"})");
  EXPECT_THAT(parsed.calls[0].id, MatchesRegex("call_[A-Za-z0-9]{24}"));
}

TEST(HermesToolCalls, QwenParallelCallsWithLeadingContentKeepItUnstripped) {
  const std::string text =
      "I'll check both cities.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n</tool_call>";
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kHermes, text);
  EXPECT_EQ(parsed.content, "I'll check both cities.\n\n");  // vLLM: text before the first <tool_call>, as is
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[1].arguments, R"({"city": "東京"})");
  EXPECT_NE(parsed.calls[0].id, parsed.calls[1].id);
  ExpectStreamsLikeParse(ToolCallFormat::kHermes, text);
}

TEST(HermesToolCalls, Qwen3ThinkingStaysContent) {
  const std::string text =
      "<think>\nThe user wants the time.\n</think>\n\n<tool_call>\n{\"name\": \"now\", \"arguments\": "
      "{}}\n</tool_call>";
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kHermes, text);
  EXPECT_EQ(parsed.content, "<think>\nThe user wants the time.\n</think>\n\n");
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].arguments, "{}");
}

TEST(HermesToolCalls, ArgumentsAreDumpedAsPythonsJsonDumps) {
  const std::string text =
      "<tool_call>{\"name\":\"f\",\"arguments\":{\"f\":1.0,\"e\":1E5,\"small\":0.00001,\"big\":1e16,\"x\":1e15,"
      "\"neg0\":-0,\"negf\":-0.0,\"inf\":1e999,\"nan\":NaN,\"minf\":-Infinity,\"int\":123456789012345678901234567890,"
      "\"s\":\"a\\\"b\\\\c\\/d\\n\\u0001\\u00e9\\ud83d\\ude00\\ud800\",\"l\":[],\"o\":{},\"dup\":1,\"t\":true,"
      "\"dup\":[null,false]}}</tool_call>";
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kHermes, text);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].arguments,
            "{\"f\": 1.0, \"e\": 100000.0, \"small\": 1e-05, \"big\": 1e+16, \"x\": 1000000000000000.0, "
            "\"neg0\": 0, \"negf\": -0.0, \"inf\": Infinity, \"nan\": NaN, \"minf\": -Infinity, "
            "\"int\": 123456789012345678901234567890, \"s\": \"a\\\"b\\\\c/d\\n\\u0001é😀\\ud800\", \"l\": [], "
            "\"o\": {}, \"dup\": [null, false], \"t\": true}");
}

TEST(HermesToolCalls, ArgumentsMayBeAnyValueButMustBePresent) {
  EXPECT_EQ(
      Parse(ToolCallFormat::kHermes, R"(<tool_call>{"name": "f", "arguments": "x"}</tool_call>)").calls.at(0).arguments,
      R"("x")");
  for (std::string_view malformed : {
           R"(<tool_call>{"name": "f"}</tool_call>)",                                     // no arguments
           R"(<tool_call>{"name": 3, "arguments": {}}</tool_call>)",                      // a name that is no string
           R"(<tool_call>[{"name": "f", "arguments": {}}]</tool_call>)",                  // not an object
           R"(<tool_call>{"name": "f", "arguments": {}} x</tool_call>)",                  // extra data
           R"(<tool_call>{"name": "f", "parameters": {}}</tool_call>)",                   // llama's key
           "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"x\ny\"}}</tool_call>",  // a raw control char
           "<tool_call></tool_call>",
       }) {
    const ParsedToolCalls parsed = Parse(ToolCallFormat::kHermes, malformed);
    EXPECT_TRUE(parsed.calls.empty()) << malformed;
    EXPECT_EQ(parsed.content, malformed);
    ExpectStreamsLikeParse(ToolCallFormat::kHermes, malformed);
  }
}

TEST(HermesToolCalls, OneMalformedBlockMakesTheWholeOutputContent) {
  const std::string text = std::string("Sure.") + std::string(kQwenSingle) +
                           "\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>";
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kHermes, text);
  EXPECT_TRUE(parsed.calls.empty());
  EXPECT_EQ(parsed.content, text);
  ExpectStreamsLikeParse(ToolCallFormat::kHermes, text);
}

TEST(HermesToolCalls, TruncatedAtMaxTokens) {
  // The JSON complete, the closing tag not yet: vLLM's <tool_call>(.*) still takes it.
  const std::string complete = std::string(kQwenSingle.substr(0, kQwenSingle.size() - 13));
  ASSERT_EQ(Parse(ToolCallFormat::kHermes, complete).calls.size(), 1u);
  ExpectStreamsLikeParse(ToolCallFormat::kHermes, complete);
  // Cut inside the JSON: all content.
  const std::string cut = std::string(kQwenSingle) + "\n<tool_call>\n{\"name\": \"get_weather\", \"argum";
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kHermes, cut);
  EXPECT_TRUE(parsed.calls.empty());
  EXPECT_EQ(parsed.content, cut);
  ExpectStreamsLikeParse(ToolCallFormat::kHermes, cut);
}

TEST(HermesToolCalls, AnEndTagInsideAStringEndsTheBlockAsVllmsRegexDoes) {
  const std::string text = R"(<tool_call>{"name": "echo", "arguments": {"s": "</tool_call>"}}</tool_call>)";
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kHermes, text);
  EXPECT_TRUE(parsed.calls.empty());
  EXPECT_EQ(parsed.content, text);
  // Escaped as a model may write it, it is an argument like any other.
  const std::string escaped = R"(<tool_call>{"name": "echo", "arguments": {"s": "<\/tool_call>"}}</tool_call>)";
  EXPECT_EQ(Parse(ToolCallFormat::kHermes, escaped).calls.at(0).arguments, R"({"s": "</tool_call>"})");
}

TEST(HermesToolCalls, TextBetweenAndAfterBlocksIsDropped) {
  const std::string text = R"(a<tool_call>{"name": "f", "arguments": {}}</tool_call> b <tool_call>{"name": "g", )"
                           R"("arguments": {}}</tool_call> c)";
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kHermes, text);
  EXPECT_EQ(parsed.content, "a");
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[1].name, "g");
  ExpectStreamsLikeParse(ToolCallFormat::kHermes, text);
}

TEST(HermesToolCalls, NoMarkerIsContentAsIs) {
  for (std::string_view text : {"", "Hello!", "<tool_call", "a </tool_call> b", "<tool_calls>"}) {
    const ParsedToolCalls parsed = Parse(ToolCallFormat::kHermes, text);
    EXPECT_TRUE(parsed.calls.empty());
    EXPECT_EQ(parsed.content, text);
    ExpectStreamsLikeParse(ToolCallFormat::kHermes, text);
  }
}

TEST(HermesToolCalls, InvalidUtf8InANameOrStringBecomesReplacementCharacters) {
  const std::string text = "<tool_call>{\"name\": \"f\xff\", \"arguments\": {\"s\": \"\xc3\"}}</tool_call>";
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kHermes, text);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "f\xEF\xBF\xBD");
  EXPECT_EQ(parsed.calls[0].arguments, "{\"s\": \"\xEF\xBF\xBD\"}");
  ExpectStreamsLikeParse(ToolCallFormat::kHermes, text);
}

// --- llama3_json (Llama 3.1 / 3.2) ------------------------------------------------------------------------

TEST(Llama3JsonToolCalls, Llama31SingleCallWithPythonTagAndParameters) {
  const std::string text =
      "<|python_tag|>{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, CA\", "
      "\"unit\": \"Fahrenheit\"}}";
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kLlama3Json, text);
  EXPECT_EQ(parsed.content, "");
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "get_current_conditions");
  EXPECT_EQ(parsed.calls[0].arguments, R"({"location": "San Francisco, CA", "unit": "Fahrenheit"})");
  ExpectStreamsLikeParse(ToolCallFormat::kLlama3Json, text);
}

TEST(Llama3JsonToolCalls, SeveralSeparatedBySemicolons) {
  const std::string text =
      R"({"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": [1, 2]}}; {"name": "c", "parameters": {}, "arguments": 5})";
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kLlama3Json, text);
  ASSERT_EQ(parsed.calls.size(), 3u);
  EXPECT_EQ(parsed.calls[1].arguments, R"({"y": [1, 2]})");
  EXPECT_EQ(parsed.calls[2].arguments, "5");  // "arguments" wins over "parameters"
  ExpectStreamsLikeParse(ToolCallFormat::kLlama3Json, text);
}

TEST(Llama3JsonToolCalls, LeadingTextIsContentWhereVllmDropsIt) {
  const std::string text = "Let me look that up. {\"name\": \"search\", \"parameters\": {\"q\": \"llama\"}}";
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kLlama3Json, text);
  EXPECT_EQ(parsed.content, "Let me look that up. ");
  ASSERT_EQ(parsed.calls.size(), 1u);
  ExpectStreamsLikeParse(ToolCallFormat::kLlama3Json, text);
}

TEST(Llama3JsonToolCalls, AnyBraceThatIsNotACallMakesTheWholeOutputContent) {
  for (std::string_view text : {
           R"({"name": "a", "parameters": {}} and then {"x": 1})",            // an object without a name
           R"(The answer is {"result": 42}.)",                                // JSON in prose
           "int main() {\n  return 0;\n}",                                    // code
           R"({"name": "a", "parameters": {"q": "x"}}; {"name": "b", "par)",  // truncated at max_tokens
           R"({"name": ["a"], "parameters": {}})",                            // a name that is no string
           "<|python_tag|>{\"name\": \"f\"}",                                 // no arguments
           "{}",
       }) {
    const ParsedToolCalls parsed = Parse(ToolCallFormat::kLlama3Json, text);
    EXPECT_TRUE(parsed.calls.empty()) << text;
    EXPECT_EQ(parsed.content, text);
    ExpectStreamsLikeParse(ToolCallFormat::kLlama3Json, text);
  }
}

TEST(Llama3JsonToolCalls, ABraceRightAfterAnObjectIsSkippedAsVllmDoes) {
  // vLLM skips a `{` at the end offset of the last object, then decodes the `{` inside the next one.
  const std::string text = R"({"name": "a", "parameters": {}}{"name": "b", "parameters": {"x": 1}})";
  EXPECT_TRUE(Parse(ToolCallFormat::kLlama3Json, text).calls.empty());
  const std::string flat = R"({"name": "a", "parameters": {}}{"name": "b", "parameters": 1})";
  EXPECT_EQ(Parse(ToolCallFormat::kLlama3Json, flat).calls.size(), 1u);
  ExpectStreamsLikeParse(ToolCallFormat::kLlama3Json, text);
  ExpectStreamsLikeParse(ToolCallFormat::kLlama3Json, flat);
}

TEST(Llama3JsonToolCalls, NoBraceIsContentWithThePythonTag) {
  for (std::string_view text : {"", "Hello there.", "<|python_tag|>print(1)", "<|python_tag|>", "<|python_"}) {
    const ParsedToolCalls parsed = Parse(ToolCallFormat::kLlama3Json, text);
    EXPECT_TRUE(parsed.calls.empty());
    EXPECT_EQ(parsed.content, text);
    ExpectStreamsLikeParse(ToolCallFormat::kLlama3Json, text);
  }
}

// --- deepseek_v3 (DeepSeek-V3, V3.1, R1) ------------------------------------------------------------------

// One call as DeepSeek-V3's chat template writes it back (and the model writes it).
std::string DeepSeekCall(std::string_view name, std::string_view arguments, std::string_view type = "function") {
  return "<｜tool▁call▁begin｜>" + std::string(type) + "<｜tool▁sep｜>" + std::string(name) + "\n```json\n" +
         std::string(arguments) + "\n```<｜tool▁call▁end｜>";
}
std::string DeepSeekCalls(const std::vector<std::string>& calls) {
  std::string text = "<｜tool▁calls▁begin｜>";
  for (const std::string& call : calls) text += call;
  return text + "<｜tool▁calls▁end｜>";
}

TEST(DeepSeekV3ToolCalls, SingleCall) {
  const ParsedToolCalls parsed =
      Parse(ToolCallFormat::kDeepSeekV3, DeepSeekCalls({DeepSeekCall("get_weather", R"({"location": "Tokyo"})")}));
  EXPECT_EQ(parsed.content, "");
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  EXPECT_EQ(parsed.calls[0].arguments, R"({"location": "Tokyo"})");
  EXPECT_THAT(parsed.calls[0].id, MatchesRegex("call_[A-Za-z0-9]{24}"));
}

TEST(DeepSeekV3ToolCalls, SeveralCallsAfterContent) {
  const std::string text =
      "Let me look both up.\n\n" +
      DeepSeekCalls({DeepSeekCall("get_weather", R"({"city": "東京"})"), DeepSeekCall("get_time", "{}")});
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kDeepSeekV3, text);
  EXPECT_EQ(parsed.content, "Let me look both up.\n\n");
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[0].arguments, R"({"city": "東京"})");
  EXPECT_EQ(parsed.calls[1].name, "get_time");
  EXPECT_NE(parsed.calls[0].id, parsed.calls[1].id);
  ExpectStreamsLikeParse(ToolCallFormat::kDeepSeekV3, text);
}

TEST(DeepSeekV3ToolCalls, ArgumentsAreTheModelsTextUnchecked) {
  // vLLM neither loads nor re-dumps them: odd spacing, broken JSON and any text pass through.
  for (const std::string arguments : {R"({"a":1,  "b" : [1.50]})", R"({"a": )", "not json", ""}) {
    const ParsedToolCalls parsed = Parse(ToolCallFormat::kDeepSeekV3, DeepSeekCalls({DeepSeekCall("f", arguments)}));
    ASSERT_EQ(parsed.calls.size(), 1u) << arguments;
    EXPECT_EQ(parsed.calls[0].arguments, arguments);
  }
}

TEST(DeepSeekV3ToolCalls, ArgumentsOverSeveralLinesAreNoCall) {
  // `.` stops at a line end: pretty-printed JSON matches nothing. The section marker still cuts the
  // content (vLLM: tools_called with no calls), and the text after it is dropped.
  const std::string text =
      "Here:" + DeepSeekCalls({DeepSeekCall("f", "{\n  \"a\": 1\n}"), DeepSeekCall("g", R"({"b": 2})")});
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kDeepSeekV3, text);
  EXPECT_EQ(parsed.content, "Here:");
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "g");
  const ParsedToolCalls none = Parse(ToolCallFormat::kDeepSeekV3, "Here:<｜tool▁calls▁begin｜>garbage");
  EXPECT_EQ(none.content, "Here:");
  EXPECT_TRUE(none.calls.empty());
  ExpectStreamsLikeParse(ToolCallFormat::kDeepSeekV3, text);
}

TEST(DeepSeekV3ToolCalls, ATypeOtherThanFunctionMakesTheWholeOutputContent) {
  // pydantic refuses ToolCall(type="tool"): vLLM's except returns the output as it is.
  const std::string text = "Hi" + DeepSeekCalls({DeepSeekCall("f", "{}"), DeepSeekCall("g", "{}", /*type=*/"tool")});
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kDeepSeekV3, text);
  EXPECT_EQ(parsed.content, text);
  EXPECT_TRUE(parsed.calls.empty());
  ExpectStreamsLikeParse(ToolCallFormat::kDeepSeekV3, text);
}

TEST(DeepSeekV3ToolCalls, TheTypeRunsToTheLinesLastSeparator) {
  // Greedy `(?P<type>.*)<｜tool▁sep｜>`: a second separator on the line makes the type "function<｜tool▁sep｜>a".
  const std::string text = DeepSeekCalls({DeepSeekCall("a<｜tool▁sep｜>b", "{}")});
  EXPECT_TRUE(Parse(ToolCallFormat::kDeepSeekV3, text).calls.empty());
  EXPECT_EQ(Parse(ToolCallFormat::kDeepSeekV3, text).content, text);
  // The name is the rest of the line, whatever it holds.
  EXPECT_EQ(Parse(ToolCallFormat::kDeepSeekV3, DeepSeekCalls({DeepSeekCall(" my tool ", "{}")})).calls.at(0).name,
            " my tool ");
}

TEST(DeepSeekV3ToolCalls, ACallCutByMaxTokensIsDroppedTheOthersKept) {
  // Each call is a regex match of its own: unlike hermes, a broken one does not spoil the rest.
  const std::string whole = DeepSeekCalls({DeepSeekCall("f", R"({"a": 1})"), DeepSeekCall("g", R"({"b": 2})")});
  const std::string cut = whole.substr(0, whole.find("\"b\""));
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kDeepSeekV3, cut);
  EXPECT_EQ(parsed.content, "");
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "f");
  ExpectStreamsLikeParse(ToolCallFormat::kDeepSeekV3, cut);
}

TEST(DeepSeekV3ToolCalls, WithoutTheSectionMarkerNothingIsACall) {
  const std::string text = "Sure " + DeepSeekCall("f", "{}");
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kDeepSeekV3, text);
  EXPECT_EQ(parsed.content, text);
  EXPECT_TRUE(parsed.calls.empty());
  // ... but with it, a call written before it counts too (vLLM's findall runs over the whole output).
  const std::string before = "A " + DeepSeekCall("f", "{}") + " then <｜tool▁calls▁begin｜>";
  const ParsedToolCalls found = Parse(ToolCallFormat::kDeepSeekV3, before);
  EXPECT_EQ(found.content, "A " + DeepSeekCall("f", "{}") + " then ");
  ASSERT_EQ(found.calls.size(), 1u);
  ExpectStreamsLikeParse(ToolCallFormat::kDeepSeekV3, before);
}

// --- kimi_k2 (Kimi K2) -----------------------------------------------------------------------------------------

std::string KimiCall(std::string_view id, std::string_view arguments) {
  return "<|tool_call_begin|>" + std::string(id) + "<|tool_call_argument_begin|>" + std::string(arguments) +
         "<|tool_call_end|>";
}
std::string KimiCalls(const std::vector<std::string>& calls) {
  std::string text = "<|tool_calls_section_begin|>";
  for (const std::string& call : calls) text += call;
  return text + "<|tool_calls_section_end|>";
}

TEST(KimiK2ToolCalls, TheIdIsTheModelsAndTheNameComesFromIt) {
  const std::string text = "I'll check." + KimiCalls({KimiCall("functions.get_weather:0", R"({"city": "Beijing"})"),
                                                      KimiCall("functions.get_time:1", "{}")});
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kKimiK2, text);
  EXPECT_EQ(parsed.content, "I'll check.");
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[0].id, "functions.get_weather:0");
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  EXPECT_EQ(parsed.calls[0].arguments, R"({"city": "Beijing"})");
  EXPECT_EQ(parsed.calls[1].id, "functions.get_time:1");
  ExpectStreamsLikeParse(ToolCallFormat::kKimiK2, text);
}

TEST(KimiK2ToolCalls, NamesAsVllmSplitsTheId) {
  // function_id.split(":")[0].split(".")[-1]
  for (const auto& [id, name] : std::vector<std::pair<std::string, std::string>>{
           {"get_weather:0", "get_weather"}, {"functions.a.b:12", "b"}, {"functions.x:y:2", "x"}, {"f.:3", ""}}) {
    const ParsedToolCalls parsed = Parse(ToolCallFormat::kKimiK2, KimiCalls({KimiCall(id, "{}")}));
    ASSERT_EQ(parsed.calls.size(), 1u) << id;
    EXPECT_EQ(parsed.calls[0].id, id);
    EXPECT_EQ(parsed.calls[0].name, name) << id;
  }
}

TEST(KimiK2ToolCalls, SpacesAroundTheIdAndArgumentsAreDropped) {
  const ParsedToolCalls parsed =
      Parse(ToolCallFormat::kKimiK2, KimiCalls({KimiCall("\n functions.f:0 \n", "\n  {\"a\": 1}\n ")}));
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].id, "functions.f:0");
  EXPECT_EQ(parsed.calls[0].arguments, R"({"a": 1})");
  // Unicode spaces and digits are the regex module's \s and \d; U+001C is not \s there (it is in `re`).
  const ParsedToolCalls unicode =
      Parse(ToolCallFormat::kKimiK2, KimiCalls({KimiCall("\u3000functions.f:\u0663", "\u00a0{}\u2028")}));
  ASSERT_EQ(unicode.calls.size(), 1u);
  EXPECT_EQ(unicode.calls[0].id, "functions.f:\u0663");
  EXPECT_EQ(unicode.calls[0].arguments, "{}");
  EXPECT_EQ(Parse(ToolCallFormat::kKimiK2, KimiCalls({KimiCall("f:0", "{}\x1c")})).calls.at(0).arguments, "{}\x1c");
  // An id of spaces before its `:` keeps one of them: `\s*` gives one back to `[^<]+`.
  EXPECT_EQ(Parse(ToolCallFormat::kKimiK2, KimiCalls({KimiCall("  :1", "{}")})).calls.at(0).id, " :1");
}

TEST(KimiK2ToolCalls, MalformedCallsAreSkippedTheOthersKept) {
  const std::string text = KimiCalls({KimiCall("functions.no_index", "{}"),  // no `:IDX`
                                      KimiCall("functions.f:x", "{}"),       // not digits
                                      "<|tool_call_begin|>functions.cut:0<|tool_call_argument_begin|>{\"a\"",
                                      KimiCall("functions.ok:3", R"({"b": 2})")});
  const ParsedToolCalls parsed = Parse(ToolCallFormat::kKimiK2, text);
  EXPECT_EQ(parsed.content, "");
  ASSERT_EQ(parsed.calls.size(), 1u);  // the cut call's arguments may not run into the next call
  EXPECT_EQ(parsed.calls[0].id, "functions.ok:3");
  ExpectStreamsLikeParse(ToolCallFormat::kKimiK2, text);

  const ParsedToolCalls none = Parse(ToolCallFormat::kKimiK2, "x<|tool_calls_section_begin|>nothing here");
  EXPECT_EQ(none.content, "x");
  EXPECT_TRUE(none.calls.empty());
}

TEST(KimiK2ToolCalls, TruncatedAtMaxTokens) {
  const std::string whole =
      "Ok." + KimiCalls({KimiCall("functions.f:0", R"({"a": 1})"), KimiCall("functions.g:1", R"({"b": 2})")});
  for (size_t cut = 0; cut <= whole.size(); ++cut) {
    const std::string text = whole.substr(0, cut);
    const ParsedToolCalls parsed = Parse(ToolCallFormat::kKimiK2, text);
    const bool section = text.find("<|tool_calls_section_begin|>") != std::string::npos;
    EXPECT_EQ(parsed.content, section ? "Ok." : text) << cut;
    EXPECT_LE(parsed.calls.size(), 2u);
  }
  ExpectStreamsLikeParse(ToolCallFormat::kKimiK2, whole.substr(0, whole.size() - 40));
}

TEST(KimiK2ToolCalls, OnlyThePluralSectionMarkerCounts) {
  // vLLM's extract_tool_calls tests `<|tool_calls_section_begin|>` alone (the singular variant is known only
  // to its streaming path).
  const std::string text = "<|tool_call_section_begin|>" + KimiCall("functions.f:0", "{}");
  EXPECT_TRUE(Parse(ToolCallFormat::kKimiK2, text).calls.empty());
  EXPECT_EQ(Parse(ToolCallFormat::kKimiK2, text).content, text);
}

// --- streaming ------------------------------------------------------------------------------------------------

TEST(ToolCallStreamParser, ContentStreamsUntilTheMarkerAndCallsComeFromFinish) {
  ToolCallStreamParser parser(ToolCallFormat::kHermes, ToolCallIds(kSeed));
  std::vector<ToolCallDelta> d = parser.Feed("Checking.<tool");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].content, "Checking.");  // "<tool" may begin a marker: held
  EXPECT_TRUE(parser.Feed("_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>").empty());
  d = parser.Finish();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].tool_index, 0);
  EXPECT_EQ(d[0].name, "f");
  EXPECT_THAT(d[0].id, MatchesRegex("call_[A-Za-z0-9]{24}"));
  EXPECT_EQ(d[1].arguments, R"({"a": 1})");
  EXPECT_TRUE(parser.Finish().empty());
  EXPECT_TRUE(parser.Feed("more").empty());
}

TEST(ToolCallStreamParser, AMarkerThatCannotStartACallIsDecidedAtOnce) {
  ToolCallStreamParser hermes(ToolCallFormat::kHermes);
  EXPECT_TRUE(hermes.Feed("Use the <tool_call>").size() == 1);
  std::vector<ToolCallDelta> d = hermes.Feed(" tag for calls.");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].content, "<tool_call> tag for calls.");
  EXPECT_EQ(hermes.Feed(" More.").at(0).content, " More.");

  ToolCallStreamParser llama(ToolCallFormat::kLlama3Json);
  EXPECT_EQ(llama.Feed("void f() {").at(0).content, "void f() ");
  EXPECT_EQ(llama.Feed("\n  g();").at(0).content, "{\n  g();");
}

TEST(ToolCallStreamParser, ContentNeverEndsInsideAUtf8Sequence) {
  ToolCallStreamParser parser(ToolCallFormat::kHermes);
  const std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(parser.Feed("a" + euro.substr(0, 2)).at(0).content, "a");
  EXPECT_EQ(parser.Feed(euro.substr(2)).at(0).content, euro);
  EXPECT_TRUE(parser.Feed("\xF0\x9F").empty());
  EXPECT_EQ(parser.Finish().at(0).content, "\xF0\x9F");  // an unfinished sequence at the end is sent as is
}

TEST(ToolCallStreamParser, SectionedFormatsHoldFromTheSectionMarkerToTheEnd) {
  ToolCallStreamParser parser(ToolCallFormat::kKimiK2, ToolCallIds(kSeed));
  std::vector<ToolCallDelta> d = parser.Feed("Checking.<|tool_calls");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].content, "Checking.");
  EXPECT_TRUE(parser.Feed("_section_begin|>" + KimiCall("functions.f:0", "{}")).empty());
  EXPECT_TRUE(parser.Feed("<|tool_calls_section_end|>trailing").empty());  // after the section: dropped
  d = parser.Finish();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].id, "functions.f:0");
  EXPECT_EQ(d[0].name, "f");
  EXPECT_EQ(d[1].arguments, "{}");

  // deepseek_v3: a failed call (a type not "function") sends the held text as content at the end.
  ToolCallStreamParser deepseek(ToolCallFormat::kDeepSeekV3, ToolCallIds(kSeed));
  EXPECT_EQ(deepseek.Feed("A<｜tool▁calls▁begin｜>").at(0).content, "A");
  EXPECT_TRUE(deepseek.Feed(DeepSeekCall("f", "{}", "tool")).empty());
  EXPECT_EQ(deepseek.Finish().at(0).content, "<｜tool▁calls▁begin｜>" + DeepSeekCall("f", "{}", "tool"));
}

TEST(ToolCallStreamParser, GeneratedSectionedOutputsStreamLikeParse) {
  std::mt19937 rng(4321);
  auto pick = [&rng](const std::vector<std::string>& options) { return options[rng() % options.size()]; };
  const std::vector<std::string> contents = {"",       "Sure! ", "naïve 日本 😀 ", "<｜tool▁call", "<|tool_call",
                                             "a < b ", "\n"};
  const std::vector<std::string> args = {"{}",   R"({"a": 1})", R"({"s": "<|tool_call_end|>"})",
                                         "{\n}", "x",           R"({"u": "😀"})"};
  for (int i = 0; i < 60; ++i) {
    const bool deepseek = i % 2 == 0;
    std::vector<std::string> calls;
    const int n = static_cast<int>(rng() % 3);
    for (int c = 0; c < n; ++c) {
      const std::string name = pick({"f", "get_weather", "天気"});
      calls.push_back(deepseek ? DeepSeekCall(name, pick(args), rng() % 8 ? "function" : "tool")
                               : KimiCall(pick({"functions.", "", " "}) + name + ":" + std::to_string(c), pick(args)));
    }
    std::string text = pick(contents);
    if (rng() % 5) text += deepseek ? DeepSeekCalls(calls) : KimiCalls(calls);
    if (rng() % 3 == 0) text += pick(contents);
    if (rng() % 4 == 0) text = text.substr(0, rng() % (text.size() + 1));  // truncated
    ExpectStreamsLikeParse(deepseek ? ToolCallFormat::kDeepSeekV3 : ToolCallFormat::kKimiK2, text);
  }
}

TEST(ToolCallStreamParser, GeneratedOutputsStreamLikeParse) {
  std::mt19937 rng(1234);
  auto pick = [&rng](const std::vector<std::string>& options) { return options[rng() % options.size()]; };
  const std::vector<std::string> contents = {
      "", "Sure! ", "<think>\nhmm\n</think>\n\n", "naïve 日本 😀 ", "a < b ", "<tool_", "{", "<|python_tag|>", "x; "};
  const std::vector<std::string> args = {"{}",
                                         R"({"a": 1})",
                                         R"({"s": "</tool_call>"})",
                                         R"({"n": [1.5, -0, 1e3]})",
                                         R"({"u": "\u00e9😀", "d": {"e": null}})",
                                         R"("str")",
                                         "{\"a\": }"};
  for (int i = 0; i < 60; ++i) {
    const bool hermes = i % 2 == 0;
    std::string text = pick(contents);
    const int calls = static_cast<int>(rng() % 3);
    for (int c = 0; c < calls; ++c) {
      const std::string object = "{\"name\": \"f" + std::to_string(c) + "\", \"" +
                                 (hermes || rng() % 2 ? "arguments" : "parameters") + "\": " + pick(args) + "}";
      text += hermes ? "<tool_call>\n" + object + "\n</tool_call>" + pick({"", "\n", " tail"}) : object + "; ";
    }
    if (rng() % 4 == 0) text = text.substr(0, rng() % (text.size() + 1));  // truncated
    ExpectStreamsLikeParse(hermes ? ToolCallFormat::kHermes : ToolCallFormat::kLlama3Json, text);
  }
}

// --- bounds ----------------------------------------------------------------------------------------------------

// CPU seconds of this thread: what the work costs, whatever else the machine runs at the time (a wall clock on 2
// shared cores is not; issue 40).
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// A megabyte fed in small pieces, streamed and not: linear work (well under a second each), no crash.
void ExpectLinear(ToolCallFormat format, const std::string& text) {
  const double start = ThreadCpuSeconds();
  const ParsedToolCalls expected = Parse(format, text);
  ToolCallStreamParser parser(format, ToolCallIds(kSeed));
  ParsedToolCalls streamed;
  for (size_t i = 0, step = 1; i < text.size(); i += step, step = step % 13 + 1) {
    Add(parser.Feed(std::string_view(text).substr(i, step)), streamed);
  }
  Add(parser.Finish(), streamed);
  ExpectSame(expected, streamed, "1 MB");
  // Linear: 50-150 ms of CPU each, idle (2026-11-28); ASan (tests/sanitize) multiplies that by 2-3.
  EXPECT_LT(ThreadCpuSeconds() - start, 5.0);
}

TEST(ToolCallBounds, MegabyteOutputs) {
  const size_t mb = 1 << 20;
  std::string many_calls;
  while (many_calls.size() < mb)
    many_calls += R"(<tool_call>{"name": "f", "arguments": {"a": [1, 2.5, "x"]}}</tool_call>)";
  ExpectLinear(ToolCallFormat::kHermes, many_calls);
  EXPECT_GT(Parse(ToolCallFormat::kHermes, many_calls).calls.size(), 10000u);

  std::string many_llama;
  while (many_llama.size() < mb) many_llama += R"({"name": "f", "parameters": {"a": "b"}}; )";
  ExpectLinear(ToolCallFormat::kLlama3Json, many_llama);

  const std::string long_string = R"(<tool_call>{"name": "f", "arguments": {"s": ")" + std::string(mb, 'x') + "\"}}";
  ExpectLinear(ToolCallFormat::kHermes, long_string);
  ExpectLinear(ToolCallFormat::kHermes, std::string(mb, 'a'));
  ExpectLinear(ToolCallFormat::kLlama3Json, std::string(mb, 'a'));

  std::string markers;
  while (markers.size() < mb) markers += "<tool_call>";
  ExpectLinear(ToolCallFormat::kHermes, markers);
  ExpectLinear(ToolCallFormat::kHermes, "<tool_call>" + std::string(mb, '['));
  ExpectLinear(ToolCallFormat::kHermes, "<tool_call>" + std::string(mb, ' ') + "x");
  ExpectLinear(ToolCallFormat::kLlama3Json, "{" + std::string(mb, '\n') + "x");
  ExpectLinear(ToolCallFormat::kHermes, "<tool_call>" + std::string(mb, '{'));
  ExpectLinear(ToolCallFormat::kLlama3Json, std::string(mb, '{'));
  std::string nested = "{\"name\": \"f\", \"parameters\": ";
  for (int i = 0; i < 100000; ++i) nested += "{\"a\": [";
  ExpectLinear(ToolCallFormat::kLlama3Json, nested);

  std::string deepseek_calls = "<｜tool▁calls▁begin｜>";
  while (deepseek_calls.size() < mb) deepseek_calls += DeepSeekCall("f", R"({"a": [1, 2.5, "x"]})");
  ExpectLinear(ToolCallFormat::kDeepSeekV3, deepseek_calls);
  EXPECT_GT(Parse(ToolCallFormat::kDeepSeekV3, deepseek_calls).calls.size(), 5000u);
  std::string kimi_calls = "<|tool_calls_section_begin|>";
  while (kimi_calls.size() < mb) kimi_calls += KimiCall("functions.f:0", R"({"a": [1, 2.5, "x"]})");
  ExpectLinear(ToolCallFormat::kKimiK2, kimi_calls);
  EXPECT_GT(Parse(ToolCallFormat::kKimiK2, kimi_calls).calls.size(), 10000u);
  // Markers on one long line, markers with no end, arguments that never end.
  std::string one_line = "<｜tool▁calls▁begin｜>";
  while (one_line.size() < mb) one_line += "<｜tool▁call▁begin｜>function";
  ExpectLinear(ToolCallFormat::kDeepSeekV3, one_line + "<｜tool▁sep｜>f\n```json\n{}\n```");
  std::string lines = "<｜tool▁calls▁begin｜>";
  while (lines.size() < mb) lines += "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n";
  ExpectLinear(ToolCallFormat::kDeepSeekV3, lines);
  std::string kimi_open = "<|tool_calls_section_begin|>";
  while (kimi_open.size() < mb) kimi_open += "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{} ";
  ExpectLinear(ToolCallFormat::kKimiK2, kimi_open);
  ExpectLinear(ToolCallFormat::kKimiK2, kimi_open + "<|tool_call_end|>");
  ExpectLinear(ToolCallFormat::kKimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>" + std::string(mb, ' ') + "x");
  ExpectLinear(ToolCallFormat::kKimiK2, std::string(mb, 'a'));
  ExpectLinear(ToolCallFormat::kDeepSeekV3, std::string(mb, '\n'));

  std::string partial_tags;
  while (partial_tags.size() < mb) partial_tags += "<|python_tag|<tool_call";
  ExpectLinear(ToolCallFormat::kLlama3Json, partial_tags);
  ExpectLinear(ToolCallFormat::kHermes, partial_tags);
  std::string partial_sections;
  while (partial_sections.size() < mb) partial_sections += "<|tool_calls_section_begi<｜tool▁calls▁begi";
  ExpectLinear(ToolCallFormat::kKimiK2, partial_sections);
  ExpectLinear(ToolCallFormat::kDeepSeekV3, partial_sections);
}

TEST(ToolCallBounds, IntegersOfMoreThan4300DigitsAreMalformedAsInPython) {
  auto call = [](size_t digits) {
    return "<tool_call>{\"name\": \"f\", \"arguments\": -" + std::string(digits, '7') + "}</tool_call>";
  };
  EXPECT_EQ(Parse(ToolCallFormat::kHermes, call(4300)).calls.at(0).arguments, "-" + std::string(4300, '7'));
  EXPECT_TRUE(Parse(ToolCallFormat::kHermes, call(4301)).calls.empty());  // Python: ValueError
}

TEST(ToolCallBounds, DeepNestingIsMalformedNotACrash) {
  std::string deep = "<tool_call>{\"name\": \"f\", \"arguments\": ";
  for (int i = 0; i < 600; ++i) deep += "[";
  for (int i = 0; i < 600; ++i) deep += "]";
  deep += "}</tool_call>";
  EXPECT_TRUE(Parse(ToolCallFormat::kHermes, deep).calls.empty());
  std::string fine = "<tool_call>{\"name\": \"f\", \"arguments\": ";
  for (int i = 0; i < 400; ++i) fine += "[";
  for (int i = 0; i < 400; ++i) fine += "]";
  fine += "}</tool_call>";
  EXPECT_EQ(Parse(ToolCallFormat::kHermes, fine).calls.size(), 1u);
}

// --- Calls a grammar forced (tool_choice "required" or a named function) -------------------------------------

ParsedToolCalls Forced(std::string_view text, std::string_view name) {
  ToolCallIds ids(kSeed);
  return ParseForcedToolCalls(text, name, ids);
}

Streamed StreamForced(std::string_view text, const std::string& name, const std::vector<size_t>& cuts) {
  ForcedToolCallStreamParser parser(name, ToolCallIds(kSeed));
  return StreamThrough(parser, text, cuts);
}

TEST(ForcedToolCalls, RequiredListIsCallsWithArgumentsAsVllmDumpsThem) {
  const ParsedToolCalls parsed =
      Forced(R"([{"name": "get_time", "parameters": {"zone":"Zürich","n":1.50}},{"name":"f","parameters":{}}])", "");
  EXPECT_EQ(parsed.content, "");
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[0].name, "get_time");
  // json.dumps(parameters, ensure_ascii=False): ", " and ": ", floats as repr().
  EXPECT_EQ(parsed.calls[0].arguments, R"({"zone": "Zürich", "n": 1.5})");
  EXPECT_EQ(parsed.calls[1].name, "f");
  EXPECT_EQ(parsed.calls[1].arguments, "{}");
  EXPECT_THAT(parsed.calls[0].id, MatchesRegex("call_[A-Za-z0-9]{24}"));
  EXPECT_NE(parsed.calls[0].id, parsed.calls[1].id);
}

TEST(ForcedToolCalls, AnOutputThatIsNotAListOfCallsIsContent) {
  // Cut by max_tokens, empty, or not vLLM's list of {"name", "parameters"}: all content, no call.
  for (std::string_view text : {R"([{"name": "f", "parameters": {"a": )", "[]", R"({"name": "f", "parameters": {}})",
                                R"([{"name": "f"}])", R"([{"name": 5, "parameters": {}}])", ""}) {
    const ParsedToolCalls parsed = Forced(text, "");
    EXPECT_TRUE(parsed.calls.empty()) << text;
    EXPECT_EQ(parsed.content, text);
  }
}

TEST(ForcedToolCalls, NamedFunctionsOutputIsItsArgumentsAsWritten) {
  const ParsedToolCalls parsed = Forced(R"({"when":  "2025"})", "book");
  EXPECT_EQ(parsed.content, "");
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "book");
  EXPECT_EQ(parsed.calls[0].arguments, R"({"when":  "2025"})");        // vLLM sends the text, not a re-dump
  EXPECT_EQ(Forced(R"({"wh)", "book").calls[0].arguments, R"({"wh)");  // cut: still its call (finish "length")
}

TEST(ForcedToolCalls, StreamAddsUpToTheWhole) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"([{"name": "get_time", "parameters": {"zone": "Zürich"}}, {"name": "f", "parameters": {}}])", ""},
      {R"([{"name": "get_time", "parameters": {"zone": )", ""},
      {R"({"when": "2025", "note": "ü"})", "book"},
      {"", "book"},
      {"", ""}};
  for (const auto& [text, name] : cases) {
    const ParsedToolCalls expected = Forced(text, name);
    ExpectSame(expected, StreamForced(text, name, {}).result, text);
    std::vector<size_t> bytes;
    for (size_t i = 1; i < text.size(); ++i) {
      ExpectSame(expected, StreamForced(text, name, {i}).result, text + " cut at " + std::to_string(i));
      bytes.push_back(i);
    }
    ExpectSame(expected, StreamForced(text, name, bytes).result, text + " byte by byte");
  }
  // A named function's call goes out with its first text, not at the end.
  ForcedToolCallStreamParser parser("book", ToolCallIds(kSeed));
  const std::vector<ToolCallDelta> first = parser.Feed("{\"wh");
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].name, "book");
  EXPECT_EQ(first[1].arguments, "{\"wh");
  EXPECT_TRUE(parser.Finish().empty());
}

}  // namespace
}  // namespace strata::chat_template
