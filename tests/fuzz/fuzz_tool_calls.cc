// libFuzzer harness: tool-call parsers (chat_template/tool_calls.h). The input is
//   CONTROL_BYTE MODEL_OUTPUT
// where the control byte's low bit picks the format (0 hermes, 1 llama3_json) and its other bits seed the
// chunk sizes (1 to 64 bytes) that the output is fed to ToolCallStreamParser in. Checked promises: the
// deltas add up to ParseToolCalls (content, and each call's id, name and arguments); calls are announced
// in order, each with its id and name first; every name and arguments text is valid UTF-8 and the
// arguments are never empty; with valid UTF-8 in, every content delta is valid UTF-8.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "chat_template/tool_calls.h"

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
  const auto format = (data[0] & 1) ? ct::ToolCallFormat::kLlama3Json : ct::ToolCallFormat::kHermes;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool utf8_in = IsValidUtf8(text);

  ct::ToolCallIds ids(99);
  const ct::ParsedToolCalls whole = ct::ParseToolCalls(format, text, ids);
  for (const ct::ToolCall& call : whole.calls) {
    Check(IsValidUtf8(call.name) && IsValidUtf8(call.arguments) && !call.arguments.empty());
  }
  if (whole.calls.empty()) Check(whole.content == text);

  ct::ToolCallStreamParser parser(format, ct::ToolCallIds(99));
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
  std::minstd_rand chunks(data[0] >> 1);
  for (size_t i = 0; i < text.size();) {
    const size_t n = 1 + chunks() % 64;
    add(parser.Feed(text.substr(i, n)));
    i += n;
  }
  add(parser.Finish());

  Check(streamed.content == whole.content);
  Check(streamed.calls.size() == whole.calls.size());
  for (size_t i = 0; i < whole.calls.size(); ++i) {
    Check(streamed.calls[i].id == whole.calls[i].id);
    Check(streamed.calls[i].name == whole.calls[i].name);
    Check(streamed.calls[i].arguments == whole.calls[i].arguments);
  }
  return 0;
}
