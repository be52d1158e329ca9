// Per-target code of linear.cc (Highway's convention: included once per target, guarded by the toggle).
#if defined(STRATA_KERNELS_LINEAR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_LINEAR_INL_H_
#undef STRATA_KERNELS_LINEAR_INL_H_
#else
#define STRATA_KERNELS_LINEAR_INL_H_
#endif

#include <cstdint>
#include <type_traits>
#include <vector>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/bf16-inl.h"
#include "kernels/linear.h"

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

// Input rows [m0, m0 + MR) against the weight rows [n, n + nr) at `wb` (row r at wb + r * k; nr <= NR: the missing
// ones read row nr - 1 again and are not stored), every pair's dot product over all of K at once: each vector of
// a weight row is loaded once for MR input rows and each input vector once for NR weight rows, MR x NR
// independent FMA chains. EW is the weights' element, E the bias's and output's. `next` (or null): the next
// block, prefetched line by line as this one streams (its rows as far apart as these).
template <class EW, class E, int MR, int NR, class EP = EW>
HWY_NOINLINE void Tile(const float* x, const typename EW::T* wb, const typename E::T* bias, typename E::T* y, int64_t k,
                       int64_t n_total, int64_t n, int64_t nr, int64_t m0, const typename EP::T* next) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const float* xs[MR];
  const typename EW::T* ws[NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) xs[m] = x + (m0 + m) * k;
  STRATA_UNROLL for (int r = 0; r < NR; ++r) ws[r] = wb + (r < nr ? r : nr - 1) * k;
  V acc[MR][NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) { STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = hn::Zero(d); }
  int64_t j = 0;
  for (; j + lanes <= k; j += lanes) {
    if (next != nullptr) {
      STRATA_UNROLL for (int r = 0; r < NR; ++r) hwy::Prefetch(next + r * k + j);
    }
    V wv[NR];
    STRATA_UNROLL for (int r = 0; r < NR; ++r) wv[r] = EW::Load(d, ws[r] + j);
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
      const float wj = EW::LoadOne(ws[r] + j);
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

// Every group of 4 input rows against one block of weight rows at `wb`; the first group prefetches `next`.
template <class EW, class E, int NR, class EP = EW>
void TilesOfBlock(const float* x, const typename EW::T* wb, const typename E::T* bias, typename E::T* y, int64_t rows,
                  int64_t k, int64_t n_total, int64_t n, int64_t nr, const typename EP::T* next) {
  for (int64_t m = 0; m < rows; m += 4, next = nullptr) {
    switch (rows - m < 4 ? rows - m : 4) {
      case 4:
        Tile<EW, E, 4, NR, EP>(x, wb, bias, y, k, n_total, n, nr, m, next);
        break;
      case 3:
        Tile<EW, E, 3, NR, EP>(x, wb, bias, y, k, n_total, n, nr, m, next);
        break;
      case 2:
        Tile<EW, E, 2, NR, EP>(x, wb, bias, y, k, n_total, n, nr, m, next);
        break;
      default:
        Tile<EW, E, 1, NR, EP>(x, wb, bias, y, k, n_total, n, nr, m, next);
        break;
    }
  }
}

#undef STRATA_UNROLL

constexpr int64_t kWidenOnceMaxBytes = int64_t{16} << 10;

// Three or more input rows: blocks of kTileWeightRows weight rows, each used by every group of 4 input rows
// while it is in cache, so the matrix is read from memory once. Widened weights (bfloat16) with more than one
// group of input rows are widened once per block into a float32 scratch that the tiles then read from L1, not
// once per group, where that block fits L1; either way the next block is prefetched while this one is multiplied.
template <class E>
void LinearTilesT(const float* x, const typename E::T* w, const typename E::T* bias, typename E::T* y, int64_t rows,
                  int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  constexpr int NR = kTileWeightRows;
  // The block after [n, n + nr), prefetched while this one is multiplied (none for a last, short one).
  auto next_of = [&](int64_t n, int64_t nr) -> const typename E::T* {
    return n + nr + NR <= n1 ? w + (n + nr) * k : nullptr;
  };
  if constexpr (!std::is_same_v<E, F32>) {
    // Only while the widened block fits L1 beside the input rows' stream: past 16 KiB the groups read it from L2
    // and converting in registers is faster (bench/linear_speed.cc, widened against converted per group).
    if (rows > 4 && NR * k * static_cast<int64_t>(sizeof(float)) <= kWidenOnceMaxBytes) {
      const hn::ScalableTag<float> d;
      const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
      thread_local std::vector<float> scratch;
      if (scratch.size() < static_cast<size_t>(NR * k)) scratch.resize(static_cast<size_t>(NR * k));
      float* wb = scratch.data();
      for (int64_t n = n0; n < n1; n += NR) {
        const int64_t nr = n1 - n < NR ? n1 - n : NR;
        const typename E::T* src = w + n * k;
        const int64_t count = nr * k;
        int64_t i = 0;
        for (; i + lanes <= count; i += lanes) hn::StoreU(E::Load(d, src + i), d, wb + i);
        for (; i < count; ++i) wb[i] = E::LoadOne(src + i);
        // The first group prefetches the next block's (bfloat16) rows as it goes.
        TilesOfBlock<F32, E, NR, E>(x, wb, bias, y, rows, k, n_total, n, nr, next_of(n, nr));
      }
      return;
    }
  }
  for (int64_t n = n0; n < n1; n += NR) {
    const int64_t nr = n1 - n < NR ? n1 - n : NR;
    TilesOfBlock<E, E, NR>(x, w + n * k, bias, y, rows, k, n_total, n, nr, next_of(n, nr));
  }
}

// ---- Panels (linear.h's kPanelRows layout): the weights packed at load, 16 output rows side by side for each
// input column, so that a tile broadcasts each input value and multiplies whole vectors of outputs: no
// horizontal sums, each weight vector loaded (and widened) once for every input row of the tile, the matrix one
// sequential stream. As llama.cpp's repacked types and BLIS's packed panels.

#define STRATA_UNROLL _Pragma("GCC unroll 16")

// Bytes ahead of a tile's weight stream that its first tile prefetches: the hardware prefetchers stop at each
// 4 KiB page, which a panel crosses every 128 (float32) or 256 (bfloat16) columns.
constexpr int64_t kPanelPrefetchBytes = 1024;

// The input rows [0, MR) (row m at x + m * xs) times `kc` columns of PP panels (panel q at w + q * ps, column j
// of a panel at j * kPanelRows), added into the float32 accumulators at c (row m at c + m * ldc, PP x 16 wide).
// kPrefetch: the first of several tiles over these columns, which reads them from memory for the others,
// prefetches each panel kPanelPrefetchBytes ahead (the panels' next columns, or the next panel's first), which
// rows streamed from memory gain from (bench/linear_speed.cc).
template <class E, int MR, int PP, bool kPrefetch>
HWY_NOINLINE void PanelTile(const float* x, int64_t xs, int64_t kc, const typename E::T* w, int64_t ps, float* c,
                            int64_t ldc) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  constexpr int L = static_cast<int>(hn::MaxLanes(d));
  constexpr int NV = static_cast<int>(kPanelRows) / L;
  V acc[MR][PP * NV];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_UNROLL for (int q = 0; q < PP * NV; ++q) acc[m][q] = hn::LoadU(d, c + m * ldc + q * L);
  }
  constexpr int64_t kLine = 64 / (kPanelRows * static_cast<int64_t>(sizeof(typename E::T)));  // columns a line
  constexpr int64_t kAhead = kPanelPrefetchBytes / (kPanelRows * static_cast<int64_t>(sizeof(typename E::T)));
  for (int64_t j = 0; j < kc; ++j) {
    if constexpr (kPrefetch) {
      if (kLine <= 1 || j % kLine == 0) {
        STRATA_UNROLL for (int p = 0; p < PP; ++p) hwy::Prefetch(w + p * ps + (j + kAhead) * kPanelRows);
      }
    }
    V wv[PP * NV];
    STRATA_UNROLL for (int p = 0; p < PP; ++p) {
      STRATA_UNROLL for (int v = 0; v < NV; ++v) wv[p * NV + v] = E::Load(d, w + p * ps + j * kPanelRows + v * L);
    }
    STRATA_UNROLL for (int m = 0; m < MR; ++m) {
      const V xb = hn::Set(d, x[m * xs + j]);
      STRATA_UNROLL for (int q = 0; q < PP * NV; ++q) acc[m][q] = hn::MulAdd(xb, wv[q], acc[m][q]);
    }
  }
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_UNROLL for (int q = 0; q < PP * NV; ++q) hn::StoreU(acc[m][q], d, c + m * ldc + q * L);
  }
}

#undef STRATA_UNROLL

// Accumulator registers a tile may use: AVX2 and SSE have 16 vector registers, AVX-512 and NEON 32 (the rest
// hold the weight vectors and the broadcast input).
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr int kPanelAccumulators = 12;
#else
constexpr int kPanelAccumulators = 24;
#endif
// Columns per chunk of a panel when a panel serves more than one tile: 256 x 16 float32 is 16 KiB, in L1 for
// every tile of the rows' block.
constexpr int64_t kPanelChunk = 256;
// Input rows per block: their columns stay in L2 (256 KiB) while every panel of the range passes.
constexpr int64_t kPanelRowBlockBytes = int64_t{256} << 10;

template <class E, int PP>
struct PanelTiles {
  static constexpr int L = static_cast<int>(hn::MaxLanes(hn::ScalableTag<float>()));
  static constexpr int NV = static_cast<int>(kPanelRows) / L;
  static constexpr int MR = kPanelAccumulators / (NV * PP) < 1 ? 1 : kPanelAccumulators / (NV * PP);

  // Rows [0, rows) in as few tiles as hold them, of even sizes (16 rows are 6, 5 and 5, not 6, 6 and 4: a tile of
  // 4 rows has 8 chains of FMA, the latency of 4 cycles times 2 units, and runs at half the speed of 6).
  static void Run(const float* x, int64_t xs, int64_t rows, int64_t kc, const typename E::T* w, int64_t ps, float* c,
                  int64_t ldc) {
    const int64_t tiles = (rows + MR - 1) / MR;
    for (int64_t m = 0, t = 0; t < tiles; ++t) {
      const int64_t mr = (rows - m + tiles - t - 1) / (tiles - t);
      if (t == 0 && tiles > 1) {  // one tile (decode) streams as fast without: the hardware prefetchers keep up
        Tile<MR, true>(static_cast<int>(mr), x + m * xs, xs, kc, w, ps, c + m * ldc, ldc);
      } else {
        Tile<MR, false>(static_cast<int>(mr), x + m * xs, xs, kc, w, ps, c + m * ldc, ldc);
      }
      m += mr;
    }
  }

 private:
  template <int R, bool kPrefetch>
  static void Tile(int mr, const float* x, int64_t xs, int64_t kc, const typename E::T* w, int64_t ps, float* c,
                   int64_t ldc) {
    if constexpr (R > 1) {
      if (mr < R) return Tile<R - 1, kPrefetch>(mr, x, xs, kc, w, ps, c, ldc);
    }
    PanelTile<E, R, PP, kPrefetch>(x, xs, kc, w, ps, c, ldc);
  }
};

// The tiles of `pp` <= Q panels side by side: the last panels of a range, fewer than PP, still go together (a
// decode row against one panel alone has 2 FMA chains, which bound it where the panel is in cache; against 3, 6).
template <class E, int Q>
void PanelTilesOf(int64_t pp, const float* x, int64_t xs, int64_t rows, int64_t kc, const typename E::T* w, int64_t ps,
                  float* c, int64_t ldc) {
  if constexpr (Q > 1) {
    if (pp < Q) return PanelTilesOf<E, Q - 1>(pp, x, xs, rows, kc, w, ps, c, ldc);
  }
  PanelTiles<E, Q>::Run(x, xs, rows, kc, w, ps, c, ldc);
}

// Panels per group while many rows go by: the group's float32 accumulators for a block of rows (256 x 512
// floats, 512 KiB) stay in L2 / L3 between the chunks of columns.
constexpr int64_t kPanelGroup = 32;

// Full panels [p0, p1), PP at a time, into the float32 accumulators c (row m at c + m * ldc) that start at the
// bias and are stored (rounded, for bfloat16) once every chunk of columns is added.
template <class E, int PP>
void PanelsOfRows(const float* x, const typename E::T* wp, const typename E::T* bias, typename E::T* y, int64_t rows,
                  int64_t k, int64_t chunk, int64_t n_total, int64_t p0, int64_t p1, float* c, int64_t ldc) {
  const hn::ScalableTag<float> d;
  constexpr int L = PanelTiles<E, PP>::L;
  const int64_t ps = kPanelRows * k;
  const int64_t n0 = p0 * kPanelRows, width = (p1 - p0) * kPanelRows;
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t i = 0; i < width; i += L) {
      hn::StoreU(bias != nullptr ? E::Load(d, bias + n0 + i) : hn::Zero(d), d, c + m * ldc + i);
    }
  }
  // The chunks outermost (each panel's chunk in L1 for every tile of the rows, the rows' chunk in L2 for
  // every panel): the panels stream once for these rows.
  for (int64_t k0 = 0; k0 < k; k0 += chunk) {
    const int64_t kc = k - k0 < chunk ? k - k0 : chunk;
    for (int64_t p = p0; p < p1; p += PP) {
      const int64_t pp = p1 - p < PP ? p1 - p : PP;
      const typename E::T* wb = wp + p * ps + k0 * kPanelRows;
      float* cb = c + (p - p0) * kPanelRows;
      PanelTilesOf<E, PP>(pp, x + k0, k, rows, kc, wb, ps, cb, ldc);
    }
  }
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t i = 0; i < width; i += L) E::Store(d, hn::LoadU(d, c + m * ldc + i), y + m * n_total + n0 + i);
  }
}

// Full panels [p0, p1), PP at a time. Rows whose columns all fit L2 (kPanelRowBlockBytes) go panel by panel,
// each panel streamed once, in chunks of kPanelChunk columns (in L1 for every tile of the rows) unless one tile
// holds the rows. More rows (a prefill) go in blocks whose chunk of columns fits L2, against groups of
// kPanelGroup panels whose accumulators wait in a scratch between the chunks (as BLIS's loops around its
// microkernel): 512 rows stream the panels twice, however long the rows, where blocks of whole rows that fit L2
// would stream them rows / (L2 / 4k) times (32 at K 4096).
template <class E, int PP>
void FullPanels(const float* x, const typename E::T* wp, const typename E::T* bias, typename E::T* y, int64_t rows,
                int64_t k, int64_t n_total, int64_t p0, int64_t p1) {
  constexpr int MR = PanelTiles<E, PP>::MR;
  constexpr int64_t kFloat = static_cast<int64_t>(sizeof(float));
  int64_t chunk = rows <= MR ? k : kPanelChunk, block = rows, group = PP;
  if (rows > MR && rows * k * kFloat > kPanelRowBlockBytes) {
    const int64_t kc = chunk < k ? chunk : k;
    const int64_t most = kPanelRowBlockBytes / (kFloat * kc);
    const int64_t blocks = (rows + most - 1) / most;  // as few as fit, of even size
    block = (rows + blocks - 1) / blocks;
    group = kPanelGroup;
  }
  const int64_t ldc = (group < p1 - p0 ? group : p1 - p0) * kPanelRows;
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(block * ldc)) scratch.resize(static_cast<size_t>(block * ldc));
  for (int64_t g = p0; g < p1; g += group) {
    const int64_t g1 = p1 - g < group ? p1 : g + group;
    for (int64_t m0 = 0; m0 < rows; m0 += block) {
      const int64_t mb = rows - m0 < block ? rows - m0 : block;
      PanelsOfRows<E, PP>(x + m0 * k, wp, bias, y + m0 * n_total, mb, k, chunk, n_total, g, g1, scratch.data(), ldc);
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

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// The per-target specialisation for AVX512_BF16 (Highway 1.0.3 has no target with it): VDPBF16PS multiplies
// 32 pairs of bfloat16 and adds them into 16 float32 sums, so neither side is widened (twice the columns per
// instruction of the widening path, and no conversion in the 4 x 4 tiles). The products of two bfloat16 are
// exact in float32; the sums round to nearest even as FMA does (denormals flush to zero). Raw intrinsics on
// the AVX-512 registers; called only where the CPU has AVX512_BF16 (Bf16DotAvailable).
#define STRATA_BF16_DOT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define STRATA_UNROLL _Pragma("GCC unroll 16")
#define STRATA_ALWAYS_INLINE __attribute__((always_inline)) inline

// GCC 12 warns, wrongly, that _mm512_reduce_add_ps reads an uninitialized value: its header builds the
// upper half with _mm256_undefined_pd(), which is meant to be undefined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// 32 bfloat16 at p (fewer under `mask`, the rest 0).
STRATA_BF16_DOT STRATA_ALWAYS_INLINE __m512bh LoadDot(const uint16_t* p, __mmask32 mask) {
  return (__m512bh)_mm512_maskz_loadu_epi16(mask, p);
}

// The lane sums of 16 vectors at once, in a transpose-and-add tree (14 shuffles and 15 adds, where 16
// _mm512_reduce_add_ps are 64 of each in chains): lane 4 * L + j of the result is the sum of v[4 * j + L].
STRATA_BF16_DOT STRATA_ALWAYS_INLINE __m512 Sum16(const __m512 (&v)[16]) {
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

// MR input rows against weight rows [n, n + nr) (the missing ones read row n + nr - 1 again, not stored).
template <int MR, int NR>
STRATA_BF16_DOT HWY_NOINLINE void TileDot(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y,
                                          int64_t k, int64_t n_total, int64_t n, int64_t nr, int64_t m0) {
  const uint16_t* ws[NR];
  STRATA_UNROLL for (int r = 0; r < NR; ++r) ws[r] = w + (n + (r < nr ? r : nr - 1)) * k;
  __m512 acc[MR][NR];
  STRATA_UNROLL for (int m = 0; m < MR; ++m) {
    STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < k; j += 32) {
    const __mmask32 mask = k - j >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << (k - j)) - 1);
    __m512bh wv[NR];
    // The first group of input rows streams the weight rows from memory: it prefetches the next tile's (NR rows on)
    // into L2 as it goes, which the hardware prefetchers do not do for rows side by side (strata_linear_bench, Zen 4,
    // 1 thread, 3072 x 768: 4 rows 7.8 -> 19.8 GiB/s, 16 rows 4.4 -> 6.0).
    if (m0 == 0) {
      STRATA_UNROLL for (int r = 0; r < NR; ++r) __builtin_prefetch(ws[r] + NR * k + j, 0, 2);
    }
    STRATA_UNROLL for (int r = 0; r < NR; ++r) wv[r] = LoadDot(ws[r] + j, mask);
    STRATA_UNROLL for (int m = 0; m < MR; ++m) {
      const __m512bh xv = LoadDot(x + (m0 + m) * k + j, mask);
      STRATA_UNROLL for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], wv[r], xv);
    }
  }
  alignas(64) float sums[MR][NR];
  if constexpr (MR == 4 && NR == 4) {  // one tree: with v[4 r + m] = acc[m][r], lanes 4m .. 4m + 3 are row m's
    __m512 v[16];
    STRATA_UNROLL for (int m = 0; m < 4; ++m) { STRATA_UNROLL for (int r = 0; r < 4; ++r) v[4 * r + m] = acc[m][r]; }
    _mm512_store_ps(&sums[0][0], Sum16(v));
  } else {
    STRATA_UNROLL for (int m = 0; m < MR; ++m) {
      STRATA_UNROLL for (int r = 0; r < NR; ++r) sums[m][r] = _mm512_reduce_add_ps(acc[m][r]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int r = 0; r < nr; ++r) {
      const float b = bias != nullptr ? BF16ToFloat(bias[n + r]) : 0.0f;
      y[(m0 + m) * n_total + n + r] = FloatToBF16(sums[m][r] + b);
    }
  }
}

// One or two input rows, each weight row streamed once; U accumulators per input row keep the chains short.
template <int MR, int U>
STRATA_BF16_DOT void RowsDot(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t k,
                             int64_t n_total, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* row = w + n * k;
    __m512 acc[MR][U];
    STRATA_UNROLL for (int m = 0; m < MR; ++m) {
      STRATA_UNROLL for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
    }
    int64_t j = 0;
    for (; j + 32 * U <= k; j += 32 * U) {
      STRATA_UNROLL for (int u = 0; u < U; ++u) {
        const __m512bh wv = LoadDot(row + j + 32 * u, ~__mmask32{0});
        STRATA_UNROLL for (int m = 0; m < MR; ++m) {
          acc[m][u] = _mm512_dpbf16_ps(acc[m][u], wv, LoadDot(x + m * k + j + 32 * u, ~__mmask32{0}));
        }
      }
    }
    for (; j < k; j += 32) {
      const __mmask32 mask = k - j >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << (k - j)) - 1);
      const __m512bh wv = LoadDot(row + j, mask);
      STRATA_UNROLL for (int m = 0; m < MR; ++m) {
        acc[m][0] = _mm512_dpbf16_ps(acc[m][0], wv, LoadDot(x + m * k + j, mask));
      }
    }
    for (int m = 0; m < MR; ++m) {
      __m512 total = acc[m][0];
      for (int u = 1; u < U; ++u) total = _mm512_add_ps(total, acc[m][u]);
      const float b = bias != nullptr ? BF16ToFloat(bias[n]) : 0.0f;
      y[m * n_total + n] = FloatToBF16(_mm512_reduce_add_ps(total) + b);
    }
  }
}

#pragma GCC diagnostic pop

// The bfloat16 rows on VDPBF16PS: 1-2 rows streamed, more by 4 x 4 tiles over blocks of 4 weight rows.
void LinearDotBF16(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                   int64_t n_total, int64_t n0, int64_t n1) {
  if (rows == 1) return RowsDot<1, 4>(x, w, bias, y, k, n_total, n0, n1);
  if (rows == 2) return RowsDot<2, 2>(x, w, bias, y, k, n_total, n0, n1);
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t nr = n1 - n < 4 ? n1 - n : 4;
    for (int64_t m = 0; m < rows; m += 4) {
      switch (rows - m < 4 ? rows - m : 4) {
        case 4:
          TileDot<4, 4>(x, w, bias, y, k, n_total, n, nr, m);
          break;
        case 3:
          TileDot<3, 4>(x, w, bias, y, k, n_total, n, nr, m);
          break;
        case 2:
          TileDot<2, 4>(x, w, bias, y, k, n_total, n, nr, m);
          break;
        default:
          TileDot<1, 4>(x, w, bias, y, k, n_total, n, nr, m);
          break;
      }
    }
  }
}

#undef STRATA_ALWAYS_INLINE
#undef STRATA_UNROLL
#undef STRATA_BF16_DOT
#endif  // HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL

// A panel `width` rows wide (the last, narrow one; every panel where vectors are sizeless), one value at a time.
template <class E>
void PanelByValues(const float* x, const typename E::T* panel, const typename E::T* bias, typename E::T* y,
                   int64_t rows, int64_t k, int64_t n_total, int64_t n, int64_t width) {
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t r = 0; r < width; ++r) {
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += x[m * k + j] * E::LoadOne(panel + j * width + r);
      E::StoreOne(sum + (bias != nullptr ? E::LoadOne(bias + n + r) : 0.0f), y + m * n_total + n + r);
    }
  }
}

template <class E>
void LinearPanelsT(const float* x, const typename E::T* wp, const typename E::T* bias, typename E::T* y, int64_t rows,
                   int64_t k, int64_t n_total, int64_t p0, int64_t p1) {
  int64_t p = p0;
#if !HWY_HAVE_SCALABLE
  constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(hn::ScalableTag<float>()));
  if constexpr (kLanes >= 4) {
    const int64_t full = n_total / kPanelRows < p1 ? n_total / kPanelRows : p1;
    if (p < full) {
      constexpr int NV = static_cast<int>(kPanelRows / kLanes);
      // One row: 8 vectors of outputs at once (independent FMA chains); two: as many as the registers hold;
      // more: one panel per tile (two where a panel is one vector).
      constexpr int kOne = NV >= 8 ? 1 : 8 / NV;
      constexpr int kTwoFit = kPanelAccumulators / (2 * NV);
      constexpr int kTwo = kTwoFit < 1 ? 1 : (kTwoFit < kOne ? kTwoFit : kOne);
      constexpr int kMany = NV == 1 ? 2 : 1;
      if (rows == 1) {
        FullPanels<E, kOne>(x, wp, bias, y, rows, k, n_total, p, full);
      } else if (rows == 2) {
        FullPanels<E, kTwo>(x, wp, bias, y, rows, k, n_total, p, full);
      } else {
        FullPanels<E, kMany>(x, wp, bias, y, rows, k, n_total, p, full);
      }
      p = full;
    }
  }
#endif
  for (; p < p1 && p * kPanelRows < n_total; ++p) {
    const int64_t n = p * kPanelRows;
    const int64_t width = n_total - n < kPanelRows ? n_total - n : kPanelRows;
    PanelByValues<E>(x, wp + n * k, bias, y, rows, k, n_total, n, width);
  }
}

void LinearPanelsF32(const float* x, const float* wp, const float* bias, float* y, int64_t rows, int64_t k,
                     int64_t n_total, int64_t p0, int64_t p1) {
  LinearPanelsT<F32>(x, wp, bias, y, rows, k, n_total, p0, p1);
}

void LinearPanelsBF16(const float* x, const uint16_t* wp, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                      int64_t n_total, int64_t p0, int64_t p1) {
  LinearPanelsT<BF16>(x, wp, bias, y, rows, k, n_total, p0, p1);
}

void LinearRowsF32(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t k,
                   int64_t n_total, int64_t n0, int64_t n1) {
  LinearT<F32>(x, w, bias, y, rows, k, n_total, n0, n1);
}

void LinearRowsBF16(const float* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                    int64_t n_total, int64_t n0, int64_t n1) {
  LinearT<BF16>(x, w, bias, y, rows, k, n_total, n0, n1);
}

// bfloat16 input rows: on VDPBF16PS where the CPU has it (`dot`), else widened to float32 here (callers that
// split the work widen once and call the float32 overload instead).
void LinearRowsBF16Dot(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y, int64_t rows, int64_t k,
                       int64_t n_total, int64_t n0, int64_t n1, bool dot) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if (dot) return LinearDotBF16(x, w, bias, y, rows, k, n_total, n0, n1);
#else
  (void)dot;
#endif
  std::vector<float> widened(static_cast<size_t>(rows * k));
  for (int64_t i = 0; i < rows * k; ++i) widened[static_cast<size_t>(i)] = BF16ToFloat(x[i]);
  LinearT<BF16>(widened.data(), w, bias, y, rows, k, n_total, n0, n1);
}

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_LINEAR_INL_H_
