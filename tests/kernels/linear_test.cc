// kernels/linear: one to 33 rows against a weight matrix on every Highway target this machine supports,
// against a double-precision reference (runtime/model's test compares Linear with at::linear).
#include "kernels/linear.h"

#include <gtest/gtest.h>
#include <hwy/tests/hwy_gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "tests/kernels/bf16_util.h"

namespace strata::kernels {
namespace {

using reference::FromBF16;
using reference::ToBF16;
using reference::Value;

HWY_BEFORE_TEST(KernelsLinear);

// y [rows, n] against x W^T (+ bias) summed in double, within float32's (or bfloat16's) rounding, on outputs
// [n0, n1); every other output still the sentinel.
template <typename T>
void ExpectProducts(const std::vector<float>& x, const std::vector<T>& w, const std::vector<T>& bias, bool with_bias,
                    const std::vector<T>& y, T sentinel, int64_t rows, int64_t k, int64_t n, int64_t n0, int64_t n1) {
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t j = 0; j < n; ++j) {
      if (j < n0 || j >= n1) {
        ASSERT_EQ(Value(y[m * n + j]), Value(sentinel)) << "rows " << rows << " k " << k << " out " << j;
        continue;
      }
      double expected = with_bias ? Value(bias[j]) : 0.0;
      for (int64_t i = 0; i < k; ++i) expected += double{x[m * k + i]} * Value(w[j * k + i]);
      const double tolerance = (std::is_same_v<T, float> ? 1e-5 : 1e-2 * std::abs(expected) + 1e-3) *
                               std::max(1.0, std::sqrt(static_cast<double>(k)));
      ASSERT_NEAR(Value(y[m * n + j]), expected, tolerance) << "rows " << rows << " k " << k << " out " << j;
    }
  }
}

// Output rows [n0, n1) of n.
template <typename T>
void Check(int64_t rows, int64_t k, bool with_bias, int64_t n = 7, int64_t n0 = 2, int64_t n1 = 6) {
  std::mt19937 gen(static_cast<uint32_t>(rows * 100000 + k * 2 + with_bias));
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (float& v : x) v = normal(gen);
  std::vector<T> w(static_cast<size_t>(n * k)), bias(static_cast<size_t>(n)), y(static_cast<size_t>(rows * n));
  for (size_t i = 0; i < w.size(); ++i) {
    const float v = normal(gen);
    if constexpr (std::is_same_v<T, float>) {
      w[i] = v;
    } else {
      w[i] = ToBF16(v);
    }
  }
  for (size_t i = 0; i < bias.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) {
      bias[i] = normal(gen);
    } else {
      bias[i] = ToBF16(normal(gen));
    }
  }
  // The kernel writes [n0, n1) and leaves the rest.
  T sentinel;
  if constexpr (std::is_same_v<T, float>) {
    sentinel = -7.0f;
  } else {
    sentinel = ToBF16(-7.0f);
  }
  std::fill(y.begin(), y.end(), sentinel);
  LinearRows(x.data(), w.data(), with_bias ? bias.data() : nullptr, y.data(), rows, k, n, n0, n1);
  ExpectProducts(x, w, bias, with_bias, y, sentinel, rows, k, n, n0, n1);
}

TEST_P(KernelsLinear, OneAndTwoRowsMatchTheReference) {
  for (int64_t rows : {1, 2}) {
    for (int64_t k : {1, 7, 64, 100, 2049, 3000}) {
      for (bool bias : {false, true}) {
        Check<float>(rows, k, bias);
        Check<BFloat16>(rows, k, bias);
      }
    }
  }
}

// Three and more rows go by tiles: every row count modulo the 4-row groups, K with and without a tail, and
// the output range [2, 6) cut across tile blocks of 3 and 4 weight rows.
TEST_P(KernelsLinear, TilesOfMoreRowsMatchTheReference) {
  for (int64_t rows : {3, 4, 5, 6, 7, 8, 16, 33}) {
    for (int64_t k : {1, 9, 64, 100, 768}) {
      for (bool bias : {false, true}) {
        Check<float>(rows, k, bias);
        Check<BFloat16>(rows, k, bias);
      }
    }
  }
}

// Many blocks of weight rows in one call: the next block is prefetched while one is multiplied, and bfloat16
// weights with more than 4 input rows are widened once per block into a scratch (reused across calls of
// different K on this thread) while a block fits L1.
TEST_P(KernelsLinear, ManyBlocksOfWeightRowsMatchTheReference) {
  for (int64_t rows : {3, 4, 5, 16}) {
    for (int64_t k : {9, 768, 33, 1500}) {  // 1500: past the widened block's 16 KiB, converted in registers
      Check<float>(rows, k, true, 40, 1, 38);
      Check<BFloat16>(rows, k, true, 40, 1, 38);
      Check<BFloat16>(rows, k, false, 40, 0, 40);
    }
  }
}

// The panel layout: a weight packed and run by LinearPanels over panels [p0, p1) of n outputs; every other output
// is left as it was.
template <typename T>
void CheckPanels(int64_t rows, int64_t k, bool with_bias, int64_t n, int64_t p0, int64_t p1) {
  std::mt19937 gen(static_cast<uint32_t>(rows * 1000003 + k * 7 + n * 2 + with_bias));
  std::normal_distribution<float> normal;
  auto draw = [&]() -> T {
    if constexpr (std::is_same_v<T, float>) {
      return normal(gen);
    } else {
      return ToBF16(normal(gen));
    }
  };
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (float& v : x) v = normal(gen);
  std::vector<T> w(static_cast<size_t>(n * k)), bias(static_cast<size_t>(n)), panels(w.size()), back(w.size());
  for (T& v : w) v = draw();
  for (T& v : bias) v = draw();
  PackPanels(w.data(), n, k, panels.data());
  UnpackPanels(panels.data(), n, k, back.data());
  for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(Value(back[i]), Value(w[i])) << "unpacked element " << i;
  T sentinel;
  if constexpr (std::is_same_v<T, float>) {
    sentinel = -7.0f;
  } else {
    sentinel = ToBF16(-7.0f);
  }
  std::vector<T> y(static_cast<size_t>(rows * n), sentinel);
  LinearPanels(x.data(), panels.data(), with_bias ? bias.data() : nullptr, y.data(), rows, k, n, p0, p1);
  const int64_t n0 = p0 * kPanelRows, n1 = std::min(n, p1 * kPanelRows);
  ExpectProducts(x, w, bias, with_bias, y, sentinel, rows, k, n, n0, n1);
}

// Every tile shape (1 and 2 rows, and rows split into tiles of even size), K across the panels' 256-column
// chunks, the narrow last panel, and a range of panels that starts past 0 or stops short of the end.
TEST_P(KernelsLinear, PanelsMatchTheReference) {
  for (int64_t rows : {1, 2, 3, 5, 6, 7, 12, 13, 16, 33}) {
    for (int64_t k : {1, 9, 255, 257, 768}) {
      for (bool bias : {false, true}) {
        CheckPanels<float>(rows, k, bias, 40, 0, 3);
        CheckPanels<BFloat16>(rows, k, bias, 40, 0, 3);
      }
      CheckPanels<float>(rows, k, true, 200, 1, 12);  // 200 = 12 full panels and 8 rows: 11 of them, PP at a time
      CheckPanels<BFloat16>(rows, k, true, 200, 3, 13);
      CheckPanels<BFloat16>(rows, k, false, 16, 0, 1);
    }
  }
}

// Many rows (prefill): rows past L2 in blocks, the chunks of a wide K, the panels in groups of 32 (the last one
// short, with the narrow last panel after it).
TEST_P(KernelsLinear, PanelsOfManyRowsMatchTheReference) {
  for (int64_t k : {700, 1500}) {
    CheckPanels<float>(100, k, true, 48, 0, 3);
    CheckPanels<BFloat16>(97, k, true, 40, 0, 3);
  }
  CheckPanels<float>(300, 300, true, 16 * 70 + 5, 1, 71);
  CheckPanels<BFloat16>(263, 520, false, 16 * 40, 2, 40);
}

// bfloat16 input rows: VDPBF16PS on the AVX-512 targets where the CPU has AVX512_BF16, widened elsewhere;
// against the reference on the same bfloat16 values.
void CheckBf16Rows(int64_t rows, int64_t k, bool with_bias) {
  const int64_t n = 7;
  std::mt19937 gen(static_cast<uint32_t>(rows * 7919 + k * 3 + with_bias));
  std::normal_distribution<float> normal;
  std::vector<BFloat16> x(static_cast<size_t>(rows * k)), w(static_cast<size_t>(n * k)), bias(static_cast<size_t>(n));
  std::vector<BFloat16> y(static_cast<size_t>(rows * n), ToBF16(-7.0f));
  for (BFloat16& v : x) v = ToBF16(normal(gen));
  for (BFloat16& v : w) v = ToBF16(normal(gen));
  for (BFloat16& v : bias) v = ToBF16(normal(gen));
  LinearRows(x.data(), w.data(), with_bias ? bias.data() : nullptr, y.data(), rows, k, n, 2, 6);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t j = 0; j < n; ++j) {
      if (j < 2 || j >= 6) {
        ASSERT_EQ(Value(y[m * n + j]), -7.0) << "wrote outside [n0, n1): row " << m << " out " << j;
        continue;
      }
      double expected = with_bias ? Value(bias[j]) : 0.0;
      for (int64_t i = 0; i < k; ++i) expected += Value(x[m * k + i]) * Value(w[j * k + i]);
      const double tolerance = (1e-2 * std::abs(expected) + 1e-3) * std::max(1.0, std::sqrt(static_cast<double>(k)));
      ASSERT_NEAR(Value(y[m * n + j]), expected, tolerance) << "rows " << rows << " k " << k << " out " << j;
    }
  }
}

TEST_P(KernelsLinear, Bf16InputRowsMatchTheReference) {
  for (int64_t rows : {1, 2, 3, 4, 5, 8, 16, 33}) {
    for (int64_t k : {1, 31, 32, 33, 100, 768, 2049}) {
      for (bool bias : {false, true}) CheckBf16Rows(rows, k, bias);
    }
  }
}

}  // namespace
}  // namespace strata::kernels
