#include "tokenizer/decoders.h"

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"
#include "tokenizer/pattern.h"
#include "tokenizer/pre_tokenizers.h"
#include "tokenizer/utf8.h"

namespace strata::tokenizer {

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->DecodeChain(tokens);
  }
  bool HasByteFallback() const override {
    for (const auto& p : parts_) {
      if (p->HasByteFallback()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// Maps alphabet characters back to bytes over all tokens at once, then reads the bytes as UTF-8
// (lossily). A token with a character outside the alphabet (an added token such as "héllo wörld")
// contributes its own UTF-8 bytes unchanged.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      size_t pos = 0;
      bool all_mapped = true;
      while (pos < t.size()) {
        const int b = ByteLevelByteOf(NextCodepoint(t, pos));
        if (b < 0) {
          all_mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!all_mapped) {
        bytes.resize(mark);
        bytes.append(t);
      }
    }
    std::string text;
    AppendUtf8Lossy(bytes, text);
    tokens.assign(1, std::move(text));
  }
};

// Consecutive "<0xAB>" tokens become the text their bytes spell; when the bytes are not valid UTF-8,
// each byte becomes one U+FFFD (upstream's rule, not from_utf8_lossy's).
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    auto flush = [&] {
      if (run.empty()) return;
      if (FindInvalidUtf8(run) == std::string_view::npos) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i) out.emplace_back(kReplacementChar);
      }
      run.clear();
    };
    for (std::string& t : tokens) {
      unsigned char byte;
      if (ParseByteToken(t, byte)) {
        run.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
  bool HasByteFallback() const override { return true; }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all.append(t);
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters from every token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
    for (std::string& t : tokens) {
      chars.clear();
      size_t pos = 0;
      while (pos < t.size()) {
        const size_t at = pos;
        chars.emplace_back(at, NextCodepoint(t, pos));
      }
      size_t first = 0;
      while (first < start_ && first < chars.size() && chars[first].second == content_) ++first;
      size_t last = chars.size();  // one past the last kept character
      for (size_t i = 0; i < stop_ && last > first && chars[last - 1].second == content_; ++i) --last;
      const size_t begin = first < chars.size() ? chars[first].first : t.size();
      const size_t end = last < chars.size() ? chars[last].first : t.size();
      t = t.substr(begin, end > begin ? end - begin : 0);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      pattern_.ReplaceAll(t, content_, out);
      t = std::move(out);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// The replacement character becomes a space, except in the first token when a prefix was prepended
// on encode (prepend_scheme other than "never"): there every replacement character is dropped, as
// upstream does.
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool prepended)
      : replacement_(std::move(replacement)), prepended_(prepended) {}
  void DecodeChain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (t.find(replacement_) == std::string::npos) continue;
      std::string out;
      out.reserve(t.size());
      size_t pos = 0, hit;
      while ((hit = t.find(replacement_, pos)) != std::string::npos) {
        out.append(t, pos, hit - pos);
        if (!(i == 0 && prepended_)) out.push_back(' ');
        pos = hit + replacement_.size();
      }
      out.append(t, pos);
      t = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool prepended_;
};

absl::StatusOr<char32_t> OneChar(const JsonAt& json, std::string_view key) {
  auto s = json.String(key);
  if (!s.ok()) return s.status();
  size_t pos = 0;
  if (s->empty() || FindInvalidUtf8(*s) != std::string_view::npos) {
    return json.FieldError(key, "expected exactly one character");
  }
  const char32_t cp = NextCodepoint(*s, pos);
  if (pos != s->size()) return json.FieldError(key, "expected exactly one character");
  return cp;
}

absl::StatusOr<size_t> Count(const JsonAt& json, std::string_view key) {
  JsonAt f = json.Field(key);
  if (f.value.is_null()) return 0;
  if (!f.value.is_number_unsigned() && !(f.value.is_number_integer() && f.value.get<int64_t>() >= 0)) {
    return f.Error("expected a non-negative integer");
  }
  return f.value.get<size_t>();
}

}  // namespace

bool ParseByteToken(std::string_view token, unsigned char& byte) {
  // Upstream: six bytes, "<0x" ... ">", and the two bytes between parse as a hex u8.
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return false;
  const int hi = HexDigit(token[3]), lo = HexDigit(token[4]);
  if (token[3] == '+' && lo >= 0) {  // u8::from_str_radix accepts a leading '+'
    byte = static_cast<unsigned char>(lo);
    return true;
  }
  if (hi < 0 || lo < 0) return false;
  byte = static_cast<unsigned char>(hi * 16 + lo);
  return true;
}

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const JsonAt& json) {
  auto type = json.Type();
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    JsonAt list = json.Field("decoders");
    if (!list.value.is_array()) return list.Error("expected an array of decoders");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.value.size(); ++i) {
      auto part = ParseDecoder(list.Index(i));
      if (!part.ok()) return part.status();
      parts.push_back(*std::move(part));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (*type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (*type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (*type == "Fuse") return std::make_unique<FuseDecoder>();
  if (*type == "Strip") {
    auto content = OneChar(json, "content");
    if (!content.ok()) return content.status();
    auto start = Count(json, "start");
    if (!start.ok()) return start.status();
    auto stop = Count(json, "stop");
    if (!stop.ok()) return stop.status();
    return std::make_unique<StripDecoder>(*content, *start, *stop);
  }
  if (*type == "Replace") {
    auto pattern = Pattern::Parse(json.Field("pattern"));
    if (!pattern.ok()) return pattern.status();
    auto content = json.String("content");
    if (!content.ok()) return content.status();
    return std::make_unique<ReplaceDecoder>(*std::move(pattern), *std::move(content));
  }
  if (*type == "Metaspace") {
    auto replacement = OneChar(json, "replacement");
    if (!replacement.ok()) return replacement.status();
    bool prepended = true;
    if (json.Has("prepend_scheme")) {
      auto s = json.String("prepend_scheme");
      if (!s.ok()) return s.status();
      if (*s != "first" && *s != "always" && *s != "never") {
        return json.FieldError("prepend_scheme", base::StrCat("unsupported prepend scheme \"", *s, "\""));
      }
      prepended = *s != "never";
    } else {
      auto add_prefix_space = json.Bool("add_prefix_space", true);
      if (!add_prefix_space.ok()) return add_prefix_space.status();
      prepended = *add_prefix_space;
    }
    std::string utf8;
    AppendUtf8(*replacement, utf8);
    return std::make_unique<MetaspaceDecoder>(std::move(utf8), prepended);
  }
  return json.FieldError("type", base::StrCat("unsupported decoder \"", *type, "\""));
}

}  // namespace strata::tokenizer
