#include "runtime/sampler.h"

#include <ATen/ops/argmax.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/topk.h>

namespace strata::runtime {

GreedyStep SampleGreedy(const at::Tensor& logits, int64_t top_k) {
  at::Tensor logprobs = at::log_softmax(logits, -1);
  at::Tensor ids = at::argmax(logits, -1, /*keepdim=*/true);
  at::Tensor chosen = logprobs.gather(-1, ids);
  at::Tensor ids_cpu = ids.to(at::kCPU).contiguous();
  at::Tensor chosen_cpu = chosen.to(at::kCPU, at::kDouble).contiguous();
  const int64_t rows = logits.size(0);
  GreedyStep step;
  step.ids.resize(rows);
  step.logprobs.resize(rows);
  step.top.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    step.ids[r] = ids_cpu.data_ptr<int64_t>()[r];
    step.logprobs[r] = chosen_cpu.data_ptr<double>()[r];
  }
  if (top_k > 0) {
    auto [values, indices] = at::topk(logprobs, std::min(top_k, logits.size(-1)), -1);
    at::Tensor v = values.to(at::kCPU, at::kDouble).contiguous();
    at::Tensor i = indices.to(at::kCPU).contiguous();
    const int64_t k = v.size(1);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        step.top[r].push_back({i.data_ptr<int64_t>()[r * k + j], v.data_ptr<double>()[r * k + j]});
      }
    }
  }
  return step;
}

}  // namespace strata::runtime
