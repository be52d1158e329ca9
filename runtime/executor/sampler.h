#pragma once
// Internal (ATen): choosing the next token of every sampling row of a micro-batch, on the device of the
// logits, in one pass over the whole batch: no .item(), no synchronous copy, no host loop over the
// vocabulary. The rows' parameters travel to the device as tensors staged (pinned) with the micro-batch;
// the results (ids, logprobs, top logprobs) come back in ONE non_blocking copy followed by an event.
//
// Semantics (transformers' generate): repetition penalty over the row's context, then temperature,
// top_k, top_p (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
// TopPLogitsWarper); temperature 0 (and any below kMinSamplingTemperature) is greedy: the argmax of the
// penalised logits, the first index among equal maxima (torch.argmax). A sampled row takes the first
// token, in vocabulary order, whose cumulative probability exceeds uniform x total (RowSampling::uniform:
// the request's own draw), never a token of probability zero; one whose processed scores overflowed to
// +inf takes their argmax instead (transformers fails in torch.multinomial on the NaNs). Every operation
// is row-wise, so a row's token does not depend on the other rows of its batch. Log-probabilities are
// log_softmax of the raw float32 logits.

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/executor/executor.h"

namespace strata::runtime {

// Everything sampling needs for the rows that sample, staged on the host when the micro-batch is built
// (engine thread), in pinned memory when `pinned` (the last stage is CUDA) so the device copies are
// non_blocking. Rows are in the order given to StageSamplingInputs, one per logits row.
struct SamplingInputs {
  // float64 [rows, kSamplingParams]: temperature, top_k, top_p, repetition_penalty, uniform.
  at::Tensor params;
  // int64 [rows, longest context], -1 past a row's end; rows without a penalty are all -1. Undefined
  // when no row has a penalty.
  at::Tensor context;
  std::vector<int32_t> row_top_logprobs;  // per row, for unpacking
  int64_t top_logprobs = 0;               // the largest of row_top_logprobs: columns copied back
  bool greedy_only = true;                // every row has temperature 0: no warpers, no draw
  bool any_penalty = false;
  bool any_top_k = false;  // some sampled row has 0 < top_k
  bool any_top_p = false;  // some sampled row has top_p < 1
  int64_t rows() const { return static_cast<int64_t>(row_top_logprobs.size()); }
};
inline constexpr int64_t kSamplingParams = 5;

SamplingInputs StageSamplingInputs(const std::vector<const BatchRow*>& rows, bool pinned);

// The packed results of SampleAsync on their way to the host: float64 [rows, 2 + 2 * top_logprobs]
// (id, logprob, top ids, top logprobs); `ready` is recorded after the copy (none on the CPU, where the
// tensor is complete on return).
struct PendingSamples {
  at::Tensor host;
  std::optional<c10::Event> ready;
};

// Enqueues every step on logits' device, on its current stream, and ends with one non_blocking copy into
// pinned host memory. logits: float32 [inputs.rows(), vocab].
PendingSamples SampleAsync(const at::Tensor& logits, const SamplingInputs& inputs);

// Waits on `ready` (that event only: no device or stream synchronisation) and unpacks one token per row,
// each with its own top_logprobs.
std::vector<GeneratedToken> FinishSamples(PendingSamples& pending, const SamplingInputs& inputs);

// The processed scores of every row, float32 [rows, vocab] on logits' device: penalty, then (sampled
// rows only) temperature, top_k and top_p with removed tokens at -inf. Greedy rows get the penalised
// logits (generate applies no warper without do_sample). SampleAsync draws from exactly these.
at::Tensor ProcessedScores(const at::Tensor& logits, const SamplingInputs& inputs);

}  // namespace strata::runtime
