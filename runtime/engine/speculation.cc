#include "runtime/engine/speculation.h"

#include <algorithm>
#include <iterator>

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
  if (proposed <= 0) return;
  rate_ += 0.25 * (static_cast<double>(accepted) / static_cast<double>(proposed) - rate_);
  kept_ = 0.9 * kept_ + accepted;
  offered_ = 0.9 * offered_ + proposed;
  window_proposed_ += proposed;
  if (window_proposed_ < options_.adaptive_window) return;
  if (rate_ < options_.min_acceptance) {
    paused_steps_ = backoff_;
    backoff_ = std::min<int64_t>(backoff_ * 2, 1024);
    rate_ = kPriorRate;  // judged afresh after the pause, over another window
    window_proposed_ = 0;
  } else if (rate_ >= 2 * options_.min_acceptance) {
    backoff_ = 32;  // good again (above the bar by a margin: a moving average just over it is not)
  }
}

namespace {

int BucketOf(int64_t size) {
  int bucket = 0;
  while ((int64_t{1} << bucket) < size && bucket < 62) ++bucket;
  return bucket;
}

}  // namespace

void PassCosts::Add(std::map<int, Bucket>& buckets, int64_t size, double seconds) {
  if (size < 1 || !(seconds >= 0)) return;
  auto [it, fresh] = buckets.try_emplace(BucketOf(size));
  Bucket& b = it->second;
  if (fresh) {
    b = {static_cast<double>(size), seconds};
    return;
  }
  constexpr double kWeight = 0.2;  // the last ~5 passes of a size
  b.size += kWeight * (static_cast<double>(size) - b.size);
  b.seconds += kWeight * (seconds - b.seconds);
}

std::optional<double> PassCosts::Estimate(const std::map<int, Bucket>& buckets, int64_t size) {
  if (buckets.empty() || size < 1) return std::nullopt;
  const double x = static_cast<double>(size);
  const auto same = buckets.find(BucketOf(size));
  auto above = buckets.upper_bound(BucketOf(size));
  auto below = buckets.lower_bound(BucketOf(size));
  const Bucket* lo = below != buckets.begin() ? &std::prev(below)->second : nullptr;
  const Bucket* hi = above != buckets.end() ? &above->second : nullptr;
  if (same != buckets.end()) {
    // Within the bucket: along the line to a neighbour on x's side, where there is one.
    const Bucket& b = same->second;
    const Bucket* other = x >= b.size ? hi : lo;
    if (other == nullptr || other->size == b.size) return b.seconds;
    return std::max(0.0, b.seconds + (other->seconds - b.seconds) * (x - b.size) / (other->size - b.size));
  }
  if (lo == nullptr || hi == nullptr) return std::nullopt;
  return lo->seconds + (hi->seconds - lo->seconds) * (x - lo->size) / (hi->size - lo->size);
}

bool ProposalsPay(const PassCosts& costs, int64_t rows, int64_t proposed, double expected_kept, bool drafted) {
  if (rows < 1 || proposed < 1) return false;
  const std::optional<double> plain = costs.Pass(rows);
  if (!plain || *plain <= 0) return false;
  const std::optional<double> verify = costs.Pass(rows + proposed);
  std::optional<double> draft = drafted ? costs.Draft(rows) : std::optional<double>(0.0);
  if (!verify || !draft) return true;
  const double with = (static_cast<double>(rows) + expected_kept) / (*verify + *draft);
  return with >= static_cast<double>(rows) / *plain;
}

}  // namespace strata::runtime
