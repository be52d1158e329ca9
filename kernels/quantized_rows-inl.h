// The portable quantized kernels, per target (included once per target from quantized-inl.h, guarded by the
// toggle), templated on a format (quantized_common-inl.h) and an output element (bf16-inl.h's F32 / BF16): the
// rows kernels' register tiles over float32 input rows, and the dequantizer.
#if defined(STRATA_KERNELS_QUANTIZED_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_QUANTIZED_ROWS_INL_H_
#undef STRATA_KERNELS_QUANTIZED_ROWS_INL_H_
#else
#define STRATA_KERNELS_QUANTIZED_ROWS_INL_H_
#endif

#include <cstdint>
#include <vector>

#include "hwy/highway.h"
#include "kernels/quantized_common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if !HWY_HAVE_SCALABLE  // arrays of vectors: not of SVE's sizeless ones (those targets go row by row)

// Weight rows per tile: AVX-512 and NEON have 32 vector registers (4 x 4 accumulators beside the decoding);
// AVX2 and SSE 16 (4 x 2).
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr int kQuantTileWeightRows = 2;
#else
constexpr int kQuantTileWeightRows = 4;
#endif

#define STRATA_UNROLL _Pragma("GCC unroll 16")

// How a tile scales what it sums (QuantTile).
enum class TileScaling {
  // Each weight vector is decoded once for MR input rows and scaled (code * mul - zero * mul) before the FMAs:
  // tiles of three or more input rows, which share the scaling.
  kWeights,
  // One or two input rows: here the conversion of the codes is not shared by many input rows, so nothing more is
  // done per code than convert and FMA. Per segment (FP8 block, int group) the products of codes and x accumulate
  // unscaled, then that sum times the segment's multiplier joins the total; the zeros are subtracted at the end as
  // sum over segments of zero * mul * sum(x over the segment) (`sumx`, [rows][segments], computed once per call
  // and shared by every weight row).
  kSums,
};

// Input rows [m0, m0 + MR) against weight rows [n, n + nr) (nr <= NR; the missing ones read row n + nr - 1
// again and are not stored), scaled as `kScaling` says: `mul` and `sub` hold the multiplier and zero * multiplier
// per weight row and segment, [NR][segments]; `sumx` is read by kSums only.
template <class Format, class E, int MR, int NR, TileScaling kScaling>
HWY_NOINLINE void QuantTile(const Format& f, const float* mul, const float* sub, const float* sumx, const float* x,
                            const typename E::T* bias, typename E::T* y, int64_t k, int64_t n_total, int64_t n,
                            int64_t nr, int64_t m0) {
  constexpr bool kScaleSums = kScaling == TileScaling::kSums;
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
    if constexpr (kScaleSums) {
      if (Format::VectorAt(begin) && begin + step <= end) {
        VQ acc[MR][NR];
        STRATA_UNROLL for (int m = 0; m < MR; ++m) {
          STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = hn::Zero(d);
        }
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
    } else if (Format::VectorAt(begin)) {
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
            STRATA_UNROLL for (int m = 0; m < MR; ++m) total[m][r] =
                hn::MulAdd(w, hn::LoadU(d, xs[m] + col), total[m][r]);
          });
        }
      }
    }
    for (; j < end; ++j) {
      for (int r = 0; r < NR; ++r) {
        // kSums subtracts the zeros at the end.
        const float w = kScaleSums ? f.Code(ws[r], j) * mul[r * segments + s]
                                   : f.Code(ws[r], j) * mul[r * segments + s] - sub[r * segments + s];
        for (int m = 0; m < MR; ++m) tail[m][r] += w * xs[m][j];
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int r = 0; r < nr; ++r) {
      float zeros = 0.0f;
      if constexpr (kScaleSums && Format::kHasZero) {
        for (int64_t s = 0; s < segments; ++s) zeros += sub[r * segments + s] * sumx[(m0 + m) * segments + s];
      }
      const float b = bias != nullptr ? E::LoadOne(bias + n + r) : 0.0f;
      E::StoreOne(hn::GetLane(hn::SumOfLanes(d, total[m][r])) + tail[m][r] - zeros + b, y + (m0 + m) * n_total + n + r);
    }
  }
}

#undef STRATA_UNROLL

// Tiles over blocks of weight rows, their multipliers and zero * multipliers gathered once per block: one or
// two input rows by kSums tiles (4 weight rows; 2 x 2 on 16-register targets), more by kWeights tiles.
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
        QuantTile<Format, E, 1, 4, TileScaling::kSums>(f, bm, bs, sumx.data(), x, bias, y, k, n_total, n, nr, 0);
        continue;
      }
      if (rows == 2) {
        if constexpr (NR == 4) {
          QuantTile<Format, E, 2, 4, TileScaling::kSums>(f, bm, bs, sumx.data(), x, bias, y, k, n_total, n, nr, 0);
        } else {
          QuantTile<Format, E, 2, 2, TileScaling::kSums>(f, bm, bs, sumx.data(), x, bias, y, k, n_total, n, nr, 0);
        }
        continue;
      }
      for (int64_t m = 0; m < rows; m += 4) {
        switch (rows - m < 4 ? rows - m : 4) {
          case 4:
            QuantTile<Format, E, 4, NR, TileScaling::kWeights>(f, bm, bs, nullptr, x, bias, y, k, n_total, n, nr, m);
            break;
          case 3:
            QuantTile<Format, E, 3, NR, TileScaling::kWeights>(f, bm, bs, nullptr, x, bias, y, k, n_total, n, nr, m);
            break;
          case 2:
            QuantTile<Format, E, 2, NR, TileScaling::kWeights>(f, bm, bs, nullptr, x, bias, y, k, n_total, n, nr, m);
            break;
          default:
            QuantTile<Format, E, 1, NR, TileScaling::kWeights>(f, bm, bs, nullptr, x, bias, y, k, n_total, n, nr, m);
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

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_QUANTIZED_ROWS_INL_H_
