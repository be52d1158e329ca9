// MXFP4 weights (E2M1 codes in blocks of 32 with an E8M0 scale each, gpt-oss's experts), per target (included once
// per target from quantized-inl.h, guarded by the toggle): the decode of a block's codes through a 16-entry table,
// the format the rows kernels read (quantized_rows-inl.h), x permuted to the codes' order, and the dequantizer.
#if defined(STRATA_KERNELS_QUANTIZED_MXFP4_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_KERNELS_QUANTIZED_MXFP4_INL_H_
#undef STRATA_KERNELS_QUANTIZED_MXFP4_INL_H_
#else
#define STRATA_KERNELS_QUANTIZED_MXFP4_INL_H_
#endif

#include <cstdint>
#include <cstring>
#include <vector>

#include "hwy/highway.h"
#include "kernels/bf16-inl.h"
#include "kernels/quantized.h"
#include "kernels/quantized_common-inl.h"
#include "kernels/quantized_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Twice each E2M1 code's value: small integers (an int8 table for TableLookupBytes, a float32 one for AVX-512's
// TableLookupLanes, whose code 8 is -0.0 as the code's own value). The 1/2 goes into the block's multiplier,
// 2^(s - 128): the real product, hence its float32 rounding (overflow included), is the same as value * 2^(s - 127).
alignas(16) constexpr int8_t kE2m1Twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// The same doubled values as float16, whose low byte is 0 for each: the high bytes, for AVX2's decode (one VPSHUFB
// gives 16 codes' float16 bits, unpacked under zero bytes and widened by F16C's VCVTPH2PS).
alignas(16) constexpr uint8_t kE2m1TwiceHalfHigh[16] = {0x00, 0x3C, 0x40, 0x42, 0x44, 0x46, 0x48, 0x4A,
                                                        0x80, 0xBC, 0xC0, 0xC2, 0xC4, 0xC6, 0xC8, 0xCA};
alignas(64) constexpr float kE2m1TwiceFloat[16] = {0.0f,  1.0f,  2.0f,  3.0f,  4.0f,  6.0f,  8.0f,  12.0f,
                                                   -0.0f, -1.0f, -2.0f, -3.0f, -4.0f, -6.0f, -8.0f, -12.0f};

// The multiplier of a block of scale byte s: 2^(s - 128) from its bits (2^-128 and 2^-127 subnormal). Every s has
// one, 255 too (2^127): times the doubled code that is torch's ldexp(value, s - 127), which scales exactly (0.5 x
// 2^128 is 2^127, 0 x 2^128 is 0) and where 2^(s - 127) itself would not be a float32.
inline float Mxfp4Multiplier(uint8_t s) {
  const uint32_t bits = s >= 2 ? static_cast<uint32_t>(s - 1) << 23 : (s + 1u) << 21;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Lanes(df) bytes at p as twice the E2M1 values of their low nibbles (lo) and high nibbles (hi), float32. With
// kSignedZero, code 8 decodes to -0.0 (the dequantizer is bit-exact with torch's table); the rows kernels' sums do
// not care.
template <bool kSignedZero>
HWY_INLINE void DecodeE2m1(DQ df, const uint8_t* p, VQ& lo, VQ& hi) {
#if HWY_TARGET == HWY_SCALAR
  lo = hn::Set(df, kE2m1TwiceFloat[p[0] & 0xF]);
  hi = hn::Set(df, kE2m1TwiceFloat[p[0] >> 4]);
#elif HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // 16 float32 lanes: the whole table is one vector, and VPERMPS looks up 16 codes at once (no int conversion).
  const hn::RebindToUnsigned<DQ> du32;
  const hn::Rebind<uint8_t, DQ> du8;
  const auto bytes = hn::PromoteTo(du32, hn::LoadU(du8, p));
  const VQ table = hn::Load(df, kE2m1TwiceFloat);
  lo = hn::TableLookupLanes(table, hn::IndicesFromVec(df, hn::And(bytes, hn::Set(du32, 0xF))));
  hi = hn::TableLookupLanes(table, hn::IndicesFromVec(df, hn::ShiftRight<4>(bytes)));
#else
  // Narrower vectors: PSHUFB / TBL over the int8 table (16 bytes, any index vector up to 16 lanes), then widened.
  const hn::Rebind<uint8_t, DQ> du8;
  const hn::Rebind<int8_t, DQ> di8;
  const hn::RebindToSigned<DQ> di32;
  const hn::Full128<int8_t> dtable;
  const auto table = hn::Load(dtable, kE2m1Twice);
  const auto bytes = hn::LoadU(du8, p);
  const auto lo_codes = hn::And(bytes, hn::Set(du8, uint8_t{0xF}));
  const auto hi_codes = hn::ShiftRight<4>(bytes);
  lo = hn::ConvertTo(df, hn::PromoteTo(di32, hn::BitCast(di8, hn::TableLookupBytes(table, lo_codes))));
  hi = hn::ConvertTo(df, hn::PromoteTo(di32, hn::BitCast(di8, hn::TableLookupBytes(table, hi_codes))));
  if constexpr (kSignedZero) {
    // The code's sign bit into the float's (a no-op but for code 8, whose 0 becomes -0).
    const hn::RebindToUnsigned<DQ> du32;
    const auto wide = hn::PromoteTo(du32, bytes);
    const auto sign = hn::Set(du32, 0x80000000u);
    lo = hn::Or(lo, hn::BitCast(df, hn::And(hn::ShiftLeft<28>(wide), sign)));
    hi = hn::Or(hi, hn::BitCast(df, hn::And(hn::ShiftLeft<24>(wide), sign)));
  }
#endif
}

// The format the rows kernels read (quantized_common-inl.h's interface) over x permuted by PermuteMxfp4: a block's
// columns in the codes' order, its 16 low nibbles then its 16 high ones (int4's chunk of 32). Segments are the
// blocks; the codes are twice the E2M1 values and the multiplier 2^(s - 128); no zeros.
struct Mxfp4Format {
  static constexpr bool kHasZero = false;
  const uint8_t* blocks;
  const uint8_t* scales;
  int64_t k, blocks_k;
  Mxfp4Format(const Mxfp4Weights& w, int64_t k_) : blocks(w.blocks), scales(w.scales), k(k_), blocks_k(k_ / 32) {}
  int64_t Segments() const { return blocks_k; }
  static int64_t SegBegin(int64_t s) { return s * 32; }
  static int64_t SegEnd(int64_t s) { return (s + 1) * 32; }
  const uint8_t* Row(int64_t n) const { return blocks + n * (k / 2); }
  static int64_t Bytes(int64_t j) { return j / 2; }
  static int64_t Step(int64_t) { return 32; }
  static bool VectorAt(int64_t j) { return j % 32 == 0; }
  void Params(int64_t n, int64_t s, float& mul, float& zero) const {
    mul = Mxfp4Multiplier(scales[n * blocks_k + s]);
    zero = 0.0f;
  }
  void RowParams(int64_t n, float* mul, float* sub) const { ChunkParams(n, 1, mul, sub); }
  // Rows [n, n + count) flat (mul[r * blocks_k + s]; sub zeros): the scale bytes of a run of rows are contiguous,
  // widened a vector at a time into the multipliers' bits.
  void ChunkParams(int64_t n, int64_t count, float* mul, float* sub) const {
    const DQ d;
    const hn::RebindToUnsigned<DQ> du32;
    const hn::RebindToSigned<DQ> di32;
    const hn::Rebind<uint8_t, DQ> du8;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const uint8_t* from = scales + n * blocks_k;
    const int64_t total = count * blocks_k;
    int64_t i = 0;
    for (; i + lanes <= total; i += lanes) {
      const auto s = hn::PromoteTo(du32, hn::LoadU(du8, from + i));
      const auto si = hn::BitCast(di32, s);
      auto bits = hn::ShiftLeft<23>(hn::Sub(s, hn::Set(du32, 1)));
      bits = hn::IfThenElse(hn::RebindMask(du32, hn::Lt(si, hn::Set(di32, 2))),
                            hn::ShiftLeft<21>(hn::Add(s, hn::Set(du32, 1))), bits);
      hn::StoreU(hn::BitCast(d, bits), d, mul + i);
      hn::StoreU(hn::Zero(d), d, sub + i);
    }
    for (; i < total; ++i) {
      mul[i] = Mxfp4Multiplier(from[i]);
      sub[i] = 0.0f;
    }
  }
  template <class Fn>
  HWY_INLINE void Decode(DQ df, const uint8_t* row, int64_t j, int64_t lanes, Fn&& fn) const {
#if HWY_TARGET == HWY_AVX2
    // A block's 16 bytes at once: two lookups of float16 bits, four unpacks and four widenings for 32 codes (the
    // int8 table's widen-and-convert per 8 codes takes 20 operations).
    const hn::Full128<uint8_t> d8;
    const hn::Full128<uint16_t> d16;
    const hn::Rebind<hwy::float16_t, DQ> dh;
    const auto table = hn::Load(d8, kE2m1TwiceHalfHigh);
    const auto bytes = hn::LoadU(d8, row + j / 2);
    const auto even = hn::TableLookupBytes(table, hn::And(bytes, hn::Set(d8, uint8_t{0xF})));
    const auto odd = hn::TableLookupBytes(table, hn::ShiftRight<4>(bytes));
    const auto zero = hn::Zero(d8);
    fn(hn::PromoteTo(df, hn::BitCast(dh, hn::ZipLower(d16, zero, even))), j);
    fn(hn::PromoteTo(df, hn::BitCast(dh, hn::ZipUpper(d16, zero, even))), j + 8);
    fn(hn::PromoteTo(df, hn::BitCast(dh, hn::ZipLower(d16, zero, odd))), j + 16);
    fn(hn::PromoteTo(df, hn::BitCast(dh, hn::ZipUpper(d16, zero, odd))), j + 24);
    (void)lanes;
    return;
#endif
    for (int64_t c = 0; c < 16; c += lanes) {
      VQ lo, hi;
      DecodeE2m1<false>(df, row + j / 2 + c, lo, hi);
      fn(lo, j + c);
      fn(hi, j + 16 + c);
    }
  }
  // The code of column j (twice its value), in column order: the kernels' vector loops cover whole blocks, and the
  // VDPBF16PS path reads the columns past its last block of 128 from x as it is.
  static float Code(const uint8_t* row, int64_t j) {
    const uint8_t byte = row[j / 2];
    return static_cast<float>(kE2m1Twice[j % 2 == 0 ? byte & 0xF : byte >> 4]);
  }
};

// x rows [rows, k] (float32 or bfloat16, by E) as float32 in the codes' order: per block of 32 columns the even
// ones, then the odd ones.
template <class E>
void PermuteMxfp4(const typename E::T* x, int64_t rows, int64_t k, float* out) {
  for (int64_t b = 0; b < rows * k; b += 32) {
    for (int64_t i = 0; i < 16; ++i) {
      out[b + i] = E::LoadOne(x + b + 2 * i);
      out[b + 16 + i] = E::LoadOne(x + b + 2 * i + 1);
    }
  }
}

// Rows kernel: x (float32 or bfloat16, XE) permuted once, then quantized_rows-inl.h's tiles; y of E.
template <class XE, class E>
void QuantRowsMxfp4T(const typename XE::T* x, const Mxfp4Weights& w, const typename E::T* bias, typename E::T* y,
                     int64_t rows, int64_t k, int64_t n_total, int64_t n0, int64_t n1) {
  std::vector<float> permuted(static_cast<size_t>(rows * k));
  PermuteMxfp4<XE>(x, rows, k, permuted.data());
  QuantRowsT<Mxfp4Format, E>(Mxfp4Format(w, k), permuted.data(), bias, y, rows, k, n_total, n0, n1);
}

// Lanes(d) values of column pairs (a[i], b[i]) stored interleaved from p: 2 * Lanes(d) consecutive columns.
template <class E>
HWY_INLINE void StorePairs(DQ d, VQ a, VQ b, typename E::T* p) {
  if constexpr (sizeof(typename E::T) == sizeof(float)) {
    hn::StoreInterleaved2(a, b, d, p);
  } else {
    const hn::Rebind<uint16_t, DQ> du16;
    const hn::RebindToSigned<DQ> di32;
    hn::StoreInterleaved2(hn::DemoteTo(du16, hn::BitCast(di32, RoundedBF16Bits(d, a))),
                          hn::DemoteTo(du16, hn::BitCast(di32, RoundedBF16Bits(d, b))), du16, p);
  }
}

// Rows [n0, n1) in column order: each code's doubled value times 2^(s - 128), one float32 multiply: exact, or
// infinite past float32's range (as torch's ldexp), bfloat16 rounded from it (exact: two significant bits).
template <class E>
void DequantizeMxfp4T(const Mxfp4Weights& w, int64_t k, int64_t n0, int64_t n1, typename E::T* out) {
  const DQ d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t blocks_k = k / 32;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.blocks + n * (k / 2);
    const uint8_t* scale = w.scales + n * blocks_k;
    typename E::T* o = out + (n - n0) * k;
    for (int64_t b = 0; b < blocks_k; ++b) {
      const VQ mv = hn::Set(d, Mxfp4Multiplier(scale[b]));
      for (int64_t c = 0; c < 16; c += lanes) {
        VQ lo, hi;
        DecodeE2m1<true>(d, row + b * 16 + c, lo, hi);
        StorePairs<E>(d, hn::Mul(lo, mv), hn::Mul(hi, mv), o + b * 32 + 2 * c);
      }
    }
  }
}

}  // namespace strata::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // STRATA_KERNELS_QUANTIZED_MXFP4_INL_H_
