#pragma once
// Internal (ATen): choosing the next token of every sampling row of a micro-batch, on the device of the
// logits, in one pass over the whole batch: no .item(), no synchronous copy, no host loop over the
// vocabulary. The rows' parameters travel to the device as tensors staged (pinned) with the micro-batch;
// the results (ids, logprobs, top logprobs) come back in ONE non_blocking copy followed by an event.
//
// Semantics, in vLLM's order: a constrained row's grammar mask first (structured outputs: the ids its grammar
// does not allow at -inf), then logit_bias added to the logits (OpenAI's; -inf bans an id), then
// transformers' repetition penalty over the row's context (every id of its prompt and output so far, kept
// between steps in PenaltyPool: the engine sends each step's new ids), then OpenAI's frequency and presence
// penalties over the row's output alone (vLLM's apply_penalties: l -= frequency x count + presence x
// (count > 0), the counts kept in the same pool), then temperature, top_k, top_p
// (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper);
// temperature 0 (and any below kMinSamplingTemperature) is greedy: the argmax of the
// penalised logits, the first index among equal maxima (torch.argmax). A sampled row takes the first
// token, in vocabulary order, whose cumulative probability exceeds uniform x total (RowSampling::uniform:
// the request's own draw), never a token of probability zero; one whose processed scores overflowed to
// +inf takes their argmax instead (transformers fails in torch.multinomial on the NaNs). Every operation
// is row-wise, so a row's token does not depend on the other rows of its batch. Log-probabilities are
// log_softmax of the raw float32 logits (of a constrained row, of its masked logits: vLLM's).

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/executor/executor.h"

namespace strata::runtime {

// Everything sampling needs for the rows that sample, staged on the host when the micro-batch is built
// (engine thread), in pinned memory when `pinned` (the last stage is CUDA) so the device copies are
// non_blocking. Rows are in the order given to StageSamplingInputs, one per logits row.
struct SamplingInputs {
  // float64 [rows, kSamplingParams]: temperature, top_k, top_p, repetition_penalty, uniform,
  // frequency_penalty, presence_penalty.
  at::Tensor params;
  // The penalties' updates (PenaltyPool), undefined when no row has a penalty. int64 [rows]: each row's
  // slot (0, always empty, for rows without a penalty); int64 [rows, longest]: the ids each row adds to
  // its slot's context (penalty_tokens) and output (output_tokens), -1 past its end; int64 [resets]: the
  // slots that start empty this step.
  at::Tensor penalty_slots;
  at::Tensor penalty_tokens;
  at::Tensor output_tokens;
  at::Tensor penalty_resets;
  // int64 [rows, longest], undefined when no row has any: ids each row's penalties count as seen and generated on top
  // of its slot's, without adding them to it (BatchRow::penalty_pending: a verified position's proposals before it).
  at::Tensor penalty_pending;
  // logit_bias, undefined when no row has one: int64 [rows, longest] ids (vocab past a row's end), float32
  // [rows, longest] what is added to them.
  at::Tensor bias_ids;
  at::Tensor bias_values;
  // Structured outputs: per row, the ids it may choose (null: every id), waited for when sampling.
  std::vector<std::shared_ptr<AllowedTokens>> allowed;
  int64_t penalty_capacity = 0;           // slots the pool must have
  std::vector<int32_t> row_top_logprobs;  // per row, for unpacking
  int64_t top_logprobs = 0;               // the largest of row_top_logprobs: columns copied back
  bool greedy_only = true;                // every row has temperature 0: no warpers, no draw
  bool any_penalty = false;               // some row has a repetition penalty
  bool any_output_penalty = false;        // some row has a frequency or presence penalty
  bool any_bias = false;
  bool any_allowed = false;  // some row is constrained
  bool any_top_k = false;    // some sampled row has 0 < top_k
  bool any_top_p = false;    // some sampled row has top_p < 1
  // Draft-model proposals (RowSampling::draft_token), undefined when no row has one: float64 [rows, 2] (the
  // proposed id or -1, the acceptance draw) and float32 [rows, vocab] q (zeros for rows without one).
  at::Tensor draft;
  at::Tensor draft_probs;
  bool any_draft = false;
  // The rows whose processed distributions come back (RowSampling::return_probs), in order.
  std::vector<int64_t> probs_rows;
  int64_t rows() const { return static_cast<int64_t>(row_top_logprobs.size()); }
};
inline constexpr int64_t kSamplingParams = 7;

// Which slot of the penalty pool holds each penalised sequence's seen ids: assigned at staging, on the
// engine's thread; freed when the engine releases the sequence. Slot 0 stays empty (rows without a penalty).
class PenaltySlots {
 public:
  // The sequence's slot, and whether it is new (so it starts empty).
  std::pair<int64_t, bool> SlotOf(uint64_t sequence);
  void Release(uint64_t sequence);
  int64_t capacity() const { return next_; }

 private:
  std::unordered_map<uint64_t, int64_t> slots_;
  std::vector<int64_t> free_;
  int64_t next_ = 1;
};

// The seen ids themselves, on the sampling device: bool [slots, vocab + 1], and how often each was
// generated, float32 [slots, vocab + 1] (the last column takes padding and ids outside the vocabulary).
// Touched only where the micro-batches are sampled, in their order. A step updates only the tables its
// rows read: a sequence's penalties never change, so every step of it reads (and updates) the same ones.
class PenaltyPool {
 public:
  // Applies the inputs' resets and new ids, and returns each row's seen ids, bool [rows, vocab].
  at::Tensor Present(const SamplingInputs& inputs, at::Device device, int64_t vocab);
  // Likewise for the generated ids: each row's counts, float32 [rows, vocab].
  at::Tensor Counts(const SamplingInputs& inputs, at::Device device, int64_t vocab);

 private:
  at::Tensor pool_;
  at::Tensor counts_;
};

// `slots` may be null: every penalised row then gets a slot of its own and must carry its whole context
// (penalty_reset), as tests and the sampling probe do.
SamplingInputs StageSamplingInputs(const std::vector<const BatchRow*>& rows, bool pinned,
                                   PenaltySlots* slots = nullptr);

// The packed results of SampleAsync on their way to the host: float64 [rows, 2 + 2 * top_logprobs]
// (id, logprob, top ids, top logprobs); `ready` is recorded after the copy (none on the CPU, where the
// tensor is complete on return).
struct PendingSamples {
  at::Tensor host;
  at::Tensor ids;    // SampleAsync's: int64 [rows] on the logits' device, the ids chosen
  at::Tensor probs;  // float32 [probs_rows, vocab] on the host, when rows asked for them (SamplingInputs::probs_rows)
  std::optional<c10::Event> ready;
};

// Enqueues every step on logits' device, on its current stream, and ends with one non_blocking copy into
// pinned host memory. logits: float32 [inputs.rows(), vocab].
// `pool` may be null: a pool of this call's alone (rows staged without PenaltySlots).
PendingSamples SampleAsync(const at::Tensor& logits, const SamplingInputs& inputs, PenaltyPool* pool = nullptr);

// Ids (int64 on a device) on their way to the host, as SampleAsync's results: `host` and `ready`.
PendingSamples IdsToHostAsync(const at::Tensor& ids);

// Waits on `ready` (that event only: no device or stream synchronisation) and unpacks one token per row,
// each with its own top_logprobs, and (when `probs` is given) the distributions of the probs_rows, in order.
std::vector<GeneratedToken> FinishSamples(PendingSamples& pending, const SamplingInputs& inputs,
                                          std::vector<std::vector<float>>* probs = nullptr);

// Prompt log-probabilities: row i of logits (float32 [n, vocab]) scores targets[i] (a host int64 [n],
// pinned when logits are on CUDA): log_softmax of the raw logits at the target, and the `top` most likely
// tokens; packed and copied back as SampleAsync's results are. FinishScores unpacks them, row i keeping
// row_top[i] of its top tokens.
PendingSamples ScoreAsync(const at::Tensor& logits, const at::Tensor& targets, int64_t top);
std::vector<GeneratedToken> FinishScores(PendingSamples& pending, const std::vector<int32_t>& row_top);

// The logits with every id a row's mask forbids at -inf (rows without a mask unchanged): what SampleAsync starts
// from. `device_ops`: expand the bits with ATen ops (the path for CUDA logits) even on the CPU, where the bits are
// otherwise read in place (tests compare the two).
at::Tensor AllowedLogits(const at::Tensor& logits, const SamplingInputs& inputs, bool device_ops = false);

// The processed scores of every row, float32 [rows, vocab] on logits' device: bias, penalties, then (sampled
// rows only) temperature, top_k and top_p with removed tokens at -inf. Greedy rows get the penalised
// logits (generate applies no warper without do_sample). SampleAsync draws from exactly these.
at::Tensor ProcessedScores(const at::Tensor& logits, const SamplingInputs& inputs, PenaltyPool* pool = nullptr);

}  // namespace strata::runtime
