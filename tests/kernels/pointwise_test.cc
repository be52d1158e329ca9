// kernels/pointwise: RMSNorm and SiLU x up on every Highway target this machine supports, against a
// scalar reference with the same rounding points (runtime/model/pointwise_test.cc checks the ATen side).
#include "kernels/pointwise.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <hwy/tests/hwy_gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/kernels/bf16_util.h"

namespace strata::kernels {
namespace {

using reference::FromBF16;
using reference::ToBF16;
using reference::Value;

HWY_BEFORE_TEST(KernelsPointwise);

float RoundBF16(float f) { return FromBF16(ToBF16(f)); }

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 2.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(gen);
  return v;
}

// Units in the last place of bfloat16 between two values.
int64_t BF16Ulps(float a, float b) {
  return std::llabs(static_cast<int64_t>(ToBF16(a).bits) - static_cast<int64_t>(ToBF16(b).bits));
}

TEST_P(KernelsPointwise, RunsOnTheTargetUnderTest) {
  EXPECT_EQ(std::string(KernelTarget()), std::string(hwy::TargetName(GetParam())));
}

TEST_P(KernelsPointwise, RmsNormFloat32MatchesTheReference) {
  for (int64_t width : {1, 7, 16, 33, 64, 4101}) {
    const int64_t rows = 3;
    const std::vector<float> x = Random(width * rows, 1), w = Random(width, 2, 1.0f);
    std::vector<float> y(x.size());
    RmsNormRows(x.data(), w.data(), y.data(), width, rows, 1e-5f);
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (int64_t j = 0; j < width; ++j) sum += double{x[r * width + j]} * x[r * width + j];
      const float scale = 1.0f / std::sqrt(static_cast<float>(sum / width) + 1e-5f);
      for (int64_t j = 0; j < width; ++j) {
        const float expected = w[j] * (x[r * width + j] * scale);
        ASSERT_NEAR(y[r * width + j], expected, 2e-6f * std::abs(expected) + 1e-30f)
            << "width " << width << " row " << r << " column " << j;
      }
    }
  }
}

TEST_P(KernelsPointwise, RmsNormBFloat16RoundsWhereTransformersDoes) {
  for (int64_t width : {5, 32, 100, 2048}) {
    const int64_t rows = 2;
    std::vector<BFloat16> x, w, y(static_cast<size_t>(width * rows));
    for (float v : Random(width * rows, 3)) x.push_back(ToBF16(v));
    for (float v : Random(width, 4, 1.0f)) w.push_back(ToBF16(v));
    RmsNormRows(x.data(), w.data(), y.data(), width, rows, 1e-6f);
    int64_t exact = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (int64_t j = 0; j < width; ++j) sum += double{FromBF16(x[r * width + j])} * FromBF16(x[r * width + j]);
      const float scale = 1.0f / std::sqrt(static_cast<float>(sum / width) + 1e-6f);
      for (int64_t j = 0; j < width; ++j) {
        // LlamaRMSNorm: (x * rsqrt) rounded to bfloat16, then times the weight, rounded again.
        const float expected = RoundBF16(FromBF16(w[j]) * RoundBF16(FromBF16(x[r * width + j]) * scale));
        const float got = FromBF16(y[r * width + j]);
        ASSERT_LE(BF16Ulps(got, expected), 1) << "width " << width << " column " << j;
        exact += got == expected;
      }
    }
    // Only the float32 sum's order differs from the reference: almost every value is exact.
    EXPECT_GE(exact, width * rows * 99 / 100) << "width " << width;
  }
}

TEST_P(KernelsPointwise, SiluMulMatchesTheReferenceAndTheEdges) {
  for (int64_t n : {1, 9, 64, 1000, 11008}) {
    std::vector<float> gate = Random(n, 5, 4.0f), up = Random(n, 6), y(static_cast<size_t>(n));
    gate[0] = -100.0f;  // exp(100) overflows: silu is -0, not NaN
    if (n > 1) gate[1] = 90.0f;
    SiluMul(gate.data(), up.data(), y.data(), n);
    for (int64_t j = 0; j < n; ++j) {
      const float expected = gate[j] / (1.0f + std::exp(-gate[j])) * up[j];
      ASSERT_TRUE(std::isfinite(y[j])) << "n " << n << " index " << j << " gate " << gate[j];
      ASSERT_NEAR(y[j], expected, 4e-6f * std::abs(expected) + 1e-30f) << "n " << n << " index " << j;
    }
  }
}

TEST_P(KernelsPointwise, SiluMulBFloat16AndNaNs) {
  const int64_t n = 777;
  std::vector<BFloat16> gate, up, y(static_cast<size_t>(n));
  for (float v : Random(n, 7, 4.0f)) gate.push_back(ToBF16(v));
  for (float v : Random(n, 8)) up.push_back(ToBF16(v));
  gate[3] = ToBF16(std::numeric_limits<float>::quiet_NaN());
  SiluMul(gate.data(), up.data(), y.data(), n);
  for (int64_t j = 0; j < n; ++j) {
    const float g = FromBF16(gate[j]);
    const float expected = RoundBF16(RoundBF16(g / (1.0f + std::exp(-g))) * FromBF16(up[j]));
    const float got = FromBF16(y[j]);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << j;
      continue;
    }
    ASSERT_LE(BF16Ulps(got, expected), 1) << "index " << j;
  }
}

// gpt-oss's clamped SwiGLU against a scalar reference rounding after each operator, gates and ups past the limit on
// both sides and NaN kept through the clamps: float32 to a few ulps (exp's last bits), bfloat16 to one ulp.
TEST_P(KernelsPointwise, ClampedSwigluRoundsWhereAtenDoes) {
  const float limit = 7.0f, alpha = 1.702f;
  for (int64_t n : {1, 17, 100, 1000}) {
    std::vector<float> gate = Random(n, 11, 6.0f), up = Random(n, 12, 6.0f);
    gate[0] = std::numeric_limits<float>::quiet_NaN();
    if (n > 2) up[2] = std::numeric_limits<float>::quiet_NaN();
    for (bool bf16 : {false, true}) {
      auto round = [&](float v) { return bf16 ? RoundBF16(v) : v; };
      std::vector<float> got(static_cast<size_t>(n));
      if (bf16) {
        std::vector<BFloat16> gb, ub, yb(static_cast<size_t>(n));
        for (float v : gate) gb.push_back(ToBF16(v));
        for (float v : up) ub.push_back(ToBF16(v));
        ClampedSwiglu(gb.data(), ub.data(), yb.data(), n, limit, alpha);
        for (int64_t j = 0; j < n; ++j) got[j] = FromBF16(yb[j]);
      } else {
        ClampedSwiglu(gate.data(), up.data(), got.data(), n, limit, alpha);
      }
      for (int64_t j = 0; j < n; ++j) {
        float g = round(gate[j]), u = round(up[j]);
        g = g > limit ? limit : g;
        u = u > limit ? limit : (u < -limit ? -limit : u);
        const float scaled = round(g * alpha);
        const float glu = round(g * round(1.0f / (1.0f + std::exp(-scaled))));
        const float expected = round(round(u + 1.0f) * glu);
        if (std::isnan(expected)) {
          EXPECT_TRUE(std::isnan(got[j])) << "n " << n << " index " << j;
          continue;
        }
        if (bf16) {
          ASSERT_LE(BF16Ulps(got[j], expected), 1) << "n " << n << " index " << j;
        } else {
          ASSERT_NEAR(got[j], expected, 4e-6f * std::abs(expected) + 1e-30f) << "n " << n << " index " << j;
        }
      }
    }
  }
}

// RoPE's rotate-half over tokens x heads vectors, against a scalar reference rounding where ATen does (each product,
// then the sum; volatile keeps the compiler from fusing them), bit for bit in float32 and bfloat16: head dims with
// and without a vector tail.
TEST_P(KernelsPointwise, RopeRowsRoundsWhereAtenDoes) {
  for (int64_t dim : {2, 6, 64, 80, 128, 256}) {
    const int64_t tokens = 3, heads = 5, half = dim / 2;
    const std::vector<float> x = Random(tokens * heads * dim, 9), angles = Random(tokens * half, 10, 3.0f);
    std::vector<float> cos(static_cast<size_t>(tokens * dim)), sin(cos.size());
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < dim; ++i) {
        cos[t * dim + i] = std::cos(angles[t * half + i % half]);
        sin[t * dim + i] = std::sin(angles[t * half + i % half]);
      }
    }
    for (bool bf16 : {false, true}) {
      auto round = [&](float v) { return bf16 ? RoundBF16(v) : v; };
      std::vector<float> got(x.size());
      if (bf16) {
        std::vector<BFloat16> xb, cb, sb, yb(x.size());
        for (float v : x) xb.push_back(ToBF16(v));
        for (float v : cos) cb.push_back(ToBF16(v));
        for (float v : sin) sb.push_back(ToBF16(v));
        RopeRows(xb.data(), cb.data(), sb.data(), yb.data(), tokens, heads, dim);
        for (size_t i = 0; i < got.size(); ++i) got[i] = FromBF16(yb[i]);
      } else {
        RopeRows(x.data(), cos.data(), sin.data(), got.data(), tokens, heads, dim);
      }
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t i = 0; i < dim; ++i) {
            const int64_t at = (t * heads + h) * dim;
            const float xi = round(x[at + i]), c = round(cos[t * dim + i]), s = round(sin[t * dim + i]);
            const float partner = i < half ? -round(x[at + i + half]) : round(x[at + i - half]);
            volatile float first = round(xi * c);
            volatile float second = round(partner * s);
            const float expected = round(first + second);
            ASSERT_EQ(got[at + i], expected) << (bf16 ? "bfloat16" : "float32") << " dim " << dim << " token " << t
                                             << " head " << h << " index " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata::kernels
