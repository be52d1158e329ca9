#include "tokenizer/pre_tokenizers.h"

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"
#include "tokenizer/pattern.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace strata::tokenizer {

namespace {

// The pattern GPT-2 splits words with; ByteLevel(use_regex=true) applies it.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

bool InAlphabetAsItself(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

// Each character of `text` matching `pred` is its own match (upstream's char-predicate patterns).
template <typename Pred>
void FindChars(std::string_view text, Pred pred, std::vector<Match>& out) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t cp = NextCodepoint(text, pos);
    if (pred(cp)) out.emplace_back(start, pos);
  }
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<Piece>& pieces, PieceArena& arena) const override {
    for (const auto& p : parts_) p->PreTokenize(pieces, arena);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}

  void PreTokenize(std::vector<Piece>& pieces, PieceArena& arena) const override {
    const auto& alphabet = ByteLevelAlphabet();
    std::vector<Piece> split;
    std::vector<Match> matches;
    std::vector<Piece> out;
    out.reserve(pieces.size() * 4);
    for (const Piece& in : pieces) {
      Piece piece = in;
      if (add_prefix_space_ && (piece.text.empty() || piece.text.front() != ' ')) {
        std::string& buf = arena.NewBuffer(piece.text.size() + 1);
        buf.push_back(' ');
        buf.append(piece.text);
        piece.text = buf;
      }
      split.clear();
      if (regex_ != nullptr) {
        matches.clear();
        regex_->FindAll(piece.text, matches);
        SplitPiece(piece, matches, SplitBehavior::kIsolated, false, split);
      } else if (!piece.text.empty()) {
        split.push_back(piece);
      }
      // Every byte becomes one alphabet character of at most two UTF-8 bytes.
      std::string& buf = arena.NewBuffer(piece.text.size() * 2);
      for (const Piece& p : split) {
        const size_t start = buf.size();
        for (char c : p.text) buf.append(alphabet[static_cast<unsigned char>(c)]);
        out.push_back(Piece{std::string_view(buf).substr(start), p.at_origin});
      }
    }
    pieces.swap(out);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null when use_regex is false
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<Piece>& pieces, PieceArena&) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 4);
    std::vector<Match> matches;
    for (const Piece& piece : pieces) {
      matches.clear();
      pattern_.FindAll(piece.text, matches);
      SplitPiece(piece, matches, behavior_, invert_, out);
    }
    pieces.swap(out);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void PreTokenize(std::vector<Piece>& pieces, PieceArena&) const override {
    std::vector<Piece> out;
    std::vector<Match> matches;
    for (const Piece& piece : pieces) {
      matches.clear();
      FindChars(piece.text, IsNumeric, matches);
      SplitPiece(piece, matches, individual_ ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false, out);
    }
    pieces.swap(out);
  }

 private:
  bool individual_;
};

enum class PrependScheme { kFirst, kAlways, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), scheme_(scheme), split_(split) {
    AppendUtf8(replacement, replacement_utf8_);
  }
  void PreTokenize(std::vector<Piece>& pieces, PieceArena& arena) const override {
    std::vector<Piece> out;
    std::vector<Match> matches;
    for (const Piece& in : pieces) {
      std::string& buf = arena.NewBuffer(in.text.size() * replacement_utf8_.size() + replacement_utf8_.size());
      const std::string_view text = in.text;
      // Upstream tests the text after spaces became the replacement.
      const bool starts_with_replacement = text.starts_with(replacement_utf8_) || text.starts_with(' ');
      if (!starts_with_replacement &&
          (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && in.at_origin))) {
        buf.append(replacement_utf8_);
      }
      for (char c : text) {
        if (c == ' ') {
          buf.append(replacement_utf8_);
        } else {
          buf.push_back(c);
        }
      }
      const Piece piece{buf, in.at_origin};
      if (!split_) {
        if (!buf.empty()) out.push_back(piece);
        continue;
      }
      matches.clear();
      const char32_t r = replacement_;
      FindChars(
          piece.text, [r](char32_t cp) { return cp == r; }, matches);
      SplitPiece(piece, matches, SplitBehavior::kMergedWithNext, false, out);
    }
    pieces.swap(out);
  }

 private:
  char32_t replacement_;
  std::string replacement_utf8_;
  PrependScheme scheme_;
  bool split_;
};

absl::StatusOr<char32_t> SingleChar(const JsonAt& json, std::string_view key) {
  auto s = json.String(key);
  if (!s.ok()) return s.status();
  if (s->empty() || FindInvalidUtf8(*s) != std::string_view::npos) {
    return json.FieldError(key, "expected exactly one character");
  }
  size_t pos = 0;
  const char32_t cp = NextCodepoint(*s, pos);
  if (pos != s->size()) return json.FieldError(key, "expected exactly one character");
  return cp;
}

}  // namespace

const std::array<std::string, 256>& ByteLevelAlphabet() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = InAlphabetAsItself(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      AppendUtf8(cp, t[b]);
    }
    return t;
  }();
  return table;
}

int ByteLevelByteOf(char32_t cp) {
  static const std::array<int16_t, 512> inverse = [] {
    std::array<int16_t, 512> inv;
    inv.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const int cp = InAlphabetAsItself(b) ? b : 256 + next++;
      inv[cp] = static_cast<int16_t>(b);
    }
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const JsonAt& json) {
  auto type = json.Type();
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    JsonAt list = json.Field("pretokenizers");
    if (!list.value.is_array()) return list.Error("expected an array of pre-tokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.value.size(); ++i) {
      auto part = ParsePreTokenizer(list.Index(i));
      if (!part.ok()) return part.status();
      parts.push_back(*std::move(part));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (*type == "ByteLevel") {
    auto add_prefix_space = json.Bool("add_prefix_space", true);
    if (!add_prefix_space.ok()) return add_prefix_space.status();
    auto use_regex = json.Bool("use_regex", true);
    if (!use_regex.ok()) return use_regex.status();
    // trim_offsets only changes offsets, which strata does not report.
    std::unique_ptr<Regex> regex;
    if (*use_regex) {
      auto compiled = Regex::Compile(kGpt2Pattern);
      if (!compiled.ok()) return compiled.status();
      regex = *std::move(compiled);
    }
    return std::make_unique<ByteLevelPreTokenizer>(*add_prefix_space, std::move(regex));
  }
  if (*type == "Split") {
    auto pattern = Pattern::Parse(json.Field("pattern"));
    if (!pattern.ok()) return pattern.status();
    auto behavior = ParseSplitBehavior(json.Field("behavior"));
    if (!behavior.ok()) return behavior.status();
    auto invert = json.Bool("invert", false);
    if (!invert.ok()) return invert.status();
    return std::make_unique<SplitPreTokenizer>(*std::move(pattern), *behavior, *invert);
  }
  if (*type == "Digits") {
    auto individual = json.Bool("individual_digits", false);
    if (!individual.ok()) return individual.status();
    return std::make_unique<DigitsPreTokenizer>(*individual);
  }
  if (*type == "Metaspace") {
    auto replacement = SingleChar(json, "replacement");
    if (!replacement.ok()) return replacement.status();
    PrependScheme scheme = PrependScheme::kAlways;
    if (json.Has("prepend_scheme")) {
      auto s = json.String("prepend_scheme");
      if (!s.ok()) return s.status();
      if (*s == "first") {
        scheme = PrependScheme::kFirst;
      } else if (*s == "always") {
        scheme = PrependScheme::kAlways;
      } else if (*s == "never") {
        scheme = PrependScheme::kNever;
      } else {
        return json.FieldError("prepend_scheme", base::StrCat("unsupported prepend scheme \"", *s, "\""));
      }
    } else {
      // Files written before prepend_scheme existed carry add_prefix_space instead.
      auto add_prefix_space = json.Bool("add_prefix_space", true);
      if (!add_prefix_space.ok()) return add_prefix_space.status();
      scheme = *add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
    }
    auto split = json.Bool("split", true);
    if (!split.ok()) return split.status();
    return std::make_unique<MetaspacePreTokenizer>(*replacement, scheme, *split);
  }
  return json.FieldError("type", base::StrCat("unsupported pre-tokenizer \"", *type, "\""));
}

}  // namespace strata::tokenizer
