#include "runtime/engine/speculation.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace strata::runtime {

absl::StatusOr<SpeculativeOptions::Method> ParseSpeculativeMethod(const std::string& text) {
  if (text == "ngram") return SpeculativeOptions::Method::kNgram;
  if (text == "draft") return SpeculativeOptions::Method::kDraft;
  if (text == "mtp") return SpeculativeOptions::Method::kMtp;
  if (text == "none" || text.empty()) return SpeculativeOptions::Method::kNone;
  return absl::InvalidArgumentError(
      absl::StrCat("--speculative: unknown method \"", text, "\" (expected ngram, draft, mtp or none)"));
}

const char* SpeculativeMethodName(SpeculativeOptions::Method method) {
  switch (method) {
    case SpeculativeOptions::Method::kNgram:
      return "ngram";
    case SpeculativeOptions::Method::kDraft:
      return "draft";
    case SpeculativeOptions::Method::kMtp:
      return "mtp";
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
    if (other == nullptr || other->size == b.size) return b.seconds;  // the bucket's own: past it nothing is known
    return std::max(0.0, b.seconds + (other->seconds - b.seconds) * (x - b.size) / (other->size - b.size));
  }
  // Outside the measured sizes nothing is known (a prefill chunk's time says nothing of a decode step's).
  if (lo == nullptr || hi == nullptr) return std::nullopt;
  return lo->seconds + (hi->seconds - lo->seconds) * (x - lo->size) / (hi->size - lo->size);
}

namespace {

// Tokens per second of a pass of `rows` rows with `proposed` more tokens, `kept` of them expected kept, after a draft
// round for `proposers` sequences; nothing where a size is unmeasured.
std::optional<double> Throughput(const PassCosts& costs, int64_t rows, int64_t proposed, double kept, bool drafted,
                                 int64_t proposers) {
  const std::optional<double> pass = costs.Pass(rows + proposed);
  const std::optional<double> draft = drafted && proposed > 0 ? costs.Draft(proposers) : std::optional<double>(0.0);
  if (!pass || !draft || *pass + *draft <= 0) return std::nullopt;
  return (static_cast<double>(rows) + kept) / (*pass + *draft);
}

}  // namespace

bool ProposalsPay(const PassCosts& costs, int64_t rows, int64_t proposed, double expected_kept, bool drafted,
                  int64_t proposers) {
  if (rows < 1 || proposed < 1) return false;
  const std::optional<double> plain = Throughput(costs, rows, 0, 0, false, 0);
  if (!plain) return false;
  const std::optional<double> with =
      Throughput(costs, rows, proposed, expected_kept, drafted, proposers > 0 ? proposers : rows);
  return !with || *with >= *plain;
}

int64_t ProposersThatPay(const PassCosts& costs, int64_t rows, const std::vector<ProposalCandidate>& candidates,
                         bool drafted) {
  const std::optional<double> plain = Throughput(costs, rows, 0, 0, false, 0);
  if (rows < 1 || !plain) return 0;
  // Proposing must promise kMargin more tokens per second than plain decoding: the estimates err by some 10-20%
  // (a pass's time drifts as contexts grow; what a sequence keeps is a guess from its recent verifications), and a
  // wrong "yes" costs every row of a compute-bound pass while a wrong "no" costs only the gain.
  constexpr double kMargin = 1.2;
  double best = *plain * kMargin;
  int64_t chosen = 0;
  int64_t proposed = 0;
  double kept = 0;
  for (size_t m = 1; m <= candidates.size(); ++m) {
    proposed += candidates[m - 1].tokens;
    kept += candidates[m - 1].kept;
    if (candidates[m - 1].tokens < 1) continue;
    const std::optional<double> with = Throughput(costs, rows, proposed, kept, drafted, static_cast<int64_t>(m));
    if (!with) return static_cast<int64_t>(m);  // unmeasured: try it
    if (*with > best) {
      best = *with;
      chosen = static_cast<int64_t>(m);
    }
  }
  return chosen;
}

bool CostProbes::Backoff::Due() {
  if (++count < every) return false;
  count = 0;
  every = std::min(every * 2, kLast);
  return true;
}

void CostProbes::Backoff::Reset() { *this = Backoff{}; }

CostProbes::Step CostProbes::Next(int64_t proposers) {
  if (proposers > 0) {
    probe_.Reset();
    return plain_.Due() ? Step::kPlain : Step::kPropose;
  }
  plain_.Reset();
  return probe_.Due() ? Step::kProbe : Step::kSkip;
}

}  // namespace strata::runtime
