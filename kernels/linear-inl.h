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

// Up to this K two input rows are read side by side (16 KiB of float32 together); wider ones go by tiles.
constexpr int64_t kTwoRowsAtOnceMaxK = 2048;

template <class E>
void LinearRowsT(const float* x, const typename E::T* w, const typename E::T* bias, typename E::T* y, int64_t rows,
                 int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t n = n0; n < n1; ++n) {
    const typename E::T* wr = w + n * k;
    const float b = bias != nullptr ? E::LoadOne(bias + n) : 0.0f;
    if (rows == 2) {
      float v0, v1;
      DotTwo<E>(d, x, x + k, wr, k, lanes, v0, v1);
      E::StoreOne(v0 + b, y + n);
      E::StoreOne(v1 + b, y + n_total + n);
    } else {
      E::StoreOne(DotOne<E>(d, x, wr, k, lanes) + b, y + n);
    }
  }
}

#if !HWY_HAVE_SCALABLE  // arrays of vectors: not of SVE's sizeless ones (those targets go row by row)

// Weight rows per tile: 4 x 3 accumulators and 3 weight vectors fit the 16 vector registers of AVX2 and SSE
// (4 x 4 spills there); AVX-512 and NEON have 32 (4 x 4).
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr int kTileWeightRows = 3;
#else
constexpr int kTileWeightRows = 4;
#endif

#define STRATA_UNROLL _Pragma("GCC unroll 16")

// Input rows [m0, m0 + MR) against weight rows [n, n + nr) (nr <= NR; the missing ones read row n + nr - 1
// again and are not stored), every pair's dot product over all of K at once: each vector of a weight row is
// loaded once for MR input rows and each input vector once for NR weight rows, MR x NR independent FMA chains.
template <class E, int MR, int NR>
HWY_NOINLINE void Tile(const float* x, const typename E::T* w, const typename E::T* bias, typename E::T* y, int64_t k,
                       int64_t n_total, int64_t n, int64_t nr, int64_t m0) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const float* xs[MR];
  const typename E::T* ws[NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) xs[m] = x + (m0 + m) * k;
  STRATA_UNROLL for (int r = 0; r < NR; ++r) ws[r] = w + (n + (r < nr ? r : nr - 1)) * k;
  V acc[MR][NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) { STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = hn::Zero(d); }
  int64_t j = 0;
  for (; j + lanes <= k; j += lanes) {
    V wv[NR];
    STRATA_UNROLL for (int r = 0; r < NR; ++r) wv[r] = E::Load(d, ws[r] + j);
    STRATA_UNROLL for (int m = 0; m < MR; ++m) {
      const V xv = hn::LoadU(d, xs[m] + j);
      STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = hn::MulAdd(wv[r], xv, acc[m][r]);
    }
  }
  float sums[MR][NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_UNROLL for (int r = 0; r < NR; ++r) sums[m][r] = hn::GetLane(hn::SumOfLanes(d, acc[m][r]));
  }
  for (; j < k; ++j) {
    for (int r = 0; r < NR; ++r) {
      const float wj = E::LoadOne(ws[r] + j);
      for (int m = 0; m < MR; ++m) sums[m][r] += wj * xs[m][j];
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int r = 0; r < nr; ++r) {
      const float b = bias != nullptr ? E::LoadOne(bias + n + r) : 0.0f;
      E::StoreOne(sums[m][r] + b, y + (m0 + m) * n_total + n + r);
    }
  }
}

#undef STRATA_UNROLL

// Three or more input rows: blocks of kTileWeightRows weight rows, each used by every group of 4 input rows
// while it is in cache, so the matrix is read from memory once.
template <class E>
void LinearTilesT(const float* x, const typename E::T* w, const typename E::T* bias, typename E::T* y, int64_t rows,
                  int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  constexpr int NR = kTileWeightRows;
  for (int64_t n = n0; n < n1; n += NR) {
    const int64_t nr = n1 - n < NR ? n1 - n : NR;
    for (int64_t m = 0; m < rows; m += 4) {
      switch (rows - m < 4 ? rows - m : 4) {
        case 4:
          Tile<E, 4, NR>(x, w, bias, y, k, n_total, n, nr, m);
          break;
        case 3:
          Tile<E, 3, NR>(x, w, bias, y, k, n_total, n, nr, m);
          break;
        case 2:
          Tile<E, 2, NR>(x, w, bias, y, k, n_total, n, nr, m);
          break;
        default:
          Tile<E, 1, NR>(x, w, bias, y, k, n_total, n, nr, m);
          break;
      }
    }
  }
}

#endif  // !HWY_HAVE_SCALABLE

template <class E>
void LinearT(const float* x, const typename E::T* w, const typename E::T* bias, typename E::T* y, int64_t rows,
             int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
#if !HWY_HAVE_SCALABLE
  // Two rows of a wide layer go by tiles too: side by side they fill L1 beside the weight stream, and a
  // tile converts each weight vector once for both (strata_linear_bench --rows 2 at K 3072-4096).
  if (rows > 2 || (rows == 2 && k > kTwoRowsAtOnceMaxK)) {
    LinearTilesT<E>(x, w, bias, y, rows, k, n_total, n0, n1);
    return;
  }
#endif
  for (int64_t m = 0; m < rows; m += 2) {
    const int64_t count = rows - m < 2 ? rows - m : 2;
    LinearRowsT<E>(x + m * k, w, bias, y + m * n_total, count, k, n_total, n0, n1);
  }
}

void LinearRowsF32(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t k,
                   int64_t n_total, int64_t n0, int64_t n1) {
  LinearT<F32>(x, w, bias, y, rows, k, n_total, n0, n1);
}
void LinearRowsBF16(const float* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                    int64_t n_total, int64_t n0, int64_t n1) {
  LinearT<BF16>(x, w, bias, y, rows, k, n_total, n0, n1);
}

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_LINEAR_INL_H_
