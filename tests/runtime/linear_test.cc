// runtime/model/linear.h: strata's few-rows CPU kernel against at::linear on the same operands, over the
// shapes that exercise its tails (K not a multiple of 16, N not a multiple of 4, 1-33 rows: row streams, 4 x 4
// tiles and their partial tiles, and past kFewRows), with and
// without bias, float32 and bfloat16, one and two intra-op threads.
#include "runtime/model/linear.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
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

// A weight in panels (as CPU linear layers are packed at load) against at::linear in float32 on the same
// values: decode rows, tiles, and prefill rows past L2 (blocks of rows against groups of panels), N with a narrow
// last panel, one and two threads; WeightRows of panels: whole panels as views, a cut panel unpacked.
TEST(Linear, PanelsMatchAFloat32Reference) {
  for (const int threads : {1, 2}) {
    const IntraOpThreads scope(threads);
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (const auto& [rows, k, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
               {1, 768, 200}, {2, 100, 40}, {16, 768, 130}, {33, 300, 16}, {300, 520, 600}}) {
        const at::Tensor w = at::randn({n, k}).to(dtype);
        const at::Tensor b = at::randn({n}).to(dtype);
        PanelWeight panels{at::empty({n * k}, w.options()), n, k};
        PackPanels(w, panels.data);
        EXPECT_TRUE(at::equal(UnpackPanels(panels), w));
        const at::Tensor x = at::randn({1, rows, k}).to(dtype);
        const at::Tensor got = Linear(x, panels, b);
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{1, rows, n}));
        ASSERT_EQ(got.scalar_type(), dtype);
        const at::Tensor want = at::linear(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat));
        const double scale = std::sqrt(static_cast<double>(k));
        if (dtype == at::kFloat) {
          EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5 * scale)) << "rows " << rows << " k " << k << " n " << n;
        } else {
          EXPECT_TRUE(at::allclose(got.to(at::kFloat), want.to(dtype).to(at::kFloat), 1.0 / 128, 1e-3 * scale))
              << "rows " << rows << " k " << k << " n " << n;
        }
        // WeightRows: [16, 48) whole panels (a view of the same bytes), [5, 37) cuts two (unpacked).
        const WeightTensor whole{{}, nullptr, std::make_shared<const PanelWeight>(panels)};
        if (n >= 48) {
          const WeightTensor view = WeightRows(whole, 16, 32);
          ASSERT_NE(view.panels, nullptr);
          EXPECT_EQ(view.panels->data.data_ptr(),
                    static_cast<char*>(panels.data.data_ptr()) + 16 * k * w.element_size());
          EXPECT_TRUE(at::equal(Linear(x, view, b.narrow(0, 16, 32)), got.narrow(2, 16, 32)));
          const WeightTensor cut = WeightRows(whole, 5, 32);
          ASSERT_EQ(cut.panels, nullptr);
          EXPECT_TRUE(at::equal(cut.tensor, w.narrow(0, 5, 32)));
        }
      }
    }
  }
}

// LinearEach: q, k and v (or gate and up) in panels run as one split over the threads, each output exactly what
// its own Linear gives (the same tiles over the same panels); a weight not in panels makes every one its own
// Linear; weights of another K are refused, naming both counts.
TEST(LinearEach, OneSplitGivesWhatEachLinearGives) {
  for (const int threads : {1, 2}) {
    const IntraOpThreads scope(threads);
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (const int64_t rows : {1, 2, 16, 300}) {
        const int64_t k = 96;
        std::vector<WeightTensor> weights;
        std::vector<at::Tensor> dense;
        for (const int64_t n : {64, 40, 40}) {  // 40: a narrow last panel inside the split's numbering
          dense.push_back(at::randn({n, k}).to(dtype));
          auto panels = std::make_shared<PanelWeight>(PanelWeight{at::empty({n * k}, dense.back().options()), n, k});
          PackPanels(dense.back(), panels->data);
          weights.push_back({{}, nullptr, panels});
        }
        const at::Tensor biases[] = {at::randn({64}).to(dtype), at::Tensor(), at::randn({40}).to(dtype)};
        const WeightTensor* each[] = {&weights[0], &weights[1], &weights[2]};
        const at::Tensor x = at::randn({1, rows, k}).to(dtype);
        const std::vector<at::Tensor> got = LinearEach(x, each, biases);
        ASSERT_EQ(got.size(), 3u);
        for (size_t i = 0; i < 3; ++i) {
          EXPECT_TRUE(at::equal(got[i], Linear(x, weights[i], biases[i]))) << "weight " << i << " rows " << rows;
        }
        const WeightTensor stored{dense[1], nullptr, nullptr};
        const WeightTensor* mixed[] = {&weights[0], &stored, &weights[2]};
        const std::vector<at::Tensor> fallback = LinearEach(x, mixed, biases);
        EXPECT_TRUE(at::equal(fallback[0], got[0]));
        EXPECT_TRUE(at::allclose(fallback[1].to(at::kFloat), got[1].to(at::kFloat), 1.0 / 64, 1e-3));
      }
    }
  }
  const at::Tensor w = at::randn({16, 32});
  auto panels = std::make_shared<PanelWeight>(PanelWeight{at::empty({16 * 32}), 16, 32});
  PackPanels(w, panels->data);
  auto wide = std::make_shared<PanelWeight>(PanelWeight{at::empty({16 * 48}), 16, 48});
  PackPanels(at::randn({16, 48}), wide->data);
  const WeightTensor a{{}, nullptr, panels}, b{{}, nullptr, wide};
  const WeightTensor* two[] = {&a, &b};
  const at::Tensor none[] = {at::Tensor(), at::Tensor()};
  // b's K differs: not one split; its own Linear refuses x of 32 features, naming them.
  try {
    LinearEach(at::randn({1, 32}), two, none);
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("input of 48 features"), std::string::npos) << e.what();
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
