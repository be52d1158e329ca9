#pragma once
// The executor's plain-C++ face (no torch headers): micro-batches of rows in, sampled tokens out.
// The engine (runtime/engine/) decides which sequences run and how many tokens each feeds; the executor
// runs them through the stages on their devices and picks each row's next token on the device of the
// last stage (vLLM's split: scheduler / executor / model).
//
//   Submit (engine thread): the micro-batch's inputs are staged in (pinned) host memory, once.
//   Stage workers: each stage copies what it needs onto its device (non_blocking, on its stream),
//     derives positions, masks and RoPE there, runs its units and hands the activation on with an event.
//   Last stage: sampling for every row at once, one device-to-host copy of ids and logprobs, an event.
//   WaitCompleted (engine thread): waits on that micro-batch's event only (never a device-wide sync).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/executor/loaded_model.h"

namespace strata::runtime {

// How one row picks its token, in vLLM's order: logit_bias, then the repetition penalty over the row's
// context (transformers' rule), the frequency and presence penalties over its output (OpenAI's), then
// temperature, top_k, top_p (transformers' warpers). temperature 0 is greedy (argmax of the processed
// logits).
// Temperatures below this sample greedily (vLLM's rule): logits / temperature overflows float32 long
// before 0 (for a logit of 10, below about 3e-38), and a distribution of infinities has no draw. The limit
// of softmax(logits / t) as t -> 0 is the argmax, which is what these rows get.
inline constexpr float kMinSamplingTemperature = 1e-5f;

// The tokens a constrained row may choose (structured outputs, structured/structured.h): xgrammar's bit mask,
// bit (id % 32) of word (id / 32) set where id is allowed. The engine's mask thread fills it while the
// micro-batch's forward pass runs; the sampler (or a group's hop to the node that samples) waits for it.
class AllowedTokens {
 public:
  explicit AllowedTokens(int64_t words) : words_(static_cast<size_t>(words), 0) {}
  static std::shared_ptr<AllowedTokens> Ready(std::vector<int32_t> words) {
    auto mask = std::make_shared<AllowedTokens>(0);
    mask->words_ = std::move(words);
    mask->ready_ = true;
    return mask;
  }
  // The filler's: write the words, then MarkReady (once).
  int32_t* data() { return words_.data(); }
  void MarkReady() {
    {
      std::lock_guard lock(mutex_);
      ready_ = true;
    }
    ready_cv_.notify_all();
  }
  // Waits until the words are filled.
  const std::vector<int32_t>& Get() const {
    std::unique_lock lock(mutex_);
    ready_cv_.wait(lock, [&] { return ready_; });
    return words_;
  }

 private:
  std::vector<int32_t> words_;
  mutable std::mutex mutex_;
  mutable std::condition_variable ready_cv_;
  bool ready_ = false;
};

struct RowSampling {
  float temperature = 0;  // below kMinSamplingTemperature: greedy
  int32_t top_k = 0;      // 0: off
  float top_p = 1;
  float repetition_penalty = 1;
  float frequency_penalty = 0;  // logit[j] -= frequency_penalty * (times j was generated)
  float presence_penalty = 0;   // logit[j] -= presence_penalty when j was generated at all
  // Added to the logits of these ids before anything else (-inf bans an id: min_tokens' EOS ids).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // The request's draw for this step, in [0, 1), from its own generator: the token is where the
  // cumulative probability (in vocabulary order) first exceeds uniform x total, so a seeded request
  // samples the same whatever else runs in its batch.
  double uniform = 0;
  int32_t top_logprobs = 0;
  // A constrained row: only these ids may be chosen (applied to the logits before anything else, so the
  // log-probabilities are those of the masked distribution, as vLLM reports them). Null: every id.
  std::shared_ptr<AllowedTokens> allowed;
  // Speculative decoding with a draft model (Leviathan et al.'s rejection sampling): a sampled row whose proposed
  // token `draft_token` (>= 0) the draft drew from `draft_probs` (q, one probability per id of the vocabulary; read
  // only while the row is staged) keeps it when accept_uniform x q(d) < p(d), p being this row's processed
  // distribution, and otherwise draws (with `uniform`) from max(p - q, 0) normalised: the token is then distributed
  // as p whatever q is. Greedy rows take their argmax (exact for any proposal); rows without draft_probs propose a
  // point mass (n-gram lookup), which drawing from p with `uniform` and comparing verifies.
  int32_t draft_token = -1;
  double accept_uniform = 0;
  std::span<const float> draft_probs;
  // The processed distribution this row's token was drawn from comes back (MicroBatchResult::probs): what a draft
  // model's proposals are verified against. A greedy row's is the point mass on its token.
  bool return_probs = false;
};

// One generated token, as the sampler makes it and the engine streams it.
struct GeneratedToken {
  int32_t id = 0;
  // log_softmax of the model's raw logits (before penalty, temperature and truncation), as
  // transformers' output_logits and vLLM's default logprobs report them.
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;  // top_logprobs (id, logprob), best first
};

// One row of a micro-batch: a sequence's KV block table (block i holds its positions
// [i * block_tokens, (i + 1) * block_tokens), as far as start + tokens.size() reaches) and the tokens it
// feeds at positions [start, start + tokens.size()). Every row of a micro-batch feeds the same number of
// tokens.
struct BatchRow {
  std::vector<int32_t> blocks;
  int64_t start = 0;
  std::vector<int32_t> tokens;
  bool samples = false;  // the last fed token is the sequence's newest: choose the next one
  RowSampling sampling;
  // With a penalty: the sampler keeps the ids each sequence has seen and how often it generated each
  // (PenaltySlots, sampler.h), so a row sends only what changed: the whole prompt and output so far when
  // `penalty_reset` (the first step), then each step's new tokens; `output_tokens` are those of them that
  // were generated (the frequency and presence penalties count only these).
  uint64_t sequence = 0;
  std::vector<int32_t> penalty_tokens;
  std::vector<int32_t> output_tokens;
  bool penalty_reset = false;
  // Ids this row's penalties count as seen and generated besides its sequence's slot, which keeps none of them: the
  // executor sets them on the positions of a verified proposal (each position's context is the sequence's tokens and
  // the proposals before it), never the engine; not sent between nodes.
  std::vector<int32_t> penalty_pending;
  // Prompt log-probabilities: the logits of every fed position are computed (not only the last one's),
  // and those of positions start, start + 1, ... score prompt_targets in turn (each the prompt token that
  // follows that position), each with its prompt_logprobs most likely tokens.
  int32_t prompt_logprobs = -1;  // -1: none
  std::vector<int32_t> prompt_targets;
  int64_t length = 0;  // the sequence's known tokens (longrope picks its factors by it); 0: start + tokens
  // Speculative decoding (runtime/engine/speculation.h): the last `verify` tokens fed are proposed ones, and each of
  // the last verify + 1 positions chooses a token as a decode step there would (position start + tokens.size() - 1
  // - verify + j with verify_uniforms[j] as its draw for j < verify, the last with sampling.uniform):
  // MicroBatchResult::verified and tokens. Such a row samples, without prompt targets; its penalties (and an EOS ban
  // by logit_bias) apply at every position, each counting the proposals before it, and a constrained row has a mask
  // per position (verify_allowed).
  int32_t verify = 0;
  std::vector<double> verify_uniforms;
  // A draft model's proposal (RowSampling::draft_probs): the distributions its verify tokens were drawn from, verify x
  // vocab, and each position's acceptance draw. Empty for point-mass proposals (n-gram) and greedy rows.
  std::vector<float> verify_draft_probs;
  std::vector<double> verify_accept_uniforms;
  // A constrained row (sampling.allowed, its last position's): the mask of each verified position before it.
  std::vector<std::shared_ptr<AllowedTokens>> verify_allowed;
  // A model with a multi-token-prediction layer (LoadedModel::mtp): the token after the row's last fed one where it is
  // known and not chosen here (a prompt chunk's next); -1: none (a sampling row's is the one chosen).
  int32_t mtp_next = -1;
  // Whether the layer's proposals at this row's sampled positions are wanted (its sequence may propose next step): the
  // layer runs over every row (its KV pool follows the model's), the LM head's product only for rows that want them.
  bool mtp_wanted = true;
};

struct MicroBatchWork {
  uint64_t id = 0;
  std::vector<BatchRow> rows;
  // Sequences that ended since the last micro-batch (none of their rows is in flight): their penalty
  // state is freed.
  std::vector<uint64_t> released;
};

struct MicroBatchResult {
  uint64_t id = 0;
  std::vector<std::optional<GeneratedToken>> tokens;  // per row; set where the row samples
  // Per row: the tokens chosen at its BatchRow::verify positions before its last, in order (empty for other rows);
  // `tokens` has the last position's.
  std::vector<std::vector<GeneratedToken>> verified;
  // Per row: its prompt_targets scored (id: the target, logprob, top), in order; empty for other rows.
  std::vector<std::vector<GeneratedToken>> prompt_logprobs;
  // Per row with RowSampling::return_probs: the distribution its token was drawn from (vocab floats); else empty.
  std::vector<std::vector<float>> probs;
  // A model with a multi-token-prediction layer: per sampling row, the layer's proposal for the token after each
  // position's choice (its verify positions', then its last one's: verify + 1 ids; -1 where the row did not want them,
  // BatchRow::mtp_wanted); empty for other rows.
  std::vector<std::vector<int32_t>> mtp;
  // Not OK when a stage (or the sampler) failed: INTERNAL naming the stage, its device and the error.
  absl::Status status;
  std::string failed_stage;   // the index of the stage that failed ("1"), for metrics
  std::string failed_device;  // the plan's device of that stage ("1", "cpu"), as stage busy time names it
  // The failure left the device unusable (a sticky CUDA error: illegal address, device-side assert):
  // nothing more can run in this process.
  bool device_lost = false;
  // Per row, OK unless the row's logits were not finite (NaN or inf: overflowed weights or activations).
  // Such a row has no token; its error is INTERNAL naming the last stage. The other rows are unaffected.
  // The check costs nothing on the device: the sampled token's log-probability, which comes back in the
  // micro-batch's one copy anyway, is finite exactly when every logit of its row is (a NaN or +inf logit
  // makes the log-sum-exp, and so every log-probability, NaN or inf; finite logits give finite ones).
  std::vector<absl::Status> row_errors;
  std::string last_stage;  // the stage that computed the logits: row_errors name it, metrics count it
  std::string last_device;
};

// A failure the tests can arm (the fault seam): stage `stage` throws on its `call`-th micro-batch
// (1-based) and on every later one when `repeat`. `device_lost` makes it look like a sticky CUDA error.
struct FaultInjection {
  int64_t stage = 0;
  int64_t call = 1;
  bool repeat = false;  // every call from `call` on (to `until`, when set) fails
  bool device_lost = false;
  int64_t until = 0;
};

// "stage=1,call=3[,repeat[,until=N]][,device_lost]". The error names the field.
absl::StatusOr<FaultInjection> ParseFaultInjection(const std::string& text);

class NodeGroup;  // group.h

// What one link of a group carried from node `from` to node `to` (group.h): messages and bytes sent, and the time
// spent sending them. The leader reports its own links and the ones its workers' heartbeats report.
struct LinkTransfer {
  int from = 0;
  int to = 0;
  uint64_t messages = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

struct ExecutorOptions {
  bool stage_threads = true;     // one worker thread per stage; false: stages run on the caller's thread
  int32_t intra_op_threads = 0;  // per stage worker; 0: leave LibTorch's setting
  std::optional<FaultInjection> fault;
  // A group of nodes (group.h; the model loaded this node's stages only): micro-batches travel to the other
  // nodes' stages and their results come back to the leader. Not owned; it must outlive the executor.
  NodeGroup* group = nullptr;
  // Called once when the group lost a node (any thread): every micro-batch in flight has then completed with
  // UNAVAILABLE naming the node (device_lost set), and later ones complete so at once.
  std::function<void(const absl::Status&)> on_group_lost;
};

struct StageBusy {
  std::string device;           // the plan's device of the stage: "0", "1", "cpu", "disk"
  std::string physical_device;  // where it runs: "cpu", "cuda:0"
  double busy_seconds = 0;      // wall time spent running micro-batches (on CUDA: issuing them)
};

class Executor {
 public:
  // Starts the stage workers over `model`, which must outlive the executor.
  static absl::StatusOr<std::unique_ptr<Executor>> Start(LoadedModel& model, const ExecutorOptions& options);
  ~Executor();  // joins the workers (micro-batches still in flight are finished first)

  void Submit(MicroBatchWork work);
  // The next micro-batch that went through every stage and the sampler; blocks until one does. A group's worker:
  // the next micro-batch whose last stage, or whose failure, was on this node (its result goes to the leader).
  MicroBatchResult WaitCompleted();
  // As WaitCompleted, for at most `timeout`: nothing when no micro-batch completed within it.
  std::optional<MicroBatchResult> WaitCompletedFor(std::chrono::milliseconds timeout);
  std::vector<StageBusy> Busy() const;
  std::vector<LinkTransfer> Transfers() const;  // a group's links; empty for one process
  int64_t RefusedConnections() const;           // a group: connections its data port refused (wrong secret, ...)

 private:
  struct Impl;
  explicit Executor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::runtime
