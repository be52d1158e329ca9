// The fused experts' two forms (moe.h): the padded batched form, which keeps the group sizes on the device (the
// CUDA path for float16 and float32), equals LibTorch's grouped matmul on the same sorted rows.

#include "runtime/model/moe.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

struct Routed {
  at::Tensor rows, sorted_experts, offsets;
};

// `tokens` tokens each routed to k distinct experts (token t's choices from `choice`), sorted by expert as
// SparseMoe sorts them.
Routed Route(const at::Tensor& flat, const std::vector<std::vector<int64_t>>& choice, int64_t experts) {
  std::vector<int64_t> pairs;
  for (const auto& c : choice) pairs.insert(pairs.end(), c.begin(), c.end());
  const int64_t k = static_cast<int64_t>(choice.front().size());
  at::Tensor pair_experts = at::tensor(pairs, at::kLong);
  auto [sorted, order] = at::sort(pair_experts);
  Routed r;
  r.rows = flat.index_select(0, order.div(k, "floor"));
  r.sorted_experts = sorted;
  r.offsets = at::histc(sorted.to(at::kFloat), experts, 0, static_cast<double>(experts - 1)).cumsum(0, at::kInt);
  return r;
}

TEST(MoeExperts, PaddedFormEqualsTheGroupedMatmul) {
  at::manual_seed(3);
  const int64_t experts = 6, hidden = 16, inter = 8;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor gate_up = at::randn({experts, 2 * inter, hidden}, dtype);
    const at::Tensor down = at::randn({experts, hidden, inter}, dtype);
    // Experts 4 and 5 get nothing; expert 0 gets every token (its group as long as the padding allows).
    const std::vector<std::vector<int64_t>> choice = {{0, 2}, {3, 0}, {0, 1}, {2, 0}, {0, 3}};
    const int64_t tokens = static_cast<int64_t>(choice.size());
    const at::Tensor flat = at::randn({tokens, hidden}, dtype);
    const Routed r = Route(flat, choice, experts);
    const at::Tensor grouped = GroupedExpertsMlp(r.rows, r.offsets, gate_up, down);
    const at::Tensor padded = PaddedExpertsMlp(r.rows, r.sorted_experts, r.offsets, gate_up, down, tokens);
    ASSERT_EQ(padded.sizes(), grouped.sizes());
    const double tolerance = dtype == at::kFloat ? 1e-5 : 2e-2;
    EXPECT_TRUE(at::allclose(padded.to(at::kFloat), grouped.to(at::kFloat), tolerance, tolerance))
        << (padded - grouped).abs().max().item<double>();
    // One token: the decode case.
    const Routed one = Route(flat.narrow(0, 0, 1), {{5, 1}}, experts);
    EXPECT_TRUE(
        at::allclose(PaddedExpertsMlp(one.rows, one.sorted_experts, one.offsets, gate_up, down, 1).to(at::kFloat),
                     GroupedExpertsMlp(one.rows, one.offsets, gate_up, down).to(at::kFloat), tolerance, tolerance));
  }
}

}  // namespace
}  // namespace strata::runtime
