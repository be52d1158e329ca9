// kernels/quantized: FP8 (e4m3, block scales) and int4 / int8 (group-wise) rows against a scalar reference
// that dequantizes as torch does and sums in double, on every Highway target this machine supports; the
// dequantizer bit-exact; the int4 packing.
#include "kernels/quantized.h"

#include <gtest/gtest.h>
#include <hwy/tests/hwy_gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/kernels/bf16_util.h"

namespace strata::kernels {
namespace {

using reference::FromBF16;
using reference::ToBF16;
using reference::Value;

// float8_e4m3fn by its definition (not by bit tricks): exponent bias 7, subnormals at exponent 0, 0x7f / 0xff
// NaN, no infinity.
float E4m3(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xF, mantissa = bits & 7;
  float v;
  if ((bits & 0x7F) == 0x7F) {
    v = NAN;
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa) / 8.0f, -6);
  } else {
    v = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  }
  return (bits & 0x80) != 0 ? -v : v;
}

// IEEE float16 by its definition.
float Half(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
  float v;
  if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    v = mantissa != 0 ? NAN : INFINITY;
  } else {
    v = std::ldexp(1.0f + static_cast<float>(mantissa) / 1024.0f, exponent - 15);
  }
  return (bits & 0x8000) != 0 ? -v : v;
}

// The nearest float16 of a normal-range value (for building scales; exactness is not needed here).
uint16_t ToHalf(float f) {
  const int exponent = std::ilogb(f);
  const int biased = exponent + 15;
  const float scaled = std::ldexp(std::fabs(f), -exponent) - 1.0f;  // [0, 1)
  const uint16_t mantissa = static_cast<uint16_t>(std::lround(scaled * 1024.0f) & 0x3FF);
  return static_cast<uint16_t>((f < 0 ? 0x8000 : 0) | biased << 10 | mantissa);
}

bool SameFloat(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0; }

// A packed matrix with its exact float32 dequantization (as torch computes it).
struct Fp8Case {
  int64_t n, k, block_n, block_k;
  std::vector<uint8_t> data;
  std::vector<float> scale;
  std::vector<float> dense;  // [n, k]
  Fp8Weights weights() const { return {data.data(), scale.data(), block_n, block_k}; }
};

Fp8Case MakeFp8(int64_t n, int64_t k, int64_t block_n, int64_t block_k, std::mt19937& gen, bool allow_nan = false) {
  Fp8Case c{n, k, block_n, block_k, {}, {}, {}};
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  c.data.resize(static_cast<size_t>(n * k));
  for (uint8_t& b : c.data) {
    do {
      b = static_cast<uint8_t>(byte(gen));
    } while (!allow_nan && (b & 0x7F) == 0x7F);
  }
  const int64_t bn = (n + block_n - 1) / block_n, bk = (k + block_k - 1) / block_k;
  c.scale.resize(static_cast<size_t>(bn * bk));
  for (float& s : c.scale) s = unit(gen) / 256.0f;
  c.dense.resize(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      c.dense[i * k + j] = E4m3(c.data[i * k + j]) * c.scale[(i / block_n) * bk + j / block_k];
    }
  }
  return c;
}

struct IntCase {
  int bits;
  int64_t n, k, group;
  ScaleType scale_type;
  std::vector<uint8_t> codes;  // [n, k], one a byte
  std::vector<uint8_t> data;   // packed
  std::vector<float> scale_f32;
  std::vector<uint16_t> scale_16;
  std::vector<uint8_t> zero;  // empty: symmetric
  std::vector<float> dense;
  IntWeights weights() const {
    IntWeights w;
    w.bits = bits;
    w.data = data.data();
    w.scale = scale_type == ScaleType::kFloat32 ? static_cast<const void*>(scale_f32.data())
                                                : static_cast<const void*>(scale_16.data());
    w.scale_type = scale_type;
    w.zero = zero.empty() ? nullptr : zero.data();
    w.group = group;
    return w;
  }
};

IntCase MakeInt(int bits, int64_t n, int64_t k, int64_t group, ScaleType type, bool asymmetric, std::mt19937& gen) {
  IntCase c{bits, n, k, group, type, {}, {}, {}, {}, {}, {}};
  std::uniform_int_distribution<int> code(0, (1 << bits) - 1);
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  c.codes.resize(static_cast<size_t>(n * k));
  for (uint8_t& q : c.codes) q = static_cast<uint8_t>(code(gen));
  if (bits == 4) {
    c.data.resize(static_cast<size_t>(n * k / 2));
    PackInt4(c.codes.data(), n, k, c.data.data());
  } else {
    c.data = c.codes;
  }
  const int64_t groups = n * (k / group);
  std::vector<float> scale(static_cast<size_t>(groups));
  for (size_t i = 0; i < scale.size(); ++i) {
    const float s = unit(gen) / static_cast<float>(1 << bits);
    switch (type) {
      case ScaleType::kFloat32:
        c.scale_f32.push_back(s);
        scale[i] = s;
        break;
      case ScaleType::kBFloat16:
        c.scale_16.push_back(ToBF16(s).bits);
        scale[i] = FromBF16(ToBF16(s));
        break;
      case ScaleType::kFloat16:
        c.scale_16.push_back(ToHalf(s));
        scale[i] = Half(ToHalf(s));
        break;
    }
  }
  if (asymmetric) {
    for (int64_t i = 0; i < groups; ++i) c.zero.push_back(static_cast<uint8_t>(code(gen)));
  }
  c.dense.resize(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t g = i * (k / group) + j / group;
      const int z = asymmetric ? c.zero[g] : 1 << (bits - 1);
      c.dense[i * k + j] = static_cast<float>(c.codes[i * k + j] - z) * scale[g];
    }
  }
  return c;
}

// Runs the rows kernel on [n0, n1) of an n-row matrix with a sentinel elsewhere and compares with the dense
// reference: relative to sum |x * w| (float32 accumulation in another order), plus half a bfloat16 step for a
// bfloat16 output.
template <typename Out, typename Weights>
void CheckRows(const Weights& weights, const std::vector<float>& dense, int64_t n, int64_t k, int64_t rows,
               bool with_bias, int64_t n0, int64_t n1, std::mt19937& gen, const char* what, float x_scale = 1.0f) {
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (float& v : x) v = normal(gen) * x_scale;
  std::vector<Out> bias(static_cast<size_t>(n));
  const Out sentinel = Out(-7.0f);
  for (Out& b : bias) b = Out(normal(gen));
  std::vector<Out> y(static_cast<size_t>(rows * n), sentinel);
  QuantizedLinearRows(x.data(), weights, with_bias ? bias.data() : nullptr, y.data(), rows, k, n, n0, n1);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t j = 0; j < n; ++j) {
      const float got = Value(y[m * n + j]);
      if (j < n0 || j >= n1) {
        ASSERT_EQ(got, -7.0f) << what << ": wrote outside [n0, n1): row " << m << " out " << j;
        continue;
      }
      double expected = with_bias ? Value(bias[j]) : 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        const double p = double{x[m * k + i]} * dense[j * k + i];
        expected += p;
        magnitude += std::abs(p);
      }
      const double tolerance =
          2e-6 * std::sqrt(static_cast<double>(k)) * magnitude + 1e-6 +
          (std::is_same_v<Out, float> ? 0.0 : std::abs(expected) / 256.0 + 1e-30);  // a bfloat16 half step
      ASSERT_NEAR(got, expected, tolerance)
          << what << ": rows " << rows << " k " << k << " out " << j << " of [" << n0 << ", " << n1 << ")";
    }
  }
}

// The bfloat16 output type the tests construct from a float.
struct Bf16Out : BFloat16 {
  Bf16Out() : BFloat16{0} {}
  explicit Bf16Out(float f) : BFloat16(ToBF16(f)) {}
};
static_assert(sizeof(Bf16Out) == sizeof(BFloat16));
float Value(Bf16Out v) { return FromBF16(v); }

template <typename Weights>
void QuantizedLinearRows(const float* x, const Weights& w, const Bf16Out* bias, Bf16Out* y, int64_t rows, int64_t k,
                         int64_t n_total, int64_t n0, int64_t n1) {
  kernels::QuantizedLinearRows(x, w, static_cast<const BFloat16*>(bias), static_cast<BFloat16*>(y), rows, k, n_total,
                               n0, n1);
}

const std::vector<int64_t> kRows = {1, 2, 3, 5, 13, 16, 32};
// The scale's dtype changes only how the multipliers are read: fewer row counts for bfloat16 and float16 scales.
const std::vector<int64_t> kFewRows = {1, 5};

template <typename Weights>
void CheckAllRows(const Weights& weights, const std::vector<float>& dense, int64_t n, int64_t k, std::mt19937& gen,
                  const char* what, const std::vector<int64_t>& row_counts = kRows) {
  for (int64_t rows : row_counts) {
    for (bool bias : {false, true}) {
      CheckRows<float>(weights, dense, n, k, rows, bias, 0, n, gen, what);
      CheckRows<Bf16Out>(weights, dense, n, k, rows, bias, 1, n - 2, gen, what);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

HWY_BEFORE_TEST(KernelsQuantized);

TEST(KernelsQuantizedScalar, Fp8CodesAreE4m3) {
  for (int b = 0; b < 256; ++b) {
    const uint8_t bits = static_cast<uint8_t>(b);
    ASSERT_TRUE(SameFloat(Fp8E4m3ToFloat(bits), E4m3(bits))) << "code " << b;
    ASSERT_EQ(std::isnan(Fp8E4m3ToFloat(bits)), (b & 0x7F) == 0x7F) << "code " << b;
  }
  EXPECT_EQ(E4m3(0x7E), 448.0f);
  EXPECT_EQ(E4m3(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(E4m3(0x08), std::ldexp(1.0f, -6));
}

TEST(KernelsQuantizedScalar, Float16ScalesConvertExactly) {
  for (int h = 0; h < 65536; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    ASSERT_TRUE(SameFloat(Float16ToFloat(bits), Half(bits))) << "float16 " << h;
  }
}

// Every e4m3 code, in every column position (so every lane and the scalar tails), NaN codes included,
// dequantized bit-exactly (float32: e4m3 * scale, one multiply; bfloat16: that rounded to nearest even).
TEST_P(KernelsQuantized, Fp8DequantizeIsBitExact) {
  std::mt19937 gen(1);
  for (int64_t k : {256, 200, 37}) {
    for (int64_t block_k : {int64_t{128}, k, int64_t{16}}) {
      const int64_t n = 5, block_n = 2;
      Fp8Case c = MakeFp8(n, k, block_n, block_k, gen, /*allow_nan=*/true);
      for (int64_t i = 0; i < n * k; ++i) c.data[i] = static_cast<uint8_t>((i * 37 + i / 256) & 0xFF);
      // Scales that make products subnormal and others that make them large.
      for (size_t i = 0; i < c.scale.size(); ++i) c.scale[i] = i % 3 == 0 ? 1e-36f : (i % 3 == 1 ? 3.0f : 1.0f);
      const int64_t bk = (k + block_k - 1) / block_k;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          c.dense[i * k + j] = E4m3(c.data[i * k + j]) * c.scale[(i / block_n) * bk + j / block_k];
        }
      }
      for (int64_t n0 : {0, 1, 3}) {
        std::vector<float> out(static_cast<size_t>((n - n0) * k), -7.0f);
        std::vector<BFloat16> out16(out.size());
        DequantizeRows(c.weights(), k, n, n0, n, out.data());
        DequantizeRows(c.weights(), k, n, n0, n, out16.data());
        for (int64_t i = n0; i < n; ++i) {
          for (int64_t j = 0; j < k; ++j) {
            const float expected = c.dense[i * k + j];
            const size_t at = static_cast<size_t>((i - n0) * k + j);
            ASSERT_TRUE(SameFloat(out[at], expected))
                << "k " << k << " block_k " << block_k << " row " << i << " col " << j << " code "
                << int{c.data[i * k + j]} << ": " << out[at] << " vs " << expected;
            ASSERT_TRUE(SameFloat(FromBF16(out16[at]), FromBF16(ToBF16(expected)))) << "bfloat16 row " << i;
          }
        }
      }
    }
  }
}

TEST_P(KernelsQuantized, Fp8RowsMatchTheReference) {
  std::mt19937 gen(2);
  struct Shape {
    int64_t n, k, block_n, block_k;
    const char* what;
  };
  for (const Shape& s : {Shape{130, 200, 128, 128, "ragged 128 x 128 blocks"}, Shape{9, 256, 128, 128, "128 x 128"},
                         Shape{11, 64, 1, 64, "per channel"}, Shape{10, 100, 1, 100, "per channel, tail"},
                         Shape{9, 77, 9, 77, "per tensor"}, Shape{7, 45, 2, 16, "small blocks with tails"}}) {
    const Fp8Case c = MakeFp8(s.n, s.k, s.block_n, s.block_k, gen);
    CheckAllRows(c.weights(), c.dense, s.n, s.k, gen, s.what);
    if (HasFatalFailure()) return;
  }
}

// Weights without NaN codes marked nan_free (as the loader marks them) give exactly what the checked decode gives,
// for every other code in every lane and tail; Fp8HasNanCode finds a NaN code anywhere.
TEST_P(KernelsQuantized, Fp8NanFreeWeightsGiveTheCheckedResults) {
  std::mt19937 gen(4);
  for (int64_t k : {256, 200, 37}) {
    const int64_t n = 7;
    Fp8Case c = MakeFp8(n, k, 2, 64, gen);
    for (int64_t i = 0; i < n * k; ++i) {
      const uint8_t code = static_cast<uint8_t>((i * 37 + i / 256) & 0xFF);
      c.data[i] = (code & 0x7F) == 0x7F ? 0x7E : code;
    }
    ASSERT_FALSE(Fp8HasNanCode(c.data.data(), n * k));
    Fp8Weights free = c.weights();
    free.nan_free = true;
    for (int64_t rows : {1, 2, 5, 17}) {
      std::vector<float> x(static_cast<size_t>(rows * k));
      std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
      for (float& v : x) v = unit(gen);
      std::vector<float> checked(static_cast<size_t>(rows * n)), skipped(checked.size());
      QuantizedLinearRows(x.data(), c.weights(), static_cast<const float*>(nullptr), checked.data(), rows, k, n, 0, n);
      QuantizedLinearRows(x.data(), free, static_cast<const float*>(nullptr), skipped.data(), rows, k, n, 0, n);
      for (size_t i = 0; i < checked.size(); ++i) {
        ASSERT_TRUE(SameFloat(checked[i], skipped[i])) << "k " << k << " rows " << rows << " at " << i;
      }
    }
  }
  std::vector<uint8_t> bytes(10000, 0x12);
  EXPECT_FALSE(Fp8HasNanCode(bytes.data(), static_cast<int64_t>(bytes.size())));
  for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{9999}}) {
    for (uint8_t nan : {uint8_t{0x7F}, uint8_t{0xFF}}) {
      bytes[at] = nan;
      EXPECT_TRUE(Fp8HasNanCode(bytes.data(), static_cast<int64_t>(bytes.size()))) << at;
      bytes[at] = 0x12;
    }
  }
}

// A NaN code (0x7f, 0xff) makes its output NaN, in the vector body and in the scalar tail.
TEST_P(KernelsQuantized, Fp8NanCodesPropagate) {
  std::mt19937 gen(3);
  const int64_t n = 6;
  struct Layout {
    int64_t k, block_k;
  };
  for (const Layout& l : {Layout{70, 70}, Layout{200, 64}}) {  // the second on VPERMI2B where the CPU has it
    const int64_t k = l.k;
    for (int64_t col : {int64_t{3}, k - 1}) {
      for (uint8_t nan : {uint8_t{0x7F}, uint8_t{0xFF}}) {
        Fp8Case c = MakeFp8(n, k, 1, l.block_k, gen);
        c.data[2 * k + col] = nan;
        for (int64_t rows : {1, 2, 5}) {
          std::vector<float> x(static_cast<size_t>(rows * k), 0.5f), y(static_cast<size_t>(rows * n));
          QuantizedLinearRows(x.data(), c.weights(), static_cast<const float*>(nullptr), y.data(), rows, k, n, 0, n);
          for (int64_t m = 0; m < rows; ++m) {
            for (int64_t j = 0; j < n; ++j) {
              EXPECT_EQ(std::isnan(y[m * n + j]), j == 2) << "k " << k << " col " << col << " rows " << rows;
            }
          }
        }
      }
    }
  }
}

struct IntShape {
  int64_t k, group;
};
// Groups of 32, 64, 128 and the whole row; k with and without a vector tail (and, for int4, a partial last
// chunk of 32 codes: k 200, 70); group 48 is not a multiple of the int4 chunk (the scalar path).
const IntShape kIntShapes[] = {{256, 32}, {256, 64}, {384, 128}, {256, 256}, {200, 200}, {70, 70}, {96, 48}};

TEST_P(KernelsQuantized, IntRowsMatchTheReference) {
  std::mt19937 gen(4);
  for (int bits : {4, 8}) {
    for (bool asymmetric : {false, true}) {
      for (ScaleType type : {ScaleType::kFloat32, ScaleType::kBFloat16, ScaleType::kFloat16}) {
        for (const IntShape& s : kIntShapes) {
          const int64_t n = 11;
          const IntCase c = MakeInt(bits, n, s.k, s.group, type, asymmetric, gen);
          const std::string what = "int" + std::to_string(bits) + (asymmetric ? " asymmetric" : " symmetric") +
                                   " scale " + std::to_string(static_cast<int>(type)) + " group " +
                                   std::to_string(s.group);
          CheckAllRows(c.weights(), c.dense, n, s.k, gen, what.c_str(), type == ScaleType::kFloat32 ? kRows : kFewRows);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_P(KernelsQuantized, IntDequantizeIsBitExact) {
  std::mt19937 gen(5);
  for (int bits : {4, 8}) {
    for (bool asymmetric : {false, true}) {
      for (ScaleType type : {ScaleType::kFloat32, ScaleType::kBFloat16, ScaleType::kFloat16}) {
        for (const IntShape& s : kIntShapes) {
          const int64_t n = 6, n0 = 2;
          const IntCase c = MakeInt(bits, n, s.k, s.group, type, asymmetric, gen);
          std::vector<float> out(static_cast<size_t>((n - n0) * s.k), -7.0f);
          std::vector<BFloat16> out16(out.size());
          DequantizeRows(c.weights(), s.k, n, n0, n, out.data());
          DequantizeRows(c.weights(), s.k, n, n0, n, out16.data());
          for (int64_t i = n0; i < n; ++i) {
            for (int64_t j = 0; j < s.k; ++j) {
              const float expected = c.dense[i * s.k + j];
              const size_t at = static_cast<size_t>((i - n0) * s.k + j);
              ASSERT_TRUE(SameFloat(out[at], expected))
                  << "int" << bits << " group " << s.group << " row " << i << " col " << j;
              ASSERT_TRUE(SameFloat(FromBF16(out16[at]), FromBF16(ToBF16(expected))))
                  << "bfloat16 int" << bits << " row " << i << " col " << j;
            }
          }
        }
      }
    }
  }
}

// bfloat16 input rows (VDPBF16PS on the AVX-512 targets where the CPU has AVX512_BF16 and VBMI, widened
// elsewhere) against the reference on the same bfloat16 values. int4 codes are summed as 128 + q there, the 128
// taken back with the zeros: the tolerance counts sum |x| * (128 + zero) * scale too (`offsets`).
template <typename Weights>
void CheckBf16Rows(const Weights& weights, const std::vector<float>& dense, const std::vector<float>& offsets,
                   int64_t n, int64_t k, int64_t rows, bool with_bias, int64_t n0, int64_t n1, std::mt19937& gen,
                   const char* what, float x_scale = 1.0f) {
  std::normal_distribution<float> normal;
  std::vector<BFloat16> x(static_cast<size_t>(rows * k)), bias(static_cast<size_t>(n));
  for (BFloat16& v : x) v = ToBF16(normal(gen) * x_scale);
  for (BFloat16& v : bias) v = ToBF16(normal(gen));
  std::vector<BFloat16> y(static_cast<size_t>(rows * n), ToBF16(-7.0f));
  QuantizedLinearRows(x.data(), weights, with_bias ? bias.data() : nullptr, y.data(), rows, k, n, n0, n1);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t j = 0; j < n; ++j) {
      const float got = FromBF16(y[m * n + j]);
      if (j < n0 || j >= n1) {
        ASSERT_EQ(got, -7.0f) << what << ": wrote outside [n0, n1): row " << m << " out " << j;
        continue;
      }
      double expected = with_bias ? FromBF16(bias[j]) : 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        const double xi = FromBF16(x[m * k + i]);
        expected += xi * dense[j * k + i];
        magnitude += std::abs(xi * dense[j * k + i]) + (offsets.empty() ? 0.0 : std::abs(xi) * offsets[j * k + i]);
      }
      const double tolerance = 2e-6 * std::sqrt(static_cast<double>(k)) * magnitude + 1e-6 + std::abs(expected) / 256.0;
      ASSERT_NEAR(got, expected, tolerance)
          << what << ": rows " << rows << " k " << k << " out " << j << " of [" << n0 << ", " << n1 << ")";
    }
  }
}

template <typename Weights>
void CheckAllBf16Rows(const Weights& weights, const std::vector<float>& dense, const std::vector<float>& offsets,
                      int64_t n, int64_t k, std::mt19937& gen, const char* what,
                      const std::vector<int64_t>& row_counts = kRows) {
  for (int64_t rows : row_counts) {
    for (bool bias : {false, true}) {
      CheckBf16Rows(weights, dense, offsets, n, k, rows, bias, 0, n, gen, what);
      CheckBf16Rows(weights, dense, offsets, n, k, rows, bias, 1, n - 2, gen, what);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST_P(KernelsQuantized, Fp8Bf16RowsMatchTheReference) {
  std::mt19937 gen(7);
  struct Shape {
    int64_t n, k, block_n, block_k;
    const char* what;
  };
  for (const Shape& s : {Shape{130, 200, 128, 128, "ragged 128 x 128 blocks"}, Shape{9, 512, 128, 128, "128 x 128"},
                         Shape{11, 256, 1, 256, "per channel"}, Shape{10, 100, 1, 100, "per channel, no 64"},
                         Shape{9, 77, 9, 77, "per tensor, tail"}, Shape{7, 192, 2, 64, "blocks of 64"}}) {
    const Fp8Case c = MakeFp8(s.n, s.k, s.block_n, s.block_k, gen);
    CheckAllBf16Rows(c.weights(), c.dense, {}, s.n, s.k, gen, s.what);
    if (HasFatalFailure()) return;
  }
  // NaN codes propagate: in a whole block and past the last one.
  for (int64_t col : {3, 130}) {
    Fp8Case c = MakeFp8(6, 136, 1, 136, gen);
    c.data[2 * 136 + col] = 0xFF;
    std::vector<BFloat16> x(136 * 3, ToBF16(0.5f)), y(6 * 3);
    QuantizedLinearRows(x.data(), c.weights(), nullptr, y.data(), 3, 136, 6, 0, 6);
    for (int64_t m = 0; m < 3; ++m) {
      for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(std::isnan(FromBF16(y[m * 6 + j])), j == 2) << "col " << col;
    }
  }
}

TEST_P(KernelsQuantized, IntBf16RowsMatchTheReference) {
  std::mt19937 gen(8);
  const IntShape shapes[] = {{256, 32}, {256, 64}, {384, 128}, {512, 256}, {300, 100}, {200, 200}, {96, 48}, {160, 32}};
  for (int bits : {4, 8}) {
    for (bool asymmetric : {false, true}) {
      for (ScaleType type : {ScaleType::kFloat32, ScaleType::kBFloat16, ScaleType::kFloat16}) {
        for (const IntShape& s : shapes) {
          // 75 rows for one shape: more than the VDPBF16PS kernel's chunk of 32 weight rows, and a short tile.
          const int64_t n = s.k == 384 ? 75 : 11;
          const IntCase c = MakeInt(bits, n, s.k, s.group, type, asymmetric, gen);
          std::vector<float> offsets(c.dense.size());
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j < s.k; ++j) {
              const int64_t g = i * (s.k / s.group) + j / s.group;
              const double z = asymmetric ? c.zero[g] : 1 << (bits - 1);
              const double q = c.codes[i * s.k + j];
              // |(128 + z) * scale|, from the dequantized value: scale = w / (q - z) where q != z.
              offsets[i * s.k + j] = q != z ? static_cast<float>(std::abs(c.dense[i * s.k + j] / (q - z)) * (128 + z))
                                            : static_cast<float>((128 + z) * 2.0 / (1 << bits));
            }
          }
          const std::string what = "int" + std::to_string(bits) + (asymmetric ? " asymmetric" : " symmetric") +
                                   " scale " + std::to_string(static_cast<int>(type)) + " group " +
                                   std::to_string(s.group) + " k " + std::to_string(s.k);
          CheckAllBf16Rows(c.weights(), c.dense, offsets, n, s.k, gen, what.c_str(),
                           type == ScaleType::kFloat32 ? kRows : kFewRows);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// bfloat16 rows whose blocks span many binades (values from 2^-24 to 2^6 of one another, and zeros), and rows
// holding an infinity or a NaN: where the CPU has no VDPBF16PS the int codes meet x as int16 with a power-of-two
// scale per block (quantized_int16-inl.h), which must keep to the reference within the same tolerance, and hand
// non-finite rows to the float32 kernels (inf and NaN come out as the reference's).
TEST_P(KernelsQuantized, IntBf16RowsOfWideRangeAndNonFiniteValues) {
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> exponent(-24.0f, 6.0f);
  std::uniform_int_distribution<int> sign(0, 1), zero_one(0, 9);
  for (int bits : {4, 8}) {
    for (int64_t group : {int64_t{32}, int64_t{128}}) {
      const int64_t n = 9, k = 256, rows = 2;
      const IntCase c = MakeInt(bits, n, k, group, ScaleType::kBFloat16, /*asymmetric=*/true, gen);
      std::vector<BFloat16> x(static_cast<size_t>(rows * k));
      for (BFloat16& v : x) {
        v = zero_one(gen) == 0 ? ToBF16(0.0f) : ToBF16((sign(gen) ? -1.0f : 1.0f) * std::exp2(exponent(gen)));
      }
      for (int case_ = 0; case_ < 3; ++case_) {
        if (case_ == 1) x[5] = ToBF16(std::numeric_limits<float>::infinity());
        if (case_ == 2) x[k + 7] = ToBF16(std::numeric_limits<float>::quiet_NaN());
        std::vector<BFloat16> y(static_cast<size_t>(rows * n));
        QuantizedLinearRows(x.data(), c.weights(), nullptr, y.data(), rows, k, n, 0, n);
        for (int64_t m = 0; m < rows; ++m) {
          for (int64_t j = 0; j < n; ++j) {
            double expected = 0.0, magnitude = 0.0;
            for (int64_t i = 0; i < k; ++i) {
              const double xi = FromBF16(x[m * k + i]), wi = c.dense[j * k + i];
              expected += xi * wi;
              magnitude += std::abs(xi * wi) + std::abs(xi) * 2.0 * std::abs(wi);
            }
            const float got = FromBF16(y[m * n + j]);
            const std::string what = "int" + std::to_string(bits) + " group " + std::to_string(group) + " case " +
                                     std::to_string(case_) + " row " + std::to_string(m) + " out " + std::to_string(j);
            if (!std::isfinite(expected)) {
              EXPECT_TRUE(std::isnan(expected) ? std::isnan(got) : !std::isfinite(got)) << what << ": got " << got;
              continue;
            }
            // 2^-16 of each block's largest |x| per product, at most: within the kernels' tolerance.
            const double tolerance =
                2e-6 * std::sqrt(static_cast<double>(k)) * magnitude + 1e-6 + std::abs(expected) / 256.0;
            EXPECT_NEAR(got, expected, tolerance) << what;
          }
        }
      }
    }
  }
}

// The smallest layers: k below one vector (and one int4 chunk), blocks and groups of one or two columns, one
// output row; both kinds of input rows.
TEST_P(KernelsQuantized, TinyLayersMatchTheReference) {
  std::mt19937 gen(9);
  for (int64_t k : {1, 2, 5}) {
    for (int64_t block_k : {int64_t{1}, k}) {
      const Fp8Case c = MakeFp8(3, k, 2, block_k, gen);
      for (int64_t rows : {1, 3}) {
        CheckRows<float>(c.weights(), c.dense, 3, k, rows, true, 0, 3, gen, "tiny fp8");
        CheckBf16Rows(c.weights(), c.dense, {}, 3, k, rows, false, 1, 2, gen, "tiny fp8");
      }
    }
  }
  for (int bits : {4, 8}) {
    for (int64_t k : {2, 6}) {
      for (int64_t group : {int64_t{2}, k}) {
        const IntCase c = MakeInt(bits, 3, k, group, ScaleType::kFloat16, true, gen);
        std::vector<float> offsets(c.dense.size(), 272.0f);  // (128 + 15) * 2 / 16 at most, generously
        for (int64_t rows : {1, 3}) {
          CheckRows<float>(c.weights(), c.dense, 3, k, rows, true, 0, 3, gen, "tiny int");
          CheckBf16Rows(c.weights(), c.dense, offsets, 3, k, rows, false, 1, 2, gen, "tiny int");
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// MXFP4: E2M1 codes two a byte (column 2i low nibble, 2i + 1 high) in blocks of 32 with an E8M0 scale each.

// E2M1 by its definition: 1 sign, 2 exponent bits of bias 1, 1 mantissa bit, a subnormal 0.5 at exponent 0.
float E2m1(uint8_t code) {
  const int exponent = (code >> 1) & 3, mantissa = code & 1;
  const float v = exponent == 0 ? 0.5f * static_cast<float>(mantissa)
                                : std::ldexp(1.0f + 0.5f * static_cast<float>(mantissa), exponent - 1);
  return (code & 8) != 0 ? -v : v;
}

// What torch computes for transformers' convert_moe_packed_tensors: ldexp(value, s - 127) in float32, an exact
// scaling rounded once (0.5 x 2^128 is 2^127; infinity past float32's range, never NaN).
float Mxfp4Reference(uint8_t code, uint8_t s) { return std::ldexp(E2m1(code), int{s} - 127); }

struct Mxfp4Case {
  int64_t n, k;
  std::vector<uint8_t> blocks;  // [n, k / 32, 16]
  std::vector<uint8_t> scales;  // [n, k / 32]
  std::vector<float> dense;     // [n, k]
  Mxfp4Weights weights() const { return {blocks.data(), scales.data()}; }
  uint8_t CodeAt(int64_t i, int64_t j) const {
    const uint8_t byte = blocks[static_cast<size_t>(i * (k / 2) + j / 2)];
    return j % 2 == 0 ? byte & 0xF : byte >> 4;
  }
  void Densify() {
    dense.resize(static_cast<size_t>(n * k));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < k; ++j) dense[i * k + j] = Mxfp4Reference(CodeAt(i, j), scales[i * (k / 32) + j / 32]);
    }
  }
};

// Random codes, scale bytes drawn from [s_lo, s_hi]. Blocks of scale 253 and 254 keep their products finite (in
// float32 and bfloat16: at most 3 and 1.5 there), as the loader requires of a checkpoint.
Mxfp4Case MakeMxfp4(int64_t n, int64_t k, int s_lo, int s_hi, std::mt19937& gen) {
  Mxfp4Case c{n, k, {}, {}, {}};
  std::uniform_int_distribution<int> byte(0, 255), scale(s_lo, s_hi);
  c.blocks.resize(static_cast<size_t>(n * k / 2));
  c.scales.resize(static_cast<size_t>(n * k / 32));
  for (uint8_t& s : c.scales) s = static_cast<uint8_t>(scale(gen));
  for (size_t i = 0; i < c.blocks.size(); ++i) {
    uint8_t b = static_cast<uint8_t>(byte(gen));
    const uint8_t s = c.scales[i / 16];
    const int largest = s == 254 ? 3 : (s == 253 ? 5 : 7);  // code magnitudes 1.5 and 3.0
    auto clamp = [&](int code) { return ((code & 7) > largest ? (code & 8) | largest : code); };
    b = static_cast<uint8_t>(clamp(b & 0xF) | clamp(b >> 4) << 4);
    c.blocks[i] = b;
  }
  c.Densify();
  return c;
}

TEST(KernelsQuantizedScalar, E2m1CodesAreTheirDefinition) {
  for (int code = 0; code < 16; ++code) {
    ASSERT_TRUE(SameFloat(E2m1ToFloat(static_cast<uint8_t>(code)), E2m1(static_cast<uint8_t>(code)))) << code;
  }
  EXPECT_TRUE(std::signbit(E2m1ToFloat(8)) && E2m1ToFloat(8) == 0.0f);  // code 8 is -0
  EXPECT_EQ(E2m1ToFloat(7), 6.0f);
  EXPECT_EQ(E2m1ToFloat(9), -0.5f);
}

// Every code at every nibble of a block (so every lane and both halves of each byte), every scale byte (253-255,
// whose large codes overflow float32, included: 0.5 x 2^128 is 2^127, more is infinite): float32 bit for bit the
// reference, -0 kept; bfloat16 that value rounded (exact where finite).
TEST_P(KernelsQuantized, Mxfp4DequantizeIsBitExact) {
  for (int64_t k : {32, 96, 160}) {
    const int64_t blocks_k = k / 32;
    const int64_t n = (256 + blocks_k - 1) / blocks_k + 1;  // every scale byte at least once
    Mxfp4Case c{n, k, {}, {}, {}};
    c.blocks.resize(static_cast<size_t>(n * k / 2));
    c.scales.resize(static_cast<size_t>(n * blocks_k));
    for (size_t i = 0; i < c.scales.size(); ++i) c.scales[i] = static_cast<uint8_t>(i * 97 % 256);
    for (size_t i = 0; i < c.blocks.size(); ++i) c.blocks[i] = static_cast<uint8_t>((i * 37 + i / 16) & 0xFF);
    c.Densify();
    std::vector<bool> seen(256);
    for (uint8_t s : c.scales) seen[s] = true;
    ASSERT_EQ(std::count(seen.begin(), seen.end(), true), 256);
    for (int64_t n0 : {0, 1, 3}) {
      std::vector<float> out(static_cast<size_t>((n - n0) * k), -7.0f);
      std::vector<BFloat16> out16(out.size());
      DequantizeRows(c.weights(), k, n, n0, n, out.data());
      DequantizeRows(c.weights(), k, n, n0, n, out16.data());
      for (int64_t i = n0; i < n; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          const float expected = c.dense[i * k + j];
          const size_t at = static_cast<size_t>((i - n0) * k + j);
          ASSERT_TRUE(SameFloat(out[at], expected))
              << "k " << k << " row " << i << " col " << j << " code " << int{c.CodeAt(i, j)} << " scale "
              << int{c.scales[i * blocks_k + j / 32]} << ": " << out[at] << " vs " << expected;
          ASSERT_EQ(out16[at].bits, ToBF16(expected).bits) << "bfloat16 row " << i << " col " << j;
        }
      }
    }
  }
}

// Rows 1-4 (decode; and 5 and 13, the wider tiles) against the reference, float32 and bfloat16 outputs and input
// rows, k of 1 to 90 blocks (odd counts included), every scale byte whose weights are finite (0-254: the rows are
// run in windows of 16 scale bytes, x scaled so that the products stay near 1 and neither sums nor weights leave
// float32's range).
TEST_P(KernelsQuantized, Mxfp4RowsMatchTheReference) {
  std::mt19937 gen(12);
  const int64_t ks[] = {32, 96, 160, 256, 2880};
  int shape = 0;
  for (int s0 = 0; s0 <= 254; s0 += 16, ++shape) {
    const int s1 = std::min(s0 + 15, 254);
    const int64_t k = ks[shape % 5], n = k == 2880 ? 9 : 11;
    const Mxfp4Case c = MakeMxfp4(n, k, s0, s1, gen);
    const float x_scale = std::ldexp(1.0f, 127 - (s0 + 12));
    const std::string what =
        "mxfp4 scales " + std::to_string(s0) + "-" + std::to_string(s1) + " k " + std::to_string(k);
    for (int64_t rows : {1, 2, 3, 4, 5, 13}) {
      if (rows > 4 && shape % 4 != 0) continue;
      for (bool bias : {false, true}) {
        CheckRows<float>(c.weights(), c.dense, n, k, rows, bias, 0, n, gen, what.c_str(), x_scale);
        CheckRows<Bf16Out>(c.weights(), c.dense, n, k, rows, bias, 1, n - 2, gen, what.c_str(), x_scale);
        CheckBf16Rows(c.weights(), c.dense, {}, n, k, rows, bias, 0, n, gen, what.c_str(), x_scale);
        CheckBf16Rows(c.weights(), c.dense, {}, n, k, rows, bias, 2, n - 1, gen, what.c_str(), x_scale);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// gpt-oss's shapes: more weight rows than a chunk of the kernels' scales (32) with a short last tile, at the scales
// its checkpoints hold (2^-8 .. 2^0).
TEST_P(KernelsQuantized, Mxfp4GptOssShapesMatchTheReference) {
  std::mt19937 gen(13);
  const Mxfp4Case c = MakeMxfp4(75, 2880, 119, 127, gen);
  for (int64_t rows : {1, 2, 4}) {
    CheckRows<float>(c.weights(), c.dense, 75, 2880, rows, true, 3, 70, gen, "gpt-oss shape");
    CheckBf16Rows(c.weights(), c.dense, {}, 75, 2880, rows, true, 0, 75, gen, "gpt-oss shape");
    if (HasFatalFailure()) return;
  }
}

// The layout quantized.h documents: byte i of a 32-code chunk holds code i (low nibble) and code 16 + i
// (high); a last chunk of c < 32 codes holds code i and c / 2 + i.
TEST(KernelsQuantizedScalar, PackInt4LayoutAndRoundTrip) {
  std::vector<uint8_t> codes(64 + 6);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i % 16);
  std::vector<uint8_t> packed(codes.size() / 2);
  PackInt4(codes.data(), 1, static_cast<int64_t>(codes.size()), packed.data());
  EXPECT_EQ(packed[0], 0x00);         // codes 0 and 16
  EXPECT_EQ(packed[1], 0x11);         // codes 1 and 17
  EXPECT_EQ(packed[16], 0x00);        // codes 32 and 48
  EXPECT_EQ(packed[32], 0x30);        // codes 64 (0) and 67 (3)
  EXPECT_EQ(packed[34], 2 | 5 << 4);  // codes 66 and 69
  std::mt19937 gen(6);
  std::uniform_int_distribution<int> code(0, 15);
  for (int64_t k : {2, 30, 32, 64, 72, 200, 4096}) {
    const int64_t n = 3;
    std::vector<uint8_t> c(static_cast<size_t>(n * k)), p(static_cast<size_t>(n * k / 2));
    for (uint8_t& q : c) q = static_cast<uint8_t>(code(gen));
    PackInt4(c.data(), n, k, p.data());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < k; ++j) ASSERT_EQ(Int4Code(p.data(), k, i, j), c[i * k + j]) << "k " << k;
    }
  }
}

}  // namespace
}  // namespace strata::kernels
