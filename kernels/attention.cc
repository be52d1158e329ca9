// Highway's dynamic dispatch for attention-inl.h (see pointwise.cc).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attention.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/attention-inl.h"

#if HWY_ONCE
#include "kernels/attention.h"

namespace strata::kernels {

HWY_EXPORT(DecodeAttentionHeadF32);
HWY_EXPORT(DecodeAttentionHeadBF16);
HWY_EXPORT(LatentAttentionHeadsF32);
HWY_EXPORT(LatentAttentionHeadsBF16);

void LatentAttentionHeads(const float* q, const float* rows, const int64_t* offsets, int64_t length, int64_t heads,
                          int64_t key_dim, int64_t value_dim, float scale, float* out, float* scratch) {
  HWY_DYNAMIC_DISPATCH(LatentAttentionHeadsF32)
  (q, rows, offsets, length, heads, key_dim, value_dim, scale, out, scratch);
}
void LatentAttentionHeads(const float* q, const BFloat16* rows, const int64_t* offsets, int64_t length, int64_t heads,
                          int64_t key_dim, int64_t value_dim, float scale, float* out, float* scratch) {
  HWY_DYNAMIC_DISPATCH(LatentAttentionHeadsBF16)
  (q, &rows->bits, offsets, length, heads, key_dim, value_dim, scale, out, scratch);
}

void DecodeAttentionHead(const float* q, const float* keys, const float* values, const int64_t* offsets, int64_t length,
                         int64_t group, int64_t dim, float scale, float* out, float* scratch, const float* sinks) {
  HWY_DYNAMIC_DISPATCH(DecodeAttentionHeadF32)
  (q, keys, values, offsets, length, group, dim, scale, out, scratch, sinks);
}
void DecodeAttentionHead(const BFloat16* q, const BFloat16* keys, const BFloat16* values, const int64_t* offsets,
                         int64_t length, int64_t group, int64_t dim, float scale, BFloat16* out, float* scratch,
                         const float* sinks) {
  HWY_DYNAMIC_DISPATCH(DecodeAttentionHeadBF16)
  (&q->bits, &keys->bits, &values->bits, offsets, length, group, dim, scale, &out->bits, scratch, sinks);
}

}  // namespace strata::kernels
#endif  // HWY_ONCE
