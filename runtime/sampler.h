#pragma once
// Internal (ATen): choosing the next token from logits. Greedy for now (what strata-generate offers),
// with the log-probabilities transformers reports: log_softmax of the float32 logits.

#include <ATen/core/Tensor.h>

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

}  // namespace strata::runtime
