#pragma once
// gpt-oss's harmony format in a model's output, read as vLLM reads it: openai_harmony's StreamableParser
// (role assistant, strict: vLLM's parse_output_into_messages), here on the decoded text with its special
// tokens kept (`<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`).
// The chat template ends the prompt with `<|start|>assistant`, so the output opens with the first message's
// header. A header runs to `<|message|>`; a message's text to `<|end|>`, `<|call|>` or `<|return|>`; then only
// `<|start|>` may follow. The rules that read the messages (vLLM's parse_chat_output for --reasoning-parser
// gpt_oss, its OpenAIToolParser for --tool-call-parser openai) are in reasoning.cc and tool_calls.cc.
//
// Where harmony's parser raises (a header it cannot read, anything but `<|start|>` after a message), vLLM's
// request fails; strata keeps what was read before that point and ignores the rest of the output. A marker
// the model spelt with ordinary tokens reads as the marker here (the text cannot tell them apart).

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::chat_template {

struct HarmonyMessage {
  std::string role;  // "assistant" for the first message (its role is the prompt's)
  std::optional<std::string> channel;
  std::optional<std::string> recipient;     // `to=functions.get_weather` gives "functions.get_weather"
  std::optional<std::string> content_type;  // e.g. "<|constrain|>json"
  std::string text;
};

// Reads the output as it grows. Events: a message's header was read, a piece of its text, its end. Text that may begin
// an end marker, or ends inside a UTF-8 sequence, waits for the next piece (or Finish). Work is linear in the text;
// memory holds an unfinished header.
class HarmonyReader {
 public:
  struct Event {
    enum class Kind { kHeader, kText, kEnd };
    Kind kind;
    std::string text;       // kText
    HarmonyMessage header;  // kHeader (text empty)
  };

  void Feed(std::string_view text, std::vector<Event>& events);
  // The output ended: the held text of an unfinished message (its text so far stays "current").
  void Finish(std::vector<Event>& events);

 private:
  enum class State { kHeader, kText, kExpectStart, kStopped };
  void Drain(bool finishing, std::vector<Event>& events);

  State state_ = State::kHeader;
  bool first_ = true;  // the first message's role is given (the prompt's `<|start|>assistant`)
  std::string buffer_;
  size_t searched_ = 0;  // kHeader: no `<|message|>` starts before here
  HarmonyMessage header_;
};

// The whole output: its ended messages, and the one whose text was still being written when it ended.
struct HarmonyOutput {
  std::vector<HarmonyMessage> messages;
  std::optional<HarmonyMessage> current;
};
HarmonyOutput ReadHarmony(std::string_view text);

}  // namespace strata::chat_template
