// Per-target code of quantized.cc (Highway's convention: included once per target, guarded by the toggle).
#if defined(STRATA_KERNELS_QUANTIZED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_QUANTIZED_INL_H_
#undef STRATA_KERNELS_QUANTIZED_INL_H_
#else
#define STRATA_KERNELS_QUANTIZED_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "hwy/highway.h"
#include "kernels/bf16-inl.h"
#include "kernels/quantized.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 float32 lanes (AVX-512's): an int4 chunk of 32 codes is then one or more whole loads.
using DQ = hn::CappedTag<float, 16>;
using VQ = hn::Vec<DQ>;

// 2 * Lanes(df) e4m3 bytes at p as float32 divided by 256 (exact): w0 the first Lanes(df), w1 the next. The
// bytes become float16 bits at twice the lanes (sign | magnitude << 7: the exponent and mantissa fields line
// up, bias 15 instead of 7, hence the 1/256; e4m3 subnormals are float16 subnormals), then widen; NaN codes
// (magnitude 0x7f) become NaN.
HWY_INLINE void DecodeFp8(DQ df, const uint8_t* p, VQ& w0, VQ& w1) {
#if HWY_TARGET == HWY_SCALAR  // one lane: no vector of twice the lanes to widen from
  w0 = hn::Set(df, Fp8E4m3ToFloat(p[0]) * (1.0f / 256.0f));
  w1 = hn::Set(df, Fp8E4m3ToFloat(p[1]) * (1.0f / 256.0f));
#else
  const hn::Repartition<int16_t, DQ> di16;
  const hn::Rebind<int8_t, decltype(di16)> di8;
  const hn::Rebind<int16_t, DQ> dih;
  const hn::Rebind<hwy::float16_t, DQ> dh;
  // Sign-extended and shifted by 7: the magnitude at bits 7..13, the sign at 14 and 15; bit 14 cleared.
  const auto magnitude_bits = hn::Set(di16, 0x3F80);
  auto h = hn::ShiftLeft<7>(hn::PromoteTo(di16, hn::LoadU(di8, reinterpret_cast<const int8_t*>(p))));
  h = hn::And(h, hn::Set(di16, static_cast<int16_t>(0xBF80)));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // A NaN code's magnitude is float16 1.875 (480 / 256, which no other code is): F16C widens float16 NaN to
  // NaN, so it becomes one here, at twice the lanes.
  h = hn::IfThenElse(hn::Eq(hn::And(h, magnitude_bits), magnitude_bits), hn::Set(di16, 0x7E00), h);
#else
  (void)magnitude_bits;
#endif
  w0 = hn::PromoteTo(df, hn::BitCast(dh, hn::LowerHalf(dih, h)));
  w1 = hn::PromoteTo(df, hn::BitCast(dh, hn::UpperHalf(dih, h)));
#if !(HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2)
  // Highway's emulated float16 widening (SSE4 and below) makes exponent 31 a number: the NaN codes become NaN
  // after widening instead, from their +-1.875.
  const VQ nan_value = hn::Set(df, 1.875f), nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  w0 = hn::IfThenElse(hn::Eq(hn::Abs(w0), nan_value), nan, w0);
  w1 = hn::IfThenElse(hn::Eq(hn::Abs(w1), nan_value), nan, w1);
#endif
#endif  // HWY_TARGET == HWY_SCALAR
}

// The formats, each as: Segments() column ranges of one scale per weight row ([SegBegin, SegEnd)); Row(n)
// the packed row; Params(n, s) its multiplier and zero there (the weight is (code - zero) * mul); Step() the
// columns one Decode covers, VectorAt(j) whether one may start at column j; Decode calls fn(codes, col) for
// each vector of codes as float32 (Lanes(df) consecutive columns from col); Code(row, j) one code, scalar.
struct Fp8Format {
  const uint8_t* data;
  const float* scale;
  int64_t block_n, block_k, k, blocks_k;
  Fp8Format(const Fp8Weights& w, int64_t k_)
      : data(w.data),
        scale(w.scale),
        block_n(w.block_n),
        block_k(w.block_k),
        k(k_),
        blocks_k((k_ + w.block_k - 1) / w.block_k) {}
  int64_t Segments() const { return blocks_k; }
  int64_t SegBegin(int64_t s) const { return s * block_k; }
  int64_t SegEnd(int64_t s) const { return (s + 1) * block_k < k ? (s + 1) * block_k : k; }
  const uint8_t* Row(int64_t n) const { return data + n * k; }
  static int64_t Bytes(int64_t j) { return j; }
  // Codes are the e4m3 values / 256, so the multiplier is scale * 256: exact, and the product the same.
  void Params(int64_t n, int64_t s, float& mul, float& zero) const {
    mul = scale[(n / block_n) * blocks_k + s] * 256.0f;
    zero = 0.0f;
  }
  static constexpr bool kHasZero = false;
  // Params of every segment of row n: mul [segments], sub = zero * mul [segments].
  void RowParams(int64_t n, float* mul, float* sub) const {
    const DQ d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const float* from = scale + (n / block_n) * blocks_k;
    int64_t s = 0;
    for (; s + lanes <= blocks_k; s += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(d, from + s), hn::Set(d, 256.0f)), d, mul + s);
      hn::StoreU(hn::Zero(d), d, sub + s);
    }
    for (; s < blocks_k; ++s) {
      mul[s] = from[s] * 256.0f;
      sub[s] = 0.0f;
    }
  }
  // Rows [n, n + count) flat (mul[r * segments + s]; sub likewise), rows of one block of block_n copied.
  void ChunkParams(int64_t n, int64_t count, float* mul, float* sub) const {
    for (int64_t r = 0; r < count; ++r) {
      if (r > 0 && (n + r) / block_n == (n + r - 1) / block_n) {
        std::copy(mul + (r - 1) * blocks_k, mul + r * blocks_k, mul + r * blocks_k);
        std::copy(sub + (r - 1) * blocks_k, sub + r * blocks_k, sub + r * blocks_k);
      } else {
        RowParams(n + r, mul + r * blocks_k, sub + r * blocks_k);
      }
    }
  }
  int64_t Step(int64_t lanes) const { return 2 * lanes; }
  static bool VectorAt(int64_t) { return true; }
  template <class Fn>
  HWY_INLINE void Decode(DQ df, const uint8_t* row, int64_t j, int64_t lanes, Fn&& fn) const {
    VQ w0, w1;
    DecodeFp8(df, row + j, w0, w1);
    fn(w0, j);
    fn(w1, j + lanes);
  }
  static float Code(const uint8_t* row, int64_t j) { return Fp8E4m3ToFloat(row[j]) * (1.0f / 256.0f); }
};

// Lanes(d) float16 values at p as float32 (exact, as Float16ToFloat: subnormals included; infinities and NaN
// only where the target widens float16 natively, not under Highway's emulation on SSE4 and below).
inline VQ HalfToFloat(DQ d, const uint16_t* p) {
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(d, Float16ToFloat(p[0]));
#else
  const hn::Rebind<hwy::float16_t, DQ> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#endif
}

// Shared by int8 and int4: the group-wise scales and zeros.
struct IntParams {
  static constexpr bool kHasZero = true;
  const void* scale;
  ScaleType scale_type;
  const uint8_t* zero;
  int64_t group, groups;
  float symmetric_zero;
  IntParams(const IntWeights& w, int64_t k)
      : scale(w.scale),
        scale_type(w.scale_type),
        zero(w.zero),
        group(w.group),
        groups(k / w.group),
        symmetric_zero(w.bits == 4 ? 8.0f : 128.0f) {}
  int64_t Segments() const { return groups; }
  int64_t SegBegin(int64_t s) const { return s * group; }
  int64_t SegEnd(int64_t s) const { return (s + 1) * group; }
  void Params(int64_t n, int64_t s, float& mul, float& z) const {
    const int64_t i = n * groups + s;
    mul = 0.0f;
    switch (scale_type) {
      case ScaleType::kFloat32:
        mul = static_cast<const float*>(scale)[i];
        break;
      case ScaleType::kBFloat16:
        mul = BF16ToFloat(static_cast<const uint16_t*>(scale)[i]);
        break;
      case ScaleType::kFloat16:
        mul = Float16ToFloat(static_cast<const uint16_t*>(scale)[i]);
        break;
    }
    z = zero != nullptr ? static_cast<float>(zero[i]) : symmetric_zero;
  }
  // Params of every group of row n, vectorised (the scales widened by type).
  void RowParams(int64_t n, float* mul, float* sub) const { ChunkParams(n, 1, mul, sub); }
  // Params of rows [n, n + count), flat: mul[r * groups + s], sub likewise (scales and zeros are row-major
  // [n_total, groups], so a run of rows is one contiguous run of groups, widened in whole vectors).
  void ChunkParams(int64_t n, int64_t count, float* mul, float* sub) const {
    const DQ d;
    const hn::RebindToUnsigned<DQ> du32;
    const hn::RebindToSigned<DQ> di32;
    const hn::Rebind<uint8_t, DQ> du8;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const int64_t first = n * groups, total = count * groups;
    int64_t s = 0;
    for (; s + lanes <= total; s += lanes) {
      VQ m;
      switch (scale_type) {
        case ScaleType::kFloat32:
          m = hn::LoadU(d, static_cast<const float*>(scale) + first + s);
          break;
        case ScaleType::kBFloat16:
          m = LoadBF16(d, static_cast<const uint16_t*>(scale) + first + s);
          break;
        default:
          m = HalfToFloat(d, static_cast<const uint16_t*>(scale) + first + s);
          break;
      }
      const VQ z = zero != nullptr
                       ? hn::ConvertTo(d, hn::BitCast(di32, hn::PromoteTo(du32, hn::LoadU(du8, zero + first + s))))
                       : hn::Set(d, symmetric_zero);
      hn::StoreU(m, d, mul + s);
      hn::StoreU(hn::Mul(z, m), d, sub + s);
    }
    for (; s < total; ++s) {
      float m, z;
      Params(n + s / groups, s % groups, m, z);
      mul[s] = m;
      sub[s] = z * m;
    }
  }
};

template <class DU8>
HWY_INLINE VQ BytesToFloat(DQ df, hn::Vec<DU8> bytes) {
  const hn::RebindToUnsigned<DQ> du32;
  const hn::RebindToSigned<DQ> di32;
  return hn::ConvertTo(df, hn::BitCast(di32, hn::PromoteTo(du32, bytes)));
}

struct Int8Format : IntParams {
  const uint8_t* data;
  int64_t k;
  Int8Format(const IntWeights& w, int64_t k_) : IntParams(w, k_), data(w.data), k(k_) {}
  const uint8_t* Row(int64_t n) const { return data + n * k; }
  static int64_t Bytes(int64_t j) { return j; }
  int64_t Step(int64_t lanes) const { return 2 * lanes; }
  static bool VectorAt(int64_t) { return true; }
  template <class Fn>
  HWY_INLINE void Decode(DQ df, const uint8_t* row, int64_t j, int64_t lanes, Fn&& fn) const {
    const hn::Rebind<uint8_t, DQ> du8;
    fn(BytesToFloat<decltype(du8)>(df, hn::LoadU(du8, row + j)), j);
    fn(BytesToFloat<decltype(du8)>(df, hn::LoadU(du8, row + j + lanes)), j + lanes);
  }
  static float Code(const uint8_t* row, int64_t j) { return static_cast<float>(row[j]); }
};

// int4 in chunks of 32 codes (quantized.h): Lanes(df) bytes from byte c * Lanes(df) of a chunk hold codes
// c * Lanes(df) ... in their low nibbles and 16 + c * Lanes(df) ... in their high ones.
struct Int4Format : IntParams {
  const uint8_t* data;
  int64_t k;
  Int4Format(const IntWeights& w, int64_t k_) : IntParams(w, k_), data(w.data), k(k_) {}
  const uint8_t* Row(int64_t n) const { return data + n * (k / 2); }
  static int64_t Bytes(int64_t j) { return j / 2; }
  static int64_t Step(int64_t) { return 32; }
  static bool VectorAt(int64_t j) { return j % 32 == 0; }
  template <class Fn>
  HWY_INLINE void Decode(DQ df, const uint8_t* row, int64_t j, int64_t lanes, Fn&& fn) const {
    const hn::Rebind<uint8_t, DQ> du8;
    const hn::RebindToUnsigned<DQ> du32;
    const hn::RebindToSigned<DQ> di32;
    const auto low = hn::Set(du32, 0xF);
    for (int64_t c = 0; c < 16; c += lanes) {
      const auto bytes = hn::PromoteTo(du32, hn::LoadU(du8, row + j / 2 + c));
      fn(hn::ConvertTo(df, hn::BitCast(di32, hn::And(bytes, low))), j + c);
      fn(hn::ConvertTo(df, hn::BitCast(di32, hn::ShiftRight<4>(bytes))), j + 16 + c);
    }
  }
  float Code(const uint8_t* row, int64_t j) const { return static_cast<float>(Int4Code(row, k, 0, j)); }
};

// ---------------------------------------------------------------------------------------------------------------
// Rows kernels.

#if !HWY_HAVE_SCALABLE  // arrays of vectors: not of SVE's sizeless ones (those targets go row by row)

// Weight rows per tile: AVX-512 and NEON have 32 vector registers (4 x 4 accumulators beside the decoding);
// AVX2 and SSE 16 (4 x 2).
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr int kQuantTileWeightRows = 2;
#else
constexpr int kQuantTileWeightRows = 4;
#endif

#define STRATA_UNROLL _Pragma("GCC unroll 16")

// Input rows [m0, m0 + MR) against weight rows [n, n + nr) (nr <= NR; the missing ones read row n + nr - 1
// again and are not stored). Each weight vector is decoded once for MR input rows and scaled (code * mul -
// zero * mul: `mul` and `sub` hold both per weight row and segment, [NR][segments]) before the FMAs.
template <class Format, class E, int MR, int NR>
HWY_NOINLINE void QuantTile(const Format& f, const float* mul, const float* sub, const float* x,
                            const typename E::T* bias, typename E::T* y, int64_t k, int64_t n_total, int64_t n,
                            int64_t nr, int64_t m0) {
  const DQ d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t segments = f.Segments();
  const float* xs[MR];
  const uint8_t* ws[NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) xs[m] = x + (m0 + m) * k;
  STRATA_UNROLL for (int r = 0; r < NR; ++r) ws[r] = f.Row(n + (r < nr ? r : nr - 1));
  // The same rows of the next block of weight rows, prefetched into L2 as these stream: the rows of a block are
  // short streams side by side, which the hardware prefetchers follow poorly (strata_quantized_bench: 1.5-2x at
  // one row; into L2 rather than L1, 1.5x more at int4). Only prefetched, never read: past the matrix's end is
  // harmless.
  const uint8_t* next[NR];
  STRATA_UNROLL for (int r = 0; r < NR; ++r) next[r] = ws[r] + (f.Row(NR) - f.Row(0));
  VQ acc[MR][NR];
  float tail[MR][NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_UNROLL for (int r = 0; r < NR; ++r) {
      acc[m][r] = hn::Zero(d);
      tail[m][r] = 0.0f;
    }
  }
  const int64_t step = f.Step(lanes);
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t begin = f.SegBegin(s), end = f.SegEnd(s);
    int64_t j = begin;
    if (Format::VectorAt(begin)) {
      VQ mv[NR], sv[NR];
      STRATA_UNROLL for (int r = 0; r < NR; ++r) {
        mv[r] = hn::Set(d, mul[r * segments + s]);
        sv[r] = hn::Set(d, sub[r * segments + s]);
      }
      for (; j + step <= end; j += step) {
        STRATA_UNROLL for (int r = 0; r < NR; ++r) {
          if (m0 == 0) __builtin_prefetch(next[r] + Format::Bytes(j), 0, 2);
          f.Decode(d, ws[r], j, lanes, [&](VQ codes, int64_t col) HWY_ATTR {
            const VQ w = hn::MulSub(codes, mv[r], sv[r]);
            STRATA_UNROLL for (int m = 0; m < MR; ++m) acc[m][r] = hn::MulAdd(w, hn::LoadU(d, xs[m] + col), acc[m][r]);
          });
        }
      }
    }
    for (; j < end; ++j) {
      for (int r = 0; r < NR; ++r) {
        const float w = f.Code(ws[r], j) * mul[r * segments + s] - sub[r * segments + s];
        for (int m = 0; m < MR; ++m) tail[m][r] += w * xs[m][j];
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int r = 0; r < nr; ++r) {
      const float b = bias != nullptr ? E::LoadOne(bias + n + r) : 0.0f;
      E::StoreOne(hn::GetLane(hn::SumOfLanes(d, acc[m][r])) + tail[m][r] + b, y + (m0 + m) * n_total + n + r);
    }
  }
}

// One or two input rows against weight rows [n, n + nr): here the conversion of the codes is not shared by
// many input rows, so nothing more is done per code than convert and FMA. Per segment (FP8 block, int group) the
// products of codes and x accumulate unscaled, then that sum times the segment's multiplier joins the total;
// the zeros are subtracted at the end as sum over segments of zero * mul * sum(x over the segment) (`sumx`,
// [rows][segments], computed once per call and shared by every weight row).
template <class Format, class E, int MR, int NR>
HWY_NOINLINE void QuantTileDeferred(const Format& f, const float* mul, const float* sub, const float* sumx,
                                    const float* x, const typename E::T* bias, typename E::T* y, int64_t k,
                                    int64_t n_total, int64_t n, int64_t nr, int64_t m0) {
  const DQ d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t segments = f.Segments();
  const float* xs[MR];
  const uint8_t* ws[NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) xs[m] = x + (m0 + m) * k;
  STRATA_UNROLL for (int r = 0; r < NR; ++r) ws[r] = f.Row(n + (r < nr ? r : nr - 1));
  // The same rows of the next block of weight rows, prefetched into L2 as these stream: the rows of a block are
  // short streams side by side, which the hardware prefetchers follow poorly (strata_quantized_bench: 1.5-2x at
  // one row; into L2 rather than L1, 1.5x more at int4). Only prefetched, never read: past the matrix's end is
  // harmless.
  const uint8_t* next[NR];
  STRATA_UNROLL for (int r = 0; r < NR; ++r) next[r] = ws[r] + (f.Row(NR) - f.Row(0));
  VQ total[MR][NR];
  float tail[MR][NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_UNROLL for (int r = 0; r < NR; ++r) {
      total[m][r] = hn::Zero(d);
      tail[m][r] = 0.0f;
    }
  }
  const int64_t step = f.Step(lanes);
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t begin = f.SegBegin(s), end = f.SegEnd(s);
    int64_t j = begin;
    if (Format::VectorAt(begin) && begin + step <= end) {
      VQ acc[MR][NR];
      STRATA_UNROLL for (int m = 0; m < MR; ++m) { STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = hn::Zero(d); }
      for (; j + step <= end; j += step) {
        STRATA_UNROLL for (int r = 0; r < NR; ++r) {
          __builtin_prefetch(next[r] + Format::Bytes(j), 0, 2);
          f.Decode(d, ws[r], j, lanes, [&](VQ codes, int64_t col) HWY_ATTR {
            STRATA_UNROLL for (int m = 0; m < MR; ++m) {
              acc[m][r] = hn::MulAdd(codes, hn::LoadU(d, xs[m] + col), acc[m][r]);
            }
          });
        }
      }
      STRATA_UNROLL for (int r = 0; r < NR; ++r) {
        const VQ mv = hn::Set(d, mul[r * segments + s]);
        STRATA_UNROLL for (int m = 0; m < MR; ++m) total[m][r] = hn::MulAdd(acc[m][r], mv, total[m][r]);
      }
    }
    for (; j < end; ++j) {
      for (int r = 0; r < NR; ++r) {
        const float w = f.Code(ws[r], j) * mul[r * segments + s];
        for (int m = 0; m < MR; ++m) tail[m][r] += w * xs[m][j];
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int r = 0; r < nr; ++r) {
      float zeros = 0.0f;
      if constexpr (Format::kHasZero) {
        for (int64_t s = 0; s < segments; ++s) zeros += sub[r * segments + s] * sumx[(m0 + m) * segments + s];
      }
      const float b = bias != nullptr ? E::LoadOne(bias + n + r) : 0.0f;
      E::StoreOne(hn::GetLane(hn::SumOfLanes(d, total[m][r])) + tail[m][r] - zeros + b, y + (m0 + m) * n_total + n + r);
    }
  }
}

#undef STRATA_UNROLL

// Tiles over blocks of weight rows, their multipliers and zero * multipliers gathered once per block: one or
// two input rows by QuantTileDeferred (4 weight rows; 2 x 2 on 16-register targets), more by QuantTile.
template <class Format, class E>
void QuantRowsT(const Format& f, const float* x, const typename E::T* bias, typename E::T* y, int64_t rows, int64_t k,
                int64_t n_total, int64_t n0, int64_t n1) {
  constexpr int NR = kQuantTileWeightRows;
  constexpr int64_t kChunk = 32;  // weight rows whose scales are widened at once (a multiple of every block)
  const int64_t segments = f.Segments();
  // mul and sub of a chunk's rows, flat ([row][segment]), and a block's worth past the end: a short block's
  // missing rows read there (their sums are never stored).
  std::vector<float> params(static_cast<size_t>(2 * (kChunk + 4) * segments));
  float* mul = params.data();
  float* sub = mul + (kChunk + 4) * segments;
  std::vector<float> sumx;
  if (Format::kHasZero && rows <= 2) {
    sumx.resize(static_cast<size_t>(rows * segments));
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t s = 0; s < segments; ++s) {
        float sum = 0.0f;
        for (int64_t j = f.SegBegin(s); j < f.SegEnd(s); ++j) sum += x[m * k + j];
        sumx[static_cast<size_t>(m * segments + s)] = sum;
      }
    }
  }
  // Weight rows per block: 4 for one or two input rows (2 for two on 16-register targets), NR for tiles.
  const int64_t block = rows == 1 ? 4 : (rows == 2 ? (NR == 4 ? 4 : 2) : NR);
  for (int64_t c0 = n0; c0 < n1; c0 += kChunk) {
    const int64_t c1 = n1 - c0 < kChunk ? n1 : c0 + kChunk;
    f.ChunkParams(c0, c1 - c0, mul, sub);
    for (int64_t n = c0; n < c1; n += block) {
      const int64_t nr = c1 - n < block ? c1 - n : block;
      const float* bm = mul + (n - c0) * segments;
      const float* bs = sub + (n - c0) * segments;
      if (rows == 1) {
        QuantTileDeferred<Format, E, 1, 4>(f, bm, bs, sumx.data(), x, bias, y, k, n_total, n, nr, 0);
        continue;
      }
      if (rows == 2) {
        if constexpr (NR == 4) {
          QuantTileDeferred<Format, E, 2, 4>(f, bm, bs, sumx.data(), x, bias, y, k, n_total, n, nr, 0);
        } else {
          QuantTileDeferred<Format, E, 2, 2>(f, bm, bs, sumx.data(), x, bias, y, k, n_total, n, nr, 0);
        }
        continue;
      }
      for (int64_t m = 0; m < rows; m += 4) {
        switch (rows - m < 4 ? rows - m : 4) {
          case 4:
            QuantTile<Format, E, 4, NR>(f, bm, bs, x, bias, y, k, n_total, n, nr, m);
            break;
          case 3:
            QuantTile<Format, E, 3, NR>(f, bm, bs, x, bias, y, k, n_total, n, nr, m);
            break;
          case 2:
            QuantTile<Format, E, 2, NR>(f, bm, bs, x, bias, y, k, n_total, n, nr, m);
            break;
          default:
            QuantTile<Format, E, 1, NR>(f, bm, bs, x, bias, y, k, n_total, n, nr, m);
            break;
        }
      }
    }
  }
}

#else  // HWY_HAVE_SCALABLE: one input row against one weight row at a time

template <class Format, class E>
void QuantRowsT(const Format& f, const float* x, const typename E::T* bias, typename E::T* y, int64_t rows, int64_t k,
                int64_t n_total, int64_t n0, int64_t n1) {
  const DQ d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t step = f.Step(lanes);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = f.Row(n);
    for (int64_t m = 0; m < rows; ++m) {
      const float* xm = x + m * k;
      auto acc = hn::Zero(d);
      float tail = 0.0f;
      for (int64_t s = 0; s < f.Segments(); ++s) {
        float mul, z;
        f.Params(n, s, mul, z);
        const int64_t end = f.SegEnd(s);
        int64_t j = f.SegBegin(s);
        if (Format::VectorAt(j)) {
          const auto mv = hn::Set(d, mul), sv = hn::Set(d, z * mul);
          for (; j + step <= end; j += step) {
            f.Decode(d, row, j, lanes, [&](VQ codes, int64_t col) HWY_ATTR {
              acc = hn::MulAdd(hn::MulSub(codes, mv, sv), hn::LoadU(d, xm + col), acc);
            });
          }
        }
        for (; j < end; ++j) tail += (f.Code(row, j) * mul - z * mul) * xm[j];
      }
      const float b = bias != nullptr ? E::LoadOne(bias + n) : 0.0f;
      E::StoreOne(hn::GetLane(hn::SumOfLanes(d, acc)) + tail + b, y + m * n_total + n);
    }
  }
}

#endif  // HWY_HAVE_SCALABLE

// ---------------------------------------------------------------------------------------------------------------
// Dequantization: (code - zero) * mul, one subtraction of exact small integers (none for FP8) and one float32
// multiply, as torch computes it.

template <class Format, class E>
void DequantizeT(const Format& f, int64_t k, int64_t n0, int64_t n1, typename E::T* out) {
  const DQ d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t step = f.Step(lanes);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = f.Row(n);
    typename E::T* o = out + (n - n0) * k;
    for (int64_t s = 0; s < f.Segments(); ++s) {
      float mul, z;
      f.Params(n, s, mul, z);
      const int64_t end = f.SegEnd(s);
      int64_t j = f.SegBegin(s);
      if (Format::VectorAt(j)) {
        const auto mv = hn::Set(d, mul), zv = hn::Set(d, z);
        for (; j + step <= end; j += step) {
          f.Decode(d, row, j, lanes,
                   [&](VQ codes, int64_t col) HWY_ATTR { E::Store(d, hn::Mul(hn::Sub(codes, zv), mv), o + col); });
        }
      }
      for (; j < end; ++j) E::StoreOne((f.Code(row, j) - z) * mul, o + j);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// bfloat16 input rows on AVX512_BF16's VDPBF16PS (a per-target specialisation of the AVX-512 target, as
// linear-inl.h's; raw intrinsics). The codes become bfloat16 in registers, exactly: an e4m3 value is a
// bfloat16 number (VPERMI2B looks up its two bytes in 128-byte tables, AVX512_VBMI), and an int4 code q is
// packed under the exponent of 128 (the word 0x4300 | q is bfloat16 128 + q: one unpack of the nibbles with
// 0x43 bytes; the 128 leaves with the zeros, below). VDPBF16PS then multiplies 32 pairs into 16 float32 sums
// per instruction, twice the float32 FMA's columns, with no conversion of x. The unpacks interleave within
// 128-bit lanes, so the codes come out in a fixed permutation of their columns; x is permuted the same way
// once per call. Float32 lane i sums words 2i and 2i + 1, both in 128-bit lane i / 4: lane L of an int4 block
// holds one chunk of 32 codes, hence one int group (group a multiple of 32), and its scale is applied per
// 128-bit lane. Products are exact in float32; the sums round to nearest even, denormals flush to zero.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define STRATA_QUANT_DOT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi")))
#define STRATA_UNROLL _Pragma("GCC unroll 16")
#define STRATA_ALWAYS_INLINE __attribute__((always_inline)) inline

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// e4m3 magnitudes (7 bits) -> their bfloat16 bits, low and high bytes (0x7f: NaN).
struct Fp8Bf16Tables {
  alignas(64) uint8_t low[128];
  alignas(64) uint8_t high[128];
};
inline const Fp8Bf16Tables& Fp8Bf16() {
  static const Fp8Bf16Tables tables = [] {
    Fp8Bf16Tables t{};
    for (int m = 0; m < 128; ++m) {
      const uint16_t bits = m == 0x7F ? uint16_t{0x7FC0} : FloatToBF16(Fp8E4m3ToFloat(static_cast<uint8_t>(m)));
      t.low[m] = static_cast<uint8_t>(bits & 0xFF);
      t.high[m] = static_cast<uint8_t>(bits >> 8);
    }
    return t;
  }();
  return tables;
}

// 256 bytes as 4 x 4 16-byte units, transposed: unit L of output vector v is unit v of input vector L.
STRATA_QUANT_DOT STRATA_ALWAYS_INLINE void TransposeUnits(const void* from, void* to) {
  const __m512i* in = static_cast<const __m512i*>(from);
  __m512i* out = static_cast<__m512i*>(to);
  const __m512i r0 = _mm512_loadu_si512(in), r1 = _mm512_loadu_si512(in + 1);
  const __m512i r2 = _mm512_loadu_si512(in + 2), r3 = _mm512_loadu_si512(in + 3);
  const __m512i t0 = _mm512_shuffle_i64x2(r0, r1, 0x44), t1 = _mm512_shuffle_i64x2(r0, r1, 0xEE);
  const __m512i t2 = _mm512_shuffle_i64x2(r2, r3, 0x44), t3 = _mm512_shuffle_i64x2(r2, r3, 0xEE);
  _mm512_storeu_si512(out, _mm512_shuffle_i64x2(t0, t2, 0x88));
  _mm512_storeu_si512(out + 1, _mm512_shuffle_i64x2(t0, t2, 0xDD));
  _mm512_storeu_si512(out + 2, _mm512_shuffle_i64x2(t1, t3, 0x88));
  _mm512_storeu_si512(out + 3, _mm512_shuffle_i64x2(t1, t3, 0xDD));
}

// FP8: blocks of 64 codes (64 bytes) as 2 vectors of 32 bfloat16; word i of 128-bit lane L of vector v is
// column 16 L + 8 v + i of the block.
struct Fp8Dot {
  static constexpr int kBlock = 64, kVectors = 2, kBlockBytes = 64;
  // One block of x (64 bfloat16) in that order: 16-byte unit u of vector v is unit 2 u + v of the block.
  STRATA_QUANT_DOT STRATA_ALWAYS_INLINE static void Permute(const uint16_t* from, uint16_t* to) {
    const __m512i a = _mm512_loadu_si512(from), b = _mm512_loadu_si512(from + 32);
    _mm512_storeu_si512(to, _mm512_permutex2var_epi64(a, _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0), b));
    _mm512_storeu_si512(to + 32, _mm512_permutex2var_epi64(a, _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2), b));
  }
  __m512i low0, low1, high0, high1;
  STRATA_QUANT_DOT Fp8Dot() {
    const Fp8Bf16Tables& t = Fp8Bf16();
    low0 = _mm512_load_si512(t.low);
    low1 = _mm512_load_si512(t.low + 64);
    high0 = _mm512_load_si512(t.high);
    high1 = _mm512_load_si512(t.high + 64);
  }
  STRATA_QUANT_DOT STRATA_ALWAYS_INLINE void Decode(const uint8_t* p, __m512bh (&w)[kVectors]) const {
    const __m512i bytes = _mm512_loadu_si512(p);
    const __m512i low = _mm512_permutex2var_epi8(low0, bytes, low1);  // VPERMI2B: index bits 0..6
    __m512i high = _mm512_permutex2var_epi8(high0, bytes, high1);
    high = _mm512_ternarylogic_epi32(high, bytes, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // | sign
    w[0] = (__m512bh)_mm512_unpacklo_epi8(low, high);
    w[1] = (__m512bh)_mm512_unpackhi_epi8(low, high);
  }
};

// int4: blocks of 128 codes (4 chunks, 64 bytes) as 4 vectors of 32 bfloat16 128 + q; word i of 128-bit lane
// L of vector v is column 32 L + 8 v + i of the block (chunk L; v 0, 1 its low nibbles, 2, 3 its high ones).
struct Int4Dot {
  static constexpr int kBlock = 128, kVectors = 4, kBlockBytes = 64;
  // One block of x (128 bfloat16) in that order: unit L of vector v is unit v of the block's 32 columns L.
  STRATA_QUANT_DOT STRATA_ALWAYS_INLINE static void Permute(const uint16_t* from, uint16_t* to) {
    TransposeUnits(from, to);
  }
  STRATA_QUANT_DOT STRATA_ALWAYS_INLINE void Decode(const uint8_t* p, __m512bh (&w)[kVectors]) const {
    const __m512i bytes = _mm512_loadu_si512(p);
    const __m512i nibble = _mm512_set1_epi8(0x0F), exponent = _mm512_set1_epi8(0x43);
    const __m512i low = _mm512_and_si512(bytes, nibble);
    const __m512i high = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
    w[0] = (__m512bh)_mm512_unpacklo_epi8(low, exponent);
    w[1] = (__m512bh)_mm512_unpackhi_epi8(low, exponent);
    w[2] = (__m512bh)_mm512_unpacklo_epi8(high, exponent);
    w[3] = (__m512bh)_mm512_unpackhi_epi8(high, exponent);
  }
};

// How a block's scales spread over its 128-bit lanes: one for all (an FP8 block, an int group of 128 or a
// multiple), or one per lane (int group 32: 4 groups a block) or per two lanes (group 64).
enum class LaneScales { kOne, kGroup32, kGroup64 };

// The scale vector of block `blk` of weight row r: dmul holds the row's multipliers per segment.
STRATA_QUANT_DOT STRATA_ALWAYS_INLINE __m512 BlockScale(const float* dmul, LaneScales lanes, int64_t segment) {
  switch (lanes) {
    case LaneScales::kGroup32:
      return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                   _mm512_castps128_ps512(_mm_loadu_ps(dmul + segment)));
    case LaneScales::kGroup64:
      return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                   _mm512_castps128_ps512(_mm_loadu_ps(dmul + segment)));
    default:
      return _mm512_set1_ps(dmul[segment]);
  }
}

// The sums of four vectors' lanes, as one 128-bit vector {a, b, c, d}.
STRATA_QUANT_DOT STRATA_ALWAYS_INLINE __m128 Reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
  const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
  const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
  // hadd(a, b): a0+a1, a2+a3, b0+b1, b2+b3 per 128-bit half; hadd of two of those: a0..3, b0..3, c0..3, d0..3.
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Input rows [m0, m0 + MR) (permuted bfloat16, `xp_stride` apart) against weight rows ws[0 .. NR) over the
// `blocks` whole blocks: sums[m][r] = sum over blocks of scale * (codes . x), the scales of weight row r at
// dmul + r * dmul_stride. One input row keeps two accumulators per weight row (the vectors of a block
// alternate) to halve the VDPBF16PS chains. `ahead`: bytes past each weight row's block to prefetch.
template <class Dot, int MR, int NR>
STRATA_QUANT_DOT HWY_NOINLINE void TileQuantDot(const Dot& dot, const uint16_t* xp, int64_t xp_stride,
                                                const uint8_t* const* ws, const float* dmul, int64_t dmul_stride,
                                                LaneScales lanes, int64_t segment_cols, int64_t blocks, int64_t m0,
                                                int64_t ahead, float (*sums)[4]) {
  constexpr int P = MR == 1 ? 2 : 1;
  __m512 total[MR][NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_UNROLL for (int r = 0; r < NR; ++r) total[m][r] = _mm512_setzero_ps();
  }
  // Steps of blocks under one scale vector: a whole segment of blocks (an FP8 block of a multiple of 64
  // columns, an int group of a multiple of 128), or one block (int groups of 32 and 64, 4 or 2 a block).
  const int64_t step = lanes == LaneScales::kOne ? segment_cols / Dot::kBlock : 1;
  const int64_t per_step = lanes == LaneScales::kGroup32 ? 4 : (lanes == LaneScales::kGroup64 ? 2 : 1);
  for (int64_t first = 0, segment = 0; first < blocks; first += step, segment += per_step) {
    const int64_t last = first + step < blocks ? first + step : blocks;
    __m512 acc[MR][NR][P];
    STRATA_UNROLL for (int m = 0; m < MR; ++m) {
      STRATA_UNROLL for (int r = 0; r < NR; ++r) {
        STRATA_UNROLL for (int p = 0; p < P; ++p) acc[m][r][p] = _mm512_setzero_ps();
      }
    }
    for (int64_t blk = first; blk < last; ++blk) {
      STRATA_UNROLL for (int r = 0; r < NR; ++r) {
        if (m0 == 0) __builtin_prefetch(ws[r] + ahead + blk * Dot::kBlockBytes, 0, 2);
        __m512bh w[Dot::kVectors];
        dot.Decode(ws[r] + blk * Dot::kBlockBytes, w);
        STRATA_UNROLL for (int v = 0; v < Dot::kVectors; ++v) {
          STRATA_UNROLL for (int m = 0; m < MR; ++m) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(xp + (m0 + m) * xp_stride + blk * Dot::kBlock + 32 * v);
            acc[m][r][v % P] = _mm512_dpbf16_ps(acc[m][r][v % P], w[v], xv);
          }
        }
      }
    }
    STRATA_UNROLL for (int r = 0; r < NR; ++r) {
      const __m512 scale = BlockScale(dmul + r * dmul_stride, lanes, segment);
      STRATA_UNROLL for (int m = 0; m < MR; ++m) {
        __m512 a = acc[m][r][0];
        if constexpr (P == 2) a = _mm512_add_ps(a, acc[m][r][P - 1]);
        total[m][r] = _mm512_fmadd_ps(a, scale, total[m][r]);
      }
    }
  }
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    if constexpr (NR == 4) {
      _mm_storeu_ps(sums[m], Reduce4(total[m][0], total[m][1], total[m][2], total[m][3]));
    } else {
      STRATA_UNROLL for (int r = 0; r < NR; ++r) sums[m][r] = _mm512_reduce_add_ps(total[m][r]);
    }
  }
}

// {sum over s < count of a[r * stride + s] * b[s]} for r = 0..3, in one vector.
STRATA_QUANT_DOT STRATA_ALWAYS_INLINE __m128 Dot4(const float* a, int64_t stride, const float* b, int64_t count) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t s = 0; s < count; s += 16) {
    const __mmask16 mask = count - s >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (count - s)) - 1);
    const __m512 bv = _mm512_maskz_loadu_ps(mask, b + s);
    STRATA_UNROLL for (int r = 0; r < 4; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a + r * stride + s), bv, acc[r]);
    }
  }
  return Reduce4(acc[0], acc[1], acc[2], acc[3]);
}

// Weight rows a chunk of QuantRowsDot takes its scales for at once (a multiple of the tiles' 4 and 2).
constexpr int64_t kDotChunkRows = 32;

// The rows kernel on VDPBF16PS for one format: `Format` (quantized-inl.h's float32 one) gives the multipliers,
// zeros and the scalar codes of the columns past the last whole block. Per chunk of kDotChunkRows weight rows
// the scales are widened in whole vectors (ChunkParams) and the zeros' term of every output computed at once,
// so that what runs per weight row besides the tile is a few stores.
template <class Dot, class Format>
STRATA_QUANT_DOT void QuantRowsDot(const Dot& dot, const Format& f, LaneScales lanes, int64_t segment_cols,
                                   float dot_factor, const uint16_t* x, const uint16_t* bias, uint16_t* y, int64_t rows,
                                   int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  const int64_t blocks = k / Dot::kBlock, kv = blocks * Dot::kBlock;
  const int64_t segments = f.Segments();
  // x permuted as the decoded codes are, per block.
  std::vector<uint16_t> xp(static_cast<size_t>(rows * kv + 32));
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      Dot::Permute(x + m * k + blk * Dot::kBlock, xp.data() + m * kv + blk * Dot::kBlock);
    }
  }
  // The sum of x over each segment's whole blocks, for the zeros (and the 128 under each int4 code).
  std::vector<float> sumx;
  if (Format::kHasZero) {
    sumx.assign(static_cast<size_t>(rows * segments), 0.0f);
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t seg = 0; seg * segment_cols < kv; ++seg) {
        const int64_t end = (seg + 1) * segment_cols < kv ? (seg + 1) * segment_cols : kv;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t c = seg * segment_cols; c < end; c += 16) {  // segments of a multiple of 32 columns here
          acc = _mm512_add_ps(
              acc,
              _mm512_castsi512_ps(_mm512_slli_epi32(
                  _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + m * k + c))), 16)));
        }
        sumx[static_cast<size_t>(m * segments + seg)] = _mm512_reduce_add_ps(acc);
      }
    }
  }
  // Per chunk: mul and sub (zero * mul) per weight row and segment, flat (4 floats of padding for BlockScale's
  // loads), and the zeros' term of each output: corr[m][r] = sum over segments of (128 + zero) * scale * sumx.
  // (Rows rounded up to 4 for Dot4, which reads a whole group of 4 rows.)
  const int64_t chunk_rows = n1 - n0 < kDotChunkRows ? n1 - n0 : kDotChunkRows;
  const int64_t padded_rows = (chunk_rows + 3) / 4 * 4;
  std::vector<float> table(static_cast<size_t>(3 * padded_rows * segments + 4 + rows * padded_rows + 4 * segments + 4));
  float* mul = table.data();
  float* sub = mul + padded_rows * segments + 4;
  float* zq = sub + padded_rows * segments;  // (128 + zero) * scale
  float* corr = zq + padded_rows * segments;
  float* edge = corr + rows * padded_rows;  // a short tile's scales
  const int nr_max = rows <= 2 ? 4 : 2;
  const int64_t ahead = 4 * nr_max * (f.Row(1) - f.Row(0));  // four tiles on
  for (int64_t c0 = n0; c0 < n1; c0 += chunk_rows) {
    const int64_t count = n1 - c0 < chunk_rows ? n1 - c0 : chunk_rows;
    f.ChunkParams(c0, count, mul, sub);
    if constexpr (Format::kHasZero) {
      const int64_t flat = count * segments;
      for (int64_t i = 0; i < flat; i += 16) {
        const __mmask16 mask = flat - i >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (flat - i)) - 1);
        _mm512_mask_storeu_ps(zq + i, mask,
                              _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, mul + i), _mm512_set1_ps(128.0f),
                                              _mm512_maskz_loadu_ps(mask, sub + i)));
      }
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t r = 0; r < count; r += 4) {
          _mm_storeu_ps(corr + m * padded_rows + r,
                        Dot4(zq + r * segments, segments, sumx.data() + m * segments, segments));
        }
      }
    }
    for (int64_t n = c0; n < c0 + count; n += nr_max) {
      const int64_t nr = c0 + count - n < nr_max ? c0 + count - n : nr_max;
      const int64_t local = n - c0;
      const uint8_t* ws[4];
      for (int r = 0; r < nr_max; ++r) ws[r] = f.Row(n + (r < nr ? r : nr - 1));
      // A short tile (the range's last rows) repeats its last row: its scales too, from a padded copy.
      const float* dm = mul + local * segments;
      if (nr < nr_max) {
        for (int r = 0; r < nr_max; ++r) {
          const float* from = mul + (local + (r < nr ? r : nr - 1)) * segments;
          std::copy(from, from + segments, edge + r * segments);
        }
        dm = edge;
      }
      for (int64_t m = 0; m < rows;) {
        float sums[4][4];
        int mr;
        if (rows <= 2) {
          mr = static_cast<int>(rows);
          if (mr == 1) {
            TileQuantDot<Dot, 1, 4>(dot, xp.data(), kv, ws, dm, segments, lanes, segment_cols, blocks, m, ahead, sums);
          } else {
            TileQuantDot<Dot, 2, 4>(dot, xp.data(), kv, ws, dm, segments, lanes, segment_cols, blocks, m, ahead, sums);
          }
        } else {
          mr = rows - m < 4 ? static_cast<int>(rows - m) : 4;
          switch (mr) {
            case 4:
              TileQuantDot<Dot, 4, 2>(dot, xp.data(), kv, ws, dm, segments, lanes, segment_cols, blocks, m, ahead,
                                      sums);
              break;
            case 3:
              TileQuantDot<Dot, 3, 2>(dot, xp.data(), kv, ws, dm, segments, lanes, segment_cols, blocks, m, ahead,
                                      sums);
              break;
            case 2:
              TileQuantDot<Dot, 2, 2>(dot, xp.data(), kv, ws, dm, segments, lanes, segment_cols, blocks, m, ahead,
                                      sums);
              break;
            default:
              TileQuantDot<Dot, 1, 2>(dot, xp.data(), kv, ws, dm, segments, lanes, segment_cols, blocks, m, ahead,
                                      sums);
              break;
          }
        }
        for (int i = 0; i < mr; ++i) {
          const uint16_t* xm = x + (m + i) * k;
          for (int r = 0; r < nr; ++r) {
            float v = sums[i][r] * dot_factor;
            if constexpr (Format::kHasZero) v -= corr[(m + i) * padded_rows + local + r];
            const float* mr_ = mul + (local + r) * segments;
            const float* sr_ = sub + (local + r) * segments;
            for (int64_t j = kv; j < k; ++j) {  // the columns past the last whole block
              const int64_t s = j / segment_cols;
              v += (f.Code(ws[r], j) * mr_[s] - sr_[s]) * BF16ToFloat(xm[j]);
            }
            const float b = bias != nullptr ? BF16ToFloat(bias[n + r]) : 0.0f;
            y[(m + i) * n_total + n + r] = FloatToBF16(v + b);
          }
        }
        m += mr;
      }
    }
  }
}

// FP8 with one or two float32 input rows where the CPU has AVX512_VBMI: the bfloat16 of each code as above,
// widened to float32 by unpacking with zero words (a bfloat16 is the top half of its float32): 10 operations per
// 64 codes, where the Highway decode (float16 bits, NaN marks, two widenings per 32) takes 18. Vector a of a
// block's 4 holds in its 128-bit lane L columns 16 L + 4 a .. + 3: x is permuted to that order once per call
// (TransposeUnits on float32). Sums per FP8 block (block_k a multiple of 64) unscaled, then scaled.
template <int MR, int NR>
STRATA_QUANT_DOT HWY_NOINLINE void TileFp8F32(const Fp8Dot& dot, const float* xp, int64_t xp_stride,
                                              const uint8_t* const* ws, const float* dmul, int64_t segments,
                                              int64_t blocks_per_segment, int64_t blocks, int64_t ahead,
                                              float (*sums)[4]) {
  __m512 total[MR][NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_UNROLL for (int r = 0; r < NR; ++r) total[m][r] = _mm512_setzero_ps();
  }
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t first = 0, segment = 0; first < blocks; first += blocks_per_segment, ++segment) {
    const int64_t last = first + blocks_per_segment < blocks ? first + blocks_per_segment : blocks;
    __m512 acc[MR][NR];
    STRATA_UNROLL for (int m = 0; m < MR; ++m) {
      STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_setzero_ps();
    }
    for (int64_t blk = first; blk < last; ++blk) {
      STRATA_UNROLL for (int r = 0; r < NR; ++r) {
        __builtin_prefetch(ws[r] + ahead + blk * 64, 0, 2);
        __m512bh w[2];
        dot.Decode(ws[r] + blk * 64, w);
        const __m512i w0 = (__m512i)w[0], w1 = (__m512i)w[1];
        const __m512 f[4] = {
            _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w0)), _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w0)),
            _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w1)), _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w1))};
        STRATA_UNROLL for (int a = 0; a < 4; ++a) {
          STRATA_UNROLL for (int m = 0; m < MR; ++m) {
            acc[m][r] = _mm512_fmadd_ps(f[a], _mm512_loadu_ps(xp + m * xp_stride + blk * 64 + 16 * a), acc[m][r]);
          }
        }
      }
    }
    STRATA_UNROLL for (int r = 0; r < NR; ++r) {
      const __m512 scale = _mm512_set1_ps(dmul[r * segments + segment]);
      STRATA_UNROLL for (int m = 0; m < MR; ++m) total[m][r] = _mm512_fmadd_ps(acc[m][r], scale, total[m][r]);
    }
  }
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_UNROLL for (int r = 0; r < NR; ++r) sums[m][r] = _mm512_reduce_add_ps(total[m][r]);
  }
}

template <class E>
STRATA_QUANT_DOT void QuantRowsFp8F32Vbmi(const Fp8Weights& w, const float* x, const typename E::T* bias,
                                          typename E::T* y, int64_t rows, int64_t k, int64_t n_total, int64_t n0,
                                          int64_t n1) {
  const Fp8Format f(w, k);
  const Fp8Dot dot;
  const int64_t blocks = k / 64, kv = blocks * 64, segments = f.Segments();
  std::vector<float> xp(static_cast<size_t>(rows * kv + 16));
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t blk = 0; blk < blocks; ++blk) TransposeUnits(x + m * k + blk * 64, xp.data() + m * kv + blk * 64);
  }
  std::vector<float> table(static_cast<size_t>(3 * 4 * segments));
  float* mul = table.data();
  float* sub = mul + 4 * segments;
  float* dmul = sub + 4 * segments;
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t nr = n1 - n < 4 ? n1 - n : 4;
    const uint8_t* ws[4];
    for (int r = 0; r < 4; ++r) {
      const int64_t row = n + (r < nr ? r : nr - 1);
      ws[r] = f.Row(row);
      f.RowParams(row, mul + r * segments, sub + r * segments);
      for (int64_t s = 0; s < segments; ++s) dmul[r * segments + s] = mul[r * segments + s] * (1.0f / 256.0f);
    }
    float sums[4][4];
    if (rows == 1) {
      TileFp8F32<1, 4>(dot, xp.data(), kv, ws, dmul, segments, w.block_k / 64, blocks, 4 * k, sums);
    } else {
      TileFp8F32<2, 4>(dot, xp.data(), kv, ws, dmul, segments, w.block_k / 64, blocks, 4 * k, sums);
    }
    for (int64_t m = 0; m < rows; ++m) {
      for (int r = 0; r < nr; ++r) {
        float v = sums[m][r];
        for (int64_t j = kv; j < k; ++j) {  // the columns past the last whole block
          const int64_t s = j / w.block_k;
          v += f.Code(ws[r], j) * mul[r * segments + s] * x[m * k + j];
        }
        const float b = bias != nullptr ? E::LoadOne(bias + n + r) : 0.0f;
        E::StoreOne(v + b, y + m * n_total + n + r);
      }
    }
  }
}

#pragma GCC diagnostic pop
#undef STRATA_ALWAYS_INLINE
#undef STRATA_UNROLL
#undef STRATA_QUANT_DOT
#endif  // HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL

#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Integer codes against bfloat16 rows where the CPU has no VDPBF16PS (AVX2, SSE4, AVX-512 without AVX512_BF16):
// x becomes int16 with a power-of-two scale per block of columns, and the codes meet it in 16-bit integer
// multiply-adds (VPMADDWD: 2 products a 32-bit lane), float32 per block. Against the float32 kernels' convert and
// FMA per code this halves the work per code, which is what bounds int4 decode there.
//
// Exactness: a block's scale is 2^(e - 15) with max |x| < 2^e, so x / scale is below 2^15 and every x within 2^6
// of the block's largest (8 significant bits) is an exact int16; smaller ones round to the nearest multiple of
// the scale (at most 2^-16 of the block's largest, where bfloat16 itself keeps 2^-9 of each value). Sums of
// products are exact integers per block (int4: |sum| < 2^26; int8: < 2^28); a block's sum times its two scales
// joins a float32 total.
using D16 = hn::Repartition<int16_t, DQ>;
using D32 = hn::Repartition<int32_t, DQ>;

// The 32 codes of an int4 chunk (16 bytes, quantized.h's layout) as 32 / Lanes(d16) int16 vectors in column order.
template <class D>
HWY_INLINE void Int4Codes16(D d16, const uint8_t* p, hn::Vec<D>* out) {
  const hn::RebindToUnsigned<D> du16;
  const hn::Full128<uint8_t> d16x8;  // the chunk's 16 bytes
  const auto bytes = hn::LoadU(d16x8, p);
  const auto nibble = hn::Set(d16x8, uint8_t{0x0F});
  const auto low = hn::And(bytes, nibble);                      // codes 0..15
  const auto high = hn::And(hn::ShiftRight<4>(bytes), nibble);  // codes 16..31
  constexpr size_t kLanes = hn::MaxLanes(D());
  const hn::Rebind<uint8_t, D> d8;  // as many bytes as d16 has lanes
  if constexpr (kLanes == 32) {
    out[0] = hn::BitCast(d16, hn::PromoteTo(du16, hn::Combine(d8, high, low)));
  } else if constexpr (kLanes == 16) {
    out[0] = hn::BitCast(d16, hn::PromoteTo(du16, low));
    out[1] = hn::BitCast(d16, hn::PromoteTo(du16, high));
  } else {
    out[0] = hn::BitCast(d16, hn::PromoteTo(du16, hn::LowerHalf(d8, low)));
    out[1] = hn::BitCast(d16, hn::PromoteTo(du16, hn::UpperHalf(d8, low)));
    out[2] = hn::BitCast(d16, hn::PromoteTo(du16, hn::LowerHalf(d8, high)));
    out[3] = hn::BitCast(d16, hn::PromoteTo(du16, hn::UpperHalf(d8, high)));
  }
}

// The 32 codes of int8 columns [j, j + 32) (one byte each) likewise.
template <class D>
HWY_INLINE void Int8Codes16(D d16, const uint8_t* p, hn::Vec<D>* out) {
  const hn::RebindToUnsigned<D> du16;
  const hn::Rebind<uint8_t, D> d8;
  constexpr size_t kLanes = hn::MaxLanes(D());
  _Pragma("GCC unroll 4") for (size_t v = 0; v < 32 / kLanes; ++v) out[v] =
      hn::BitCast(d16, hn::PromoteTo(du16, hn::LoadU(d8, p + v * kLanes)));
}

struct Int4Codes {
  static const uint8_t* Row(const uint8_t* data, int64_t k, int64_t n) { return data + n * (k / 2); }
  static const uint8_t* Chunk(const uint8_t* row, int64_t j) { return row + j / 2; }
  HWY_INLINE static void Decode(const uint8_t* p, hn::Vec<D16>* out) { Int4Codes16(D16(), p, out); }
};
struct Int8Codes {
  static const uint8_t* Row(const uint8_t* data, int64_t k, int64_t n) { return data + n * k; }
  static const uint8_t* Chunk(const uint8_t* row, int64_t j) { return row + j; }
  HWY_INLINE static void Decode(const uint8_t* p, hn::Vec<D16>* out) { Int8Codes16(D16(), p, out); }
};

// bfloat16 rows [rows, k] as int16 (x16), with per block of `block` columns its scale and the sum of its int16
// values; false (nothing usable) where a block holds a NaN or infinity or is too small for its scale to be a
// normal float32.
bool QuantizeRows16(const uint16_t* x, int64_t rows, int64_t k, int64_t block, int16_t* x16, float* scale, float* sum) {
  const DQ df;
  const D32 d32;
  const hn::Rebind<int16_t, DQ> d16h;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t blocks = k / block;
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t b = 0; b < blocks; ++b) {
      const uint16_t* xb = x + m * k + b * block;
      VQ top = hn::Zero(df);
      for (int64_t j = 0; j < block; j += lanes) top = hn::Max(top, hn::Abs(LoadBF16(df, xb + j)));
      const float largest = hn::GetLane(hn::MaxOfLanes(df, top));
      if (!(largest <= std::numeric_limits<float>::max())) return false;  // NaN or infinity: the float32 kernels
      int e = 0;
      std::frexp(largest, &e);  // largest < 2^e
      if (largest == 0.0f) e = 0;
      if (e - 15 < -126 || 15 - e > 127) return false;
      const VQ inverse = hn::Set(df, std::ldexp(1.0f, 15 - e));
      auto total = hn::Zero(d32);
      int16_t* out = x16 + m * k + b * block;
      for (int64_t j = 0; j < block; j += lanes) {
        const auto q = hn::NearestInt(hn::Mul(LoadBF16(df, xb + j), inverse));
        total = hn::Add(total, q);
        hn::StoreU(hn::DemoteTo(d16h, q), d16h, out + j);
      }
      scale[m * blocks + b] = std::ldexp(1.0f, e - 15);
      sum[m * blocks + b] = static_cast<float>(hn::GetLane(hn::SumOfLanes(d32, total)));
    }
  }
  return true;
}

// Input rows [0, MR) against weight rows ws[0 .. NR): sums[m][r] = sum over blocks of mul(r, group) * scale(m,
// block) * (codes . x16), the zeros left to the caller.
#define STRATA_INT16_UNROLL _Pragma("GCC unroll 16")
template <class Codes, int MR, int NR>
HWY_NOINLINE void TileInt16(const int16_t* x16, int64_t k, const float* xscale, int64_t block, const uint8_t* const* ws,
                            int64_t ahead, const float* mul, int64_t segments, int64_t group, float (*sums)[4]) {
  const D16 d16;
  const D32 d32;
  const DQ df;
  constexpr int V = static_cast<int>(32 / hn::MaxLanes(D16()));
  const int64_t blocks = k / block;
  VQ total[MR][NR];
  STRATA_INT16_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_INT16_UNROLL for (int r = 0; r < NR; ++r) total[m][r] = hn::Zero(df);
  }
  for (int64_t b = 0; b < blocks; ++b) {
    hn::Vec<D32> acc[MR][NR], odd[MR][NR];
    STRATA_INT16_UNROLL for (int m = 0; m < MR; ++m) {
      STRATA_INT16_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = odd[m][r] = hn::Zero(d32);
    }
    for (int64_t j = b * block; j < (b + 1) * block; j += 32) {
      STRATA_INT16_UNROLL for (int r = 0; r < NR; ++r) {
        // The next tile's rows into L2 as these stream (as QuantTileDeferred: short row streams side by side
        // defeat the hardware prefetchers); never read, so past the matrix's end is harmless.
        __builtin_prefetch(Codes::Chunk(ws[r], j) + ahead, 0, 2);
        hn::Vec<D16> codes[V];
        Codes::Decode(Codes::Chunk(ws[r], j), codes);
        STRATA_INT16_UNROLL for (int v = 0; v < V; ++v) {
          STRATA_INT16_UNROLL for (int m = 0; m < MR; ++m) {
            const auto xv = hn::LoadU(d16, x16 + m * k + j + v * static_cast<int64_t>(hn::Lanes(d16)));
            acc[m][r] = hn::ReorderWidenMulAccumulate(d32, codes[v], xv, acc[m][r], odd[m][r]);
          }
        }
      }
    }
    const int64_t g = b * block / group;
    STRATA_INT16_UNROLL for (int r = 0; r < NR; ++r) {
      STRATA_INT16_UNROLL for (int m = 0; m < MR; ++m) {
        const VQ factor = hn::Set(df, mul[r * segments + g] * xscale[m * blocks + b]);
        total[m][r] =
            hn::MulAdd(hn::ConvertTo(df, hn::RearrangeToOddPlusEven(acc[m][r], odd[m][r])), factor, total[m][r]);
      }
    }
  }
  STRATA_INT16_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_INT16_UNROLL for (int r = 0; r < NR; ++r) sums[m][r] = hn::GetLane(hn::SumOfLanes(df, total[m][r]));
  }
}

#undef STRATA_INT16_UNROLL

// One or two bfloat16 rows against int4 / int8 weights (group a multiple of 32); false where x cannot be made
// int16 (QuantizeRows16): the caller runs the float32 kernels then.
template <class Codes>
bool QuantRowsInt16(const IntParams& params, const uint8_t* data, const uint16_t* x, const uint16_t* bias, uint16_t* y,
                    int64_t rows, int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  const int64_t group = params.group;
  const int64_t block = group % 128 == 0 ? 128 : (group % 64 == 0 ? 64 : 32);
  const int64_t blocks = k / block, segments = params.groups;
  std::vector<int16_t> x16(static_cast<size_t>(rows * k));
  std::vector<float> xscale(static_cast<size_t>(rows * blocks)), xsum(static_cast<size_t>(rows * blocks));
  if (!QuantizeRows16(x, rows, k, block, x16.data(), xscale.data(), xsum.data())) return false;
  // Per input row and group: sum over the group's blocks of scale * sum(x16), for the zeros' term.
  std::vector<float> sx(static_cast<size_t>(rows * segments), 0.0f);
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t b = 0; b < blocks; ++b) {
      sx[static_cast<size_t>(m * segments + b * block / group)] += xscale[m * blocks + b] * xsum[m * blocks + b];
    }
  }
  constexpr int64_t kChunk = 32;
  std::vector<float> table(static_cast<size_t>(2 * (kChunk + 4) * segments));
  float* mul = table.data();
  float* sub = mul + (kChunk + 4) * segments;
  for (int64_t c0 = n0; c0 < n1; c0 += kChunk) {
    const int64_t c1 = n1 - c0 < kChunk ? n1 : c0 + kChunk;
    params.ChunkParams(c0, c1 - c0, mul, sub);
    for (int64_t n = c0; n < c1; n += 4) {
      const int64_t nr = c1 - n < 4 ? c1 - n : 4;
      const uint8_t* ws[4];
      for (int r = 0; r < 4; ++r) ws[r] = Codes::Row(data, k, n + (r < nr ? r : nr - 1));
      // A short tile's missing rows read the chunk's padding (their sums are never stored).
      const float* bm = mul + (n - c0) * segments;
      float sums[4][4];
      const int64_t ahead = 4 * (Codes::Row(data, k, 1) - Codes::Row(data, k, 0));  // the next 4 rows
      if (rows == 1) {
        TileInt16<Codes, 1, 4>(x16.data(), k, xscale.data(), block, ws, ahead, bm, segments, group, sums);
      } else {
        TileInt16<Codes, 2, 4>(x16.data(), k, xscale.data(), block, ws, ahead, bm, segments, group, sums);
      }
      for (int64_t m = 0; m < rows; ++m) {
        for (int r = 0; r < nr; ++r) {
          const float* zr = sub + (n - c0 + r) * segments;
          float zeros = 0.0f;
          for (int64_t g = 0; g < segments; ++g) zeros += zr[g] * sx[static_cast<size_t>(m * segments + g)];
          const float b = bias != nullptr ? BF16ToFloat(bias[n + r]) : 0.0f;
          y[m * n_total + n + r] = FloatToBF16(sums[m][r] - zeros + b);
        }
      }
    }
  }
  return true;
}
#endif  // SSE4, AVX2, AVX3

// bfloat16 input rows: on VDPBF16PS where `dot` (Bf16DotAvailable, and AVX512_VBMI for FP8) and the layout
// suits it (FP8 blocks of a multiple of 64 columns, int4 groups of 32, 64 or a multiple of 128, k at least one
// block); elsewhere widened to float32 here and run by the kernels above.
void QuantRowsFp8Dot(const uint16_t* x, const Fp8Weights& w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                     int64_t n_total, int64_t n0, int64_t n1, bool dot) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (dot && w.block_k % 64 == 0 && k >= 64) {
    return QuantRowsDot(Fp8Dot(), Fp8Format(w, k), LaneScales::kOne, w.block_k, 1.0f / 256.0f, x, bias, y, rows, k,
                        n_total, n0, n1);
  }
#else
  (void)dot;
#endif
  std::vector<float> widened(static_cast<size_t>(rows * k));
  for (int64_t i = 0; i < rows * k; ++i) widened[static_cast<size_t>(i)] = BF16ToFloat(x[i]);
  QuantRowsT<Fp8Format, BF16>(Fp8Format(w, k), widened.data(), bias, y, rows, k, n_total, n0, n1);
}

void QuantRowsIntDot(const uint16_t* x, const IntWeights& w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                     int64_t n_total, int64_t n0, int64_t n1, bool dot) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // Groups of 32 and 64 scale per block, per 128-bit lane: past two rows the float32 tiles, which scale each
  // weight once for 4 input rows, are 2x faster there (strata_quantized_bench, int4 g32 at 16 and 32 rows).
  if (dot && w.bits == 4 && k >= 128 && (w.group % 128 == 0 || ((w.group == 32 || w.group == 64) && rows <= 2))) {
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
  QuantRowsT<Fp8Format, F32>(Fp8Format(w, k), x, bias, y, rows, k, n_total, n0, n1);
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
  QuantRowsT<Fp8Format, BF16>(Fp8Format(w, k), x, bias, y, rows, k, n_total, n0, n1);
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

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_QUANTIZED_INL_H_
