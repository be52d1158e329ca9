// Highway's dynamic dispatch: this file is compiled once per target (foreach_target.h re-includes it),
// the per-target code in pointwise-inl.h, and the exported functions pick the best at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/pointwise.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/pointwise-inl.h"

#if HWY_ONCE
#include "kernels/pointwise.h"

namespace strata::kernels {

HWY_EXPORT(RmsNormRowsF32);
HWY_EXPORT(RmsNormRowsBF16);
HWY_EXPORT(SiluMulF32);
HWY_EXPORT(SiluMulBF16);
HWY_EXPORT(ClampedSwigluF32);
HWY_EXPORT(ClampedSwigluBF16);
HWY_EXPORT(RopeRowsF32);
HWY_EXPORT(RopeRowsBF16);
HWY_EXPORT(TargetOfThisCode);

void RmsNormRows(const float* x, const float* w, float* y, int64_t width, int64_t rows, float eps) {
  HWY_DYNAMIC_DISPATCH(RmsNormRowsF32)(x, w, y, width, rows, eps);
}
void RmsNormRows(const BFloat16* x, const BFloat16* w, BFloat16* y, int64_t width, int64_t rows, float eps) {
  HWY_DYNAMIC_DISPATCH(RmsNormRowsBF16)(&x->bits, &w->bits, &y->bits, width, rows, eps);
}
void SiluMul(const float* gate, const float* up, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluMulF32)(gate, up, y, n);
}
void SiluMul(const BFloat16* gate, const BFloat16* up, BFloat16* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluMulBF16)(&gate->bits, &up->bits, &y->bits, n);
}

void ClampedSwiglu(const float* gate, const float* up, float* y, int64_t n, float limit, float alpha) {
  HWY_DYNAMIC_DISPATCH(ClampedSwigluF32)(gate, up, y, n, limit, alpha);
}
void ClampedSwiglu(const BFloat16* gate, const BFloat16* up, BFloat16* y, int64_t n, float limit, float alpha) {
  HWY_DYNAMIC_DISPATCH(ClampedSwigluBF16)(&gate->bits, &up->bits, &y->bits, n, limit, alpha);
}
void RopeRows(const float* x, const float* cos, const float* sin, float* y, int64_t tokens, int64_t heads,
              int64_t dim) {
  HWY_DYNAMIC_DISPATCH(RopeRowsF32)(x, cos, sin, y, tokens, heads, dim);
}
void RopeRows(const BFloat16* x, const BFloat16* cos, const BFloat16* sin, BFloat16* y, int64_t tokens, int64_t heads,
              int64_t dim) {
  HWY_DYNAMIC_DISPATCH(RopeRowsBF16)(&x->bits, &cos->bits, &sin->bits, &y->bits, tokens, heads, dim);
}

const char* KernelTarget() { return HWY_DYNAMIC_DISPATCH(TargetOfThisCode)(); }

}  // namespace strata::kernels
#endif  // HWY_ONCE
