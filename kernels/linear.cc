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
HWY_EXPORT(LinearPanelsF32);
HWY_EXPORT(LinearPanelsBF16);

namespace {

template <typename T>
void Pack(const T* w, int64_t n, int64_t k, T* out, bool unpack) {
  for (int64_t n0 = 0; n0 < n; n0 += kPanelRows) {
    const int64_t width = n - n0 < kPanelRows ? n - n0 : kPanelRows;
    for (int64_t r = 0; r < width; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = (n0 + r) * k + j;
        const int64_t panel = n0 * k + j * width + r;
        if (unpack) {
          out[row] = w[panel];
        } else {
          out[panel] = w[row];
        }
      }
    }
  }
}

}  // namespace

void PackPanels(const float* w, int64_t n, int64_t k, float* out) { Pack(w, n, k, out, false); }
void PackPanels(const BFloat16* w, int64_t n, int64_t k, BFloat16* out) { Pack(w, n, k, out, false); }
void UnpackPanels(const float* panels, int64_t n, int64_t k, float* out) { Pack(panels, n, k, out, true); }
void UnpackPanels(const BFloat16* panels, int64_t n, int64_t k, BFloat16* out) { Pack(panels, n, k, out, true); }

void LinearPanels(const float* x, const float* panels, const float* bias, float* y, int64_t rows, int64_t k,
                  int64_t n_total, int64_t p0, int64_t p1) {
  HWY_DYNAMIC_DISPATCH(LinearPanelsF32)(x, panels, bias, y, rows, k, n_total, p0, p1);
}
void LinearPanels(const float* x, const BFloat16* panels, const BFloat16* bias, BFloat16* y, int64_t rows, int64_t k,
                  int64_t n_total, int64_t p0, int64_t p1) {
  HWY_DYNAMIC_DISPATCH(LinearPanelsBF16)
  (x, &panels->bits, bias != nullptr ? &bias->bits : nullptr, &y->bits, rows, k, n_total, p0, p1);
}

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
