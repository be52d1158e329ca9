#include "runtime/model/linear.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>

#include <algorithm>
#include <vector>

#include "kernels/linear.h"
#include "runtime/model/cpu_features.h"
#include "runtime/model/simd_avx512.h"

namespace strata::runtime {
namespace {

using simd::Load;  // 16 weights (fewer under a mask) widened to float32
using simd::Store;

// GCC 12 warns, wrongly, that _mm512_reduce_add_ps reads an uninitialized value: its header builds the
// upper half with _mm256_undefined_pd(), which is meant to be undefined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Weight row n against input rows [m0, m0 + MR): y[m][n] = dot(x[m], w[n]) (+ bias[n]). One weight row at a
// time: the matrix is read as one sequential stream (four rows side by side, four streams, measured slower:
// the hardware prefetchers follow one stream best). U accumulators per input row keep the FMA chains short.
// x rows are float32 (bfloat16 inputs are widened once by the caller).
template <int MR, int U, typename T>
STRATA_AVX512 void Row(const float* x, const T* w, const T* bias, T* y, int64_t k, int64_t n_total, int64_t n,
                       int64_t m0) {
  const T* row = w + n * k;
  __m512 acc[MR][U];
  for (int m = 0; m < MR; ++m) {
    for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
  }
  constexpr __mmask16 kAll = static_cast<__mmask16>(0xFFFF);
  int64_t j = 0;
  for (; j + 16 * U <= k; j += 16 * U) {
    for (int u = 0; u < U; ++u) {
      const __m512 wv = Load(row + j + 16 * u, kAll);
      for (int m = 0; m < MR; ++m) {
        acc[m][u] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + (m0 + m) * k + j + 16 * u), acc[m][u]);
      }
    }
  }
  for (; j < k; j += 16) {
    const __mmask16 mask = k - j >= 16 ? kAll : static_cast<__mmask16>((1u << (k - j)) - 1);
    const __m512 wv = Load(row + j, mask);
    for (int m = 0; m < MR; ++m) {
      acc[m][0] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mask, x + (m0 + m) * k + j), acc[m][0]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    __m512 total = acc[m][0];
    for (int u = 1; u < U; ++u) total = _mm512_add_ps(total, acc[m][u]);
    float value = _mm512_reduce_add_ps(total);
    if (bias != nullptr) value += static_cast<float>(bias[n]);
    Store(y + (m0 + m) * n_total + n, value);
  }
}

// bfloat16 with AVX512_BF16: VDPBF16PS multiplies 32 pairs of bfloat16 and adds them into 16 float32 sums,
// so neither side is widened (twice the columns per instruction of the widening path above, which the
// bfloat16 matrices of a 4096-wide layer need to stream at memory speed). The products of two bfloat16 are
// exact in float32; the sums round to nearest even as FMA does (denormals flush to zero).
template <int MR, int U>
STRATA_AVX512_BF16 void RowDot(const c10::BFloat16* x, const c10::BFloat16* w, const c10::BFloat16* bias,
                               c10::BFloat16* y, int64_t k, int64_t n_total, int64_t n, int64_t m0) {
  const c10::BFloat16* row = w + n * k;
  __m512 acc[MR][U];
  for (int m = 0; m < MR; ++m) {
    for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
  }
  int64_t j = 0;
  for (; j + 32 * U <= k; j += 32 * U) {
    for (int u = 0; u < U; ++u) {
      const __m512bh wv = (__m512bh)_mm512_loadu_si512(row + j + 32 * u);
      for (int m = 0; m < MR; ++m) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (m0 + m) * k + j + 32 * u);
        acc[m][u] = _mm512_dpbf16_ps(acc[m][u], wv, xv);
      }
    }
  }
  for (; j < k; j += 32) {
    const __mmask32 mask = k - j >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << (k - j)) - 1);
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, row + j);
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + (m0 + m) * k + j);
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], wv, xv);
    }
  }
  for (int m = 0; m < MR; ++m) {
    __m512 total = acc[m][0];
    for (int u = 1; u < U; ++u) total = _mm512_add_ps(total, acc[m][u]);
    float value = _mm512_reduce_add_ps(total);
    if (bias != nullptr) value += static_cast<float>(bias[n]);
    y[(m0 + m) * n_total + n] = c10::BFloat16(value);
  }
}

// The tiles of more rows (a batch of decodes, a short chunk): MR input rows against NR weight rows, every
// pair's dot product over all of K at once. Each 16 (32) columns of a weight row are loaded once for MR rows
// and each input chunk once for NR weight rows: MR x NR independent FMA chains and one load per two FMAs at
// 4 x 4. The callers walk a block of NR weight rows over every group of MR input rows, so the block is read
// from memory once and from L1 after (see Tiles).
// The loops over MR and NR are unrolled by hand (GCC at -O2 keeps `acc` in memory otherwise).
#define STRATA_UNROLL _Pragma("GCC unroll 16")
// Inlined always: a tile's accumulators live in registers only while every step is inlined into its loop.
#define STRATA_INLINE __attribute__((always_inline)) inline

// The lane sums of 16 vectors at once, in a transpose-and-add tree (14 shuffles and 15 adds, where 16
// _mm512_reduce_add_ps are 64 of each in chains): lane 4 * L + j of the result is the sum of v[4 * j + L].
STRATA_AVX512 STRATA_INLINE __m512 Sum16(const __m512 (&v)[16]) {
  __m512 halves[8], quarters[4];
  for (int i = 0; i < 8; ++i) {  // [v(2i) folded to 8 lanes | v(2i+1) folded to 8 lanes]
    halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
  for (int j = 0; j < 4; ++j) {  // 128-bit lane L: v(4j + L) folded to 4 lanes
    quarters[j] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * j], halves[2 * j + 1], 0x88),
                                _mm512_shuffle_f32x4(halves[2 * j], halves[2 * j + 1], 0xDD));
  }
  const __m512 r01 =
      _mm512_add_ps(_mm512_unpacklo_ps(quarters[0], quarters[1]), _mm512_unpackhi_ps(quarters[0], quarters[1]));
  const __m512 r23 =
      _mm512_add_ps(_mm512_unpacklo_ps(quarters[2], quarters[3]), _mm512_unpackhi_ps(quarters[2], quarters[3]));
  const __m512d a = _mm512_castps_pd(r01), b = _mm512_castps_pd(r23);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}

// y[m0 + m][n + r] = the sum of acc[m][r]'s lanes (+ bias[n + r]). A full 4 x 4 tile sums in one tree: with
// v[4 r + m] = acc[m][r], lanes 4m .. 4m + 3 are row m's four outputs, side by side as y holds them.
template <int MR, int NR, typename T>
STRATA_AVX512 STRATA_INLINE void StoreTile(const __m512 (&acc)[MR][NR], const T* bias, T* y, int64_t n_total, int64_t n,
                                           int64_t m0) {
  if constexpr (MR == 4 && NR == 4) {
    __m512 v[16];
    STRATA_UNROLL for (int m = 0; m < 4; ++m) { STRATA_UNROLL for (int r = 0; r < 4; ++r) v[4 * r + m] = acc[m][r]; }
    alignas(64) float sums[16];
    _mm512_store_ps(sums, Sum16(v));
    for (int m = 0; m < 4; ++m) {
      for (int r = 0; r < 4; ++r) {
        float value = sums[4 * m + r];
        if (bias != nullptr) value += static_cast<float>(bias[n + r]);
        Store(y + (m0 + m) * n_total + n + r, value);
      }
    }
  } else {
    STRATA_UNROLL for (int m = 0; m < MR; ++m) {
      STRATA_UNROLL for (int r = 0; r < NR; ++r) {
        float value = _mm512_reduce_add_ps(acc[m][r]);
        if (bias != nullptr) value += static_cast<float>(bias[n + r]);
        Store(y + (m0 + m) * n_total + n + r, value);
      }
    }
  }
}

template <int MR, int NR, typename T>
STRATA_AVX512 STRATA_INLINE void TileStep(const float* x, const T* w, int64_t k, int64_t n, int64_t m0, int64_t j,
                                          __mmask16 mask, __m512 (&acc)[MR][NR]) {
  __m512 wv[NR];
  STRATA_UNROLL for (int r = 0; r < NR; ++r) wv[r] = Load(w + (n + r) * k + j, mask);
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    const __m512 xv = _mm512_maskz_loadu_ps(mask, x + (m0 + m) * k + j);
    STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_fmadd_ps(wv[r], xv, acc[m][r]);
  }
}

template <int MR, int NR, typename T>
STRATA_AVX512 void Tile(const float* x, const T* w, const T* bias, T* y, int64_t k, int64_t n_total, int64_t n,
                        int64_t m0) {
  __m512 acc[MR][NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_setzero_ps();
  }
  int64_t j = 0;
  for (; j + 16 <= k; j += 16) TileStep<MR, NR>(x, w, k, n, m0, j, static_cast<__mmask16>(0xFFFF), acc);
  if (j < k) TileStep<MR, NR>(x, w, k, n, m0, j, static_cast<__mmask16>((1u << (k - j)) - 1), acc);
  StoreTile<MR, NR>(acc, bias, y, n_total, n, m0);
}

template <int MR, int NR>
STRATA_AVX512_BF16 STRATA_INLINE void TileDotStep(const c10::BFloat16* x, const c10::BFloat16* w, int64_t k, int64_t n,
                                                  int64_t m0, int64_t j, __mmask32 mask, __m512 (&acc)[MR][NR]) {
  __m512bh wv[NR];
  STRATA_UNROLL for (int r = 0; r < NR; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + (n + r) * k + j);
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + (m0 + m) * k + j);
    STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], wv[r], xv);
  }
}

template <int MR, int NR>
STRATA_AVX512_BF16 void TileDot(const c10::BFloat16* x, const c10::BFloat16* w, const c10::BFloat16* bias,
                                c10::BFloat16* y, int64_t k, int64_t n_total, int64_t n, int64_t m0) {
  __m512 acc[MR][NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_setzero_ps();
  }
  int64_t j = 0;
  for (; j + 32 <= k; j += 32) TileDotStep<MR, NR>(x, w, k, n, m0, j, ~__mmask32{0}, acc);
  if (j < k) TileDotStep<MR, NR>(x, w, k, n, m0, j, static_cast<__mmask32>((uint64_t{1} << (k - j)) - 1), acc);
  StoreTile<MR, NR>(acc, bias, y, n_total, n, m0);
}

#pragma GCC diagnostic pop

STRATA_AVX512_BF16 void RowsDot(const c10::BFloat16* x, const c10::BFloat16* w, const c10::BFloat16* bias,
                                c10::BFloat16* y, int64_t rows, int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  for (int64_t m = 0; m < rows; m += 4) {
    for (int64_t n = n0; n < n1; ++n) {
      switch (std::min<int64_t>(4, rows - m)) {
        case 4:
          RowDot<4, 1>(x, w, bias, y, k, n_total, n, m);
          break;
        case 3:
          RowDot<3, 1>(x, w, bias, y, k, n_total, n, m);
          break;
        case 2:
          RowDot<2, 2>(x, w, bias, y, k, n_total, n, m);
          break;
        default:
          RowDot<1, 4>(x, w, bias, y, k, n_total, n, m);
          break;
      }
    }
  }
}

// Output rows [n0, n1) for all input rows, in groups of at most 4 (at most 4 x 4 accumulators).
template <typename T>
STRATA_AVX512 void Rows(const float* x, const T* w, const T* bias, T* y, int64_t rows, int64_t k, int64_t n_total,
                        int64_t n0, int64_t n1) {
  for (int64_t m = 0; m < rows; m += 4) {
    for (int64_t n = n0; n < n1; ++n) {
      switch (std::min<int64_t>(4, rows - m)) {
        case 4:
          Row<4, 1>(x, w, bias, y, k, n_total, n, m);
          break;
        case 3:
          Row<3, 1>(x, w, bias, y, k, n_total, n, m);
          break;
        case 2:
          Row<2, 2>(x, w, bias, y, k, n_total, n, m);
          break;
        default:
          Row<1, 4>(x, w, bias, y, k, n_total, n, m);
          break;
      }
    }
  }
}

// Output rows [n0, n1) for `rows` input rows in tiles of up to 4 x 4: a block of 4 weight rows (12 KiB of
// float32 at K = 768) is used by every group of 4 input rows while it is in L1. `Kernel` is Tile<MR, NR, T>
// or TileDot<MR, NR>, chosen per tile from the table below.
template <typename X, typename T>
using TileFn = void (*)(const X*, const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t);

template <typename X, typename T, template <int, int> class Pick>
void Tiles(const X* x, const T* w, const T* bias, T* y, int64_t rows, int64_t k, int64_t n_total, int64_t n0,
           int64_t n1) {
  static constexpr TileFn<X, T> kTable[4][4] = {{Pick<1, 1>::fn, Pick<1, 2>::fn, Pick<1, 3>::fn, Pick<1, 4>::fn},
                                                {Pick<2, 1>::fn, Pick<2, 2>::fn, Pick<2, 3>::fn, Pick<2, 4>::fn},
                                                {Pick<3, 1>::fn, Pick<3, 2>::fn, Pick<3, 3>::fn, Pick<3, 4>::fn},
                                                {Pick<4, 1>::fn, Pick<4, 2>::fn, Pick<4, 3>::fn, Pick<4, 4>::fn}};
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t nr = std::min<int64_t>(4, n1 - n);
    for (int64_t m = 0; m < rows; m += 4) {
      kTable[std::min<int64_t>(4, rows - m) - 1][nr - 1](x, w, bias, y, k, n_total, n, m);
    }
  }
}

template <typename T>
struct PickTile {
  template <int MR, int NR>
  struct Of {
    static constexpr TileFn<float, T> fn = &Tile<MR, NR, T>;
  };
};
template <int MR, int NR>
struct PickTileDot {
  static constexpr TileFn<c10::BFloat16, c10::BFloat16> fn = &TileDot<MR, NR>;
};

// At least ~64 KiB of weights per task: smaller pieces cost more in scheduling than they save.
int64_t Grain(int64_t k, int64_t element_size) { return std::max<int64_t>(1, (64 << 10) / (k * element_size)); }

// One or two rows stream each weight row once (Rows); more go by tiles over blocks of 4 weight rows (Tiles).
template <typename T>
void FewRows(const float* x, const T* w, const T* bias, T* y, int64_t rows, int64_t k, int64_t n) {
  const int64_t grain = Grain(k, sizeof(T));
  if (rows <= 2) {
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) { Rows(x, w, bias, y, rows, k, n, begin, end); });
    return;
  }
  at::parallel_for(0, (n + 3) / 4, (grain + 3) / 4, [&](int64_t begin, int64_t end) {
    Tiles<float, T, PickTile<T>::template Of>(x, w, bias, y, rows, k, n, begin * 4, std::min(n, end * 4));
  });
}

}  // namespace

bool LinearUsesOwnKernel(const at::Tensor& x, const at::Tensor& weight) {
  if (!x.device().is_cpu() || !weight.device().is_cpu()) return false;
  if (x.scalar_type() != weight.scalar_type()) return false;
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) return false;
  if (weight.dim() != 2 || !weight.is_contiguous() || x.dim() < 1 || x.size(-1) != weight.size(1)) return false;
  const int64_t k = weight.size(1);
  if (k <= 0 || x.numel() == 0) return false;
  const int64_t rows = x.numel() / k;
  // Past kFewRows (prefill) the blocked, packed GEMMs of MKL/oneDNN reuse each weight more often than 4 x 4
  // tiles do (bench/linear_speed.cc: at 32 rows the tiles are still 1.1-3.9x ahead, at 64 even in bfloat16).
  return rows <= kFewRows;
}

namespace {

// The few input rows as float32: float32 inputs in place, bfloat16 ones widened once into a per-thread buffer
// (the weights are widened in registers as they stream).
const float* Float32Rows(const at::Tensor& xc, int64_t count) {
  if (xc.scalar_type() == at::kFloat) return xc.data_ptr<float>();
  thread_local std::vector<float> widened;
  widened.resize(static_cast<size_t>(count));
  const c10::BFloat16* src = xc.data_ptr<c10::BFloat16>();
  for (int64_t i = 0; i < count; ++i) widened[static_cast<size_t>(i)] = static_cast<float>(src[i]);
  return widened.data();
}

// The portable path: output rows split over the threads.
template <typename T, typename K>
void PortableRows(const at::Tensor& xc, const at::Tensor& weight, const at::Tensor& bias, at::Tensor& y, int64_t rows,
                  int64_t k, int64_t n) {
  const float* xs = Float32Rows(xc, rows * k);
  const K* ws = reinterpret_cast<const K*>(weight.data_ptr<T>());
  const K* bs = bias.defined() ? reinterpret_cast<const K*>(bias.data_ptr<T>()) : nullptr;
  K* ys = reinterpret_cast<K*>(y.data_ptr<T>());
  at::parallel_for(0, n, Grain(k, sizeof(T)),
                   [&](int64_t begin, int64_t end) { kernels::LinearRows(xs, ws, bs, ys, rows, k, n, begin, end); });
}

}  // namespace

bool LinearWidensBf16(const at::Tensor& x, const at::Tensor& weight) {
  return x.device().is_cpu() && weight.device().is_cpu() && x.scalar_type() == at::kBFloat16 &&
         weight.scalar_type() == at::kBFloat16 && weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1) &&
         x.numel() / std::max<int64_t>(1, weight.size(1)) > kFewRows && !CpuHasAvx512Bf16();
}

namespace {

// Weights widened per block: a few MiB of float32, used by every row of x while it is in cache.
constexpr int64_t kWidenBlockBytes = int64_t{8} << 20;

// bfloat16 prefill on a CPU without AVX512_BF16, where ATen's bfloat16 GEMM (oneDNN's) runs 3-5x slower than
// its float32 one: as llama.cpp does, widen to float32 and run the float32 GEMM (MKL sgemm). x is widened
// once; the weights block by block into one reused buffer, each block's product written into its columns of
// a float32 result that is rounded to bfloat16 once, as a bfloat16 GEMM with float32 accumulation rounds.
at::Tensor WidenedLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const int64_t k = weight.size(1);
  const int64_t n = weight.size(0);
  const int64_t rows = x.numel() / k;
  const at::Tensor x32 = x.reshape({rows, k}).to(at::kFloat);
  at::Tensor y32 = at::empty({rows, n}, x32.options());
  const int64_t block = std::clamp<int64_t>(kWidenBlockBytes / (4 * k), 16, n);
  at::Tensor w32 = at::empty({block, k}, x32.options());
  at::Tensor part = at::empty({rows, block}, x32.options());
  for (int64_t n0 = 0; n0 < n; n0 += block) {
    const int64_t nb = std::min(block, n - n0);
    at::Tensor w_block = w32.narrow(0, 0, nb);
    w_block.copy_(weight.narrow(0, n0, nb));
    at::Tensor out = part.narrow(1, 0, nb);
    if (nb == block) {
      at::mm_out(part, x32, w_block.t());
    } else {
      out = at::mm(x32, w_block.t());
    }
    y32.narrow(1, n0, nb).copy_(out);
  }
  if (bias.defined()) y32.add_(bias.to(at::kFloat));
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = n;
  return y32.to(at::kBFloat16).reshape(sizes);
}

}  // namespace

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const bool bias_ok =
      !bias.defined() || (bias.scalar_type() == x.scalar_type() && bias.is_contiguous() && bias.device().is_cpu());
  if (bias_ok && LinearWidensBf16(x, weight)) return WidenedLinear(x, weight, bias);
  if (!bias_ok || !LinearUsesOwnKernel(x, weight)) {
    return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
  }
  const int64_t k = weight.size(1);
  const int64_t n = weight.size(0);
  const int64_t rows = x.numel() / k;
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = n;
  at::Tensor y = at::empty(sizes, x.options());
  const at::Tensor xc = x.contiguous();
  if (!CpuHasAvx512()) {
    if (x.scalar_type() == at::kFloat) {
      PortableRows<float, float>(xc, weight, bias, y, rows, k, n);
    } else {
      PortableRows<c10::BFloat16, kernels::BFloat16>(xc, weight, bias, y, rows, k, n);
    }
  } else if (x.scalar_type() == at::kFloat) {
    FewRows<float>(xc.data_ptr<float>(), weight.data_ptr<float>(), bias.defined() ? bias.data_ptr<float>() : nullptr,
                   y.data_ptr<float>(), rows, k, n);
  } else if (CpuHasAvx512Bf16()) {
    const c10::BFloat16* xs = xc.data_ptr<c10::BFloat16>();
    const c10::BFloat16* ws = weight.data_ptr<c10::BFloat16>();
    const c10::BFloat16* bs = bias.defined() ? bias.data_ptr<c10::BFloat16>() : nullptr;
    c10::BFloat16* ys = y.data_ptr<c10::BFloat16>();
    const int64_t grain = Grain(k, 2);
    if (rows <= 2) {
      at::parallel_for(0, n, grain,
                       [&](int64_t begin, int64_t end) { RowsDot(xs, ws, bs, ys, rows, k, n, begin, end); });
    } else {
      at::parallel_for(0, (n + 3) / 4, (grain + 3) / 4, [&](int64_t begin, int64_t end) {
        Tiles<c10::BFloat16, c10::BFloat16, PickTileDot>(xs, ws, bs, ys, rows, k, n, begin * 4, std::min(n, end * 4));
      });
    }
  } else {
    FewRows<c10::BFloat16>(Float32Rows(xc, rows * k), weight.data_ptr<c10::BFloat16>(),
                           bias.defined() ? bias.data_ptr<c10::BFloat16>() : nullptr, y.data_ptr<c10::BFloat16>(), rows,
                           k, n);
  }
  return y;
}

}  // namespace strata::runtime
