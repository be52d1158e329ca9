#pragma once
// Tool calls in a model's generated text, as vLLM's `--tool-call-parser` extracts them into OpenAI
// `tool_calls`: `hermes` (Qwen2.5/Qwen3, Hermes: `<tool_call>{json}</tool_call>` blocks), `llama3_json`
// (Llama 3.1/3.2: optional `<|python_tag|>`, then `{"name", "parameters"|"arguments"}` objects, several
// separated by `; `), `deepseek_v3` (DeepSeek-V3/R1: `<｜tool▁calls▁begin｜>` then per call
// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`), `kimi_k2`
// (`<|tool_calls_section_begin|>` then per call
// `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>`), `glm45`
// (GLM-4.5/4.6: `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>`),
// `minimax_m2` (`<minimax:tool_call><invoke name="NAME"><parameter name="K">V</parameter>...</invoke>
// </minimax:tool_call>`; these two type their arguments by the request's tool schemas) and `openai` (gpt-oss's
// harmony: commentary messages `to=functions.NAME` are the calls, the final channel the content; it reads
// the whole output, not the content after a reasoning parser: ReadsWholeOutput). Text in, plain structs out;
// the HTTP layer makes the JSON.
//
// One rule for every format: the streamed deltas of ToolCallStreamParser, concatenated, are exactly
// ParseToolCalls' result (content, and each call's id, name and arguments), for any text cut anywhere.
// Because vLLM turns the whole output into plain content when any tool-call block is malformed (a later
// block truncated by max_tokens included), no call is certain before the output ends: the stream parser
// sends content as it comes, holds everything from the first tool-call marker on, and sends the calls
// from Finish() (a model ends its turn right after its last call, so this costs little latency). Text
// after such a marker that can no longer be a call (`<tool_call>` not followed by `{`, `{` not followed
// by `"`) is decided early and streamed as content from then on. deepseek_v3 and kimi_k2 mark a section:
// the text before it is content whatever follows, the text after it never is (bar deepseek_v3's failure,
// which makes the whole output content), so content streams up to the marker and the rest waits for the
// end. openai's messages are certain when they end: each call goes out as its message ends, the final
// channel's text as it comes (README, "Tool calls", says when it waits).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "chat_template/harmony.h"
#include "nlohmann/json.hpp"

namespace strata::chat_template {

enum class ToolCallFormat { kHermes, kLlama3Json, kDeepSeekV3, kKimiK2, kGlm45, kMinimaxM2, kOpenAi };

// "hermes", "llama3_json", "deepseek_v3", "kimi_k2", "glm45", "minimax_m2" or "openai" (vLLM's names); an error
// names the valid ones.
absl::StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view flag);
std::string_view ToolCallFormatName(ToolCallFormat format);

// openai reads gpt-oss's harmony channels itself: it is given the whole output, never the content a reasoning
// parser left (its reasoning then comes from --reasoning-parser gpt_oss, as vLLM's gpt-oss serving takes it
// from parse_chat_output).
bool ReadsWholeOutput(ToolCallFormat format);

// OpenAI-style tool-call ids: "call_" + 24 random ASCII letters and digits. A seed makes them
// deterministic (tests); the default constructor seeds from std::random_device.
class ToolCallIds {
 public:
  ToolCallIds();
  explicit ToolCallIds(uint64_t seed) : state_(seed) {}
  std::string Next();

 private:
  uint64_t state_;
};

struct ToolCall {
  std::string id;         // from ToolCallIds; kimi_k2: the model's own (`functions.NAME:IDX`), as vLLM keeps it
  std::string name;       // as the model wrote it (invalid UTF-8 replaced by U+FFFD)
  std::string arguments;  // JSON text: Python's json.dumps(value, ensure_ascii=False), as vLLM sends it;
                          // deepseek_v3 and kimi_k2: the model's text as is (vLLM neither checks nor re-dumps it)
};

struct ParsedToolCalls {
  // With calls: the text before the first call (vLLM: null for llama3_json; the HTTP layer sends an
  // empty content as null; glm45: empty when all whitespace). Without calls: the whole output, unchanged; but
  // deepseek_v3 and kimi_k2 cut at their section's begin marker whenever it is there, calls or not (vLLM's
  // tools_called). openai: the final channel's text, else the last preamble, else empty, calls or not.
  std::string content;
  std::vector<ToolCall> calls;
};

// `tools`: the request's "tools" (null or a list), which glm45 and minimax_m2 read to type arguments.
ParsedToolCalls ParseToolCalls(ToolCallFormat format, std::string_view text, ToolCallIds& ids,
                               const nlohmann::ordered_json* tools = nullptr);

// One piece of a streamed message, in the order OpenAI's streamed chat sends them: content fragments
// (tool_index < 0), then per call a first delta with id and name, then its argument fragments.
struct ToolCallDelta {
  int tool_index = -1;  // < 0: a content fragment
  std::string content;  // the content fragment
  std::string id;       // the call's first delta: its id and name (arguments empty)
  std::string name;
  std::string arguments;  // a fragment of the call's arguments
};

// Fed the decoded text as it grows (only the new part each time). Content fragments never end inside a
// UTF-8 sequence (an incomplete one is held until its next bytes or Finish). Work is linear in the text;
// memory holds only the text from the first tool-call marker on.
class ToolCallStreamParser {
 public:
  explicit ToolCallStreamParser(ToolCallFormat format, ToolCallIds ids = ToolCallIds(),
                                nlohmann::ordered_json tools = nullptr);

  std::vector<ToolCallDelta> Feed(std::string_view new_text);
  // The output has ended: what was held back, and the calls.
  std::vector<ToolCallDelta> Finish();

 private:
  void EmitContent(std::string_view text, std::vector<ToolCallDelta>& out);
  // Streams `text` as content, holding back a tail that may begin a marker or a UTF-8 sequence.
  void FeedContent(std::string_view text, std::vector<ToolCallDelta>& out);

  // deepseek_v3, kimi_k2: keeps kept_ from the first call or section marker on (a call may start before
  // the section, where vLLM's findall finds it too).
  void Keep(std::string_view new_text);
  // openai: the harmony reader's events as content and calls.
  void HarmonyEvents(const std::vector<HarmonyReader::Event>& events, std::vector<ToolCallDelta>& out);
  void EmitCall(ToolCall call, std::vector<ToolCallDelta>& out);

  enum class Mode { kContent, kHeld, kDecidedContent, kFinished };
  ToolCallFormat format_;
  ToolCallIds ids_;
  Mode mode_ = Mode::kContent;
  std::string pending_;           // kContent/kDecidedContent: held back tail not yet sent
  std::string held_tag_;          // llama3_json: a `<|python_tag|>` right before the first `{`; glm45: the
                                  // all-whitespace text before the first marker (content only without calls)
  std::string held_;              // kHeld: the text from the first marker on
  bool decided_checked_ = false;  // the character after the first marker was looked at
  size_t decide_from_ = 0;        // held_ is whitespace after the marker up to here
  std::string kept_;              // deepseek_v3, kimi_k2: the text from the first marker on, or a tail
  bool kept_anchored_ = false;    // kept_ starts at a marker
  bool content_started_ = false;  // glm45: a character other than whitespace was sent as content
  nlohmann::ordered_json tools_;  // glm45, minimax_m2: the request's tools

  // openai: what the message being read is to the content and the calls (kFinal: its text is the content as
  // it comes; kFinalHeld: when it ends; kPartialOnly: only if the output ends inside it; kPreamble: the
  // content when no final message has any), its text where held, and how the content stands.
  enum class HarmonyPart { kNone, kCall, kFinal, kFinalHeld, kPartialOnly, kPreamble };
  std::optional<HarmonyReader> harmony_;
  HarmonyPart harmony_part_ = HarmonyPart::kNone;
  HarmonyMessage harmony_header_;
  std::string harmony_text_;
  bool content_sent_ = false;  // a final message's text went out: it is the content
  bool final_ended_ = false;   // a final message ended (vLLM's final_content is set, empty or not)
  std::optional<std::string> preamble_;
  size_t harmony_ended_ = 0;  // messages ended so far
  int calls_sent_ = 0;
};

// Tool calls a grammar forced: tool_choice "required" or a named function, constrained as vLLM constrains them
// (server/README.md, "Structured outputs"). "required" (`name` empty): the output is a JSON list of {"name",
// "parameters"} objects, each a call whose arguments are json.dumps(parameters, ensure_ascii=False) as vLLM makes
// them; an output that is not such a list (max_tokens cut it) is all content. A named function: the output is the
// arguments of one call of `name`, as written (vLLM's), content empty.
ParsedToolCalls ParseForcedToolCalls(std::string_view text, std::string_view name, ToolCallIds& ids);

// The same as a stream, its deltas adding up to ParseForcedToolCalls' result: a named function's call goes out
// with the first text and its arguments as they come; the calls of "required" at the end (only a whole list is
// certain to be one of calls).
class ForcedToolCallStreamParser {
 public:
  explicit ForcedToolCallStreamParser(std::string name, ToolCallIds ids = ToolCallIds());

  std::vector<ToolCallDelta> Feed(std::string_view new_text);
  std::vector<ToolCallDelta> Finish();

 private:
  std::string name_;  // empty: "required"
  ToolCallIds ids_;
  std::string held_;      // "required": the output so far
  bool started_ = false;  // named: the call's first delta was sent
  bool finished_ = false;
};

}  // namespace strata::chat_template
