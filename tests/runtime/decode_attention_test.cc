// runtime/model/decode_attention.h: decode rows' attention read from the paged pools, against softmax(q k^T
// scale) v in float64 over each row's visible keys gathered by hand: block tables in shuffled order, blocks of
// 16 and of 3 positions, GQA groups of 1, 3 and 8 query heads, head_dim with and without a tail of 16,
// sliding windows, float32 and bfloat16, one and two intra-op threads.
#include "runtime/model/decode_attention.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/runtime/intra_op_threads.h"

namespace strata::runtime {
namespace {

// Row b's output [heads, head_dim] in float64, from the pools as KvWrite lays them out.
at::Tensor Reference(const at::Tensor& q, const KvLayer& cache, const at::Tensor& table, int64_t block_tokens,
                     int64_t b, int64_t position, int64_t window, double scale) {
  const int64_t lo = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
  std::vector<int64_t> rows;
  for (int64_t t = lo; t <= position; ++t) {
    rows.push_back(table[b][t / block_tokens].item<int64_t>() * block_tokens + t % block_tokens);
  }
  const at::Tensor index = at::tensor(rows, at::kLong);
  const int64_t group = q.size(1) / cache.k.size(1);
  const at::Tensor k = cache.k.index_select(0, index).to(at::kDouble).transpose(0, 1).repeat_interleave(group, 0);
  const at::Tensor v = cache.v.index_select(0, index).to(at::kDouble).transpose(0, 1).repeat_interleave(group, 0);
  const at::Tensor qb = q[b].to(at::kDouble);                                        // [heads, 1, D]
  const at::Tensor weights = at::softmax(qb.matmul(k.transpose(1, 2)) * scale, -1);  // [heads, 1, L]
  return weights.matmul(v).squeeze(1);                                               // [heads, D]
}

class DecodeAttentionTest : public ::testing::TestWithParam<std::tuple<at::ScalarType, int>> {};

TEST_P(DecodeAttentionTest, MatchesSoftmaxOverTheVisibleKeys) {
  const auto [dtype, threads] = GetParam();
  const IntraOpThreads scope(threads);
  int checked = 0;
  for (const auto& [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {12, 4}, {16, 2}}) {
    for (int64_t dim : {64, 80, 256}) {
      for (int64_t block_tokens : {16, 3}) {
        for (int64_t window : {0, 5}) {
          const int64_t blocks = 40, table_blocks = 12, rows = 5;
          KvLayer cache{at::randn({blocks * block_tokens, kv_heads, dim}).to(dtype),
                        at::randn({blocks * block_tokens, kv_heads, dim}).to(dtype)};
          // Each row owns table_blocks distinct blocks in shuffled order (not strided runs).
          const at::Tensor table = at::randperm(blocks, at::kLong).narrow(0, 0, rows * 8).view({rows, 8});
          const at::Tensor tables = at::cat({table, table.narrow(1, 0, table_blocks - 8)}, 1);
          const std::vector<int64_t> where = {0, 1, 7, 8 * block_tokens - 1, 2 * block_tokens + 1};
          const at::Tensor positions = at::tensor(where, at::kLong).view({rows, 1});
          const at::Tensor q = at::randn({rows, heads, 1, dim}).to(dtype);
          const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
          ASSERT_TRUE(DecodeAttentionApplies(q, cache, 1));
          const at::Tensor got =
              DecodeAttention(q, cache, KvBlockTables{tables, block_tokens}, positions, window, scale);
          ASSERT_EQ(got.sizes(), q.sizes());
          ASSERT_EQ(got.scalar_type(), dtype);
          for (int64_t b = 0; b < rows; ++b) {
            const at::Tensor want = Reference(q, cache, tables, block_tokens, b, where[b], window, scale);
            const at::Tensor row = got[b].squeeze(1).to(at::kDouble);
            // float32: sums in another order; bfloat16: the output rounded once (2^-8 relative).
            const double tolerance = dtype == at::kFloat ? 1e-5 : 1.0 / 128;
            EXPECT_TRUE(at::allclose(row, want, tolerance, tolerance))
                << "heads " << heads << "/" << kv_heads << " dim " << dim << " block " << block_tokens << " window "
                << window << " row " << b << " (position " << where[b] << ")";
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 3 * 2 * 2 * 5);
}

INSTANTIATE_TEST_SUITE_P(DtypesThreads, DecodeAttentionTest,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16), ::testing::Values(1, 2)));

TEST(DecodeAttention, OtherOperandsKeepSdpa) {
  const KvLayer cache{at::randn({32, 2, 64}), at::randn({32, 2, 64})};
  EXPECT_TRUE(DecodeAttentionApplies(at::randn({1, 4, 1, 64}), cache, 1));                 // on every CPU (kernels/)
  EXPECT_FALSE(DecodeAttentionApplies(at::randn({1, 4, 2, 64}), cache, 2));                // a prefill chunk
  EXPECT_FALSE(DecodeAttentionApplies(at::randn({1, 4, 1, 64}).to(at::kHalf), cache, 1));  // float16
  EXPECT_FALSE(DecodeAttentionApplies(at::randn({1, 4, 1, 64}).to(at::kBFloat16), cache, 1));  // mixed dtypes
  EXPECT_FALSE(DecodeAttentionApplies(at::randn({1, 3, 1, 64}), cache, 1));  // 3 heads over 2 KV heads
  const KvLayer wide{at::randn({32, 2, 320}), at::randn({32, 2, 320})};
  EXPECT_FALSE(DecodeAttentionApplies(at::randn({1, 4, 1, 320}), wide, 1));  // head_dim past 256
}

TEST(DecodeAttention, ABlockOutsideThePoolIsAnError) {
  const KvLayer cache{at::randn({32, 2, 64}), at::randn({32, 2, 64})};
  const at::Tensor q = at::randn({1, 2, 1, 64});
  const at::Tensor positions = at::tensor(std::vector<int64_t>{20}, at::kLong).view({1, 1});
  const at::Tensor table = at::tensor(std::vector<int64_t>{0, 7}, at::kLong).view({1, 2});  // block 7 of 2
  EXPECT_THROW(DecodeAttention(q, cache, KvBlockTables{table, 16}, positions, 0, 0.125), c10::Error);
  const at::Tensor late = at::tensor(std::vector<int64_t>{40}, at::kLong).view({1, 1});  // past the table
  EXPECT_THROW(
      DecodeAttention(q, cache, KvBlockTables{at::tensor(std::vector<int64_t>{0, 1}, at::kLong).view({1, 2}), 16}, late,
                      0, 0.125),
      c10::Error);
}

}  // namespace
}  // namespace strata::runtime
