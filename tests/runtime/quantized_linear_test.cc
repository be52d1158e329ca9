// LinearPacked against at::linear on the dequantized weight, over every path it takes: the kernels on packed
// bytes (up to 4 rows), dequantized blocks on the dense tiles (5-32 rows), dequantized blocks into a GEMM
// (prefill), float32 and bfloat16 activations, FP8 and int4/int8, act-order columns, bias.

#include "runtime/model/quantized_linear.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/quantized.h"
#include "runtime/model/linear.h"

namespace strata::runtime {
namespace {

PackedLinear RandomFp8(int64_t n, int64_t k, int64_t block_n, int64_t block_k) {
  PackedLinear w;
  w.kind = PackedLinear::Kind::kFp8;
  w.out_features = n;
  w.in_features = k;
  w.block_n = block_n;
  w.block_k = block_k;
  // Every finite e4m3 code (0x7f and 0xff are NaN).
  w.data = at::randint(0, 0x7f, {n, k}, at::kByte) + at::randint(0, 2, {n, k}, at::kByte) * 0x80;
  w.scale = at::rand({(n + block_n - 1) / block_n, (k + block_k - 1) / block_k}) * 0.01 + 0.001;
  return w;
}

PackedLinear RandomInt(int bits, int64_t n, int64_t k, int64_t group, bool zeros, at::ScalarType scale_dtype) {
  PackedLinear w;
  w.kind = bits == 4 ? PackedLinear::Kind::kInt4 : PackedLinear::Kind::kInt8;
  w.out_features = n;
  w.in_features = k;
  w.group = group;
  const at::Tensor codes = at::randint(0, 1 << bits, {n, k}, at::kByte);
  if (bits == 8) {
    w.data = codes;
  } else {
    w.data = at::empty({n, k / 2}, at::kByte);
    kernels::PackInt4(codes.data_ptr<uint8_t>(), n, k, w.data.data_ptr<uint8_t>());
  }
  w.scale = (at::rand({n, k / group}) * 0.02 + 0.001).to(scale_dtype);
  if (zeros) w.zero = at::randint(0, 1 << bits, {n, k / group}, at::kByte);
  return w;
}

void ExpectMatches(const PackedLinear& w, at::ScalarType dtype, int64_t rows, bool bias) {
  at::Tensor x = at::randn({1, rows, w.in_features}).to(dtype);
  at::Tensor b = bias ? at::randn({w.out_features}).to(dtype) : at::Tensor();
  const at::Tensor got = LinearPacked(x, w, b).to(at::kFloat);
  // The reference: the dequantized weight in float32 sums. The kernels use each product of a code and its scale
  // unrounded, where Dequantize rounds it through a 16-bit scale's dtype (the formats' references do): float32
  // activations up to kFewRows rows are compared with the unrounded products; prefill (past kFewRows: blocks of
  // Dequantize) and bfloat16 ones (rounded anyway) with Dequantize's.
  PackedLinear exact = w;
  if (dtype == at::kFloat && rows <= kFewRows) exact.scale = w.scale.to(at::kFloat);
  at::Tensor dense = Dequantize(exact, dtype).to(at::kFloat);
  at::Tensor xs = x.to(at::kFloat);
  if (w.perm.defined()) {
    // Act-order: the packed columns are x's columns in `perm` order.
    xs = xs.index_select(-1, w.perm);
  }
  const at::Tensor want = at::linear(xs, dense, bias ? b.to(at::kFloat) : at::Tensor());
  const double scale = at::linear(xs.abs(), dense.abs()).max().item<double>() + 1.0;
  const double tolerance = dtype == at::kFloat ? 1e-5 : 2e-2;
  const double worst = (got - want).abs().max().item<double>() / scale;
  EXPECT_LE(worst, tolerance) << "rows " << rows << " dtype " << at::toString(dtype) << " bias " << bias;
}

TEST(LinearPacked, Fp8EveryPathMatchesTheDequantizedWeight) {
  at::manual_seed(1);
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{256, 256}, {200, 320}}) {
    const PackedLinear w = RandomFp8(n, k, 128, 128);
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t rows : {1, 2, 4, 5, 16, 32, 40}) {
        ExpectMatches(w, dtype, rows, rows % 2 == 0);
      }
    }
  }
}

TEST(LinearPacked, IntegerLayoutsEveryPathMatchTheDequantizedWeight) {
  at::manual_seed(2);
  for (int bits : {4, 8}) {
    for (bool zeros : {false, true}) {
      for (at::ScalarType scale_dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
        const PackedLinear w = RandomInt(bits, 96, 256, 64, zeros, scale_dtype);
        for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
          for (int64_t rows : {1, 3, 8, 32, 33}) ExpectMatches(w, dtype, rows, rows == 8);
        }
      }
    }
  }
}

TEST(LinearPacked, ActOrderGathersTheInputColumns) {
  at::manual_seed(3);
  PackedLinear w = RandomInt(4, 64, 128, 32, true, at::kHalf);
  w.perm = at::randperm(128, at::kLong);
  for (int64_t rows : {1, 6, 40}) ExpectMatches(w, at::kFloat, rows, false);
}

TEST(LinearPacked, RowsOfAFusedWeightRunAlone) {
  at::manual_seed(4);
  const PackedLinear w = RandomFp8(384, 256, 128, 128);
  const PackedLinear middle = PackedRows(w, 128, 128);
  const at::Tensor x = at::randn({1, 3, 256});
  const at::Tensor whole = LinearPacked(x, w, {});
  EXPECT_TRUE(at::allclose(LinearPacked(x, middle, {}), whole.narrow(-1, 128, 128), 1e-5, 1e-5));
  EXPECT_THROW(PackedRows(w, 64, 128), c10::Error);  // not on the scale blocks
}

TEST(LinearPacked, AtenDequantizationEqualsTheKernels) {
  at::manual_seed(5);
  const PackedLinear fp8 = RandomFp8(200, 320, 128, 128);
  const PackedLinear int4 = RandomInt(4, 64, 160, 32, true, at::kBFloat16);
  for (const PackedLinear* w : {&fp8, &int4}) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      EXPECT_TRUE(at::equal(Dequantize(*w, dtype), DequantizeWithAten(*w, dtype)));
      const int64_t end = std::min<int64_t>(90, w->out_features);
      EXPECT_TRUE(at::equal(Dequantize(*w, dtype, 17, end), DequantizeWithAten(*w, dtype, 17, end)));
    }
  }
}

}  // namespace
}  // namespace strata::runtime
