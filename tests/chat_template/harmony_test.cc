// chat_template/harmony: gpt-oss's harmony output as vLLM reads it with openai_harmony, split by
// `--reasoning-parser gpt_oss` (reasoning_content, content) and `--tool-call-parser openai` (calls, content), on
// outputs shaped as gpt-oss writes them and as its chat template writes them back; bad input included.

#include "chat_template/harmony.h"

#include <string>
#include <vector>

#include "chat_template/reasoning.h"
#include "chat_template/tool_calls.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chat_template/tool_call_checks.h"

namespace strata::chat_template {
namespace {

constexpr ToolCallFormat kOpenAi = ToolCallFormat::kOpenAi;
constexpr ReasoningFormat kGptOss = ReasoningFormat::kGptOss;

const char kAnalysis[] = "<|channel|>analysis<|message|>The user wants the weather.<|end|>";
const char kCall[] =
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    "{\"city\":\"東京\"}<|call|>";
const char kFinal[] = "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>";

// ReasoningStreamParser fed at every cut into two pieces and byte by byte: its deltas add up to ParseReasoning.
void ExpectReasoningStreams(std::string_view text) {
  const ParsedReasoning whole = ParseReasoning(kGptOss, text);
  auto check = [&](const std::vector<size_t>& cuts, const std::string& what) {
    ReasoningStreamParser parser(kGptOss);
    std::string reasoning, content;
    size_t start = 0;
    auto add = [&](const std::vector<ReasoningDelta>& deltas) {
      for (const ReasoningDelta& d : deltas) (d.reasoning ? reasoning : content) += d.text;
    };
    for (size_t cut : cuts) {
      add(parser.Feed(text.substr(start, cut - start)));
      start = cut;
    }
    add(parser.Feed(text.substr(start)));
    add(parser.Finish());
    EXPECT_EQ(reasoning, whole.reasoning.value_or("")) << what;
    EXPECT_EQ(content, whole.content.value_or("")) << what;
  };
  for (size_t cut = 0; cut <= text.size(); ++cut) check({cut}, "cut at " + std::to_string(cut));
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  check(every, "byte by byte");
}

TEST(HarmonyReader, ReadsMessagesAndTheOneCutShort) {
  const HarmonyOutput out =
      ReadHarmony(std::string(kAnalysis) + kCall + "<|start|>assistant<|channel|>final<|message|>Sun");
  ASSERT_EQ(out.messages.size(), 2u);
  EXPECT_EQ(out.messages[0].role, "assistant");
  EXPECT_EQ(out.messages[0].channel, "analysis");
  EXPECT_EQ(out.messages[0].text, "The user wants the weather.");
  EXPECT_EQ(out.messages[1].channel, "commentary");
  EXPECT_EQ(out.messages[1].recipient, "functions.get_weather");
  EXPECT_EQ(out.messages[1].content_type, "<|constrain|>json");
  ASSERT_TRUE(out.current.has_value());
  EXPECT_EQ(out.current->channel, "final");
  EXPECT_EQ(out.current->text, "Sun");
}

TEST(HarmonyReader, HeadersAsHarmonyParsesThem) {
  // The template's order (recipient first), a tool's message, a lone recipient, a content type after it.
  const HarmonyOutput out = ReadHarmony(
      "<|channel|>analysis<|message|>a<|end|>"
      "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>"
      "<|start|>functions.f to=assistant<|channel|>commentary<|message|>\"r\"<|end|>"
      "<|start|>assistant<|channel|>final stuff more<|message|>b<|end|>");
  ASSERT_EQ(out.messages.size(), 4u);
  EXPECT_EQ(out.messages[1].recipient, "functions.f");
  EXPECT_EQ(out.messages[1].content_type, "json");
  EXPECT_EQ(out.messages[2].role, "tool");
  EXPECT_EQ(out.messages[2].recipient, "assistant");
  EXPECT_EQ(out.messages[3].recipient, "stuff");
  EXPECT_EQ(out.messages[3].content_type, "more");
}

TEST(HarmonyReader, WhereHarmonyRaisesTheRestIsIgnored) {
  // Text after a message that is no `<|start|>`; an empty channel; an unknown role alone; parts left over.
  for (const char* bad : {"trailing", "<|start|>assistant<|channel|><|message|>x", "<|start|>bogus<|message|>x",
                          "<|start|>assistant<|channel|>final a b c<|message|>x", "\n<|start|>assistant"}) {
    const HarmonyOutput out = ReadHarmony(std::string("<|channel|>final<|message|>Hi<|end|>") + bad +
                                          "<|start|>assistant<|channel|>final<|message|>later<|end|>");
    ASSERT_EQ(out.messages.size(), 1u) << bad;
    EXPECT_EQ(out.messages[0].text, "Hi");
    EXPECT_FALSE(out.current.has_value()) << bad;
  }
  // No header end at all: nothing.
  const HarmonyOutput plain = ReadHarmony("Plain text from a model that is not gpt-oss.");
  EXPECT_TRUE(plain.messages.empty());
  EXPECT_FALSE(plain.current.has_value());
}

TEST(GptOssReasoning, AnalysisIsReasoningFinalAndPreamblesAreContent) {
  const std::string text = std::string(kAnalysis) +
                           "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>" + kCall +
                           "<|start|>assistant<|channel|>analysis<|message|>Got it.<|end|>" + kFinal;
  const ParsedReasoning parsed = ParseReasoning(kGptOss, text);
  EXPECT_EQ(parsed.reasoning, "The user wants the weather.\nGot it.");
  EXPECT_EQ(parsed.content, "Checking.\nIt is sunny.");
  ExpectReasoningStreams(text);
}

TEST(GptOssReasoning, CutWhileThinkingAndEmptyOutputs) {
  EXPECT_EQ(ParseReasoning(kGptOss, "<|channel|>analysis<|message|>Hmm").reasoning, "Hmm");
  EXPECT_FALSE(ParseReasoning(kGptOss, "<|channel|>analysis<|message|>Hmm").content.has_value());
  EXPECT_FALSE(ParseReasoning(kGptOss, "").reasoning.has_value());
  EXPECT_FALSE(ParseReasoning(kGptOss, "").content.has_value());
  // An ended empty message counts in its list ("" joined), the one cut short only with text.
  EXPECT_EQ(ParseReasoning(kGptOss,
                           "<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>analysis"
                           "<|message|>b<|end|>")
                .reasoning,
            "\nb");
  for (const std::string& text :
       {std::string(kAnalysis) + "<|start|>assistant<|channel|>final<|message|>Ans",
        std::string("<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>analysis<|message|>b"),
        std::string(kAnalysis) + "garbage" + kFinal, std::string("naïve 日本 😀 <|end|>")}) {
    ExpectReasoningStreams(text);
  }
}

TEST(OpenAiToolCalls, CommentaryToFunctionsAreCalls) {
  const std::string text = std::string(kAnalysis) + kCall;
  const ParsedToolCalls parsed = Parse(kOpenAi, text);
  ASSERT_EQ(parsed.calls.size(), 1u);
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  // json.dumps(json.loads(text)): Python's separators and ASCII escapes.
  EXPECT_EQ(parsed.calls[0].arguments, R"({"city": "\u6771\u4eac"})");
  EXPECT_EQ(parsed.content, "");
  ExpectStreamsLikeParse(kOpenAi, text);
}

TEST(OpenAiToolCalls, TheFinalChannelIsTheContentElseThePreamble) {
  const std::string preamble = std::string(kAnalysis) +
                               "<|start|>assistant<|channel|>commentary<|message|>Let me look."
                               "<|end|>" +
                               kCall;
  EXPECT_EQ(Parse(kOpenAi, preamble).content, "Let me look.");
  EXPECT_EQ(Parse(kOpenAi, preamble + kFinal).content, "It is sunny.");
  ExpectStreamsLikeParse(kOpenAi, preamble + kFinal);
  // A final message cut short counts when a message ended before it, not when it is the first.
  EXPECT_EQ(Parse(kOpenAi, std::string(kAnalysis) + "<|start|>assistant<|channel|>final<|message|>It is").content,
            "It is");
  EXPECT_EQ(Parse(kOpenAi, "<|channel|>final<|message|>It is").content, "");
  ExpectStreamsLikeParse(kOpenAi, "<|channel|>final<|message|>It is");
  ExpectStreamsLikeParse(kOpenAi, "<|channel|>final<|message|>It is<|return|>");
}

TEST(OpenAiToolCalls, BadArgumentsAndNamesAsVllm) {
  // Invalid JSON stays as written; a content type without "json" is never parsed; the name is what follows
  // "functions.", up to another.
  const std::string text =
      std::string(kAnalysis) +
      "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"city\": <|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.g <|constrain|>code<|message|>{\"a\":1}<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.a.functions.b<|message|>[1,2]<|call|>"
      "<|start|>assistant<|channel|>commentary to=browser.search<|message|>{}<|call|>";
  const ParsedToolCalls parsed = Parse(kOpenAi, text);
  ASSERT_EQ(parsed.calls.size(), 3u);
  EXPECT_EQ(parsed.calls[0].arguments, "{\"city\": ");
  EXPECT_EQ(parsed.calls[1].arguments, "{\"a\":1}");
  EXPECT_EQ(parsed.calls[2].name, "a.");
  EXPECT_EQ(parsed.calls[2].arguments, "[1, 2]");
  ExpectStreamsLikeParse(kOpenAi, text);
}

TEST(OpenAiToolCalls, UnterminatedAndGarbageNeverCrash) {
  for (const std::string& text :
       {std::string(kAnalysis) + "<|start|>assistant<|channel|>commentary to=functions.f<|message|>{\"a\": 1",
        std::string(kAnalysis) + "<|start|>assistant<|channel|>commentary to=functions.f", std::string("<|"),
        std::string("<|start|><|channel|><|message|><|end|><|call|><|return|>"), std::string(kCall) + kCall,
        std::string(kAnalysis) + "<|start|>" + std::string(1000, '<') + "<|message|>x"}) {
    const ParsedToolCalls parsed = Parse(kOpenAi, text);
    EXPECT_TRUE(parsed.calls.empty() || text.find("<|call|>") != std::string::npos) << text;
    ExpectStreamsLikeParse(kOpenAi, text);
  }
}

TEST(OpenAiToolCalls, SeveralFinalMessagesTheFirstIsTheContent) {
  // A documented difference: vLLM's content is the last final message's, strata's the first's (which streams).
  const std::string text =
      std::string(kAnalysis) + kFinal + "<|start|>assistant<|channel|>final<|message|>Second.<|return|>";
  EXPECT_EQ(Parse(kOpenAi, text).content, "It is sunny.");
  ExpectStreamsLikeParse(kOpenAi, text);
}

}  // namespace
}  // namespace strata::chat_template
