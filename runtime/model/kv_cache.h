#pragma once
// Internal (ATen): the KV cache of the decoder layers one stage runs, on that stage's device, allocated
// once at load for `slots` sequences x `max_context` positions (GUIDE.md, KV cache).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>

namespace strata::runtime {

struct KvLayer {
  // [slots, max_context, kv_heads, head_dim]: a batch's new keys are written with one index_put_ at
  // (slot, position) pairs, and each sequence's prefix is a plain slice.
  at::Tensor k;
  at::Tensor v;
};

class KvCache {
 public:
  // Allocates the layers' buffers (zeroed) on `device`.
  void AddLayer(int64_t layer, at::Device device, at::ScalarType dtype, int64_t slots, int64_t max_context,
                int64_t kv_heads, int64_t head_dim);
  KvLayer& layer(int64_t index) { return layers_.at(index); }
  int64_t bytes() const;

 private:
  std::map<int64_t, KvLayer> layers_;
};

// Writes `k`/`v` ([batch, kv_heads, tokens, head_dim]) at `positions` ([batch, tokens]) of `slots`
// ([batch]) and returns each sequence's keys and values for positions [0, key_length) as
// [batch, kv_heads, key_length, head_dim].
std::pair<at::Tensor, at::Tensor> KvAppend(KvLayer& cache, const at::Tensor& slots, bool slots_contiguous,
                                           int64_t first_slot, const at::Tensor& positions, const at::Tensor& k,
                                           const at::Tensor& v, int64_t key_length);

}  // namespace strata::runtime
