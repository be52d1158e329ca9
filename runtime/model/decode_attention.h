#pragma once
// Internal (ATen): attention of decode rows (one query token each) read straight from the paged KV pools, on
// any CPU (kernels/attention.h: one Highway source, the best target of this CPU). SDPA needs each row's keys as one
// tensor, so a batch of decodes gathers its blocks (index_select) and then runs flash attention's per-head GEMMs of one
// query row: on a CPU those are thousands of tiny BLAS calls per step (MKL's bfloat16 gemv was 14% of a 16-stream
// serving profile). Here each (row, KV head) task walks the row's block table once: scores of its query heads against
// every visible key, a softmax in float32, and the weighted sum of the values. Prefill chunks, CUDA and other dtypes
// keep SDPA.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "runtime/model/kv_cache.h"

namespace strata::runtime {

// Whether DecodeAttention runs for a group of `count` tokens per row with queries `q` over `cache`: one token
// per row, on the CPU, float32 or bfloat16 queries and pools of that dtype, head_dim <= 256.
bool DecodeAttentionApplies(const at::Tensor& q, const KvLayer& cache, int64_t count);

// q [rows, heads, 1, head_dim] (RoPE applied, heads a multiple of the pools' kv_heads: query head i reads KV
// head i / (heads / kv_heads), as repeat_kv). Row b attends to its positions [lo, p] where p = positions[b][0]
// and lo = max(0, p - window + 1) when window > 0, else 0 (AttentionMask's keys), which KvWrite has written.
// Returns [rows, heads, 1, head_dim] in q's dtype; softmax and sums in float32, scores scaled by `scale`. `sinks`
// [heads] (gpt-oss; undefined: none): one more logit per query head in its softmax, with no value.
at::Tensor DecodeAttention(const at::Tensor& q, const KvLayer& cache, const KvBlockTables& tables,
                           const at::Tensor& positions, int64_t window, double scale,
                           const at::Tensor& sinks = at::Tensor());

// Multi-head latent attention's decode rows (DeepSeek-V3, absorbed) on the CPU: q [rows, heads, 1, key_dim] float32
// (the absorbed queries with their RoPE part), every head over the latent pool `cache.k` [slots, 1, key_dim] (float32
// or bfloat16; row b reads positions [0, positions[b]] through its block table); the values are each row's first
// value_dim. Returns [rows, heads, 1, value_dim] float32 (kernels/attention.h's LatentAttentionHeads).
bool LatentDecodeApplies(const at::Tensor& q, const KvLayer& cache, int64_t count);
at::Tensor LatentDecodeAttention(const at::Tensor& q, const KvLayer& cache, const KvBlockTables& tables,
                                 const at::Tensor& positions, int64_t value_dim, double scale);

}  // namespace strata::runtime
