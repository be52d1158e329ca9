#pragma once
// Internal (ATen): choosing the next token from logits. Greedy (strata-generate) and the engine's
// per-row sampling with transformers' logits processors, with the log-probabilities transformers reports:
// log_softmax of the float32 logits.

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <optional>
#include "runtime/executor/executor.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace strata::runtime {

struct GreedyStep {
  std::vector<int64_t> ids;       // per row: argmax (the first index among equal maxima, as torch.argmax)
  std::vector<double> logprobs;   // per row: log-probability of that id
  std::vector<std::vector<std::pair<int64_t, double>>> top;  // per row: the top_k (id, logprob), best first
};

// logits: float32 [rows, vocab] on any device; one copy of the small results reaches the host.
GreedyStep SampleGreedy(const at::Tensor& logits, int64_t top_k);

// How one row picks its token, in transformers' order: repetition penalty over `context` (the prompt and
// what was generated: a logit l becomes l / p when positive, l * p otherwise), then temperature, top_k,
// top_p (the smallest set of most likely tokens whose probability reaches top_p; at least one). With
// temperature 0 the choice is the argmax of the penalised logits; otherwise the token where the
// cumulative probability (in vocabulary order) first exceeds `uniform` of the total — one uniform draw
// per step from the request's own generator, so a seeded request samples the same whatever its batch.
struct RowChoice {
  float temperature = 0;
  int64_t top_k = 0;
  double top_p = 1;
  double repetition_penalty = 1;
  const std::vector<int32_t>* context = nullptr;  // needed when repetition_penalty != 1
  double uniform = 0;                             // in [0, 1)
  int64_t top_logprobs = 0;
};

// logits: float32 [rows, vocab]; `rows` one per logits row. Log-probabilities are of the raw logits.
GreedyStep SampleRows(const at::Tensor& logits, const std::vector<RowChoice>& rows);

// PROVISIONAL (replaced by the device sampler): the executor's interface to sampling.
struct SamplingInputs {
  std::vector<RowSampling> rows;
  std::vector<std::vector<int32_t>> contexts;
};
SamplingInputs StageSamplingInputs(const std::vector<const BatchRow*>& rows, bool pinned);
struct PendingSamples {
  std::vector<SampledToken> done;
};
PendingSamples SampleAsync(const at::Tensor& logits, const SamplingInputs& inputs);
std::vector<SampledToken> FinishSamples(PendingSamples& pending, const SamplingInputs& inputs);

}  // namespace strata::runtime
