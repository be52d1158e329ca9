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

}  // namespace

absl::StatusOr<ReasoningFormat> ParseReasoningFormat(std::string_view flag) {
  if (flag == "deepseek_r1") return ReasoningFormat::kDeepSeekR1;
  if (flag == "qwen3") return ReasoningFormat::kQwen3;
  return absl::InvalidArgumentError("reasoning parser: unknown \"" + std::string(flag) +
                                    "\" (valid: deepseek_r1, qwen3)");
}

std::string_view ReasoningFormatName(ReasoningFormat format) {
  return format == ReasoningFormat::kDeepSeekR1 ? "deepseek_r1" : "qwen3";
}

ParsedReasoning ParseReasoning(ReasoningFormat format, std::string_view text, bool thinking_enabled) {
  const bool qwen3 = format == ReasoningFormat::kQwen3;
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
      phase_(format == ReasoningFormat::kQwen3 && !thinking_enabled ? Phase::kContent : Phase::kOpening) {}

std::vector<ReasoningDelta> ReasoningStreamParser::Feed(std::string_view new_text) {
  std::vector<ReasoningDelta> out;
  if (phase_ == Phase::kFinished) return out;
  buffer_.append(new_text);
  Drain(false, out);
  return out;
}

std::vector<ReasoningDelta> ReasoningStreamParser::Finish() {
  std::vector<ReasoningDelta> out;
  if (phase_ == Phase::kFinished) return out;
  Drain(true, out);
  buffer_.clear();
  phase_ = Phase::kFinished;
  return out;
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
        if (rest.starts_with(kThinkStart)) {
          buffer_.erase(0, searched_ + kThinkStart.size());
        } else if (!finishing && kThinkStart.starts_with(rest)) {
          return;
        }
        searched_ = 0;
        phase_ = Phase::kReasoning;
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
