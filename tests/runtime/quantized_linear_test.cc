// LinearPacked against at::linear on the dequantized weight, over every path it takes: the kernels on packed
// bytes (up to 4 rows), dequantized blocks on the dense tiles (5-32 rows), dequantized blocks into a GEMM
// (prefill), float32 and bfloat16 activations, FP8, int4/int8 and MXFP4, act-order columns, bias. MXFP4's
// dequantization against its definition, bit for bit, and Mxfp4Linear's checks.

#include "runtime/model/quantized_linear.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/quantized.h"
#include "runtime/executor/torch_info.h"
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

// MXFP4 codes and scale bytes drawn from [s_lo, s_hi], through Mxfp4Linear (blocks [n, k / 32, 16]).
PackedLinear RandomMxfp4(int64_t n, int64_t k, int s_lo, int s_hi) {
  const at::Tensor blocks = at::randint(0, 256, {n, k / 32, 16}, at::kByte);
  const at::Tensor scales = at::randint(s_lo, s_hi + 1, {n, k / 32}, at::kByte);
  absl::StatusOr<PackedLinear> w = Mxfp4Linear(blocks, scales, "experts.gate_up_proj");
  TORCH_CHECK(w.ok(), w.status().ToString());
  return *w;
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
  const bool integer = w.kind == PackedLinear::Kind::kInt4 || w.kind == PackedLinear::Kind::kInt8;
  if (integer && dtype == at::kFloat && rows <= kFewRows) exact.scale = w.scale.to(at::kFloat);
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
        // Groups of 64 and 128: int4 bfloat16 rows keep the packed VDPBF16PS tiles up to 32 rows where the CPU has
        // them.
        for (int64_t group : {64, 128}) {
          const PackedLinear w = RandomInt(bits, 96, 256, group, zeros, scale_dtype);
          for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
            for (int64_t rows : {1, 3, 8, 32, 33}) ExpectMatches(w, dtype, rows, rows == 8);
          }
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
  const PackedLinear mxfp4 = RandomMxfp4(100, 160, 0, 252);
  for (const PackedLinear* w : {&fp8, &int4, &mxfp4}) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      EXPECT_TRUE(at::equal(Dequantize(*w, dtype), DequantizeWithAten(*w, dtype)));
      const int64_t end = std::min<int64_t>(90, w->out_features);
      EXPECT_TRUE(at::equal(Dequantize(*w, dtype, 17, end), DequantizeWithAten(*w, dtype, 17, end)));
    }
  }
}

// --fp8-matmul scaled_mm's activations, on the CPU (the quantization is ATen ops; _scaled_mm's block scaling is
// CUDA's): each row's blocks of 128 columns scaled by amax / 448, codes rounded once to e4m3, and the scales laid out
// outer-dim-major.
TEST(ScaledMm, ActivationsAreQuantizedPerRowAndBlockOf128) {
  at::manual_seed(6);
  at::Tensor x = at::randn({5, 384}) * 3;
  x[2].narrow(0, 128, 128).zero_();  // an all-zero block: scale 1e-10 / 448, codes 0
  x[3][300] = 1000;                  // one large value: its block's scale follows it
  auto [codes, scales] = QuantizeFp8Activations(x.to(at::kBFloat16));
  ASSERT_EQ(codes.scalar_type(), at::kFloat8_e4m3fn);
  ASSERT_EQ(codes.sizes(), x.sizes());
  ASSERT_EQ(scales.sizes(), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(scales.strides(), (std::vector<int64_t>{1, 5}));
  const at::Tensor xb = x.to(at::kBFloat16).to(at::kFloat);
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t b = 0; b < 3; ++b) {
      const at::Tensor block = xb[r].narrow(0, 128 * b, 128);
      const float amax = block.abs().max().item<float>();
      const float scale = std::max(amax, 1e-10f) / 448.0f;
      EXPECT_EQ(scales[r][b].item<float>(), scale) << r << ", " << b;
      const at::Tensor want = (block / scale).to(at::kFloat8_e4m3fn).to(at::kFloat);
      EXPECT_TRUE(at::equal(codes[r].narrow(0, 128 * b, 128).to(at::kFloat), want)) << r << ", " << b;
      // The block's largest magnitude maps to 448 (e4m3's largest), the rest within e4m3's 2^-4 relative step.
      if (amax > 0) {
        EXPECT_EQ(codes[r].narrow(0, 128 * b, 128).to(at::kFloat).abs().max().item<float>(), 448.0f);
      }
    }
  }
  EXPECT_THROW(QuantizeFp8Activations(at::randn({2, 100})), c10::Error);  // K not whole blocks
}

TEST(ScaledMm, OnlyWholeBlocksOf128AreEligible) {
  EXPECT_TRUE(ScaledMmEligible(RandomFp8(256, 384, 128, 128)));
  EXPECT_FALSE(ScaledMmEligible(RandomFp8(320, 384, 128, 128)));  // N ragged
  EXPECT_FALSE(ScaledMmEligible(RandomFp8(256, 320, 128, 128)));  // K ragged
  EXPECT_FALSE(ScaledMmEligible(RandomFp8(256, 384, 1, 384)));    // per channel
  EXPECT_FALSE(ScaledMmEligible(RandomInt(4, 256, 384, 128, false, at::kFloat)));
}

// W8A8 on a GPU against the product of its own quantized operands in float32 (what _scaled_mm computes, up to the
// order of the sums and the output's rounding), decode and prefill rows, bias fused (bfloat16) or added (float32).
TEST(ScaledMm, W8A8OnAGpuIsTheProductOfTheQuantizedOperands) {
  if (!QueryTorch().cuda_available) {
    GTEST_SKIP() << "no CUDA device here; this test runs on a GPU machine (scripts/gpu-check.sh)";
  }
  const at::Device cuda(at::kCUDA, 0);
  ASSERT_TRUE(ProbeFp8ScaledMm(cuda).ok()) << ProbeFp8ScaledMm(cuda);
  at::manual_seed(7);
  PackedLinear w = RandomFp8(384, 512, 128, 128).To(cuda, false);
  w.scaled_mm = true;
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    for (int64_t rows : {1, 3, 40}) {
      const at::Tensor x = (at::randn({1, rows, 512}) * 2).to(dtype).to(cuda);
      const at::Tensor bias = at::randn({384}).to(dtype).to(cuda);
      const at::Tensor got = LinearPacked(x, w, bias).to(at::kCPU, at::kFloat);
      ASSERT_EQ(got.sizes(), (std::vector<int64_t>{1, rows, 384}));
      auto [codes, scales] = QuantizeFp8Activations(x.reshape({rows, 512}));
      const at::Tensor xq = (codes.to(at::kFloat).view({rows, 4, 128}) * scales.unsqueeze(-1)).view({rows, 512});
      const at::Tensor dense = Dequantize(w.To(at::kCPU, false), at::kFloat);
      const at::Tensor want = at::linear(xq.to(at::kCPU), dense, bias.to(at::kCPU, at::kFloat)).view({1, rows, 384});
      const double scale = at::linear(xq.to(at::kCPU).abs(), dense.abs()).max().item<double>() + 1.0;
      EXPECT_LE((got - want).abs().max().item<double>() / scale, dtype == at::kFloat ? 1e-4 : 1e-2)
          << rows << " rows, " << at::toString(dtype);
    }
  }
}

}  // namespace
}  // namespace strata::runtime

namespace strata::runtime {
namespace {

// gpt-oss's scales (2^-8 .. 2^0 and around), and K of an odd count of blocks; every path of LinearPacked.
TEST(LinearPacked, Mxfp4EveryPathMatchesTheDequantizedWeight) {
  at::manual_seed(8);
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{96, 256}, {75, 2880}, {40, 96}}) {
    const PackedLinear w = RandomMxfp4(n, k, 116, 130);
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t rows : {1, 2, 3, 4, 5, 16, 32, 40}) {
        ExpectMatches(w, dtype, rows, rows % 2 == 1);
        EXPECT_EQ(LinearPackedUsesKernel(at::zeros({rows, k}, dtype), w), rows <= kFewRows);
      }
    }
  }
}

// A weight's rows as a weight of their own (an expert's gate half of gate_up, say): views, the same outputs and the
// same dequantized rows; and [N, K / 2] data (the blocks flattened per row) reads the same.
TEST(LinearPacked, Mxfp4RowsAndFlatBlocks) {
  at::manual_seed(9);
  const PackedLinear w = RandomMxfp4(120, 320, 110, 135);
  const PackedLinear middle = PackedRows(w, 37, 50);
  EXPECT_EQ(middle.data.data_ptr(), w.data[37].data_ptr());
  EXPECT_EQ(middle.bytes(), 50 * (160 + 10));
  for (int64_t rows : {1, 3, 40}) {
    const at::Tensor x = at::randn({rows, 320});
    EXPECT_TRUE(at::allclose(LinearPacked(x, middle, {}), LinearPacked(x, w, {}).narrow(-1, 37, 50), 1e-5, 1e-5))
        << rows;
  }
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    EXPECT_TRUE(at::equal(Dequantize(middle, dtype), Dequantize(w, dtype).narrow(0, 37, 50)));
    EXPECT_TRUE(at::equal(Dequantize(w, dtype, 10, 90), Dequantize(w, dtype).narrow(0, 10, 80)));
  }
  PackedLinear flat = w;
  flat.data = w.data.view({120, 160});
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    EXPECT_TRUE(at::equal(Dequantize(flat, dtype), Dequantize(w, dtype)));
    EXPECT_TRUE(at::equal(DequantizeWithAten(flat, dtype), Dequantize(w, dtype)));
  }
  const at::Tensor x = at::randn({2, 320});
  EXPECT_TRUE(at::equal(LinearPacked(x, flat, {}), LinearPacked(x, w, {})));
}

// Bitwise equality (-0 is not 0).
bool SameBits(const at::Tensor& a, const at::Tensor& b) {
  if (!a.sizes().equals(b.sizes()) || a.scalar_type() != b.scalar_type()) return false;
  const at::ScalarType bits = a.element_size() == 4 ? at::kInt : at::kShort;
  return at::equal(a.view(bits), b.view(bits));
}

// Every code in every nibble, every scale byte (past 252 too: infinities, and 0.5 x 2^128 = 2^127, as torch's ldexp
// scales): the kernels' and the ATen dequantizers equal the definition, ldexp(value, s - 127) in float32, then
// rounded once to bfloat16; -0 kept.
TEST(Mxfp4, DequantizeIsTheCodeTimesTheScaleBitForBit) {
  const int64_t n = 256, k = 64;
  PackedLinear w;
  w.kind = PackedLinear::Kind::kMxfp4;
  w.out_features = n;
  w.in_features = k;
  w.group = 32;
  w.data = (at::arange(n * k / 2, at::kInt) * 37 % 256).to(at::kByte).view({n, k / 32, 16});
  w.scale = (at::arange(n * k / 32, at::kInt) * 97 % 256).to(at::kByte).view({n, k / 32});
  const std::vector<float> values = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  at::Tensor want = at::empty({n, k});
  const uint8_t* bytes = w.data.data_ptr<uint8_t>();
  const uint8_t* scales = w.scale.data_ptr<uint8_t>();
  float* out = want.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const uint8_t byte = bytes[i * (k / 2) + j / 2];
      const float value = values[j % 2 == 0 ? byte & 15 : byte >> 4];
      out[i * k + j] = std::ldexp(value, int{scales[i * (k / 32) + j / 32]} - 127);
    }
  }
  EXPECT_TRUE(want.isinf().any().item<bool>());
  EXPECT_TRUE(want.eq(std::ldexp(1.0f, 127)).any().item<bool>());          // 0.5 x 2^128
  EXPECT_TRUE(want.eq(0).logical_and(want.signbit()).any().item<bool>());  // -0 among them
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor reference = want.to(dtype);
    EXPECT_TRUE(SameBits(Dequantize(w, dtype), reference)) << at::toString(dtype);
    EXPECT_TRUE(SameBits(DequantizeWithAten(w, dtype), reference)) << at::toString(dtype);
    EXPECT_TRUE(SameBits(Dequantize(w, dtype, 100, 200), reference.narrow(0, 100, 100))) << at::toString(dtype);
  }
}

// Mxfp4Linear refuses what the kernels cannot read, naming the tensor and what is wrong.
TEST(Mxfp4, BadBlocksAndScalesAreRefusedNamingTheTensor) {
  const std::string name = "model.layers.3.mlp.experts.down_proj[5]";
  const at::Tensor blocks = at::zeros({8, 4, 16}, at::kByte);
  const at::Tensor scales = at::full({8, 4}, 127, at::kByte);
  ASSERT_TRUE(Mxfp4Linear(blocks, scales, name).ok());
  const PackedLinear ok = *Mxfp4Linear(blocks, scales, name);
  EXPECT_EQ(ok.out_features, 8);
  EXPECT_EQ(ok.in_features, 128);
  EXPECT_EQ(ok.data.data_ptr(), blocks.data_ptr());  // a view, not a copy
  struct Case {
    at::Tensor blocks, scales;
    std::vector<std::string> says;
  };
  at::Tensor nan_scale = scales.clone();
  nan_scale[6][1] = 255;
  at::Tensor huge_scale = scales.clone();
  huge_scale[2][3] = 253;
  const std::vector<Case> cases = {
      {blocks.to(at::kChar), scales, {"blocks of dtype", "expected uint8"}},
      {blocks, scales.to(at::kFloat), {"scales of dtype", "expected uint8"}},
      {blocks.view({8, 64}), scales, {"blocks of shape [8, 64]", "[N, K / 32, 16]"}},
      {at::zeros({8, 4, 15}, at::kByte), scales, {"blocks of shape [8, 4, 15]"}},
      {blocks, scales.narrow(1, 0, 3), {"scales of shape [8, 3]", "expected [8, 4]"}},
      {blocks, at::full({7, 4}, 127, at::kByte), {"scales of shape [7, 4]"}},
      {blocks, at::full({8, 4, 1}, 127, at::kByte), {"scales of shape [8, 4, 1]"}},
      {blocks, nan_scale, {"scale 255 at element 25", "NaN"}},
      {blocks, huge_scale, {"scale 253 at element 11", "overflows bfloat16"}},
  };
  for (const Case& c : cases) {
    const absl::StatusOr<PackedLinear> got = Mxfp4Linear(c.blocks, c.scales, name);
    ASSERT_FALSE(got.ok()) << c.says.front();
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(got.status().message());
    EXPECT_NE(message.find(name), std::string::npos) << message;
    for (const std::string& say : c.says) EXPECT_NE(message.find(say), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace strata::runtime
