#pragma once
// Decode attention of one KV head for its group of query heads (one query token each), reading keys and
// values in place from a paged pool: scores, softmax in float32, weighted sum of the values. The caller
// (runtime/model/decode_attention.cc) walks the block tables, checks them and splits (row, KV head) tasks
// over threads. One Highway source for every ISA, as pointwise.h.

#include <cstdint>

#include "kernels/pointwise.h"  // BFloat16

namespace strata::kernels {

// For query heads g < group: q + g * dim (dim values, not yet scaled), out + g * dim. Key t is
// keys + offsets[t], its value values + offsets[t] (dim values each), t < length (length >= 1).
// out[g] = sum_t softmax_t(scale * q[g] . key_t) value_t. `scratch` holds group * (length + dim) floats.
// `sinks` (gpt-oss's attention sinks; nullptr: none): per query head g, one more logit sinks[g] in its softmax, with
// no value (the weights of the keys then sum to less than 1).
void DecodeAttentionHead(const float* q, const float* keys, const float* values, const int64_t* offsets, int64_t length,
                         int64_t group, int64_t dim, float scale, float* out, float* scratch,
                         const float* sinks = nullptr);
void DecodeAttentionHead(const BFloat16* q, const BFloat16* keys, const BFloat16* values, const int64_t* offsets,
                         int64_t length, int64_t group, int64_t dim, float scale, BFloat16* out, float* scratch,
                         const float* sinks = nullptr);

// Multi-head latent attention's decode (DeepSeek-V3, weight absorption): `heads` query heads over one shared latent
// KV head. q [heads, key_dim] float32 (absorbed queries, not yet scaled); key t is rows + offsets[t] (key_dim values),
// its value the same row's first value_dim. out[g] [value_dim] float32 = sum_t softmax_t(scale * q[g] . row_t) row_t.
// Scores and sums in float32; the rows are read once per tile of keys for every head (the heads share them).
// `scratch` holds heads * (length + 1) floats.
void LatentAttentionHeads(const float* q, const float* rows, const int64_t* offsets, int64_t length, int64_t heads,
                          int64_t key_dim, int64_t value_dim, float scale, float* out, float* scratch);
void LatentAttentionHeads(const float* q, const BFloat16* rows, const int64_t* offsets, int64_t length, int64_t heads,
                          int64_t key_dim, int64_t value_dim, float scale, float* out, float* scratch);

}  // namespace strata::kernels
