#include "chat_template/reasoning.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "chat_template/stream_text.h"
#include "chat_template/value.h"

namespace strata::chat_template {
namespace {

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kToolCall = "<tool_call>";
constexpr std::string_view kFunctionOpen = "<function";

bool IsAsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// How much of `text` an opening `<think>` takes: whitespace, then the tag (0: no opening tag).
// vLLM (BaseThinkingReasoningParser.extract_reasoning, Qwen3ReasoningParser.extract_reasoning) drops the
// text up to and including the first `<think>` wherever it is; a stream cannot wait for a `<think>` that
// may come after the answer, so strata drops it only where it opens the output (after whitespace).
size_t OpeningTag(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && IsAsciiSpace(text[i])) ++i;
  return text.substr(i).starts_with(kThinkStart) ? i + kThinkStart.size() : 0;
}

// Qwen3ReasoningParser's test of the first `<tool_call>` as an implicit end of the reasoning:
// `_RE_FUNCTION_OPEN.match(after.lstrip())` with `<function[\s=]` (the `re` module: `\s` and lstrip are
// Python's str.isspace). `after` is the text after the tag: 1 it opens a call, 0 it does not, -1 not yet
// known (the text so far is a prefix of one that would). `spaces`: the length of the spaces after the tag
// found so far (a stream's next look starts there), updated.
int OpensFunction(std::string_view after, size_t& spaces) {
  size_t& i = spaces;
  while (i < after.size()) {
    const int n = ValidSequenceAt(after, i);
    if (n == 0) {
      if (IncompleteUtf8Tail(after.substr(i)) == after.size() - i) return -1;
      return 0;
    }
    if (!IsPySpace(CodePointAt(after, i, n))) break;
    i += n;
  }
  const std::string_view rest = after.substr(i);
  if (rest.size() <= kFunctionOpen.size()) return kFunctionOpen.starts_with(rest) ? -1 : 0;
  if (!rest.starts_with(kFunctionOpen)) return 0;
  const size_t at = kFunctionOpen.size();
  const int n = ValidSequenceAt(rest, at);
  if (n == 0) return IncompleteUtf8Tail(rest.substr(at)) == rest.size() - at ? -1 : 0;
  const char32_t c = CodePointAt(rest, at, n);
  return c == '=' || IsPySpace(c) ? 1 : 0;
}

std::optional<std::string> NonEmpty(std::string_view text) {
  if (text.empty()) return std::nullopt;
  return std::string(text);
}

void Emit(bool reasoning, std::string_view text, std::vector<ReasoningDelta>& out) {
  if (text.empty()) return;
  if (!out.empty() && out.back().reasoning == reasoning) {
    out.back().text.append(text);
    return;
  }
  out.push_back({reasoning, std::string(text)});
}

// parse_chat_output's lists: 1 the reasoning (the analysis channel), 2 the content (the final channel and
// commentary with no recipient: preambles meant for the user), 0 neither (tool calls, other channels).
int HarmonyList(const HarmonyMessage& m) {
  if (m.channel == "analysis") return 1;
  const bool recipient = m.recipient.has_value() && !m.recipient->empty();  // Python's `not msg.recipient`
  if (m.channel == "final" || (m.channel == "commentary" && !recipient)) return 2;
  return 0;
}

// vLLM's parse_chat_output (harmony_utils.py), which its gpt-oss serving uses for reasoning_content and
// content: the analysis messages' texts joined with "\n", and so the final ones and the preambles; the
// message being written when the output ended counts when it has text; an empty join is None.
ParsedReasoning GptOssReasoning(std::string_view text) {
  HarmonyOutput harmony = ReadHarmony(text);
  std::vector<std::string_view> lists[3];
  for (const HarmonyMessage& m : harmony.messages) lists[HarmonyList(m)].push_back(m.text);
  if (harmony.current && !harmony.current->text.empty()) {
    lists[HarmonyList(*harmony.current)].push_back(harmony.current->text);
  }
  auto join = [](const std::vector<std::string_view>& parts) -> std::optional<std::string> {
    std::string joined;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i > 0) joined.push_back('\n');
      joined.append(parts[i]);
    }
    return NonEmpty(joined);
  };
  return {join(lists[1]), join(lists[2])};
}

}  // namespace

absl::StatusOr<ReasoningFormat> ParseReasoningFormat(std::string_view flag) {
  if (flag == "deepseek_r1") return ReasoningFormat::kDeepSeekR1;
  if (flag == "qwen3") return ReasoningFormat::kQwen3;
  if (flag == "glm45") return ReasoningFormat::kGlm45;
  if (flag == "gpt_oss" || flag == "openai_gptoss") return ReasoningFormat::kGptOss;
  return absl::InvalidArgumentError("reasoning parser: unknown \"" + std::string(flag) +
                                    "\" (valid: deepseek_r1, qwen3, glm45, gpt_oss)");
}

std::string_view ReasoningFormatName(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::kDeepSeekR1:
      return "deepseek_r1";
    case ReasoningFormat::kQwen3:
      return "qwen3";
    case ReasoningFormat::kGlm45:
      return "glm45";
    case ReasoningFormat::kGptOss:
      return "gpt_oss";
  }
  return "";
}

ParsedReasoning ParseReasoning(ReasoningFormat format, std::string_view text, bool thinking_enabled) {
  if (format == ReasoningFormat::kGptOss) return GptOssReasoning(text);
  const bool qwen3 = format == ReasoningFormat::kQwen3;
  // vLLM's Glm4MoeModelReasoningParser: no `<think>` (thinking off: the template wrote `<think></think>` into
  // the prompt), all content. vLLM's whole-output rule also makes all content an output that has a `<think>`
  // but no `</think>` (cut while thinking), and drops the text before a `<think>` that does not open it; its
  // stream does neither, and strata follows the stream (README, "Reasoning").
  if (format == ReasoningFormat::kGlm45 && OpeningTag(text) == 0) return {std::nullopt, std::string(text)};
  // vLLM's Qwen3ReasoningParser: with thinking off and no `</think>`, all content. Its streaming never
  // calls the parser then (the prompt ends the reasoning: prompt_is_reasoning_end), so a `</think>` the
  // model writes anyway stays content; strata follows the stream: all content.
  if (qwen3 && !thinking_enabled) return {std::nullopt, std::string(text)};
  text.remove_prefix(OpeningTag(text));
  // Both: everything before the first `</think>` is reasoning, the rest content (None when empty).
  if (const size_t end = text.find(kThinkEnd); end != std::string_view::npos) {
    return {std::string(text.substr(0, end)), NonEmpty(text.substr(end + kThinkEnd.size()))};
  }
  // qwen3 without `</think>`: the first `<tool_call>` ends the reasoning when a `<function` call follows
  // it (Qwen3.5 calls tools from inside its thinking); reasoning and content are then None when empty.
  if (qwen3) {
    size_t spaces = 0;
    if (const size_t call = text.find(kToolCall);
        call != std::string_view::npos && OpensFunction(text.substr(call + kToolCall.size()), spaces) > 0) {
      return {NonEmpty(text.substr(0, call)), NonEmpty(text.substr(call))};
    }
  }
  // No end: all reasoning, content None. vLLM's BaseThinkingReasoningParser.extract_reasoning (deepseek_r1)
  // returns (model_output, None) here, "for models that may not generate start token, assume the reasoning
  // content is always at the start" (R1's template writes `<think>\n` into the prompt); Qwen3's, with
  // thinking on, reads a missing `</think>` as an output cut inside its thinking, the same result.
  return {std::string(text), std::nullopt};
}

// ---------------------------------------------------------------------------------------------------------
// Streaming

ReasoningStreamParser::ReasoningStreamParser(ReasoningFormat format, bool thinking_enabled)
    : format_(format),
      phase_(format == ReasoningFormat::kQwen3 && !thinking_enabled ? Phase::kContent : Phase::kOpening) {
  if (format == ReasoningFormat::kGptOss) harmony_.emplace();
}

std::vector<ReasoningDelta> ReasoningStreamParser::Feed(std::string_view new_text) {
  std::vector<ReasoningDelta> out;
  if (phase_ == Phase::kFinished) return out;
  if (harmony_) {
    std::vector<HarmonyReader::Event> events;
    harmony_->Feed(new_text, events);
    HarmonyEvents(events, out);
    return out;
  }
  buffer_.append(new_text);
  Drain(false, out);
  return out;
}

std::vector<ReasoningDelta> ReasoningStreamParser::Finish() {
  std::vector<ReasoningDelta> out;
  if (phase_ == Phase::kFinished) return out;
  if (harmony_) {
    std::vector<HarmonyReader::Event> events;
    harmony_->Finish(events);
    HarmonyEvents(events, out);
  } else {
    Drain(true, out);
  }
  buffer_.clear();
  phase_ = Phase::kFinished;
  return out;
}

void ReasoningStreamParser::HarmonyEvents(std::vector<HarmonyReader::Event>& events, std::vector<ReasoningDelta>& out) {
  // A message joins its list when it first has text, or when it ends empty (an ended message counts
  // even empty; the one being written only with text), after a "\n" when the list has parts already.
  auto count = [&] {
    if (harmony_list_ == 0 || harmony_counted_) return;
    harmony_counted_ = true;
    if (harmony_parts_[harmony_list_]++ > 0) Emit(harmony_list_ == 1, "\n", out);
  };
  for (HarmonyReader::Event& event : events) {
    switch (event.kind) {
      case HarmonyReader::Event::Kind::kHeader:
        harmony_list_ = HarmonyList(event.header);
        harmony_counted_ = false;
        break;
      case HarmonyReader::Event::Kind::kText:
        if (harmony_list_ == 0) break;
        count();
        Emit(harmony_list_ == 1, event.text, out);
        break;
      case HarmonyReader::Event::Kind::kEnd:
        count();
        harmony_list_ = 0;
        break;
    }
  }
}

void ReasoningStreamParser::Drain(bool finishing, std::vector<ReasoningDelta>& out) {
  const bool qwen3 = format_ == ReasoningFormat::kQwen3;
  auto send = [&](bool reasoning, size_t n) {
    Emit(reasoning, std::string_view(buffer_).substr(0, n), out);
    buffer_.erase(0, n);
  };
  while (true) {
    switch (phase_) {
      case Phase::kOpening: {
        // Whitespace and a prefix of `<think>` may still become the opening tag (searched_: the
        // whitespace seen so far).
        while (searched_ < buffer_.size() && IsAsciiSpace(buffer_[searched_])) ++searched_;
        const std::string_view rest = std::string_view(buffer_).substr(searched_);
        bool opened = false;
        if (rest.starts_with(kThinkStart)) {
          buffer_.erase(0, searched_ + kThinkStart.size());
          opened = true;
        } else if (!finishing && kThinkStart.starts_with(rest)) {
          return;
        }
        searched_ = 0;
        // glm45 without an opening `<think>`: thinking is off, all content.
        phase_ = format_ == ReasoningFormat::kGlm45 && !opened ? Phase::kContent : Phase::kReasoning;
        break;
      }
      case Phase::kReasoning: {
        const size_t end = buffer_.find(kThinkEnd);
        const size_t call = qwen3 && !tool_call_checked_ ? buffer_.find(kToolCall) : std::string::npos;
        if (call != std::string::npos && call < end) {
          send(true, call);
          phase_ = Phase::kToolCallCheck;
          break;
        }
        if (end != std::string::npos) {
          send(true, end);
          buffer_.erase(0, kThinkEnd.size());
          phase_ = Phase::kContent;
          break;
        }
        size_t hold = 0;
        if (!finishing) {
          hold = std::max(IncompleteUtf8Tail(buffer_), MarkerOverlap(buffer_, kThinkEnd, kThinkEnd.size() - 1));
          if (qwen3 && !tool_call_checked_)
            hold = std::max(hold, MarkerOverlap(buffer_, kToolCall, kToolCall.size() - 1));
        }
        send(true, buffer_.size() - hold);
        return;
      }
      case Phase::kToolCallCheck: {
        // buffer_ starts with the first `<tool_call>`; searched_: the spaces after it seen so far.
        const int opens = OpensFunction(std::string_view(buffer_).substr(kToolCall.size()), searched_);
        if (opens < 0 && !finishing) return;
        tool_call_checked_ = true;
        searched_ = 0;
        phase_ = opens > 0 ? Phase::kAfterToolCall : Phase::kReasoning;
        break;
      }
      case Phase::kAfterToolCall: {
        // Content from the `<tool_call>` on, unless a `</think>` follows: vLLM splits there first, and
        // all of it is then reasoning.
        if (const size_t end = buffer_.find(kThinkEnd, searched_); end != std::string::npos) {
          send(true, end);
          buffer_.erase(0, kThinkEnd.size());
          phase_ = Phase::kContent;
          break;
        }
        if (!finishing) {
          searched_ = buffer_.size() >= kThinkEnd.size() ? buffer_.size() - kThinkEnd.size() + 1 : 0;
          return;
        }
        send(false, buffer_.size());
        return;
      }
      case Phase::kContent:
        send(false, buffer_.size() - (finishing ? 0 : IncompleteUtf8Tail(buffer_)));
        return;
      case Phase::kFinished:
        return;
    }
  }
}

}  // namespace strata::chat_template
