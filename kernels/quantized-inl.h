// Per-target code of quantized.cc (Highway's convention: included once per target, guarded by the toggle).
#if defined(STRATA_KERNELS_QUANTIZED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_QUANTIZED_INL_H_
#undef STRATA_KERNELS_QUANTIZED_INL_H_
#else
#define STRATA_KERNELS_QUANTIZED_INL_H_
#endif

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
  // Codes are the e4m3 values / 256, so the multiplier is scale * 256: exact, and the product the same.
  void Params(int64_t n, int64_t s, float& mul, float& zero) const {
    mul = scale[(n / block_n) * blocks_k + s] * 256.0f;
    zero = 0.0f;
  }
  static constexpr bool kHasZero = false;
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
  const int64_t segments = f.Segments();
  std::vector<float> params(static_cast<size_t>(2 * 4 * segments));
  float* mul = params.data();
  float* sub = mul + 4 * segments;
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
  for (int64_t n = n0; n < n1; n += block) {
    const int64_t nr = n1 - n < block ? n1 - n : block;
    for (int64_t r = 0; r < block; ++r) {
      const int64_t row = n + (r < nr ? r : nr - 1);
      for (int64_t s = 0; s < segments; ++s) {
        float m, z;
        f.Params(row, s, m, z);
        mul[r * segments + s] = m;
        sub[r * segments + s] = z * m;
      }
    }
    if (rows == 1) {
      QuantTileDeferred<Format, E, 1, 4>(f, mul, sub, sumx.data(), x, bias, y, k, n_total, n, nr, 0);
      continue;
    }
    if (rows == 2) {
      if constexpr (NR == 4) {
        QuantTileDeferred<Format, E, 2, 4>(f, mul, sub, sumx.data(), x, bias, y, k, n_total, n, nr, 0);
      } else {
        QuantTileDeferred<Format, E, 2, 2>(f, mul, sub, sumx.data(), x, bias, y, k, n_total, n, nr, 0);
      }
      continue;
    }
    for (int64_t m = 0; m < rows; m += 4) {
      switch (rows - m < 4 ? rows - m : 4) {
        case 4:
          QuantTile<Format, E, 4, NR>(f, mul, sub, x, bias, y, k, n_total, n, nr, m);
          break;
        case 3:
          QuantTile<Format, E, 3, NR>(f, mul, sub, x, bias, y, k, n_total, n, nr, m);
          break;
        case 2:
          QuantTile<Format, E, 2, NR>(f, mul, sub, x, bias, y, k, n_total, n, nr, m);
          break;
        default:
          QuantTile<Format, E, 1, NR>(f, mul, sub, x, bias, y, k, n_total, n, nr, m);
          break;
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
// The entry points quantized.cc dispatches to.

void QuantRowsFp8F32(const float* x, const Fp8Weights& w, const float* bias, float* y, int64_t rows, int64_t k,
                     int64_t n_total, int64_t n0, int64_t n1) {
  QuantRowsT<Fp8Format, F32>(Fp8Format(w, k), x, bias, y, rows, k, n_total, n0, n1);
}
void QuantRowsFp8BF16(const float* x, const Fp8Weights& w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                      int64_t n_total, int64_t n0, int64_t n1) {
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
