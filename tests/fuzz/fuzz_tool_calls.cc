// libFuzzer harness: the parsers of a model's output (chat_template/tool_calls.h, chat_template/reasoning.h).
// The input is
//   CONTROL_BYTE MODEL_OUTPUT
// where the control byte's bits 0-2 pick the tool-call format (hermes, llama3_json, deepseek_v3, kimi_k2, glm45,
// minimax_m2, openai; 7 is hermes again), bits 3-5 the reasoning parser before it (none, deepseek_r1, qwen3, qwen3
// with thinking off, glm45, gpt_oss; 6 and 7 none) and bits 6-7 seed the chunk sizes (1 to 64 bytes) that the
// output is fed to the stream parsers in: reasoning first, its content deltas through ToolCallStreamParser (openai:
// the whole output, which it reads itself), as the HTTP API chains them; glm45 and minimax_m2 type arguments by a
// fixed set of tool schemas. Checked promises: the reasoning deltas add up to ParseReasoning, the tool-call deltas
// to ParseToolCalls of its content (content, and each call's id, name and arguments); calls are announced in
// order, each with its id and name first; every name, id and arguments text is valid UTF-8, and the JSON formats'
// arguments are never empty; with valid UTF-8 in, every content and reasoning delta is valid UTF-8.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "chat_template/reasoning.h"
#include "chat_template/tool_calls.h"
#include "nlohmann/json.hpp"

namespace {

namespace ct = strata::chat_template;

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    const auto c1 = n > 1 ? static_cast<unsigned char>(s[i + 1]) : 0x80;
    if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) {
      return false;
    }
    for (int k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static constexpr ct::ToolCallFormat kFormats[] = {ct::ToolCallFormat::kHermes,     ct::ToolCallFormat::kLlama3Json,
                                                    ct::ToolCallFormat::kDeepSeekV3, ct::ToolCallFormat::kKimiK2,
                                                    ct::ToolCallFormat::kGlm45,      ct::ToolCallFormat::kMinimaxM2,
                                                    ct::ToolCallFormat::kOpenAi,     ct::ToolCallFormat::kHermes};
  static constexpr std::optional<ct::ReasoningFormat> kReasoning[] = {std::nullopt,
                                                                      ct::ReasoningFormat::kDeepSeekR1,
                                                                      ct::ReasoningFormat::kQwen3,
                                                                      ct::ReasoningFormat::kQwen3,
                                                                      ct::ReasoningFormat::kGlm45,
                                                                      ct::ReasoningFormat::kGptOss,
                                                                      std::nullopt,
                                                                      std::nullopt};
  // The schemas glm45 and minimax_m2 read: a string, an integer, a number, a boolean, a union, an enum.
  static const nlohmann::ordered_json kTools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}, "ratio": {"type": "number"}, "metric": {"type": "boolean"},
      "when": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "unit": {"enum": ["c", "f", 1]}}}}}])");
  const ct::ToolCallFormat format = kFormats[data[0] & 7];
  const int reasoning_mode = (data[0] >> 3) & 7;
  const std::optional<ct::ReasoningFormat> reasoning = kReasoning[reasoning_mode];
  const bool thinking_enabled = reasoning_mode != 3;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool utf8_in = IsValidUtf8(text);
  const bool sectioned = format == ct::ToolCallFormat::kDeepSeekV3 || format == ct::ToolCallFormat::kKimiK2;
  const bool whole_output = ct::ReadsWholeOutput(format);
  const bool json_arguments = format == ct::ToolCallFormat::kHermes || format == ct::ToolCallFormat::kLlama3Json ||
                              format == ct::ToolCallFormat::kGlm45 || format == ct::ToolCallFormat::kMinimaxM2;

  // The whole output: reasoning split off, then the calls of the content.
  std::string whole_reasoning;
  std::string content(text);
  if (reasoning) {
    ct::ParsedReasoning split = ct::ParseReasoning(*reasoning, text, thinking_enabled);
    // gpt_oss reads channels: an output without harmony messages has neither.
    Check(split.reasoning || split.content || reasoning == ct::ReasoningFormat::kGptOss);
    whole_reasoning = split.reasoning.value_or("");
    content = split.content.value_or("");
    Check(whole_reasoning.size() + content.size() <= text.size());
  }
  if (whole_output) content = std::string(text);
  ct::ToolCallIds ids(99);
  const ct::ParsedToolCalls whole = ct::ParseToolCalls(format, content, ids, &kTools);
  for (const ct::ToolCall& call : whole.calls) {
    Check(IsValidUtf8(call.name) && IsValidUtf8(call.arguments) && IsValidUtf8(call.id) && !call.id.empty());
    if (json_arguments) Check(!call.arguments.empty());
  }
  if (!whole_output) {
    if (whole.calls.empty() && !sectioned) Check(whole.content == content);
    Check(std::string_view(content).starts_with(whole.content));
  }

  // Streamed.
  std::optional<ct::ReasoningStreamParser> reasoning_stream;
  if (reasoning) reasoning_stream.emplace(*reasoning, thinking_enabled);
  ct::ToolCallStreamParser parser(format, ct::ToolCallIds(99), kTools);
  std::string streamed_reasoning;
  ct::ParsedToolCalls streamed;
  auto add = [&](const std::vector<ct::ToolCallDelta>& deltas) {
    for (const ct::ToolCallDelta& delta : deltas) {
      if (delta.tool_index < 0) {
        Check(!delta.content.empty() && (!utf8_in || IsValidUtf8(delta.content)));
        streamed.content += delta.content;
        continue;
      }
      const auto index = static_cast<size_t>(delta.tool_index);
      Check(index <= streamed.calls.size());
      if (index == streamed.calls.size()) {
        Check(!delta.id.empty());
        streamed.calls.emplace_back();
      } else {
        Check(delta.id.empty() && delta.name.empty());
      }
      streamed.calls[index].id += delta.id;
      streamed.calls[index].name += delta.name;
      streamed.calls[index].arguments += delta.arguments;
    }
  };
  auto add_reasoning = [&](const std::vector<ct::ReasoningDelta>& deltas) {
    for (const ct::ReasoningDelta& delta : deltas) {
      Check(!delta.text.empty() && (!utf8_in || IsValidUtf8(delta.text)));
      if (delta.reasoning) {
        streamed_reasoning += delta.text;
      } else if (!whole_output) {
        add(parser.Feed(delta.text));
      }
    }
  };
  std::minstd_rand chunks(data[0] >> 6);
  for (size_t i = 0; i < text.size();) {
    const size_t n = 1 + chunks() % 64;
    if (reasoning_stream) add_reasoning(reasoning_stream->Feed(text.substr(i, n)));
    if (!reasoning_stream || whole_output) add(parser.Feed(text.substr(i, n)));
    i += n;
  }
  if (reasoning_stream) add_reasoning(reasoning_stream->Finish());
  add(parser.Finish());

  Check(streamed_reasoning == whole_reasoning);
  Check(streamed.content == whole.content);
  Check(streamed.calls.size() == whole.calls.size());
  for (size_t i = 0; i < whole.calls.size(); ++i) {
    Check(streamed.calls[i].id == whole.calls[i].id);
    Check(streamed.calls[i].name == whole.calls[i].name);
    Check(streamed.calls[i].arguments == whole.calls[i].arguments);
  }
  return 0;
}
