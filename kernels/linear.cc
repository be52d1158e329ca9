// Highway's dynamic dispatch for linear-inl.h (see pointwise.cc).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/linear.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/linear-inl.h"

#if HWY_ONCE
#include "kernels/linear.h"
#include "kernels/targets.h"

namespace strata::kernels {

HWY_EXPORT(LinearRowsF32);
HWY_EXPORT(LinearRowsBF16);
HWY_EXPORT(LinearRowsBF16Dot);

void LinearRows(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t k, int64_t n_total,
                int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(LinearRowsF32)(x, w, bias, y, rows, k, n_total, n0, n1);
}
void LinearRows(const float* x, const BFloat16* w, const BFloat16* bias, BFloat16* y, int64_t rows, int64_t k,
                int64_t n_total, int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(LinearRowsBF16)
  (x, &w->bits, bias != nullptr ? &bias->bits : nullptr, &y->bits, rows, k, n_total, n0, n1);
}
void LinearRows(const BFloat16* x, const BFloat16* w, const BFloat16* bias, BFloat16* y, int64_t rows, int64_t k,
                int64_t n_total, int64_t n0, int64_t n1) {
  HWY_DYNAMIC_DISPATCH(LinearRowsBF16Dot)
  (&x->bits, &w->bits, bias != nullptr ? &bias->bits : nullptr, &y->bits, rows, k, n_total, n0, n1, Bf16DotAvailable());
}

}  // namespace strata::kernels
#endif  // HWY_ONCE
