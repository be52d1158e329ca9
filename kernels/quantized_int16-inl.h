// int4 / int8 codes against one or two bfloat16 rows in 16-bit integer multiply-adds, the x86 targets' own
// code without VDPBF16PS (included once per target from quantized-inl.h, guarded by the toggle; SSE4, AVX2 and
// AVX-512 only, empty on the others).
#if defined(STRATA_KERNELS_QUANTIZED_INT16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_QUANTIZED_INT16_INL_H_
#undef STRATA_KERNELS_QUANTIZED_INT16_INL_H_
#else
#define STRATA_KERNELS_QUANTIZED_INT16_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "hwy/highway.h"
#include "kernels/bf16-inl.h"
#include "kernels/quantized_common-inl.h"
#include "kernels/quantized_int-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_QUANTIZED_INT16_INL_H_
