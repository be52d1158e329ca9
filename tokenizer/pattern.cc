#include "tokenizer/pattern.h"

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"

namespace strata::tokenizer {

absl::StatusOr<Pattern> Pattern::Parse(const JsonAt& json) {
  if (!json.value.is_object()) {
    return json.Error("expected {\"String\": ...} or {\"Regex\": ...}");
  }
  if (json.Has("String")) {
    auto s = json.String("String");
    if (!s.ok()) return s.status();
    return Literal(*std::move(s));
  }
  if (json.Has("Regex")) {
    auto r = json.String("Regex");
    if (!r.ok()) return r.status();
    auto compiled = Regex::Compile(*r);
    if (!compiled.ok()) return json.FieldError("Regex", std::string(compiled.status().message()));
    Pattern p;
    p.regex_ = std::shared_ptr<Regex>(*std::move(compiled));
    return p;
  }
  return json.Error("expected {\"String\": ...} or {\"Regex\": ...}");
}

absl::StatusOr<Pattern> Pattern::Literal(std::string text) {
  Pattern p;
  if (text.empty()) {
    // Upstream compiles the escaped literal as a regex; the empty regex matches between characters.
    auto compiled = Regex::Compile("");
    if (!compiled.ok()) return compiled.status();
    p.regex_ = std::shared_ptr<Regex>(*std::move(compiled));
  }
  p.literal_ = std::move(text);
  return p;
}

void Pattern::FindAll(std::string_view text, std::vector<Match>& out) const {
  if (regex_ != nullptr) {
    regex_->FindAll(text, out);
    return;
  }
  size_t pos = 0;
  while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
    out.emplace_back(pos, pos + literal_.size());
    pos += literal_.size();
  }
}

void Pattern::ReplaceAll(std::string_view text, std::string_view content, std::string& out) const {
  thread_local std::vector<Match> matches;
  matches.clear();
  FindAll(text, matches);
  size_t last = 0;
  for (const auto& [s, e] : matches) {
    out.append(text.substr(last, s - last));
    out.append(content);
    last = e;
  }
  out.append(text.substr(last));
}

absl::StatusOr<SplitBehavior> ParseSplitBehavior(const JsonAt& json) {
  if (!json.value.is_string()) return json.Error("expected a split behaviour string");
  const std::string& b = json.value.get_ref<const std::string&>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return json.Error(base::StrCat("unsupported split behaviour \"", b, "\""));
}

void SplitPiece(const Piece& piece, const std::vector<Match>& matches, SplitBehavior behavior, bool invert,
                std::vector<Piece>& out) {
  struct Span {
    size_t start, end;
    bool is_match;
  };
  thread_local std::vector<Span> spans;
  thread_local std::vector<Span> merged;
  spans.clear();
  merged.clear();
  const size_t n = piece.text.size();
  // Upstream's find_matches: the matches plus the gaps between them, covering the whole piece.
  if (n == 0) {
    spans.push_back({0, 0, false});
  } else {
    size_t prev = 0;
    for (const auto& [s, e] : matches) {
      if (prev != s) spans.push_back({prev, s, invert});
      spans.push_back({s, e, !invert});
      prev = e;
    }
    if (prev != n) spans.push_back({prev, n, invert});
  }
  auto emit = [&](size_t s, size_t e) {
    if (e > s) out.push_back(Piece{piece.text.substr(s, e - s), piece.at_origin && s == 0});
  };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& sp : spans) emit(sp.start, sp.end);
      return;
    case SplitBehavior::kRemoved:
      for (const Span& sp : spans) {
        if (!sp.is_match) emit(sp.start, sp.end);
      }
      return;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& sp : spans) {
        if (sp.is_match == previous_match && !merged.empty()) {
          merged.back().end = sp.end;
        } else {
          merged.push_back(sp);
        }
        previous_match = sp.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& sp : spans) {
        if (sp.is_match && !previous_match && !merged.empty()) {
          merged.back().end = sp.end;
        } else {
          merged.push_back(sp);
        }
        previous_match = sp.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // Walks right to left: a match is glued to the front of the span that follows it.
      bool previous_match = false;
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& sp = spans[i];
        if (sp.is_match && !previous_match && !merged.empty()) {
          merged.back().start = sp.start;
        } else {
          merged.push_back(sp);
        }
        previous_match = sp.is_match;
      }
      for (size_t i = merged.size(); i-- > 0;) emit(merged[i].start, merged[i].end);
      return;
    }
  }
  for (const Span& sp : merged) emit(sp.start, sp.end);
}

}  // namespace strata::tokenizer
