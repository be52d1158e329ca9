#include "chat_template/harmony.h"

#include <algorithm>
#include <utility>

#include "chat_template/stream_text.h"

namespace strata::chat_template {
namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kConstrain = "<|constrain|>";
// The encoding's stop tokens: each ends a message's text.
constexpr std::string_view kEnds[] = {"<|end|>", "<|call|>", "<|return|>"};

// Rust's char::is_whitespace (Unicode White_Space), which harmony's header parsing uses to end a channel
// name and to trim; splitting into parts uses ASCII whitespace only (split_ascii_whitespace: no \v).
bool IsAsciiWhitespace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r'; }

std::string_view TrimWhiteSpace(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    const int n = ValidSequenceAt(s, b);
    if (n == 0 || !IsRegexSpace(CodePointAt(s, b, n))) break;
    b += n;
  }
  size_t e = s.size();
  while (e > b) {
    size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    const int n = ValidSequenceAt(s, start);
    if (n == 0 || start + n != e || !IsRegexSpace(CodePointAt(s, start, n))) break;
    e = start;
  }
  return s.substr(b, e - b);
}

bool IsRole(std::string_view s) {
  return s == "user" || s == "assistant" || s == "system" || s == "developer" || s == "tool";
}

// StreamableParser's header parse (openai_harmony 0.0.8, parse_header_from_tokens): the channel after
// `<|channel|>` up to whitespace or `<`; the rest trimmed, `<|constrain|>` set apart, split on ASCII
// whitespace; the role first (given for the first message; an unknown one followed by more is a tool's name);
// then the last part is `to=RECIPIENT`, a lone recipient, or a content type after an optional recipient.
// False where it raises (an empty channel, no role, an unknown role alone, parts left over, invalid UTF-8).
bool ParseHeader(std::string_view text, bool role_given, HarmonyMessage& out) {
  for (size_t i = 0; i < text.size();) {
    const int n = ValidSequenceAt(text, i);
    if (n == 0) return false;  // "could not decode header"
    i += n;
  }
  std::string header(text);
  if (const size_t idx = header.find(kChannel); idx != std::string::npos) {
    const size_t after = idx + kChannel.size();
    size_t end = after;
    while (end < header.size()) {
      const int n = ValidSequenceAt(header, end);
      const char32_t c = CodePointAt(header, end, n);
      if (c == '<' || IsRegexSpace(c)) break;
      end += n;
    }
    if (end == after) return false;  // "channel marker present but no channel value found in header"
    out.channel = header.substr(after, end - after);
    header = header.substr(0, idx) + header.substr(end);
  }
  header = std::string(TrimWhiteSpace(header));
  if (header.find(kConstrain) != std::string::npos) {
    std::string spaced;
    for (size_t pos = 0;;) {
      const size_t hit = header.find(kConstrain, pos);
      spaced.append(header, pos, hit == std::string::npos ? std::string::npos : hit - pos);
      if (hit == std::string::npos) break;
      spaced += " ";
      spaced += kConstrain;
      pos = hit + kConstrain.size();
    }
    header = std::string(TrimWhiteSpace(spaced));
  }
  std::vector<std::string> parts;
  for (size_t i = 0; i < header.size();) {
    while (i < header.size() && IsAsciiWhitespace(header[i])) ++i;
    const size_t start = i;
    while (i < header.size() && !IsAsciiWhitespace(header[i])) ++i;
    if (i > start) parts.push_back(header.substr(start, i - start));
  }
  if (role_given) {
    out.role = "assistant";
  } else {
    if (parts.empty()) return false;  // "message header did not contain a role"
    if (IsRole(parts[0])) {
      out.role = parts[0];
    } else if (parts.size() > 1 || parts[0].starts_with("to=")) {
      parts.erase(parts.begin());  // an unknown role before a recipient: a tool, named so
      out.role = "tool";
    } else {
      return false;  // "Unknown role"
    }
  }
  if (!parts.empty() && parts[0] == out.role) parts.erase(parts.begin());
  if (!parts.empty()) {
    const size_t count = parts.size();
    std::string last = std::move(parts.back());
    parts.pop_back();
    if (last.starts_with("to=")) {
      out.recipient = last.substr(3);
    } else if (count == 1) {
      out.recipient = std::move(last);
    } else {
      out.content_type = std::move(last);
      std::string raw = std::move(parts.back());
      parts.pop_back();
      out.recipient = raw.starts_with("to=") ? raw.substr(3) : std::move(raw);
    }
  }
  return parts.empty();  // "unexpected tokens remaining in message header"
}

}  // namespace

void HarmonyReader::Feed(std::string_view text, std::vector<Event>& events) {
  if (state_ == State::kStopped) return;
  buffer_.append(text);
  Drain(false, events);
}

void HarmonyReader::Finish(std::vector<Event>& events) {
  if (state_ == State::kStopped) return;
  Drain(true, events);
  buffer_.clear();
  if (state_ != State::kText) state_ = State::kStopped;
}

void HarmonyReader::Drain(bool finishing, std::vector<Event>& events) {
  // Reads from `at` on and drops what was read once, at the end: a whole output fed at once stays linear.
  size_t at = 0;
  auto done = [&] { buffer_.erase(0, at); };
  while (true) {
    switch (state_) {
      case State::kHeader: {
        const size_t end = buffer_.find(kMessage, std::max(at, searched_));
        if (end == std::string::npos) {
          searched_ = buffer_.size() >= kMessage.size() ? buffer_.size() - kMessage.size() + 1 : 0;
          searched_ = std::max(searched_, at) - at;  // after the erase below
          done();
          return;
        }
        header_ = HarmonyMessage{};
        if (!ParseHeader(std::string_view(buffer_).substr(at, end - at), first_, header_)) {
          state_ = State::kStopped;
          buffer_.clear();
          return;
        }
        first_ = false;
        at = end + kMessage.size();
        searched_ = 0;
        state_ = State::kText;
        events.push_back({Event::Kind::kHeader, {}, header_});
        break;
      }
      case State::kText: {
        // The first end marker: every `<|` from here is looked at once.
        size_t end = std::string::npos, marker = 0;
        for (size_t p = buffer_.find("<|", at); p != std::string::npos; p = buffer_.find("<|", p + 1)) {
          for (std::string_view e : kEnds) {
            if (std::string_view(buffer_).substr(p, e.size()) == e) {
              end = p;
              marker = e.size();
            }
          }
          if (end != std::string::npos) break;
        }
        if (end != std::string::npos) {
          if (end > at) events.push_back({Event::Kind::kText, buffer_.substr(at, end - at), {}});
          events.push_back({Event::Kind::kEnd, {}, {}});
          at = end + marker;
          state_ = State::kExpectStart;
          break;
        }
        const std::string_view rest = std::string_view(buffer_).substr(at);
        size_t hold = 0;
        if (!finishing) {
          hold = IncompleteUtf8Tail(rest);
          for (std::string_view e : kEnds) hold = std::max(hold, MarkerOverlap(rest, e, e.size() - 1));
        }
        if (rest.size() > hold)
          events.push_back({Event::Kind::kText, std::string(rest.substr(0, rest.size() - hold)), {}});
        at = buffer_.size() - hold;
        done();
        return;
      }
      case State::kExpectStart: {
        const std::string_view rest = std::string_view(buffer_).substr(at);
        if (rest.starts_with(kStart)) {
          at += kStart.size();
          state_ = State::kHeader;
          break;
        }
        if (!rest.empty() && !kStart.starts_with(rest)) {
          state_ = State::kStopped;  // "Unexpected token ... while expecting start token"
          buffer_.clear();
          return;
        }
        if (finishing) at = buffer_.size();  // a start cut short is no message
        done();
        return;
      }
      case State::kStopped:
        return;
    }
  }
}

HarmonyOutput ReadHarmony(std::string_view text) {
  HarmonyOutput out;
  HarmonyReader reader;
  std::vector<HarmonyReader::Event> events;
  reader.Feed(text, events);
  reader.Finish(events);
  std::optional<HarmonyMessage> message;
  for (HarmonyReader::Event& event : events) {
    switch (event.kind) {
      case HarmonyReader::Event::Kind::kHeader:
        message = std::move(event.header);
        break;
      case HarmonyReader::Event::Kind::kText:
        message->text += event.text;
        break;
      case HarmonyReader::Event::Kind::kEnd:
        out.messages.push_back(*std::move(message));
        message.reset();
        break;
    }
  }
  out.current = std::move(message);
  return out;
}

}  // namespace strata::chat_template
