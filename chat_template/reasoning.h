#pragma once
// Reasoning in a model's generated text, as vLLM's `--reasoning-parser` separates it into the chat
// message's `reasoning_content` and `content`: `deepseek_r1` (DeepSeek-R1, whose template puts `<think>` in
// the prompt: everything up to `</think>` is reasoning), `qwen3` (Qwen3, Qwen3.5: the same, a `<tool_call>`
// that opens a `<function=...>` call also ending the reasoning, and no reasoning at all when the request's
// chat_template_kwargs turn `enable_thinking` off), `glm45` (GLM-4.5/4.6/4.7: `<think>...</think>` the model
// opens itself; without it, all content) and `gpt_oss` (gpt-oss's harmony channels: `analysis` is the
// reasoning, `final` and the commentary meant for the user the content; harmony.h). Text in, plain structs
// out; tool calls are then parsed from the content alone (tool_calls.h), bar `--tool-call-parser openai`,
// which reads the harmony channels itself.
//
// The rule of tool_calls.h holds here too: the streamed deltas of ReasoningStreamParser, concatenated, are
// exactly ParseReasoning's result, for any text cut anywhere. vLLM's own whole-output rule is not a rule a
// stream can follow (the first `<think>` anywhere drops all the text before it, so a `<think>` written
// after the answer would turn the answer into nothing), so strata's rule is the stream's, and equals
// vLLM's for every output whose `<think>`, if any, opens it (chat_template/README.md, "Reasoning", lists the
// differences).

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "chat_template/harmony.h"

namespace strata::chat_template {

enum class ReasoningFormat { kDeepSeekR1, kQwen3, kGlm45, kGptOss };

// "deepseek_r1", "qwen3", "glm45" or "gpt_oss" (vLLM's names; vLLM calls the last "openai_gptoss", which is
// accepted too); an error names the valid ones.
absl::StatusOr<ReasoningFormat> ParseReasoningFormat(std::string_view flag);
std::string_view ReasoningFormatName(ReasoningFormat format);

struct ParsedReasoning {
  std::optional<std::string> reasoning;  // nullopt where vLLM's is None (the message's null)
  std::optional<std::string> content;    // nullopt where vLLM's is None: nothing after the reasoning
};

// `thinking_enabled`: the request's chat_template_kwargs.enable_thinking, Python-truthy, true when absent
// (vLLM's Qwen3ReasoningParser reads it; deepseek_r1 ignores it).
ParsedReasoning ParseReasoning(ReasoningFormat format, std::string_view text, bool thinking_enabled = true);

struct ReasoningDelta {
  bool reasoning = false;  // a fragment of reasoning_content, else of content
  std::string text;        // never empty
};

// Fed the decoded text as it grows (only the new part each time). Reasoning streams as it comes, less a
// tail that may begin `</think>` (or `<tool_call>`) or end inside a UTF-8 sequence; after the reasoning,
// content streams likewise. Only behind a qwen3 `<tool_call>` that opens a call is text held (a later
// `</think>` would make it reasoning after all), until `</think>` or the end. Work is linear in the text.
class ReasoningStreamParser {
 public:
  explicit ReasoningStreamParser(ReasoningFormat format, bool thinking_enabled = true);

  std::vector<ReasoningDelta> Feed(std::string_view new_text);
  // The output has ended: what was held back.
  std::vector<ReasoningDelta> Finish();

 private:
  enum class Phase { kOpening, kReasoning, kToolCallCheck, kAfterToolCall, kContent, kFinished };
  // Sends what buffer_ allows in the current phase, moving through phases; `finishing`: no more text.
  void Drain(bool finishing, std::vector<ReasoningDelta>& out);
  // gpt_oss: the reader's events as parse_chat_output's two "\n"-joined lists.
  void HarmonyEvents(std::vector<HarmonyReader::Event>& events, std::vector<ReasoningDelta>& out);

  ReasoningFormat format_;
  Phase phase_;
  std::string buffer_;              // text not yet sent
  bool tool_call_checked_ = false;  // qwen3: the first <tool_call> was looked at (vLLM looks at no other)
  // kOpening: the whitespace before a possible `<think>`; kToolCallCheck: the spaces after `<tool_call>`;
  // kAfterToolCall: no `</think>` starts before here. So that held text is looked at once.
  size_t searched_ = 0;
  // gpt_oss: the harmony reader; the list the current message adds to (0 none, 1 reasoning, 2 content),
  // whether it was counted in it yet, and how many parts each list has.
  std::optional<HarmonyReader> harmony_;
  int harmony_list_ = 0;
  bool harmony_counted_ = false;
  size_t harmony_parts_[3] = {0, 0, 0};
};

}  // namespace strata::chat_template
