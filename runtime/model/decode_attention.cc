#include "runtime/model/decode_attention.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/model/cpu_features.h"
#include "runtime/model/simd_avx512.h"

namespace strata::runtime {
namespace {

constexpr int64_t kMaxHeadDim = 256;
constexpr int kMaxChunks = kMaxHeadDim / 16;

using simd::Exp;
using simd::Load;
using simd::Store;
using simd::Tail;

struct Shape {
  int64_t heads, kv_heads, group, dim, block_tokens, table_blocks, pool_rows, window;
  float scale;
};

// GCC 12 warns, wrongly, that _mm512_reduce_add_ps reads an uninitialized value (see linear.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Row b, KV head h: out[b, h * group + g] for its `group` query heads.
template <typename T>
STRATA_AVX512 void OneHead(const T* q, const T* keys, const T* values, const int64_t* table, int64_t position, T* out,
                           const Shape& s, int64_t b, int64_t h, std::vector<float>& scores,
                           std::vector<int64_t>& offsets) {
  const int64_t lo = s.window > 0 ? std::max<int64_t>(0, position - s.window + 1) : 0;
  const int64_t length = position - lo + 1;
  const int chunks = static_cast<int>((s.dim + 15) / 16);
  auto mask_of = [&](int c) { return Tail(s.dim - 16 * c); };
  scores.resize(static_cast<size_t>(s.group * length));
  // Where key position lo + t of head h starts in the pools: its block's first row plus its offset in the block.
  offsets.resize(static_cast<size_t>(length));
  for (int64_t t = 0; t < length; ++t) {
    const int64_t block = table[(lo + t) / s.block_tokens];
    const int64_t row = block * s.block_tokens + (lo + t) % s.block_tokens;
    TORCH_CHECK(block >= 0 && row < s.pool_rows, "DecodeAttention: block ", block, " of row ", b,
                " is outside the KV pool (", s.pool_rows, " positions)");
    offsets[static_cast<size_t>(t)] = (row * s.kv_heads + h) * s.dim;
  }

  // Scores: each key is loaded once for the group's query heads.
  __m512 qv[8][kMaxChunks];
  for (int64_t g0 = 0; g0 < s.group; g0 += 8) {
    const int64_t gn = std::min<int64_t>(8, s.group - g0);
    for (int64_t g = 0; g < gn; ++g) {
      const T* qrow = q + ((b * s.heads) + h * s.group + g0 + g) * s.dim;
      for (int c = 0; c < chunks; ++c) {
        qv[g][c] = _mm512_mul_ps(Load(qrow + 16 * c, mask_of(c)), _mm512_set1_ps(s.scale));
      }
    }
    for (int64_t t = 0; t < length; ++t) {
      const T* key = keys + offsets[static_cast<size_t>(t)];
      __m512 kv[kMaxChunks];
      for (int c = 0; c < chunks; ++c) kv[c] = Load(key + 16 * c, mask_of(c));
      for (int64_t g = 0; g < gn; ++g) {
        __m512 acc = _mm512_mul_ps(qv[g][0], kv[0]);
        for (int c = 1; c < chunks; ++c) acc = _mm512_fmadd_ps(qv[g][c], kv[c], acc);
        scores[static_cast<size_t>((g0 + g) * length + t)] = _mm512_reduce_add_ps(acc);
      }
    }
  }

  // Softmax of each query head's scores, then the weighted sum of the values.
  for (int64_t g = 0; g < s.group; ++g) {
    float* row = scores.data() + g * length;
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < length; t += 16) {
      const __mmask16 m = Tail(length - t);
      top = _mm512_mask_max_ps(top, m, top, _mm512_maskz_loadu_ps(m, row + t));
    }
    const __m512 peak = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 total = _mm512_setzero_ps();
    for (int64_t t = 0; t < length; t += 16) {
      const __mmask16 m = Tail(length - t);
      const __m512 e = _mm512_maskz_mov_ps(m, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + t), peak)));
      _mm512_mask_storeu_ps(row + t, m, e);
      total = _mm512_add_ps(total, e);
    }
    const float inverse = 1.0f / _mm512_reduce_add_ps(total);
    __m512 acc[kMaxChunks];
    for (int c = 0; c < chunks; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < length; ++t) {
      const T* value = values + offsets[static_cast<size_t>(t)];
      const __m512 weight = _mm512_set1_ps(row[t]);
      for (int c = 0; c < chunks; ++c) acc[c] = _mm512_fmadd_ps(weight, Load(value + 16 * c, mask_of(c)), acc[c]);
    }
    T* dst = out + ((b * s.heads) + h * s.group + g) * s.dim;
    for (int c = 0; c < chunks; ++c) {
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, _mm512_mul_ps(acc[c], _mm512_set1_ps(inverse)));
      for (int64_t i = 0; i < std::min<int64_t>(16, s.dim - 16 * c); ++i) Store(dst + 16 * c + i, lanes[i]);
    }
  }
}

#pragma GCC diagnostic pop

template <typename T>
void Run(const at::Tensor& q, const KvLayer& cache, const at::Tensor& table, const at::Tensor& positions,
         at::Tensor& out, const Shape& s) {
  const int64_t rows = q.size(0);
  const T* qs = q.data_ptr<T>();
  const T* keys = cache.k.data_ptr<T>();
  const T* values = cache.v.data_ptr<T>();
  const int64_t* tables = table.data_ptr<int64_t>();
  const int64_t* where = positions.data_ptr<int64_t>();
  T* outs = out.data_ptr<T>();
  for (int64_t b = 0; b < rows; ++b) {
    TORCH_CHECK(where[b] >= 0 && where[b] < s.table_blocks * s.block_tokens, "DecodeAttention: position ", where[b],
                " of row ", b, " is outside its block table (", s.table_blocks * s.block_tokens, " positions)");
  }
  // A task is one (row, KV head); at least ~32k multiply-adds of keys per task are worth a thread's hand-off.
  const int64_t per_task = std::max<int64_t>(1, s.group * s.dim * (where[0] + 1));
  const int64_t grain = std::max<int64_t>(1, (32 << 10) / per_task);
  at::parallel_for(0, rows * s.kv_heads, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    thread_local std::vector<int64_t> offsets;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / s.kv_heads;
      OneHead<T>(qs, keys, values, tables + b * s.table_blocks, where[b], outs, s, b, task % s.kv_heads, scores,
                 offsets);
    }
  });
}

}  // namespace

bool DecodeAttentionApplies(const at::Tensor& q, const KvLayer& cache, int64_t count) {
  if (count != 1 || !CpuHasAvx512() || !q.device().is_cpu() || !cache.k.device().is_cpu()) return false;
  if (q.scalar_type() != at::kFloat && q.scalar_type() != at::kBFloat16) return false;
  if (cache.k.scalar_type() != q.scalar_type() || cache.v.scalar_type() != q.scalar_type()) return false;
  if (q.dim() != 4 || q.size(2) != 1 || q.size(3) > kMaxHeadDim || cache.k.dim() != 3) return false;
  return q.size(3) == cache.k.size(2) && cache.k.size(1) > 0 && q.size(1) % cache.k.size(1) == 0;
}

at::Tensor DecodeAttention(const at::Tensor& q, const KvLayer& cache, const KvBlockTables& tables,
                           const at::Tensor& positions, int64_t window, double scale) {
  const at::Tensor qc = q.contiguous();
  const at::Tensor table = tables.table.contiguous();
  const at::Tensor where = positions.reshape({-1}).contiguous();
  TORCH_CHECK(cache.k.is_contiguous() && cache.v.is_contiguous(), "DecodeAttention: the KV pools are not contiguous");
  TORCH_CHECK(table.size(0) == q.size(0) && where.size(0) == q.size(0), "DecodeAttention: ", q.size(0), " query rows, ",
              table.size(0), " block tables, ", where.size(0), " positions");
  const int64_t kv_heads = cache.k.size(1);
  const Shape shape{q.size(1),       kv_heads, q.size(1) / kv_heads,     q.size(3), tables.block_tokens, table.size(1),
                    cache.k.size(0), window,   static_cast<float>(scale)};
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (q.scalar_type() == at::kFloat) {
    Run<float>(qc, cache, table, where, out, shape);
  } else {
    Run<c10::BFloat16>(qc, cache, table, where, out, shape);
  }
  return out;
}

}  // namespace strata::runtime
