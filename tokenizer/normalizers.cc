#include "tokenizer/normalizers.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"
#include "tokenizer/pattern.h"
#include "tokenizer/utf8.h"

namespace strata::tokenizer {

namespace {

bool IsAscii(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void Normalize(std::string& text) const override {
    for (const auto& p : parts_) p->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// NFC/NFD/NFKC/NFKD. ASCII text is invariant under all four, which skips utf8proc for most input.
class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  void Normalize(std::string& text) const override {
    if (IsAscii(text)) return;
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                     &mapped, static_cast<utf8proc_option_t>(options_));
    // The input was validated as UTF-8 before normalisation, so utf8proc only fails when out of memory.
    if (n >= 0) text.assign(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
    std::free(mapped);
  }

 private:
  int options_;
};

// Rust's char::to_lowercase per character: the full (not simple) mapping, which differs only for
// U+0130 (LATIN CAPITAL LETTER I WITH DOT ABOVE -> "i" + U+0307). No context rules (final sigma):
// upstream lowercases character by character.
class LowercaseNormalizer : public Normalizer {
 public:
  void Normalize(std::string& text) const override {
    if (IsAscii(text)) {
      for (char& c : text) {
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
      }
      return;
    }
    std::string out;
    out.reserve(text.size() + 8);
    size_t pos = 0;
    while (pos < text.size()) {
      const char32_t cp = NextCodepoint(text, pos);
      if (cp == 0x130) {
        out.push_back('i');
        AppendUtf8(0x307, out);
      } else {
        AppendUtf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))), out);
      }
    }
    text = std::move(out);
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t pos = begin;
        if (!IsWhitespace(NextCodepoint(text, pos))) break;
        begin = pos;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t pos = start;
        if (!IsWhitespace(NextCodepoint(text, pos))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);  // upstream leaves an empty piece empty
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size() + text.size() / 2);
    pattern_.ReplaceAll(text, content_, out);
    text = std::move(out);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const JsonAt& json) {
  auto type = json.Type();
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    JsonAt list = json.Field("normalizers");
    if (!list.value.is_array()) return list.Error("expected an array of normalizers");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.value.size(); ++i) {
      auto part = ParseNormalizer(list.Index(i));
      if (!part.ok()) return part.status();
      parts.push_back(*std::move(part));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (*type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (*type == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  if (*type == "NFKC") {
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  }
  if (*type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  }
  if (*type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (*type == "Strip") {
    auto left = json.Bool("strip_left", false);
    if (!left.ok()) return left.status();
    auto right = json.Bool("strip_right", false);
    if (!right.ok()) return right.status();
    return std::make_unique<StripNormalizer>(*left, *right);
  }
  if (*type == "Prepend") {
    auto prefix = json.String("prepend");
    if (!prefix.ok()) return prefix.status();
    return std::make_unique<PrependNormalizer>(*std::move(prefix));
  }
  if (*type == "Replace") {
    auto pattern = Pattern::Parse(json.Field("pattern"));
    if (!pattern.ok()) return pattern.status();
    auto content = json.String("content");
    if (!content.ok()) return content.status();
    return std::make_unique<ReplaceNormalizer>(*std::move(pattern), *std::move(content));
  }
  return json.FieldError("type", base::StrCat("unsupported normalizer \"", *type, "\""));
}

}  // namespace strata::tokenizer
