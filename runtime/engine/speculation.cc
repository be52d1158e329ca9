#include "runtime/engine/speculation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata::runtime {

absl::StatusOr<SpeculativeOptions::Method> ParseSpeculativeMethod(const std::string& text) {
  if (text == "ngram") return SpeculativeOptions::Method::kNgram;
  if (text == "draft") return SpeculativeOptions::Method::kDraft;
  if (text == "none" || text.empty()) return SpeculativeOptions::Method::kNone;
  return absl::InvalidArgumentError(
      absl::StrCat("--speculative: unknown method \"", text, "\" (expected ngram, draft or none)"));
}

const char* SpeculativeMethodName(SpeculativeOptions::Method method) {
  switch (method) {
    case SpeculativeOptions::Method::kNgram:
      return "ngram";
    case SpeculativeOptions::Method::kDraft:
      return "draft";
    case SpeculativeOptions::Method::kNone:
      break;
  }
  return "none";
}

absl::Status ValidateSpeculativeOptions(const SpeculativeOptions& o) {
  if (o.tokens < 1 || o.tokens > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--num-speculative-tokens: ", o.tokens, " is not in [1, 64]"));
  }
  if (o.ngram_min < 1) return absl::InvalidArgumentError(absl::StrCat("--ngram-min: ", o.ngram_min, " is below 1"));
  if (o.ngram_max < o.ngram_min || o.ngram_max > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ngram-max: ", o.ngram_max, " is not in [--ngram-min (", o.ngram_min, "), 64]"));
  }
  if (o.method == SpeculativeOptions::Method::kDraft && o.draft_model.empty()) {
    return absl::InvalidArgumentError("--speculative draft: no --draft-model was given");
  }
  if (o.method != SpeculativeOptions::Method::kDraft && !o.draft_model.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--draft-model: given with --speculative ",
                                                   SpeculativeMethodName(o.method),
                                                   " (a draft model proposes for "
                                                   "--speculative draft alone)"));
  }
  return absl::OkStatus();
}

std::vector<int32_t> ProposeNgram(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t count) {
  const int64_t length = static_cast<int64_t>(tokens.size());
  if (count < 1 || min_n < 1) return {};
  for (int64_t n = std::min<int64_t>(max_n, length - 1); n >= min_n; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<size_t>(length - n));
    // The most recent earlier occurrence that has a token after it: it starts at most at length - n - 1.
    for (int64_t at = length - n - 1; at >= 0; --at) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + at)) continue;
      const int64_t from = at + n;
      const int64_t to = std::min<int64_t>(from + count, length);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
}

bool Speculation::MayPropose() {
  if (paused_steps_ == 0) return true;
  --paused_steps_;
  return false;
}

void Speculation::Record(int32_t proposed, int32_t accepted) {
  window_proposed_ += proposed;
  window_accepted_ += accepted;
  if (window_proposed_ < options_.adaptive_window) return;
  const double rate = static_cast<double>(window_accepted_) / static_cast<double>(window_proposed_);
  if (rate < options_.min_acceptance) {
    paused_steps_ = backoff_;
    backoff_ = std::min<int64_t>(backoff_ * 2, 1024);
  } else {
    backoff_ = 32;
  }
  window_proposed_ = 0;
  window_accepted_ = 0;
}

}  // namespace strata::runtime
