// kernels/attention: decode attention of one KV head on every Highway target this machine supports, against
// a double-precision softmax(scale q.k) v over keys scattered in a pool (runtime/model's test checks the
// block-table walk and SDPA's side).
#include "kernels/attention.h"

#include <gtest/gtest.h>
#include <hwy/tests/hwy_gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "tests/kernels/bf16_util.h"

namespace strata::kernels {
namespace {

using reference::FromBF16;
using reference::ToBF16;
using reference::Value;

HWY_BEFORE_TEST(KernelsAttention);

// `with_sinks`: gpt-oss's sinks, one more softmax logit per query head with no value (some larger than every score,
// so that they dominate).
template <typename T>
void Check(int64_t group, int64_t dim, int64_t length, double tolerance, bool with_sinks = false) {
  std::mt19937 gen(static_cast<uint32_t>(group * 1000 + dim * 10 + length));
  std::normal_distribution<float> normal;
  auto make = [&](int64_t n) {
    std::vector<T> v(static_cast<size_t>(n));
    for (T& x : v) {
      if constexpr (std::is_same_v<T, float>) {
        x = normal(gen);
      } else {
        x = ToBF16(normal(gen));
      }
    }
    return v;
  };
  // A pool of 2 * length + 3 slots; key t sits at slot 2 t + 1 (not contiguous, as paged blocks are).
  const int64_t slots = 2 * length + 3;
  const std::vector<T> q = make(group * dim), keys = make(slots * dim), values = make(slots * dim);
  std::vector<int64_t> offsets;
  for (int64_t t = 0; t < length; ++t) offsets.push_back((2 * t + 1) * dim);
  std::vector<T> out(static_cast<size_t>(group * dim));
  std::vector<float> scratch(static_cast<size_t>(group * (length + dim)));
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  std::vector<float> sinks;
  for (int64_t g = 0; g < group; ++g) sinks.push_back(g % 2 == 0 ? 3.0f * normal(gen) : 12.0f + normal(gen));
  DecodeAttentionHead(q.data(), keys.data(), values.data(), offsets.data(), length, group, dim, scale, out.data(),
                      scratch.data(), with_sinks ? sinks.data() : nullptr);
  for (int64_t g = 0; g < group; ++g) {
    std::vector<double> s(static_cast<size_t>(length));
    double peak = -INFINITY, total = 0;
    for (int64_t t = 0; t < length; ++t) {
      double dot = 0;
      for (int64_t c = 0; c < dim; ++c) {
        dot += double{Value(q[g * dim + c])} * scale * Value(keys[offsets[t] + c]);
      }
      s[t] = dot;
      peak = std::max(peak, dot);
    }
    if (with_sinks) peak = std::max(peak, double{sinks[g]});
    for (double& x : s) total += (x = std::exp(x - peak));
    if (with_sinks) total += std::exp(sinks[g] - peak);
    for (int64_t c = 0; c < dim; ++c) {
      double expected = 0;
      for (int64_t t = 0; t < length; ++t) expected += s[t] / total * Value(values[offsets[t] + c]);
      ASSERT_NEAR(Value(out[g * dim + c]), expected, tolerance)
          << "group " << group << " dim " << dim << " length " << length << " head " << g << " column " << c;
    }
  }
}

TEST_P(KernelsAttention, SinksTakePartInTheSoftmaxWithoutAValue) {
  for (int64_t group : {1, 4}) {
    for (int64_t dim : {24, 64, 128}) {
      for (int64_t length : {1, 7, 300}) {
        Check<float>(group, dim, length, 2e-5, /*with_sinks=*/true);
        Check<BFloat16>(group, dim, length, 2e-2, /*with_sinks=*/true);
      }
    }
  }
}

TEST_P(KernelsAttention, Float32MatchesTheSoftmaxInDouble) {
  for (int64_t group : {1, 3, 8}) {
    for (int64_t dim : {24, 64, 80, 128, 256}) {
      for (int64_t length : {1, 5, 17, 300}) Check<float>(group, dim, length, 2e-5);
    }
  }
}

TEST_P(KernelsAttention, BFloat16MatchesTheSoftmaxInDouble) {
  for (int64_t group : {1, 4}) {
    for (int64_t dim : {24, 128}) {
      for (int64_t length : {1, 33}) Check<BFloat16>(group, dim, length, 2e-2);
    }
  }
}

// LatentAttentionHeads: every head over one shared latent KV head whose values are the first value_dim of each row.
template <typename T>
void CheckLatent(int64_t heads, int64_t key_dim, int64_t value_dim, int64_t length, double tolerance) {
  std::mt19937 gen(static_cast<uint32_t>(heads * 7919 + key_dim * 31 + value_dim * 7 + length));
  std::normal_distribution<float> normal;
  std::vector<float> q(static_cast<size_t>(heads * key_dim));
  for (float& x : q) x = normal(gen);
  const int64_t slots = 2 * length + 3;  // row t at slot 2 t + 1, as paged blocks scatter them
  std::vector<T> rows(static_cast<size_t>(slots * key_dim));
  for (T& x : rows) {
    if constexpr (std::is_same_v<T, float>) {
      x = normal(gen);
    } else {
      x = ToBF16(normal(gen));
    }
  }
  std::vector<int64_t> offsets;
  for (int64_t t = 0; t < length; ++t) offsets.push_back((2 * t + 1) * key_dim);
  std::vector<float> out(static_cast<size_t>(heads * value_dim), NAN);
  std::vector<float> scratch(static_cast<size_t>(heads * (length + 1)));
  const float scale = 1.0f / std::sqrt(static_cast<float>(key_dim));
  LatentAttentionHeads(q.data(), rows.data(), offsets.data(), length, heads, key_dim, value_dim, scale, out.data(),
                       scratch.data());
  for (int64_t g = 0; g < heads; ++g) {
    std::vector<double> s(static_cast<size_t>(length));
    double peak = -INFINITY, total = 0;
    for (int64_t t = 0; t < length; ++t) {
      double dot = 0;
      for (int64_t c = 0; c < key_dim; ++c) dot += double{q[g * key_dim + c]} * Value(rows[offsets[t] + c]);
      s[t] = dot * scale;
      peak = std::max(peak, s[t]);
    }
    for (double& x : s) total += (x = std::exp(x - peak));
    for (int64_t c = 0; c < value_dim; ++c) {
      double expected = 0;
      for (int64_t t = 0; t < length; ++t) expected += s[t] / total * Value(rows[offsets[t] + c]);
      ASSERT_NEAR(out[g * value_dim + c], expected, tolerance)
          << "heads " << heads << " key_dim " << key_dim << " value_dim " << value_dim << " length " << length
          << " head " << g << " column " << c;
    }
  }
}

TEST_P(KernelsAttention, LatentHeadsMatchTheSoftmaxInDouble) {
  // DeepSeek-V3's 576 / 512 and tiny models' odd widths; lengths across the 64-key tiles.
  for (auto [key_dim, value_dim] : {std::pair<int64_t, int64_t>{576, 512}, {40, 32}, {27, 19}}) {
    for (int64_t heads : {1, 4, 16}) {
      for (int64_t length : {1, 5, 64, 65, 200}) {
        CheckLatent<float>(heads, key_dim, value_dim, length, 2e-5);
        CheckLatent<BFloat16>(heads, key_dim, value_dim, length, 2e-5);  // float32 sums of bf16 rows: as exact
      }
    }
  }
}

}  // namespace
}  // namespace strata::kernels
