// Per-target code of linear.cc (Highway's convention: included once per target, guarded by the toggle).
#if defined(STRATA_KERNELS_LINEAR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_LINEAR_INL_H_
#undef STRATA_KERNELS_LINEAR_INL_H_
#else
#define STRATA_KERNELS_LINEAR_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"
#include "kernels/bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One input row against weight row `wr`: four accumulators keep the FMA chains short.
template <class E, class D>
HWY_INLINE float DotOne(D d, const float* x, const typename E::T* wr, int64_t k, int64_t lanes) {
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  int64_t j = 0;
  for (; j + 4 * lanes <= k; j += 4 * lanes) {
    a0 = hn::MulAdd(E::Load(d, wr + j), hn::LoadU(d, x + j), a0);
    a1 = hn::MulAdd(E::Load(d, wr + j + lanes), hn::LoadU(d, x + j + lanes), a1);
    a2 = hn::MulAdd(E::Load(d, wr + j + 2 * lanes), hn::LoadU(d, x + j + 2 * lanes), a2);
    a3 = hn::MulAdd(E::Load(d, wr + j + 3 * lanes), hn::LoadU(d, x + j + 3 * lanes), a3);
  }
  for (; j + lanes <= k; j += lanes) a0 = hn::MulAdd(E::Load(d, wr + j), hn::LoadU(d, x + j), a0);
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; j < k; ++j) sum += E::LoadOne(wr + j) * x[j];
  return sum;
}

// Two input rows against one weight row: each weight vector is loaded once for both.
template <class E, class D>
HWY_INLINE void DotTwo(D d, const float* x0, const float* x1, const typename E::T* wr, int64_t k, int64_t lanes,
                       float& out0, float& out1) {
  auto a00 = hn::Zero(d), a01 = hn::Zero(d), a10 = hn::Zero(d), a11 = hn::Zero(d);
  int64_t j = 0;
  for (; j + 2 * lanes <= k; j += 2 * lanes) {
    const auto w0 = E::Load(d, wr + j), w1 = E::Load(d, wr + j + lanes);
    a00 = hn::MulAdd(w0, hn::LoadU(d, x0 + j), a00);
    a01 = hn::MulAdd(w1, hn::LoadU(d, x0 + j + lanes), a01);
    a10 = hn::MulAdd(w0, hn::LoadU(d, x1 + j), a10);
    a11 = hn::MulAdd(w1, hn::LoadU(d, x1 + j + lanes), a11);
  }
  for (; j + lanes <= k; j += lanes) {
    const auto w0 = E::Load(d, wr + j);
    a00 = hn::MulAdd(w0, hn::LoadU(d, x0 + j), a00);
    a10 = hn::MulAdd(w0, hn::LoadU(d, x1 + j), a10);
  }
  out0 = hn::GetLane(hn::SumOfLanes(d, hn::Add(a00, a01)));
  out1 = hn::GetLane(hn::SumOfLanes(d, hn::Add(a10, a11)));
  for (; j < k; ++j) {
    const float w = E::LoadOne(wr + j);
    out0 += w * x0[j];
    out1 += w * x1[j];
  }
}

// Up to this K both input rows are read side by side (16 KiB of float32 together).
constexpr int64_t kTwoRowsAtOnceMaxK = 2048;

template <class E>
void LinearRowsT(const float* x, const typename E::T* w, const typename E::T* bias, typename E::T* y, int64_t rows,
                 int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t n = n0; n < n1; ++n) {
    const typename E::T* wr = w + n * k;
    const float b = bias != nullptr ? E::LoadOne(bias + n) : 0.0f;
    if (rows == 2 && k <= kTwoRowsAtOnceMaxK) {
      float v0, v1;
      DotTwo<E>(d, x, x + k, wr, k, lanes, v0, v1);
      E::StoreOne(v0 + b, y + n);
      E::StoreOne(v1 + b, y + n_total + n);
    } else if (rows == 2) {
      // Two float32 input rows of a wide layer fill L1 with the weight stream beside them: one row after
      // the other, the weight row read again from L1 (strata_linear_bench, --rows 2 at K 3072-4096).
      E::StoreOne(DotOne<E>(d, x, wr, k, lanes) + b, y + n);
      E::StoreOne(DotOne<E>(d, x + k, wr, k, lanes) + b, y + n_total + n);
    } else {
      E::StoreOne(DotOne<E>(d, x, wr, k, lanes) + b, y + n);
    }
  }
}

void LinearRowsF32(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t k,
                   int64_t n_total, int64_t n0, int64_t n1) {
  LinearRowsT<F32>(x, w, bias, y, rows, k, n_total, n0, n1);
}
void LinearRowsBF16(const float* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                    int64_t n_total, int64_t n0, int64_t n1) {
  LinearRowsT<BF16>(x, w, bias, y, rows, k, n_total, n0, n1);
}

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_LINEAR_INL_H_
