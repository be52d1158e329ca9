// runtime/model/pointwise.h: the fused RMSNorm and SiLU * up against the ATen expressions they replace
// (transformers' LlamaRMSNorm and LlamaMLP), float32 and bfloat16, widths with and without a tail of 16,
// one and many rows, one and two intra-op threads; and the values at the edges (large gates, NaN).
#include "runtime/model/pointwise.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/all.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tensor.h>

#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/rope.h"
#include "tests/runtime/intra_op_threads.h"

namespace strata::runtime {
namespace {

at::Tensor AtenRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor x32 = x.to(at::kFloat);
  x32 = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * x32.to(x.scalar_type());
}

// float32: a few ulps (summation order, exp's last bits). bfloat16: equal, except where float32 values one
// ulp apart straddle a bfloat16 rounding boundary: a step there, which the second rounding (the product)
// can make two, in a small share of the elements.
void ExpectClose(const at::Tensor& got, const at::Tensor& want, const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes());
  ASSERT_EQ(got.scalar_type(), want.scalar_type());
  if (got.scalar_type() == at::kFloat) {
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << what;
    return;
  }
  EXPECT_TRUE(at::allclose(got.to(at::kFloat), want.to(at::kFloat), 1.0 / 64, 1e-6)) << what;
  const double differ = at::ne(got, want).sum().item<double>() / static_cast<double>(got.numel());
  EXPECT_LT(differ, 0.01) << what << ": " << differ * 100 << "% of the bfloat16 values differ";
}

class PointwiseTest : public ::testing::TestWithParam<std::tuple<at::ScalarType, int>> {};

TEST_P(PointwiseTest, MatchesTheAtenExpressions) {
  const auto [dtype, threads] = GetParam();
  const IntraOpThreads scope(threads);
  for (int64_t width : {1, 15, 64, 768, 1000}) {
    for (int64_t rows : {1, 3, 200}) {
      const at::Tensor x = (at::randn({1, rows, width}) * 3).to(dtype);
      const at::Tensor weight = at::randn({width}).to(dtype);
      ASSERT_TRUE(FusedPointwiseApplies(x, weight));
      const std::string what = "width " + std::to_string(width) + " rows " + std::to_string(rows);
      ExpectClose(FusedRmsNorm(x, weight, 1e-5), AtenRmsNorm(x, weight, 1e-5), ("rms " + what).c_str());
      const at::Tensor gate = (at::randn({1, rows, width}) * 4).to(dtype);
      ExpectClose(FusedSiluMul(gate, x), at::silu(gate) * x, ("silu " + what).c_str());
      ExpectClose(SiluMul(gate, x), at::silu(gate) * x, ("SiluMul " + what).c_str());
      // gpt-oss's limit 7 and alpha 1.702 (GptOssExperts), gates and ups past the limit on both sides.
      const at::Tensor g7 = gate.clamp_max(7.0), u7 = x.clamp(-7.0, 7.0);
      ExpectClose(FusedClampedSwiglu(gate, x, 7.0, 1.702), (u7 + 1) * (g7 * at::sigmoid(g7 * 1.702)),
                  ("clamped swiglu " + what).c_str());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesThreads, PointwiseTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16), ::testing::Values(1, 2)));

TEST(Pointwise, EdgeValues) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    // Gates far past exp's range: silu(-200) is -0 and silu(200) is 200, as at::silu.
    const at::Tensor gate = at::tensor(std::vector<float>{-200.f, -90.f, -30.f, 0.f, 30.f, 90.f, 200.f}).to(dtype);
    const at::Tensor up = at::full({7}, 1.5, at::TensorOptions().dtype(dtype));
    EXPECT_TRUE(at::equal(FusedSiluMul(gate, up), at::silu(gate) * up)) << dtype;
    // NaN stays NaN through both (non-finite logits are detected downstream).
    const at::Tensor nan = at::tensor(std::vector<float>{1.f, NAN, 2.f}).to(dtype);
    const at::Tensor ones = at::full({3}, 1.0, at::TensorOptions().dtype(dtype));
    EXPECT_TRUE(at::isnan(FusedSiluMul(nan, ones))[1].item<bool>()) << dtype;
    EXPECT_TRUE(at::isnan(FusedRmsNorm(nan, ones, 1e-6)).all().item<bool>()) << dtype;
    // The clamps keep NaN, as torch.clamp does (a min / max instruction would make it the limit).
    EXPECT_TRUE(at::isnan(FusedClampedSwiglu(nan, ones, 7.0, 1.702))[1].item<bool>()) << dtype;
    EXPECT_TRUE(at::isnan(FusedClampedSwiglu(ones, nan, 7.0, 1.702))[1].item<bool>()) << dtype;
    EXPECT_TRUE(at::equal(FusedClampedSwiglu(gate, up, 7.0, 1.702),
                          (up.clamp(-7.0, 7.0) + 1) * (gate.clamp_max(7.0) * at::sigmoid(gate.clamp_max(7.0) * 1.702))))
        << dtype;
  }
  // Other operands keep ATen: float16, mixed dtypes, a strided view.
  const at::Tensor x = at::randn({4, 32});
  EXPECT_FALSE(FusedPointwiseApplies(x.to(at::kHalf), at::randn({32}).to(at::kHalf)));
  EXPECT_FALSE(FusedPointwiseApplies(x, at::randn({32}).to(at::kBFloat16)));
  EXPECT_FALSE(FusedPointwiseApplies(x.t(), at::randn({4})));
  EXPECT_TRUE(at::allclose(SiluMul(x.t(), x.t()), at::silu(x.t()) * x.t()));
}

// ApplyRope's kernel (decode rows and chunks of q / k as GroupHeads views them) against the ATen expression it
// replaces, bit for bit in float32 and bfloat16: head dims with and without a vector tail, one and several tokens
// and rows; and the layouts it leaves to ATen (contiguous [B, H, T, D] with T > 1, partial rotary) unchanged.
TEST(Rope, FusedEqualsTheAtenExpressionBitForBit) {
  auto aten = [](const at::Tensor& x, const RopeTables& t) {
    const int64_t half = x.size(-1) / 2;
    const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
    return x * t.cos.unsqueeze(1) + rotated * t.sin.unsqueeze(1);
  };
  planner::RopeConfig config;
  config.theta = 10000.0;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t dim : {6, 64, 80, 128}) {
      const at::Tensor inv_freq = RopeInvFreq(config, dim);
      for (int64_t batch : {1, 3}) {
        for (int64_t tokens : {1, 5}) {
          const int64_t heads = 4;
          const at::Tensor positions = at::arange(batch * tokens, at::kLong).view({batch, tokens}) * 37 + 3;
          const RopeTables tables = RopeForPositions(inv_freq, positions, dtype);
          // GroupHeads' view: [B, T, H, D] memory seen as [B, H, T, D].
          const at::Tensor x = (at::randn({batch, tokens, heads, dim}) * 2).to(dtype).transpose(1, 2);
          const std::string what = std::string(at::toString(dtype)) + " dim " + std::to_string(dim) + " batch " +
                                   std::to_string(batch) + " tokens " + std::to_string(tokens);
          const at::Tensor got = ApplyRope(x, tables);
          ASSERT_EQ(got.sizes(), x.sizes()) << what;
          EXPECT_TRUE(at::equal(got, aten(x, tables))) << what;
          const at::Tensor plain = x.contiguous();
          EXPECT_TRUE(at::equal(ApplyRope(plain, tables), aten(plain, tables))) << what << " contiguous";
        }
      }
    }
  }
  // Partial rotary (tables narrower than the head): the first dims rotate, the rest pass through, through ATen.
  const at::Tensor inv_freq = RopeInvFreq(config, 32);
  const RopeTables tables = RopeForPositions(inv_freq, at::arange(2, at::kLong).view({1, 2}), at::kFloat);
  const at::Tensor x = at::randn({1, 2, 4, 64}).transpose(1, 2);
  const at::Tensor got = ApplyRope(x, tables);
  EXPECT_TRUE(at::equal(got.narrow(-1, 0, 32), aten(x.narrow(-1, 0, 32), tables)));
  EXPECT_TRUE(at::equal(got.narrow(-1, 32, 32), x.narrow(-1, 32, 32)));
}

}  // namespace
}  // namespace strata::runtime
