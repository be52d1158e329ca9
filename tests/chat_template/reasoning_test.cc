// chat_template/reasoning: vLLM's deepseek_r1 and qwen3 reasoning parsers on outputs shaped as DeepSeek-R1,
// Qwen3 and Qwen3.5 write them, and the stream parser whose deltas add up to the non-streamed result.

#include "chat_template/reasoning.h"

#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chat_template/utf8_check.h"

namespace strata::chat_template {
namespace {

using ::testing::HasSubstr;

constexpr ReasoningFormat kR1 = ReasoningFormat::kDeepSeekR1;
constexpr ReasoningFormat kQwen3 = ReasoningFormat::kQwen3;
constexpr ReasoningFormat kGlm45 = ReasoningFormat::kGlm45;
constexpr ReasoningFormat kGptOss = ReasoningFormat::kGptOss;

// What the deltas add up to: reasoning and content, each empty when none came.
struct Streamed {
  std::string reasoning;
  std::string content;
  std::vector<std::vector<ReasoningDelta>> feeds;  // what each Feed returned, then Finish
};

Streamed Stream(ReasoningFormat format, std::string_view text, const std::vector<size_t>& cuts,
                bool thinking_enabled = true) {
  ReasoningStreamParser parser(format, thinking_enabled);
  Streamed streamed;
  size_t start = 0;
  for (size_t cut : cuts) {
    streamed.feeds.push_back(parser.Feed(text.substr(start, cut - start)));
    start = cut;
  }
  streamed.feeds.push_back(parser.Feed(text.substr(start)));
  streamed.feeds.push_back(parser.Finish());
  for (const auto& deltas : streamed.feeds) {
    for (size_t i = 0; i < deltas.size(); ++i) {
      EXPECT_FALSE(deltas[i].text.empty());
      if (i > 0) {
        EXPECT_NE(deltas[i].reasoning, deltas[i - 1].reasoning) << "one delta per kind and run";
      }
      (deltas[i].reasoning ? streamed.reasoning : streamed.content) += deltas[i].text;
    }
  }
  return streamed;
}

// Every cut into two pieces, every byte alone, and random cuts: the deltas add up to ParseReasoning, and
// with valid UTF-8 in, every delta is valid UTF-8.
void ExpectStreamsLikeParse(ReasoningFormat format, std::string_view text, bool thinking_enabled = true) {
  const ParsedReasoning expected = ParseReasoning(format, text, thinking_enabled);
  const bool utf8 = IsValidUtf8(text);
  auto check = [&](const std::vector<size_t>& cuts, const std::string& what) {
    const Streamed streamed = Stream(format, text, cuts, thinking_enabled);
    EXPECT_EQ(streamed.reasoning, expected.reasoning.value_or("")) << what << " of " << text;
    EXPECT_EQ(streamed.content, expected.content.value_or("")) << what << " of " << text;
    if (!utf8) return;
    for (const auto& deltas : streamed.feeds) {
      for (const ReasoningDelta& delta : deltas) EXPECT_TRUE(IsValidUtf8(delta.text)) << what;
    }
  };
  check({}, "whole");
  for (size_t cut = 0; cut <= text.size(); ++cut) check({cut}, "cut at " + std::to_string(cut));
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  check(every, "byte by byte");
  std::mt19937 rng(static_cast<uint32_t>(text.size()));
  for (int round = 0; round < 10; ++round) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i) {
      if (rng() % 4 == 0) cuts.push_back(i);
    }
    check(cuts, "random cuts " + std::to_string(round));
  }
}

void ExpectParsed(ReasoningFormat format, std::string_view text, std::optional<std::string> reasoning,
                  std::optional<std::string> content, bool thinking_enabled = true) {
  const ParsedReasoning parsed = ParseReasoning(format, text, thinking_enabled);
  EXPECT_EQ(parsed.reasoning, reasoning) << text;
  EXPECT_EQ(parsed.content, content) << text;
  ExpectStreamsLikeParse(format, text, thinking_enabled);
}

TEST(ReasoningFormat, NamesAreVllms) {
  EXPECT_EQ(*ParseReasoningFormat("deepseek_r1"), kR1);
  EXPECT_EQ(*ParseReasoningFormat("qwen3"), kQwen3);
  absl::StatusOr<ReasoningFormat> bad = ParseReasoningFormat("granite");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("\"granite\""));
  EXPECT_THAT(bad.status().message(), HasSubstr("deepseek_r1, qwen3, glm45, gpt_oss"));
  for (ReasoningFormat format : {kR1, kQwen3, kGlm45, kGptOss}) {
    EXPECT_EQ(*ParseReasoningFormat(ReasoningFormatName(format)), format);
  }
  EXPECT_EQ(*ParseReasoningFormat("openai_gptoss"), kGptOss) << "vLLM's own name for it";
}

// --- glm45 ------------------------------------------------------------------------------------------------

TEST(Glm45Reasoning, TheModelOpensItsThinking) {
  // GLM-4.5/4.6's template ends the prompt with `<|assistant|>`; the model writes `\n<think>...</think>`.
  ExpectParsed(kGlm45, "\n<think>The user greets.</think>\nHello!", "The user greets.", "\nHello!");
  ExpectParsed(kGlm45, "<think></think>", "", std::nullopt);
}

TEST(Glm45Reasoning, ThinkingOffIsAllContent) {
  // With enable_thinking off the template writes `<think></think>` into the prompt: no tag in the output.
  ExpectParsed(kGlm45, "\nHello!", std::nullopt, "\nHello!");
  ExpectParsed(kGlm45, "no think </think> here", std::nullopt, "no think </think> here");
  ExpectParsed(kGlm45, "", std::nullopt, "");
}

TEST(Glm45Reasoning, CutWhileThinkingIsReasoningAsVllmStreamsIt) {
  // vLLM's whole-output rule makes this all content (tag included); its stream sends it as reasoning, as strata.
  ExpectParsed(kGlm45, "\n<think>Still thinking", "Still thinking", std::nullopt);
}

TEST(Glm45Reasoning, AThinkThatDoesNotOpenTheOutputIsText) {
  ExpectParsed(kGlm45, "Answer first <think>x</think>y", std::nullopt, "Answer first <think>x</think>y");
}

// --- deepseek_r1 ------------------------------------------------------------------------------------------

TEST(DeepSeekR1Reasoning, TheTemplateOpensTheThinkingSoTheOutputStartsInIt) {
  // DeepSeek-R1's template ends the prompt with "<think>\n": the output is reasoning up to </think>.
  ExpectParsed(kR1, "Okay, 2 + 2 is 4.\n</think>\n\nThe answer is **4**.", "Okay, 2 + 2 is 4.\n",
               "\n\nThe answer is **4**.");
  // Older R1 outputs open with the tag themselves: it is dropped (after whitespace too).
  ExpectParsed(kR1, "<think>\nhmm\n</think>\n\n4", "\nhmm\n", "\n\n4");
  ExpectParsed(kR1, "\n <think>hmm</think>4", "hmm", "4");
}

TEST(DeepSeekR1Reasoning, WithoutAnEndEverythingIsReasoning) {
  // vLLM: "DeepSeek R1 doesn't generate <think> now. Thus we assume the reasoning content is always at
  // the start": no </think> (max_tokens reached inside the thinking) is all reasoning, content None.
  ExpectParsed(kR1, "Let me think about this", "Let me think about this", std::nullopt);
  ExpectParsed(kR1, "", "", std::nullopt);
  ExpectParsed(kR1, "<think>\nstill thinking", "\nstill thinking", std::nullopt);
}

TEST(DeepSeekR1Reasoning, NothingAfterTheEndIsNullContentAndTheFirstEndCounts) {
  ExpectParsed(kR1, "r</think>", "r", std::nullopt);
  ExpectParsed(kR1, "</think>answer", "", "answer");
  ExpectParsed(kR1, "a</think>b</think>c", "a", "b</think>c");
  // enable_thinking is qwen3's: deepseek_r1 ignores it.
  ExpectParsed(kR1, "a</think>b", "a", "b", /*thinking_enabled=*/false);
}

TEST(DeepSeekR1Reasoning, AThinkTagThatDoesNotOpenTheOutputIsText) {
  // vLLM would drop all the text before the first <think> wherever it is (an answer before a later
  // <think> included); a stream cannot, so strata keeps it (chat_template/README.md).
  ExpectParsed(kR1, "x<think>r</think>a", "x<think>r", "a");
  ExpectParsed(kR1, "r</think>a<think>b", "r", "a<think>b");
  ExpectParsed(kR1, "<think>a<think>b</think>c", "a<think>b", "c");  // as vLLM
}

// --- qwen3 ------------------------------------------------------------------------------------------------

TEST(Qwen3Reasoning, ThinkingBlocksAsQwen3WritesThem) {
  ExpectParsed(kQwen3, "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?", "\nThe user greets me.\n",
               "\n\nHello! How can I help?");
  // Qwen3-2507 Thinking and Qwen3.5 templates open the thinking in the prompt: no <think> in the output.
  ExpectParsed(kQwen3, "The user greets me.\n</think>\n\nHello!", "The user greets me.\n", "\n\nHello!");
  // Thinking on and no </think>: the output was cut inside the thinking, all reasoning.
  ExpectParsed(kQwen3, "<think>\nStill going", "\nStill going", std::nullopt);
  ExpectParsed(kQwen3, "<think>\n\n</think>\n\n", "\n\n", "\n\n");
}

TEST(Qwen3Reasoning, ThinkingOffIsAllContent) {
  // chat_template_kwargs {"enable_thinking": false}: the template writes an empty thinking block into the
  // prompt; vLLM's stream then never looks for tags, and strata's rule is the stream's.
  ExpectParsed(kQwen3, "Hello!", std::nullopt, "Hello!", /*thinking_enabled=*/false);
  ExpectParsed(kQwen3, "a</think>b", std::nullopt, "a</think>b", /*thinking_enabled=*/false);
  ExpectParsed(kQwen3, "", std::nullopt, "", /*thinking_enabled=*/false);
}

TEST(Qwen3Reasoning, AToolCallOpeningAFunctionEndsTheReasoning) {
  // Qwen3.5 may call a tool from inside its thinking: `<tool_call>` then `<function=` (after spaces).
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
      "</tool_call>";
  ExpectParsed(kQwen3, "I need the weather.\n" + call, "I need the weather.\n", call);
  ExpectParsed(kQwen3, call, std::nullopt, call);  // reasoning None when empty
  ExpectParsed(kQwen3, "x<tool_call> \t<function name=\"f\">", "x", "<tool_call> \t<function name=\"f\">");
  // ... but a </think> anywhere wins (vLLM splits there first), the call then being reasoning.
  ExpectParsed(kQwen3, "a" + call + "b</think>c", "a" + call + "b", "c");
}

TEST(Qwen3Reasoning, OnlyTheFirstToolCallIsLookedAt) {
  // A bare mention (or Qwen3's JSON calls) is not an end; and vLLM looks no further than the first one.
  ExpectParsed(kQwen3, "Use <tool_call> tags. <tool_call>\n<function=f>",
               "Use <tool_call> tags. <tool_call>\n<function=f>", std::nullopt);
  ExpectParsed(kQwen3, "r<tool_call>\n{\"name\": \"f\"}", "r<tool_call>\n{\"name\": \"f\"}", std::nullopt);
  // Cut before the character after `<function`: not (yet) a call, so reasoning.
  ExpectParsed(kQwen3, "r<tool_call>\n<function", "r<tool_call>\n<function", std::nullopt);
  ExpectParsed(kQwen3, "r<tool_call>\n<functional", "r<tool_call>\n<functional", std::nullopt);
  // Unicode spaces are Python's isspace, U+001C included (the `re` module's \s).
  ExpectParsed(kQwen3, "r<tool_call>\u3000\x1c<function\u2028x", "r", "<tool_call>\u3000\x1c<function\u2028x");
}

// --- streaming ------------------------------------------------------------------------------------------------

TEST(ReasoningStreamParser, ReasoningStreamsAsItComesAndContentAfterIt) {
  ReasoningStreamParser parser(kR1);
  std::vector<ReasoningDelta> d = parser.Feed("Let me see</thi");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].reasoning);
  EXPECT_EQ(d[0].text, "Let me see");  // "</thi" may begin the end tag: held
  d = parser.Feed("nk>\n\nAnswer");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_FALSE(d[0].reasoning);
  EXPECT_EQ(d[0].text, "\n\nAnswer");
  EXPECT_TRUE(parser.Finish().empty());
  EXPECT_TRUE(parser.Feed("more").empty());

  ReasoningStreamParser opening(kQwen3);
  EXPECT_TRUE(opening.Feed("\n<thi").empty());  // may still be the opening tag
  d = opening.Feed("nk>abc");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, "abc");
}

TEST(ReasoningStreamParser, TextAfterAQwen3FunctionCallIsHeldUntilTheEnd) {
  ReasoningStreamParser parser(kQwen3);
  EXPECT_EQ(parser.Feed("r<tool_call>\n").at(0).text, "r");
  EXPECT_TRUE(parser.Feed("<function=f>\n</function>\n</tool_call>").empty());  // a </think> may still follow
  std::vector<ReasoningDelta> d = parser.Finish();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_FALSE(d[0].reasoning);
  EXPECT_EQ(d[0].text, "<tool_call>\n<function=f>\n</function>\n</tool_call>");
}

TEST(ReasoningStreamParser, DeltasNeverEndInsideAUtf8Sequence) {
  ReasoningStreamParser parser(kR1);
  const std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(parser.Feed("a" + euro.substr(0, 2)).at(0).text, "a");
  std::vector<ReasoningDelta> d = parser.Feed(euro.substr(2) + "</think>b\xF0\x9F");
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].text, euro);
  EXPECT_EQ(d[1].text, "b");
  EXPECT_EQ(parser.Finish().at(0).text, "\xF0\x9F");  // an unfinished sequence at the end is sent as is
}

TEST(ReasoningStreamParser, GeneratedOutputsStreamLikeParse) {
  std::mt19937 rng(99);
  auto pick = [&rng](const std::vector<std::string>& options) { return options[rng() % options.size()]; };
  const std::vector<std::string> pieces = {"<think>",   "</think>",     "<tool_call>", "\n",     " ",  "<function=f>",
                                           "<function", "naïve 日本 😀", "reason",      "<",      "</", "<think",
                                           "\u3000",    "answer",       "<tool_",      "</think"};
  for (int i = 0; i < 150; ++i) {
    std::string text;
    const int n = static_cast<int>(rng() % 7);
    for (int k = 0; k < n; ++k) text += pick(pieces);
    const ReasoningFormat format = i % 3 == 0 ? kGlm45 : i % 2 ? kR1 : kQwen3;
    ExpectStreamsLikeParse(format, text, /*thinking_enabled=*/rng() % 5 != 0);
  }
}

// CPU seconds of this thread: what the work costs, whatever else the machine runs at the time (a wall clock on 2
// shared cores is not; issue 40).
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

TEST(ReasoningBounds, MegabyteOutputsAreLinear) {
  const size_t mb = 1 << 20;
  auto expect_linear = [](ReasoningFormat format, const std::string& text) {
    const double start = ThreadCpuSeconds();
    const ParsedReasoning expected = ParseReasoning(format, text);
    ReasoningStreamParser parser(format);
    std::string reasoning, content;
    auto add = [&](const std::vector<ReasoningDelta>& deltas) {
      for (const ReasoningDelta& d : deltas) (d.reasoning ? reasoning : content) += d.text;
    };
    for (size_t i = 0, step = 1; i < text.size(); i += step, step = step % 13 + 1) {
      add(parser.Feed(std::string_view(text).substr(i, step)));
    }
    add(parser.Finish());
    EXPECT_EQ(reasoning, expected.reasoning.value_or(""));
    EXPECT_EQ(content, expected.content.value_or(""));
    // Linear: 10-40 ms of CPU each, idle (2026-11-28); ASan and TSan (tests/sanitize) multiply that by 2-15.
    EXPECT_LT(ThreadCpuSeconds() - start, 5.0);
  };
  std::string tags;
  while (tags.size() < mb) tags += "</thin<tool_cal<think";
  expect_linear(kR1, tags);
  expect_linear(kQwen3, tags);
  expect_linear(kQwen3, "a<tool_call><function=f>" + std::string(mb, 'x') + "</think>b");
  expect_linear(kQwen3, "a<tool_call>" + std::string(mb, ' ') + "<function=f>");
  expect_linear(kR1, std::string(mb, ' ') + "<think>x");
  expect_linear(kR1, std::string(mb, 'r') + "</think>" + std::string(mb, 'c'));
  expect_linear(kGlm45, "<think>" + std::string(mb, 'r') + "</think>" + std::string(mb, 'c'));
  std::string harmony = "<|channel|>analysis<|message|>";
  while (harmony.size() < mb) harmony += "x<|en<|end|><|start|>assistant<|channel|>final<|message|>y<|re";
  expect_linear(kGptOss, harmony);
  expect_linear(kGptOss, "<|channel|>analysis" + std::string(mb, ' ') + "<|message|>x");
}

}  // namespace
}  // namespace strata::chat_template
