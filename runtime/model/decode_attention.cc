#include "runtime/model/decode_attention.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/attention.h"
#include "runtime/model/parallel.h"

namespace strata::runtime {
namespace {

constexpr int64_t kMaxHeadDim = 256;

struct Shape {
  int64_t heads, kv_heads, group, dim, block_tokens, table_blocks, pool_rows, window;
  float scale;
  const float* sinks = nullptr;  // [heads] float32, or none
};

// The kernels' element type for T (the same bits for bfloat16).
template <typename T>
using KernelT = std::conditional_t<std::is_same_v<T, float>, float, kernels::BFloat16>;
template <typename T>
const KernelT<T>* K(const T* p) {
  return reinterpret_cast<const KernelT<T>*>(p);
}
template <typename T>
KernelT<T>* K(T* p) {
  return reinterpret_cast<KernelT<T>*>(p);
}

// Row b, KV head h: out[b, h * group + g] for its `group` query heads, keys lo .. position of its table.
template <typename T>
void OneHead(const T* q, const T* keys, const T* values, const int64_t* table, int64_t position, T* out, const Shape& s,
             int64_t b, int64_t h, std::vector<float>& scratch, std::vector<int64_t>& offsets) {
  const int64_t lo = s.window > 0 ? std::max<int64_t>(0, position - s.window + 1) : 0;
  const int64_t length = position - lo + 1;
  // Where key position lo + t of head h starts in the pools: its block's first row plus its offset in the block.
  offsets.resize(static_cast<size_t>(length));
  for (int64_t t = 0; t < length; ++t) {
    const int64_t block = table[(lo + t) / s.block_tokens];
    const int64_t row = block * s.block_tokens + (lo + t) % s.block_tokens;
    TORCH_CHECK(block >= 0 && row < s.pool_rows, "DecodeAttention: block ", block, " of row ", b,
                " is outside the KV pool (", s.pool_rows, " positions)");
    offsets[static_cast<size_t>(t)] = (row * s.kv_heads + h) * s.dim;
  }
  scratch.resize(static_cast<size_t>(s.group * (length + s.dim)));
  const int64_t first = (b * s.heads + h * s.group) * s.dim;
  kernels::DecodeAttentionHead(K(q + first), K(keys), K(values), offsets.data(), length, s.group, s.dim, s.scale,
                               K(out + first), scratch.data(), s.sinks == nullptr ? nullptr : s.sinks + h * s.group);
}

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
  ParallelRows(rows * s.kv_heads, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    thread_local std::vector<int64_t> offsets;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / s.kv_heads;
      OneHead<T>(qs, keys, values, tables + b * s.table_blocks, where[b], outs, s, b, task % s.kv_heads, scratch,
                 offsets);
    }
  });
}

// Row b's latent attention for query heads [h0, h1).
template <typename T>
void LatentRow(const float* q, const T* pool, const int64_t* table, int64_t position, float* out, const Shape& s,
               int64_t b, int64_t h0, int64_t h1, int64_t value_dim, std::vector<float>& scratch,
               std::vector<int64_t>& offsets) {
  const int64_t length = position + 1;
  offsets.resize(static_cast<size_t>(length));
  for (int64_t t = 0; t < length; ++t) {
    const int64_t block = table[t / s.block_tokens];
    const int64_t row = block * s.block_tokens + t % s.block_tokens;
    TORCH_CHECK(block >= 0 && row < s.pool_rows, "LatentDecodeAttention: block ", block, " of row ", b,
                " is outside the KV pool (", s.pool_rows, " positions)");
    offsets[static_cast<size_t>(t)] = row * s.dim;
  }
  const int64_t heads = h1 - h0;
  scratch.resize(static_cast<size_t>(heads * (length + 1)));
  kernels::LatentAttentionHeads(q + (b * s.heads + h0) * s.dim, K(pool), offsets.data(), length, heads, s.dim,
                                value_dim, s.scale, out + (b * s.heads + h0) * value_dim, scratch.data());
}

}  // namespace

bool LatentDecodeApplies(const at::Tensor& q, const KvLayer& cache, int64_t count) {
  if (count != 1 || !q.device().is_cpu() || !cache.k.device().is_cpu() || cache.v.defined()) return false;
  if (cache.k.scalar_type() != at::kFloat && cache.k.scalar_type() != at::kBFloat16) return false;
  return cache.k.dim() == 3 && cache.k.size(1) == 1;
}

at::Tensor LatentDecodeAttention(const at::Tensor& q, const KvLayer& cache, const KvBlockTables& tables,
                                 const at::Tensor& positions, int64_t value_dim, double scale) {
  const at::Tensor qc = q.to(at::kFloat).contiguous();
  const at::Tensor table = tables.table.contiguous();
  const at::Tensor where = positions.reshape({-1}).contiguous();
  TORCH_CHECK(cache.k.is_contiguous(), "LatentDecodeAttention: the latent pool is not contiguous");
  TORCH_CHECK(q.dim() == 4 && q.size(2) == 1 && q.size(3) == cache.k.size(2) && value_dim <= q.size(3),
              "LatentDecodeAttention: queries ", q.sizes(), " against a pool of rows of ", cache.k.size(2));
  TORCH_CHECK(table.size(0) == q.size(0) && where.size(0) == q.size(0), "LatentDecodeAttention: ", q.size(0),
              " query rows, ", table.size(0), " block tables, ", where.size(0), " positions");
  const int64_t rows = q.size(0), heads = q.size(1);
  const Shape s{
      heads, 1, heads, q.size(3), tables.block_tokens, table.size(1), cache.k.size(0), 0, static_cast<float>(scale)};
  const int64_t* tables_data = table.data_ptr<int64_t>();
  const int64_t* at_position = where.data_ptr<int64_t>();
  for (int64_t b = 0; b < rows; ++b) {
    TORCH_CHECK(at_position[b] >= 0 && at_position[b] < s.table_blocks * s.block_tokens,
                "LatentDecodeAttention: position ", at_position[b], " of row ", b, " is outside its block table (",
                s.table_blocks * s.block_tokens, " positions)");
  }
  at::Tensor out = at::empty({rows, heads, 1, value_dim}, qc.options());
  // Tasks of (row, a slice of its heads): the heads share the row's latent keys, so a task takes as many heads as
  // leaves every thread a few tasks (a lone decode row still splits over the threads).
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t slices = std::min(heads, std::max<int64_t>(1, (2 * threads + rows - 1) / rows));
  const int64_t per_slice = (heads + slices - 1) / slices;
  const float* qs = qc.data_ptr<float>();
  float* outs = out.data_ptr<float>();
  auto run = [&](auto* pool) {
    ParallelRows(rows * slices, 1, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> scratch;
      thread_local std::vector<int64_t> offsets;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / slices, h0 = (task % slices) * per_slice, h1 = std::min(heads, h0 + per_slice);
        if (h0 < h1) {
          LatentRow(qs, pool, tables_data + b * s.table_blocks, at_position[b], outs, s, b, h0, h1, value_dim, scratch,
                    offsets);
        }
      }
    });
  };
  if (cache.k.scalar_type() == at::kFloat) {
    run(cache.k.data_ptr<float>());
  } else {
    run(cache.k.data_ptr<c10::BFloat16>());
  }
  return out;
}

bool DecodeAttentionApplies(const at::Tensor& q, const KvLayer& cache, int64_t count) {
  if (count != 1 || !q.device().is_cpu() || !cache.k.device().is_cpu()) return false;
  if (q.scalar_type() != at::kFloat && q.scalar_type() != at::kBFloat16) return false;
  if (cache.k.scalar_type() != q.scalar_type() || cache.v.scalar_type() != q.scalar_type()) return false;
  if (q.dim() != 4 || q.size(2) != 1 || q.size(3) > kMaxHeadDim || cache.k.dim() != 3) return false;
  return q.size(3) == cache.k.size(2) && cache.k.size(1) > 0 && q.size(1) % cache.k.size(1) == 0;
}

at::Tensor DecodeAttention(const at::Tensor& q, const KvLayer& cache, const KvBlockTables& tables,
                           const at::Tensor& positions, int64_t window, double scale, const at::Tensor& sinks) {
  const at::Tensor qc = q.contiguous();
  const at::Tensor table = tables.table.contiguous();
  const at::Tensor where = positions.reshape({-1}).contiguous();
  TORCH_CHECK(cache.k.is_contiguous() && cache.v.is_contiguous(), "DecodeAttention: the KV pools are not contiguous");
  TORCH_CHECK(table.size(0) == q.size(0) && where.size(0) == q.size(0), "DecodeAttention: ", q.size(0), " query rows, ",
              table.size(0), " block tables, ", where.size(0), " positions");
  const int64_t kv_heads = cache.k.size(1);
  const at::Tensor sink_values = sinks.defined() ? sinks.to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(!sinks.defined() || sink_values.numel() == q.size(1), "DecodeAttention: ", sink_values.numel(),
              " sinks for ", q.size(1), " query heads");
  const Shape shape{q.size(1),
                    kv_heads,
                    q.size(1) / kv_heads,
                    q.size(3),
                    tables.block_tokens,
                    table.size(1),
                    cache.k.size(0),
                    window,
                    static_cast<float>(scale),
                    sinks.defined() ? sink_values.data_ptr<float>() : nullptr};
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (q.scalar_type() == at::kFloat) {
    Run<float>(qc, cache, table, where, out, shape);
  } else {
    Run<c10::BFloat16>(qc, cache, table, where, out, shape);
  }
  return out;
}

}  // namespace strata::runtime
