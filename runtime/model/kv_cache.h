#pragma once
// Internal (ATen): the paged KV cache of the decoder layers one stage runs, on that stage's device: per
// layer a pool of `blocks` blocks of `block_tokens` positions, allocated once at load and sized from the
// plan's KV reserve (GUIDE.md, KV cache). Which block holds which positions of which sequence is the
// engine's business (runtime/engine/kv_blocks.h); a forward pass brings each row's block table.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>

namespace strata::runtime {

struct KvLayer {
  // [blocks * block_tokens, kv_heads, head_dim]: position p of a sequence lives at row
  // table[p / block_tokens] * block_tokens + p % block_tokens.
  at::Tensor k;
  at::Tensor v;  // undefined for a latent layer (MLA): `k` [rows, 1, width] holds keys and values alike
};

class KvCache {
 public:
  // Allocates the layer's pools (zeroed) on `device`.
  void AddLayer(int64_t layer, at::Device device, at::ScalarType dtype, int64_t blocks, int64_t block_tokens,
                int64_t kv_heads, int64_t head_dim);
  // MLA (DeepSeek-V3): one pool [blocks * block_tokens, 1, width] of latent rows, no values pool.
  void AddLatentLayer(int64_t layer, at::Device device, at::ScalarType dtype, int64_t blocks, int64_t block_tokens,
                      int64_t width);
  KvLayer& layer(int64_t index) { return layers_.at(index); }
  int64_t bytes() const;

 private:
  std::map<int64_t, KvLayer> layers_;
};

// How a batch's rows find their positions in the pools: the block tables, and what the host knows of them
// without reading a device.
struct KvBlockTables {
  at::Tensor table;  // int64 [batch, table_blocks] on the stage's device
  int64_t block_tokens = 16;
  // Every row's table is a run of consecutive blocks, row b's starting at first + b * stride: the keys
  // are then a strided view of the pool (no copy), as one contiguous sequence's always are.
  bool strided = false;
  int64_t first = 0;
  int64_t stride = 0;
};

// Writes `k`/`v` ([batch, kv_heads, tokens, head_dim]) at `positions` ([batch, tokens]) of each row's blocks (`v`
// undefined for a latent layer).
void KvWrite(KvLayer& cache, const KvBlockTables& tables, const at::Tensor& positions, const at::Tensor& k,
             const at::Tensor& v);

// KvWrite, then each row's keys and values for positions [0, key_length) as
// [batch, kv_heads, key_length, head_dim] (a view when the tables are strided, else gathered).
std::pair<at::Tensor, at::Tensor> KvAppend(KvLayer& cache, const KvBlockTables& tables, const at::Tensor& positions,
                                           const at::Tensor& k, const at::Tensor& v, int64_t key_length);

// Each row's positions [0, key_length) of `pool` (a KvLayer's k or v) as [batch, kv_heads, key_length, head_dim].
at::Tensor KvRead(const at::Tensor& pool, const KvBlockTables& tables, int64_t key_length);

}  // namespace strata::runtime
