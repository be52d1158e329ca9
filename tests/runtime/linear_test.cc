// runtime/model/linear.h: strata's few-rows CPU kernel against at::linear on the same operands, over the
// shapes that exercise its tails (K not a multiple of 16, N not a multiple of 4, 1-33 rows: row streams, 4 x 4
// tiles and their partial tiles, and past kFewRows), with and
// without bias, float32 and bfloat16, one and two intra-op threads.
#include "runtime/model/linear.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/pointwise.h"
#include "kernels/targets.h"
#include "tests/runtime/intra_op_threads.h"

namespace strata::runtime {
namespace {

class LinearTest : public ::testing::TestWithParam<std::tuple<at::ScalarType, bool, int>> {};

TEST_P(LinearTest, MatchesAtLinear) {
  const auto [dtype, with_bias, threads] = GetParam();
  const IntraOpThreads scope(threads);
  const bool own = LinearUsesOwnKernel(at::randn({1, 16}).to(dtype), at::randn({4, 16}).to(dtype));
  int checked = 0;
  for (int64_t k : {1, 15, 16, 17, 100, 768, 1500}) {
    for (int64_t n : {1, 3, 4, 5, 130}) {
      for (int64_t rows : {1, 2, 3, 4, 5, 8, 9, 16, 17, 33}) {
        const at::Tensor w = at::randn({n, k}).to(dtype);
        const at::Tensor b = with_bias ? at::randn({n}).to(dtype) : at::Tensor();
        const at::Tensor x = at::randn({rows, 1, k}).to(dtype);  // [batch, tokens, K] as the model calls it
        const at::Tensor got = Linear(x, w, b);
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{rows, 1, n}));
        ASSERT_EQ(got.scalar_type(), dtype);
        // The reference in float32 from the same (possibly bfloat16-rounded) values: the kernel accumulates
        // in float32 and rounds once, as oneDNN does.
        const at::Tensor want32 = b.defined() ? at::linear(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat))
                                              : at::linear(x.to(at::kFloat), w.to(at::kFloat));
        const at::Tensor want = want32.to(dtype).to(at::kFloat);
        const double scale = std::sqrt(static_cast<double>(k));  // sums of k unit-variance products
        if (dtype == at::kFloat) {
          EXPECT_TRUE(at::allclose(got, want32, 1e-5, 1e-5 * scale)) << "k " << k << " n " << n << " rows " << rows;
        } else {
          // One bfloat16 step apart at most (float32 sums in another order can round to the neighbour).
          EXPECT_TRUE(at::allclose(got.to(at::kFloat), want, 1.0 / 128, 1e-3 * scale))
              << "k " << k << " n " << n << " rows " << rows;
        }
        EXPECT_EQ(LinearUsesOwnKernel(x, w), own && rows <= kFewRows);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 7 * 5 * 10);
  EXPECT_TRUE(own);  // every CPU runs strata's kernel (kernels/linear.h) for a row
}

INSTANTIATE_TEST_SUITE_P(DtypesBiasThreads, LinearTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16), ::testing::Bool(),
                                            ::testing::Values(1, 2)));

TEST(Linear, OtherOperandsFallBackToAtLinear) {
  const at::Tensor w = at::randn({8, 32});
  EXPECT_FALSE(LinearUsesOwnKernel(at::randn({kFewRows + 1, 32}), w));                   // prefill: many rows
  EXPECT_FALSE(LinearUsesOwnKernel(at::randn({1, 32}).to(at::kHalf), w.to(at::kHalf)));  // float16
  EXPECT_FALSE(LinearUsesOwnKernel(at::randn({1, 32}), w.to(at::kBFloat16)));            // mixed dtypes
  EXPECT_FALSE(LinearUsesOwnKernel(at::randn({1, 32}), w.t().contiguous().t()));         // a strided weight
  const at::Tensor x = at::randn({kFewRows + 1, 32});
  EXPECT_TRUE(at::allclose(Linear(x, w), at::linear(x, w)));
}

// bfloat16 prefill: on a CPU without AVX512_BF16 (and under the KernelsCappedAtAvx2 test's cap) widened to
// float32 block by block; several blocks at K 65536 (32 weight rows per 8 MiB block) and a partial last one.
TEST(Linear, Bf16PrefillMatchesAFloat32Reference) {
  for (const int threads : {1, 2}) {
    const IntraOpThreads scope(threads);
    for (const auto& [rows, k, n] :
         std::vector<std::tuple<int64_t, int64_t, int64_t>>{{kFewRows + 1, 100, 5}, {64, 768, 130}, {40, 65536, 70}}) {
      for (const bool with_bias : {false, true}) {
        const at::Tensor w = at::randn({n, k}).to(at::kBFloat16);
        const at::Tensor b = with_bias ? at::randn({n}).to(at::kBFloat16) : at::Tensor();
        const at::Tensor x = at::randn({1, rows, k}).to(at::kBFloat16);  // [batch, tokens, K]
        const at::Tensor got = Linear(x, w, b);
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{1, rows, n}));
        ASSERT_EQ(got.scalar_type(), at::kBFloat16);
        const at::Tensor want32 = b.defined() ? at::linear(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat))
                                              : at::linear(x.to(at::kFloat), w.to(at::kFloat));
        const double scale = std::sqrt(static_cast<double>(k));
        EXPECT_TRUE(at::allclose(got.to(at::kFloat), want32.to(at::kBFloat16).to(at::kFloat), 1.0 / 128, 1e-3 * scale))
            << "rows " << rows << " k " << k << " n " << n;
        EXPECT_EQ(LinearWidensBf16(x, w), !kernels::Bf16DotAvailable());
        EXPECT_FALSE(LinearUsesOwnKernel(x, w));
      }
    }
  }
}

// STRATA_CPU_ISA caps strata's kernels (kernels/targets.h): the KernelsCappedAtAvx2 test runs this suite
// with it set; without it the CPU's own instruction sets decide.
TEST(CpuIsa, TheCapIsHonoured) {
  const char* cap = std::getenv("STRATA_CPU_ISA");
  if (cap != nullptr && std::string(cap) == "avx2") {
    EXPECT_FALSE(kernels::Avx512Allowed());
    EXPECT_FALSE(kernels::Bf16DotAvailable());
    EXPECT_EQ(std::string(kernels::KernelTarget()), "AVX2");
  } else {
    EXPECT_EQ(kernels::Avx512Allowed(), __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                            __builtin_cpu_supports("avx512vl"));
    EXPECT_EQ(kernels::Bf16DotAvailable(), kernels::Avx512Allowed() && __builtin_cpu_supports("avx512bf16"));
  }
}

}  // namespace
}  // namespace strata::runtime
