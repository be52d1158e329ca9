#pragma once
// Speculative decoding's engine half (issue 44; README "Speculative decoding"): what a sequence proposes and
// when it stops proposing. No tensor here: the executor verifies a proposal as a chunk (BatchRow::verify), and
// the engine keeps the prefix the model agrees with.
//
// Verification is exact for a proposal that is a fixed list of tokens (n-gram lookup: q is a point mass, vLLM's
// rule): each position's token is chosen as decoding would choose it there (greedy: the argmax; sampled: a draw
// from the processed distribution with the request's own uniform), and the proposal's tokens are kept while they
// equal those choices; the first choice that differs is kept too, or the token after the last proposed one when
// all agree. Accepting proposed token d with probability p(d) and otherwise drawing from p without d, Leviathan et
// al.'s rule for q = 1{d}, emits each token with probability p: the same distribution as drawing from p and
// comparing, which is what this does.

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::runtime {

struct SpeculativeOptions {
  // kNgram: prompt lookup (ProposeNgram); kDraft: a draft model (draft_model.h); kMtp: the checkpoint's
  // multi-token-prediction layer (runtime/model/mtp.h), which each forward pass runs after sampling: one token a step,
  // its argmax, verified as a fixed proposal (vLLM's rule for its MTP and EAGLE drafts).
  enum class Method { kNone, kNgram, kDraft, kMtp };
  Method method = Method::kNone;
  std::string draft_model;  // --draft-model: the draft's checkpoint folder (kDraft)
  int32_t tokens = 4;       // proposed tokens per step at most (--num-speculative-tokens)
  int32_t ngram_min = 1;    // the shortest suffix looked up (--ngram-min)
  int32_t ngram_max = 4;    // the longest (--ngram-max); longer matches are tried first
  // The adaptive off-switch: a sequence whose moving-average acceptance (Speculation::expected_rate) is below this,
  // once it proposed `adaptive_window` tokens, stops proposing for a while (32 steps, doubling up to 1024 while it
  // stays low, back to 32 once it reaches twice this; after each pause it is judged afresh).
  double min_acceptance = 0.25;
  int32_t adaptive_window = 8;
  // The cost-aware switch (PassCosts): a step proposes only when the measured cost of verifying (and drafting) is
  // expected to be repaid by the tokens kept (--speculative-cost-aware).
  bool cost_aware = true;
};

// "ngram" | "draft" | "mtp" | "none" into the method; the error names the flag's value.
absl::StatusOr<SpeculativeOptions::Method> ParseSpeculativeMethod(const std::string& text);
const char* SpeculativeMethodName(SpeculativeOptions::Method method);
// The options' ranges; the error names the offending field.
absl::Status ValidateSpeculativeOptions(const SpeculativeOptions& options);

// Prompt lookup (transformers' prompt_lookup_num_tokens, vLLM's "ngram"): the longest suffix of `tokens` of
// n in [min_n, max_n] tokens that occurred before, at its most recent earlier occurrence, proposes the (at most
// `count`) tokens that followed it there. Empty when no suffix recurs.
std::vector<int32_t> ProposeNgram(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t count);

// One sequence's speculation state: the proposals' acceptance so far, and the off-switch.
class Speculation {
 public:
  explicit Speculation(const SpeculativeOptions& options) : options_(options) {}
  // Whether this step may propose (counts the step when it may not).
  bool MayPropose();
  // Whether the off-switch holds the sequence back for the next step (MayPropose will say no).
  bool Paused() const { return paused_steps_ > 0; }
  // A verified proposal of `proposed` tokens kept `accepted` of them.
  void Record(int32_t proposed, int32_t accepted);
  // The share of its proposed tokens this sequence is expected to keep, for the cost-aware switch: its kept / proposed
  // tokens, each verification's counts fading by 0.9 per later one, with 4 proposed tokens all kept as the prior (an
  // untried sequence is tried: its acceptance is learnt from its verifications, not from a guess that holds it back).
  double expected_rate() const { return (kept_ + kPriorTokens) / (offered_ + kPriorTokens); }
  static constexpr double kPriorRate = 0.4;  // the off-switch's moving average starts here (and after each pause)
  static constexpr double kPriorTokens = 4;

 private:
  SpeculativeOptions options_;
  double rate_ = kPriorRate;  // the off-switch's: a moving average over verifications, each weighing 1/4
  double kept_ = 0;
  double offered_ = 0;
  int64_t window_proposed_ = 0;  // tokens proposed since the start or the last pause
  int64_t paused_steps_ = 0;     // steps left without proposing
  int64_t backoff_ = 32;         // the next pause's length: doubles while acceptance stays low, up to 1024
};

// The cost-aware switch's measurements: forward passes' seconds by the tokens they fed (a micro-batch from Submit to
// its result, so on a pipeline the latency of its stages), and a draft model's proposal rounds' by the sequences they
// served. Each is a moving average per bucket of sizes (powers of two), read between buckets by linear interpolation.
class PassCosts {
 public:
  void RecordPass(int64_t tokens, double seconds) { Add(pass_, tokens, seconds); }
  void RecordDraft(int64_t rows, double seconds) { Add(draft_, rows, seconds); }
  // Expected seconds: within and between measured sizes on their line; nothing outside them (or before any).
  std::optional<double> Pass(int64_t tokens) const { return Estimate(pass_, tokens); }
  std::optional<double> Draft(int64_t rows) const { return Estimate(draft_, rows); }

 private:
  struct Bucket {
    double size = 0;
    double seconds = 0;
  };
  static void Add(std::map<int, Bucket>& buckets, int64_t size, double seconds);
  static std::optional<double> Estimate(const std::map<int, Bucket>& buckets, int64_t size);
  std::map<int, Bucket> pass_;
  std::map<int, Bucket> draft_;
};

// Whether a step's proposals are expected to pay: the next pass feeds `rows` decoding rows, which would add `proposed`
// tokens in all and keep `expected_kept` of them; with a draft model (`drafted`), its round for the `proposers`
// sequences comes first. They pay when (rows + kept) / (pass(rows + proposed) + draft(proposers)) >=
// rows / pass(rows). Unmeasured sizes: no while the plain pass is unmeasured (it is measured first), yes while the one
// with proposals is.
bool ProposalsPay(const PassCosts& costs, int64_t rows, int64_t proposed, double expected_kept, bool drafted,
                  int64_t proposers = 0);

// A proposing sequence as the switch weighs it: the tokens it would propose and those it is expected to keep.
struct ProposalCandidate {
  int64_t tokens = 0;
  double kept = 0;
};
// How many of `candidates` (the best first: most expected kept per proposed token) propose this step: the count m
// whose pass (rows + their tokens, after a draft round for m sequences) makes the most tokens per second, 0 when no m
// beats plain decoding by 20% (the estimates' error). A size past the largest measured is tried (the first m that
// reaches one is returned), so the costs of larger passes get measured as the evidence allows.
int64_t ProposersThatPay(const PassCosts& costs, int64_t rows, const std::vector<ProposalCandidate>& candidates,
                         bool drafted);

// The cost-aware switch's probes, which keep its measurements current: while nothing pays, the likeliest sequence
// proposes after 32 skipped steps, then 64, ... up to 1024 (acceptance and the larger pass stay measured); while
// proposing pays, one step is plain after 32 proposing steps, then 64, ... up to 1024 (the plain pass's time drifts as
// contexts grow). Either run of steps ending starts the other's count from 32 again.
class CostProbes {
 public:
  enum class Step { kPropose, kSkip, kProbe, kPlain };
  // This step's decision, given how many sequences the costs say should propose (ProposersThatPay): kPropose (that
  // many), kSkip (none: nothing pays), kProbe (one: nothing pays, but it is time to measure), kPlain (none: it pays,
  // but it is time to measure the plain pass).
  Step Next(int64_t proposers);

 private:
  // Steps counted since the last time it was due; due every 32 steps, then 64, ... up to 1024.
  struct Backoff {
    static constexpr uint64_t kFirst = 32, kLast = 1024;
    uint64_t count = 0;
    uint64_t every = kFirst;
    bool Due();    // counts a step: true (and the next wait doubled) when this one completes the wait
    void Reset();  // from 32 again
  };
  Backoff probe_;  // skipped steps
  Backoff plain_;  // proposing steps
};

}  // namespace strata::runtime
