// The AVX-512 target's own quantized code (included once per target from quantized-inl.h, guarded by the
// toggle; empty on every other target): bfloat16 input rows on AVX512_BF16's VDPBF16PS, and FP8 float32 rows
// decoded by AVX512_VBMI's VPERMI2B.
#if defined(STRATA_KERNELS_QUANTIZED_AVX512_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_QUANTIZED_AVX512_INL_H_
#undef STRATA_KERNELS_QUANTIZED_AVX512_INL_H_
#else
#define STRATA_KERNELS_QUANTIZED_AVX512_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

#include "hwy/highway.h"
#include "kernels/bf16-inl.h"
#include "kernels/quantized.h"
#include "kernels/quantized_common-inl.h"
#include "kernels/quantized_fp8-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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
  static constexpr bool kMaskedTail = false;  // the columns past the last whole block: scalar, in Store
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
  static constexpr bool kMaskedTail = false;
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

// MXFP4: blocks of 128 codes (4 MXFP4 blocks of 32, each with its scale: one per 128-bit lane, as int4's groups of
// 32) as 4 vectors of 32 bfloat16, twice each code's E2M1 value (0 to 12, bfloat16 numbers: VPSHUFB looks up the
// low and the high byte of each). The codes unpack as Int4Dot's once x's columns are in the codes' order (per block
// of 32 the even columns, then the odd ones): Permute deinterleaves, then transposes as Int4Dot. The multipliers are
// 2^(s - 128) (the 1/2 of the doubled codes in them). k need not be a multiple of 128: the last block of a row may
// hold 1-3 MXFP4 blocks (gpt-oss's 2880 columns: 22 blocks of 128 and 64 columns), read by a masked load (zero bytes
// decode to 0) against x padded with zeros, so that no column runs in scalar code (kMaskedTail).
struct Mxfp4Dot {
  static constexpr int kBlock = 128, kVectors = 4, kBlockBytes = 64;
  static constexpr bool kMaskedTail = true;
  STRATA_QUANT_DOT STRATA_ALWAYS_INLINE static void Permute(const uint16_t* from, uint16_t* to) {
    alignas(64) uint16_t codes_order[kBlock];
    for (int b = 0; b < kBlock; b += 32) {
      for (int i = 0; i < 16; ++i) {
        codes_order[b + i] = from[b + 2 * i];
        codes_order[b + 16 + i] = from[b + 2 * i + 1];
      }
    }
    TransposeUnits(codes_order, to);
  }
  __m512i low, high;  // the doubled values' bfloat16 bytes by code, in every 128-bit lane
  __mmask64 tail;     // the bytes of a row's last block of 128 columns
  STRATA_QUANT_DOT explicit Mxfp4Dot(int64_t k) {
    const int64_t tail_bytes = ((k - 1) % kBlock + 1) / 2;
    tail = tail_bytes == kBlockBytes ? ~__mmask64{0} : (__mmask64{1} << tail_bytes) - 1;
    // 0, 1, 2, 3, 4, 6, 8, 12 and their negatives (code 8: -0) as bfloat16: 0x0000, 0x3F80, 0x4000, 0x4040, ...
    alignas(16) static constexpr uint8_t kLow[16] = {0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40,
                                                     0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40};
    alignas(16) static constexpr uint8_t kHigh[16] = {0x00, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41,
                                                      0x80, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0, 0xC1, 0xC1};
    low = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kLow)));
    high = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kHigh)));
  }
  // `last`: the row's last block, whose bytes past the row are not read.
  STRATA_QUANT_DOT STRATA_ALWAYS_INLINE void Decode(const uint8_t* p, __m512bh (&w)[kVectors], bool last) const {
    const __m512i bytes = _mm512_maskz_loadu_epi8(last ? tail : ~__mmask64{0}, p);
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const __m512i even = _mm512_and_si512(bytes, nibble);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble);
    const __m512i even_low = _mm512_shuffle_epi8(low, even), even_high = _mm512_shuffle_epi8(high, even);
    const __m512i odd_low = _mm512_shuffle_epi8(low, odd), odd_high = _mm512_shuffle_epi8(high, odd);
    w[0] = (__m512bh)_mm512_unpacklo_epi8(even_low, even_high);
    w[1] = (__m512bh)_mm512_unpackhi_epi8(even_low, even_high);
    w[2] = (__m512bh)_mm512_unpacklo_epi8(odd_low, odd_high);
    w[3] = (__m512bh)_mm512_unpackhi_epi8(odd_low, odd_high);
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
        if constexpr (Dot::kMaskedTail) {
          dot.Decode(ws[r] + blk * Dot::kBlockBytes, w, blk + 1 == blocks);
        } else {
          dot.Decode(ws[r] + blk * Dot::kBlockBytes, w);
        }
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

// One call of QuantRowsDot: what its tiles read for the whole call (x permuted, the sums of x per segment) and,
// per chunk of kDotChunkRows weight rows, the scales and the zeros' term of every output.
template <class Dot, class Format>
class QuantDotCall {
 public:
  STRATA_QUANT_DOT QuantDotCall(const Dot& dot, const Format& f, LaneScales lanes, int64_t segment_cols,
                                float dot_factor, const uint16_t* x, const uint16_t* bias, uint16_t* y, int64_t rows,
                                int64_t k, int64_t n_total, int64_t n0, int64_t n1)
      : dot_(dot),
        f_(f),
        lanes_(lanes),
        segment_cols_(segment_cols),
        dot_factor_(dot_factor),
        x_(x),
        bias_(bias),
        y_(y),
        rows_(rows),
        k_(k),
        n_total_(n_total),
        // A partial last block, where the Dot masks its bytes (x's columns past k are zeros), or only whole ones.
        blocks_(Dot::kMaskedTail ? (k + Dot::kBlock - 1) / Dot::kBlock : k / Dot::kBlock),
        kv_(blocks_ * Dot::kBlock),
        segments_(f.Segments()),
        // x permuted as the decoded codes are, per block.
        xp_(static_cast<size_t>(rows * kv_ + 32)),
        chunk_rows_(n1 - n0 < kDotChunkRows ? n1 - n0 : kDotChunkRows),
        // Weight rows rounded up to 4 (a short tile's scales), input rows to 16 (the zeros' terms, a vector of
        // input rows at a time).
        padded_rows_((chunk_rows_ + 3) / 4 * 4),
        rows16_((rows + 15) / 16 * 16),
        table_(static_cast<size_t>(3 * padded_rows_ * segments_ + 4 + padded_rows_ * rows16_ + 4 * segments_ + 4)),
        nr_max_(rows <= 2 ? 4 : 2),
        ahead_(4 * nr_max_ * (f.Row(1) - f.Row(0))) {  // four tiles on
    alignas(64) uint16_t padded[Dot::kBlock];
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t blk = 0; blk < blocks_; ++blk) {
        const uint16_t* from = x + m * k + blk * Dot::kBlock;
        if ((blk + 1) * Dot::kBlock > k) {  // a masked last block: its columns past k zero
          std::fill(std::copy(from, x + (m + 1) * k, padded), padded + Dot::kBlock, uint16_t{0});
          from = padded;
        }
        Dot::Permute(from, xp_.data() + m * kv_ + blk * Dot::kBlock);
      }
    }
    if (Format::kHasZero) SumX();
    // Per chunk: mul and sub (zero * mul) per weight row and segment, flat (4 floats of padding for BlockScale's
    // loads), and the zeros' term of each output: corr[r][m] = sum over segments of (128 + zero) * scale * sumx.
    mul_ = table_.data();
    sub_ = mul_ + padded_rows_ * segments_ + 4;
    zq_ = sub_ + padded_rows_ * segments_;  // (128 + zero) * scale
    corr_ = zq_ + padded_rows_ * segments_;
    edge_ = corr_ + padded_rows_ * rows16_;  // a short tile's scales
  }

  STRATA_QUANT_DOT void Run(int64_t n0, int64_t n1) {
    for (int64_t c0 = n0; c0 < n1; c0 += chunk_rows_) {
      const int64_t count = n1 - c0 < chunk_rows_ ? n1 - c0 : chunk_rows_;
      f_.ChunkParams(c0, count, mul_, sub_);
      if constexpr (Format::kHasZero) ZeroTerms(count);
      for (int64_t n = c0; n < c0 + count; n += nr_max_) WeightTile(c0, count, n);
    }
  }

 private:
  // The sum of x over each segment's whole blocks, for the zeros (and the 128 under each int4 code): sumx[m][seg]
  // for Dot4, and sumx_t[seg][m] (input rows padded to 16 with zeros) for 16 input rows a vector.
  STRATA_QUANT_DOT void SumX() {
    sumx_.assign(static_cast<size_t>(rows_ * segments_), 0.0f);
    sumx_t_.assign(static_cast<size_t>(segments_ * rows16_), 0.0f);
    for (int64_t m = 0; m < rows_; ++m) {
      for (int64_t seg = 0; seg * segment_cols_ < kv_; ++seg) {
        const int64_t end = (seg + 1) * segment_cols_ < kv_ ? (seg + 1) * segment_cols_ : kv_;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t c = seg * segment_cols_; c < end; c += 16) {  // segments of a multiple of 32 columns here
          acc = _mm512_add_ps(
              acc,
              _mm512_castsi512_ps(_mm512_slli_epi32(
                  _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x_ + m * k_ + c))), 16)));
        }
        const float sum = _mm512_reduce_add_ps(acc);
        sumx_[static_cast<size_t>(m * segments_ + seg)] = sum;
        sumx_t_[static_cast<size_t>(seg * rows16_ + m)] = sum;
      }
    }
  }

  // The chunk's (128 + zero) * scale per weight row and segment, and from them its zeros' terms.
  STRATA_QUANT_DOT void ZeroTerms(int64_t count) {
    const int64_t flat = count * segments_;
    for (int64_t i = 0; i < flat; i += 16) {
      const __mmask16 mask = flat - i >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (flat - i)) - 1);
      _mm512_mask_storeu_ps(zq_ + i, mask,
                            _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, mul_ + i), _mm512_set1_ps(128.0f),
                                            _mm512_maskz_loadu_ps(mask, sub_ + i)));
    }
    // Either a Dot4 (a reduction) per input row and 4 weight rows, vectors along the segments: few input rows against
    // many segments (int4 groups of 32 at one row: 64 segments); or 16 input rows a vector, one multiply-add per
    // weight row, segment and 16 input rows: many input rows against few segments (groups of 128 at 16 rows).
    const int64_t dot4_cost = rows_ * ((count + 3) / 4) * (4 * ((segments_ + 15) / 16) + 14);
    const int64_t column_cost = count * (rows16_ / 16) * segments_;
    if (dot4_cost < column_cost) {
      alignas(16) float four[4];
      for (int64_t m = 0; m < rows_; ++m) {
        for (int64_t r = 0; r < count; r += 4) {
          _mm_store_ps(four, Dot4(zq_ + r * segments_, segments_, sumx_.data() + m * segments_, segments_));
          for (int64_t i = 0; i < 4 && r + i < count; ++i) corr_[(r + i) * rows16_ + m] = four[i];
        }
      }
      return;
    }
    for (int64_t r = 0; r < count; ++r) {
      const float* zq = zq_ + r * segments_;
      for (int64_t m = 0; m < rows16_; m += 16) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t seg = 0; seg < segments_; ++seg) {
          acc = _mm512_fmadd_ps(_mm512_set1_ps(zq[seg]), _mm512_loadu_ps(sumx_t_.data() + seg * rows16_ + m), acc);
        }
        _mm512_storeu_ps(corr_ + r * rows16_ + m, acc);
      }
    }
  }

  // Weight rows [n, n + nr_max) of the chunk from c0 (fewer at its end) against every input row.
  STRATA_QUANT_DOT void WeightTile(int64_t c0, int64_t count, int64_t n) {
    const int64_t nr = c0 + count - n < nr_max_ ? c0 + count - n : nr_max_;
    const int64_t local = n - c0;
    const uint8_t* ws[4];
    for (int r = 0; r < nr_max_; ++r) ws[r] = f_.Row(n + (r < nr ? r : nr - 1));
    // A short tile (the range's last rows) repeats its last row: its scales too, from a padded copy.
    const float* dm = mul_ + local * segments_;
    if (nr < nr_max_) {
      for (int r = 0; r < nr_max_; ++r) {
        const float* from = mul_ + (local + (r < nr ? r : nr - 1)) * segments_;
        std::copy(from, from + segments_, edge_ + r * segments_);
      }
      dm = edge_;
    }
    for (int64_t m = 0; m < rows_;) {
      float sums[4][4];
      const int mr = InputTile(ws, dm, m, sums);
      Store(ws, sums, local, n, nr, m, mr);
      m += mr;
    }
  }

  // The tile of input rows from m (all of one or two, else up to 4) against weight rows ws: its sums, and how many
  // input rows it took.
  STRATA_QUANT_DOT int InputTile(const uint8_t* const* ws, const float* dm, int64_t m, float (*sums)[4]) const {
    const uint16_t* xp = xp_.data();
    if (rows_ <= 2) {
      if (rows_ == 1) {
        TileQuantDot<Dot, 1, 4>(dot_, xp, kv_, ws, dm, segments_, lanes_, segment_cols_, blocks_, m, ahead_, sums);
      } else {
        TileQuantDot<Dot, 2, 4>(dot_, xp, kv_, ws, dm, segments_, lanes_, segment_cols_, blocks_, m, ahead_, sums);
      }
      return static_cast<int>(rows_);
    }
    const int mr = rows_ - m < 4 ? static_cast<int>(rows_ - m) : 4;
    switch (mr) {
      case 4:
        TileQuantDot<Dot, 4, 2>(dot_, xp, kv_, ws, dm, segments_, lanes_, segment_cols_, blocks_, m, ahead_, sums);
        break;
      case 3:
        TileQuantDot<Dot, 3, 2>(dot_, xp, kv_, ws, dm, segments_, lanes_, segment_cols_, blocks_, m, ahead_, sums);
        break;
      case 2:
        TileQuantDot<Dot, 2, 2>(dot_, xp, kv_, ws, dm, segments_, lanes_, segment_cols_, blocks_, m, ahead_, sums);
        break;
      default:
        TileQuantDot<Dot, 1, 2>(dot_, xp, kv_, ws, dm, segments_, lanes_, segment_cols_, blocks_, m, ahead_, sums);
        break;
    }
    return mr;
  }

  // Outputs [m, m + mr) x [n, n + nr) from a tile's sums: scaled, less the zeros' term, plus the columns past the
  // last whole block and the bias.
  STRATA_QUANT_DOT void Store(const uint8_t* const* ws, const float (*sums)[4], int64_t local, int64_t n, int64_t nr,
                              int64_t m, int mr) const {
    if (kv_ == k_) {  // no columns past the last whole block (the common case): a few operations an output
      const float factor = dot_factor_;
      const uint16_t* bias = bias_ != nullptr ? bias_ + n : nullptr;
      for (int i = 0; i < mr; ++i) {
        const float* corr = corr_ + local * rows16_ + m + i;
        uint16_t* out = y_ + (m + i) * n_total_ + n;
        for (int r = 0; r < nr; ++r) {
          float v = sums[i][r] * factor;
          if constexpr (Format::kHasZero) v -= corr[r * rows16_];
          if (bias != nullptr) v += BF16ToFloat(bias[r]);
          out[r] = FloatToBF16(v);
        }
      }
      return;
    }
    for (int i = 0; i < mr; ++i) {
      const uint16_t* xm = x_ + (m + i) * k_;
      for (int r = 0; r < nr; ++r) {
        float v = sums[i][r] * dot_factor_;
        if constexpr (Format::kHasZero) v -= corr_[(local + r) * rows16_ + m + i];
        const float* row_mul = mul_ + (local + r) * segments_;
        const float* row_sub = sub_ + (local + r) * segments_;
        for (int64_t j = kv_; j < k_; ++j) {  // the columns past the last whole block
          const int64_t s = j / segment_cols_;
          v += (f_.Code(ws[r], j) * row_mul[s] - row_sub[s]) * BF16ToFloat(xm[j]);
        }
        const float b = bias_ != nullptr ? BF16ToFloat(bias_[n + r]) : 0.0f;
        y_[(m + i) * n_total_ + n + r] = FloatToBF16(v + b);
      }
    }
  }

  const Dot& dot_;
  const Format& f_;
  const LaneScales lanes_;
  const int64_t segment_cols_;
  const float dot_factor_;
  const uint16_t* const x_;
  const uint16_t* const bias_;
  uint16_t* const y_;
  const int64_t rows_, k_, n_total_;
  const int64_t blocks_, kv_, segments_;
  std::vector<uint16_t> xp_;
  std::vector<float> sumx_;    // [rows, segments]
  std::vector<float> sumx_t_;  // [segments, rows16]
  const int64_t chunk_rows_, padded_rows_, rows16_;
  std::vector<float> table_;
  float *mul_, *sub_, *zq_, *corr_, *edge_;
  const int nr_max_;
  const int64_t ahead_;
};

// The rows kernel on VDPBF16PS for one format: `Format` (quantized_fp8-inl.h's or quantized_int-inl.h's) gives
// the multipliers, zeros and the scalar codes of the columns past the last whole block. Per chunk of kDotChunkRows
// weight rows the scales are widened in whole vectors (ChunkParams) and the zeros' term of every output computed
// at once, so that what runs per weight row besides the tile is a few stores.
template <class Dot, class Format>
STRATA_QUANT_DOT void QuantRowsDot(const Dot& dot, const Format& f, LaneScales lanes, int64_t segment_cols,
                                   float dot_factor, const uint16_t* x, const uint16_t* bias, uint16_t* y, int64_t rows,
                                   int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  QuantDotCall<Dot, Format>(dot, f, lanes, segment_cols, dot_factor, x, bias, y, rows, k, n_total, n0, n1).Run(n0, n1);
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

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_QUANTIZED_AVX512_INL_H_
