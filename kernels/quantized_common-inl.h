// What every quantized format's per-target code shares (Highway's convention: included once per target from
// each quantized_*-inl.h, guarded by the toggle): the float32 vectors the codes decode into, and the interface
// a format gives the rows kernels (quantized_rows-inl.h) and the VDPBF16PS ones (quantized_avx512-inl.h).
#if defined(STRATA_KERNELS_QUANTIZED_COMMON_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_QUANTIZED_COMMON_INL_H_
#undef STRATA_KERNELS_QUANTIZED_COMMON_INL_H_
#else
#define STRATA_KERNELS_QUANTIZED_COMMON_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 float32 lanes (AVX-512's): an int4 chunk of 32 codes is then one or more whole loads.
using DQ = hn::CappedTag<float, 16>;
using VQ = hn::Vec<DQ>;

// The formats (Fp8Format in quantized_fp8-inl.h; Int8Format and Int4Format in quantized_int-inl.h), each as:
// Segments() column ranges of one scale per weight row ([SegBegin, SegEnd)); Row(n) the packed row; Params(n, s)
// its multiplier and zero there (the weight is (code - zero) * mul); RowParams / ChunkParams those of whole rows,
// widened in vectors; kHasZero whether the format has zeros at all; Step() the columns one Decode covers, VectorAt(j)
// whether one may start at column j; Bytes(j) the byte column j starts in; Decode calls fn(codes, col) for each
// vector of codes as float32 (Lanes(df) consecutive columns from col); Code(row, j) one code, scalar.

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_QUANTIZED_COMMON_INL_H_
