#include "runtime/model/kv_cache.h"

#include <ATen/ops/index_put.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/zeros.h>

#include <vector>

namespace strata::runtime {

void KvCache::AddLayer(int64_t layer, at::Device device, at::ScalarType dtype, int64_t slots, int64_t max_context,
                       int64_t kv_heads, int64_t head_dim) {
  at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
  layers_[layer] = KvLayer{at::zeros({slots, max_context, kv_heads, head_dim}, options),
                           at::zeros({slots, max_context, kv_heads, head_dim}, options)};
}

int64_t KvCache::bytes() const {
  int64_t total = 0;
  for (const auto& [index, layer] : layers_) total += layer.k.nbytes() + layer.v.nbytes();
  return total;
}

std::pair<at::Tensor, at::Tensor> KvAppend(KvLayer& cache, const at::Tensor& slots, bool slots_contiguous,
                                           int64_t first_slot, const at::Tensor& positions, const at::Tensor& k,
                                           const at::Tensor& v, int64_t key_length) {
  const c10::List<std::optional<at::Tensor>> index({slots.unsqueeze(1), positions});
  cache.k.index_put_(index, k.transpose(1, 2));
  cache.v.index_put_(index, v.transpose(1, 2));
  // Consecutive slots are a slice of the cache; others (micro-batches of a running batch) are gathered,
  // only the key_length positions that take part.
  at::Tensor keys = slots_contiguous ? cache.k.narrow(0, first_slot, slots.size(0)).narrow(1, 0, key_length)
                                     : cache.k.narrow(1, 0, key_length).index_select(0, slots);
  at::Tensor values = slots_contiguous ? cache.v.narrow(0, first_slot, slots.size(0)).narrow(1, 0, key_length)
                                       : cache.v.narrow(1, 0, key_length).index_select(0, slots);
  return {keys.transpose(1, 2), values.transpose(1, 2)};
}

}  // namespace strata::runtime
