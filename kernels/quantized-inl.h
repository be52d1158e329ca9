// Per-target code of quantized.cc (Highway's convention: included once per target, guarded by the toggle): the
// entry points quantized.cc dispatches to, each choosing among the kernels of the files below for its target.
//   quantized_common-inl.h   the float32 vectors and the format interface
//   quantized_fp8-inl.h      FP8 e4m3: decode and format
//   quantized_int-inl.h      int8 / int4: group parameters and formats
//   quantized_mxfp4-inl.h    MXFP4: E2M1 decode by table, format, x permutation, dequantizer
//   quantized_rows-inl.h     the portable rows kernels and the dequantizer
//   quantized_avx512-inl.h   AVX-512 only: VDPBF16PS and VPERMI2B
//   quantized_int16-inl.h    SSE4 / AVX2 / AVX-512 only: 16-bit integer multiply-adds
// Every one is included on every target (each keeps its own toggle in step); the per-target ones are empty where
// their target is not.
#if defined(STRATA_KERNELS_QUANTIZED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_QUANTIZED_INL_H_
#undef STRATA_KERNELS_QUANTIZED_INL_H_
#else
#define STRATA_KERNELS_QUANTIZED_INL_H_
#endif

#include <cstdint>
#include <vector>

#include "hwy/highway.h"
#include "kernels/bf16-inl.h"
#include "kernels/quantized.h"
#include "kernels/quantized_avx512-inl.h"
#include "kernels/quantized_common-inl.h"
#include "kernels/quantized_fp8-inl.h"
#include "kernels/quantized_int-inl.h"
#include "kernels/quantized_int16-inl.h"
#include "kernels/quantized_mxfp4-inl.h"
#include "kernels/quantized_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// FP8 rows on the float32 tiles, without the decode's NaN handling where the loader found no NaN code
// (Fp8Weights::nan_free).
template <class E>
void QuantRowsFp8T(const Fp8Weights& w, const float* x, const typename E::T* bias, typename E::T* y, int64_t rows,
                   int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  if (w.nan_free) return QuantRowsT<Fp8NanFreeFormat, E>(Fp8NanFreeFormat(w, k), x, bias, y, rows, k, n_total, n0, n1);
  QuantRowsT<Fp8Format, E>(Fp8Format(w, k), x, bias, y, rows, k, n_total, n0, n1);
}

// bfloat16 input rows: on VDPBF16PS where `dot` (Bf16DotAvailable, and AVX512_VBMI for FP8) and the layout
// suits it (FP8 blocks of a multiple of 64 columns, int4 groups of 32, 64 or a multiple of 128, k at least one
// block); elsewhere widened to float32 here and run by the float32 kernels (quantized_rows-inl.h).
void QuantRowsFp8Dot(const uint16_t* x, const Fp8Weights& w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                     int64_t n_total, int64_t n0, int64_t n1, bool dot) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (dot && Fp8DotLayout(w, k)) {
    return QuantRowsDot(Fp8Dot(), Fp8Format(w, k), LaneScales::kOne, w.block_k, 1.0f / 256.0f, x, bias, y, rows, k,
                        n_total, n0, n1);
  }
#else
  (void)dot;
#endif
  std::vector<float> widened(static_cast<size_t>(rows * k));
  for (int64_t i = 0; i < rows * k; ++i) widened[static_cast<size_t>(i)] = BF16ToFloat(x[i]);
  QuantRowsFp8T<BF16>(w, widened.data(), bias, y, rows, k, n_total, n0, n1);
}

void QuantRowsIntDot(const uint16_t* x, const IntWeights& w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                     int64_t n_total, int64_t n0, int64_t n1, bool dot) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // Groups of 32 and 64 scale per block, per 128-bit lane (strata_quantized_bench, int4 g32: 1.3-1.7x the float32
  // tiles at 3-32 rows on Zen 4).
  if (dot && Int4DotLayout(w, k)) {
    const LaneScales lanes =
        w.group == 32 ? LaneScales::kGroup32 : (w.group == 64 ? LaneScales::kGroup64 : LaneScales::kOne);
    return QuantRowsDot(Int4Dot(), Int4Format(w, k), lanes, w.group, 1.0f, x, bias, y, rows, k, n_total, n0, n1);
  }
#else
  (void)dot;
#endif
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (rows <= 2 && w.group % 32 == 0 && k % 32 == 0) {
    const bool done = w.bits == 4
                          ? QuantRowsInt16<Int4Codes>(IntParams(w, k), w.data, x, bias, y, rows, k, n_total, n0, n1)
                          : QuantRowsInt16<Int8Codes>(IntParams(w, k), w.data, x, bias, y, rows, k, n_total, n0, n1);
    if (done) return;
  }
#endif
  std::vector<float> widened(static_cast<size_t>(rows * k));
  for (int64_t i = 0; i < rows * k; ++i) widened[static_cast<size_t>(i)] = BF16ToFloat(x[i]);
  if (w.bits == 4)
    return QuantRowsT<Int4Format, BF16>(Int4Format(w, k), widened.data(), bias, y, rows, k, n_total, n0, n1);
  QuantRowsT<Int8Format, BF16>(Int8Format(w, k), widened.data(), bias, y, rows, k, n_total, n0, n1);
}

// ---------------------------------------------------------------------------------------------------------------
// The entry points quantized.cc dispatches to.

// `vbmi`: Bf16DotAvailable() and VbmiAvailable() (the code shares the VDPBF16PS path's target attributes), for
// the AVX-512 target's FP8 decode by VPERMI2B (one or two rows, FP8 blocks of a multiple of 64 columns).
void QuantRowsFp8F32(const float* x, const Fp8Weights& w, const float* bias, float* y, int64_t rows, int64_t k,
                     int64_t n_total, int64_t n0, int64_t n1, bool vbmi) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (vbmi && rows <= 2 && w.block_k % 64 == 0 && k >= 64) {
    return QuantRowsFp8F32Vbmi<F32>(w, x, bias, y, rows, k, n_total, n0, n1);
  }
#else
  (void)vbmi;
#endif
  QuantRowsFp8T<F32>(w, x, bias, y, rows, k, n_total, n0, n1);
}
void QuantRowsFp8BF16(const float* x, const Fp8Weights& w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                      int64_t n_total, int64_t n0, int64_t n1, bool vbmi) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (vbmi && rows <= 2 && w.block_k % 64 == 0 && k >= 64) {
    return QuantRowsFp8F32Vbmi<BF16>(w, x, bias, y, rows, k, n_total, n0, n1);
  }
#else
  (void)vbmi;
#endif
  QuantRowsFp8T<BF16>(w, x, bias, y, rows, k, n_total, n0, n1);
}
void QuantRowsIntF32(const float* x, const IntWeights& w, const float* bias, float* y, int64_t rows, int64_t k,
                     int64_t n_total, int64_t n0, int64_t n1) {
  if (w.bits == 4) return QuantRowsT<Int4Format, F32>(Int4Format(w, k), x, bias, y, rows, k, n_total, n0, n1);
  QuantRowsT<Int8Format, F32>(Int8Format(w, k), x, bias, y, rows, k, n_total, n0, n1);
}
void QuantRowsIntBF16(const float* x, const IntWeights& w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                      int64_t n_total, int64_t n0, int64_t n1) {
  if (w.bits == 4) return QuantRowsT<Int4Format, BF16>(Int4Format(w, k), x, bias, y, rows, k, n_total, n0, n1);
  QuantRowsT<Int8Format, BF16>(Int8Format(w, k), x, bias, y, rows, k, n_total, n0, n1);
}

void QuantRowsMxfp4F32(const float* x, const Mxfp4Weights& w, const float* bias, float* y, int64_t rows, int64_t k,
                       int64_t n_total, int64_t n0, int64_t n1) {
  QuantRowsMxfp4T<F32, F32>(x, w, bias, y, rows, k, n_total, n0, n1);
}
void QuantRowsMxfp4BF16(const float* x, const Mxfp4Weights& w, const uint16_t* bias, uint16_t* y, int64_t rows,
                        int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  QuantRowsMxfp4T<F32, BF16>(x, w, bias, y, rows, k, n_total, n0, n1);
}
// bfloat16 rows: up to 4 (decode) on VDPBF16PS where `dot` (Bf16DotAvailable) and k holds a block of 128 (a scale
// per 128-bit lane; unlike int4's groups of 32, 2x the float32 tiles at 3 and 4 rows too: strata_quantized_bench,
// 5760 x 2880); else widened (and permuted) once per call for the float32 kernels.
void QuantRowsMxfp4Bf16x(const uint16_t* x, const Mxfp4Weights& w, const uint16_t* bias, uint16_t* y, int64_t rows,
                         int64_t k, int64_t n_total, int64_t n0, int64_t n1, bool dot) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (dot && rows <= 4 && k >= 128) {
    return QuantRowsDot(Mxfp4Dot(k), Mxfp4Format(w, k), LaneScales::kGroup32, 32, 1.0f, x, bias, y, rows, k, n_total,
                        n0, n1);
  }
#else
  (void)dot;
#endif
  QuantRowsMxfp4T<BF16, BF16>(x, w, bias, y, rows, k, n_total, n0, n1);
}

void DequantizeFp8F32(const Fp8Weights& w, int64_t k, int64_t n0, int64_t n1, float* out) {
  DequantizeT<Fp8Format, F32>(Fp8Format(w, k), k, n0, n1, out);
}
void DequantizeFp8BF16(const Fp8Weights& w, int64_t k, int64_t n0, int64_t n1, uint16_t* out) {
  DequantizeT<Fp8Format, BF16>(Fp8Format(w, k), k, n0, n1, out);
}
void DequantizeIntF32(const IntWeights& w, int64_t k, int64_t n0, int64_t n1, float* out) {
  if (w.bits == 4) return DequantizeT<Int4Format, F32>(Int4Format(w, k), k, n0, n1, out);
  DequantizeT<Int8Format, F32>(Int8Format(w, k), k, n0, n1, out);
}
void DequantizeIntBF16(const IntWeights& w, int64_t k, int64_t n0, int64_t n1, uint16_t* out) {
  if (w.bits == 4) return DequantizeT<Int4Format, BF16>(Int4Format(w, k), k, n0, n1, out);
  DequantizeT<Int8Format, BF16>(Int8Format(w, k), k, n0, n1, out);
}

void DequantizeMxfp4F32(const Mxfp4Weights& w, int64_t k, int64_t n0, int64_t n1, float* out) {
  DequantizeMxfp4T<F32>(w, k, n0, n1, out);
}
void DequantizeMxfp4BF16(const Mxfp4Weights& w, int64_t k, int64_t n0, int64_t n1, uint16_t* out) {
  DequantizeMxfp4T<BF16>(w, k, n0, n1, out);
}

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_QUANTIZED_INL_H_
