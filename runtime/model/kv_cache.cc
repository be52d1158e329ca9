#include "runtime/model/kv_cache.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/index_copy.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/zeros.h>

namespace strata::runtime {

void KvCache::AddLayer(int64_t layer, at::Device device, at::ScalarType dtype, int64_t blocks, int64_t block_tokens,
                       int64_t kv_heads, int64_t head_dim) {
  at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
  layers_[layer] = KvLayer{at::zeros({blocks * block_tokens, kv_heads, head_dim}, options),
                           at::zeros({blocks * block_tokens, kv_heads, head_dim}, options)};
}

void KvCache::AddLatentLayer(int64_t layer, at::Device device, at::ScalarType dtype, int64_t blocks,
                             int64_t block_tokens, int64_t width) {
  at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
  layers_[layer] = KvLayer{at::zeros({blocks * block_tokens, 1, width}, options), at::Tensor()};
}

int64_t KvCache::bytes() const {
  int64_t total = 0;
  for (const auto& [index, layer] : layers_) total += layer.k.nbytes() + (layer.v.defined() ? layer.v.nbytes() : 0);
  return total;
}

at::Tensor KvRead(const at::Tensor& pool, const KvBlockTables& tables, int64_t key_length) {
  const int64_t batch = tables.table.size(0);
  const int64_t heads = pool.size(1);
  const int64_t dim = pool.size(2);
  at::Tensor rows;
  if (tables.strided) {
    const int64_t row = heads * dim;
    rows = pool.as_strided({batch, key_length, heads, dim}, {tables.stride * tables.block_tokens * row, row, dim, 1},
                           pool.storage_offset() + tables.first * tables.block_tokens * row);
  } else {
    const int64_t blocks = tables.table.size(1);
    rows = pool.view({-1, tables.block_tokens, heads, dim})
               .index_select(0, tables.table.reshape({-1}))
               .view({batch, blocks * tables.block_tokens, heads, dim})
               .narrow(1, 0, key_length);
  }
  return rows.transpose(1, 2);
}

void KvWrite(KvLayer& cache, const KvBlockTables& tables, const at::Tensor& positions, const at::Tensor& k,
             const at::Tensor& v) {
  // The pool row of every (batch, token): its block's first row plus the offset in the block.
  const at::Tensor blocks = tables.table.gather(1, positions.div(tables.block_tokens, "floor"));
  const at::Tensor where = (blocks * tables.block_tokens + positions.remainder(tables.block_tokens)).reshape({-1});
  const int64_t heads = k.size(1);
  const int64_t dim = k.size(3);
  cache.k.index_copy_(0, where, k.transpose(1, 2).reshape({-1, heads, dim}));
  if (v.defined()) cache.v.index_copy_(0, where, v.transpose(1, 2).reshape({-1, heads, dim}));
}

std::pair<at::Tensor, at::Tensor> KvAppend(KvLayer& cache, const KvBlockTables& tables, const at::Tensor& positions,
                                           const at::Tensor& k, const at::Tensor& v, int64_t key_length) {
  KvWrite(cache, tables, positions, k, v);
  return {KvRead(cache.k, tables, key_length), KvRead(cache.v, tables, key_length)};
}

}  // namespace strata::runtime
